"""Issue 37 item 20: a GenerationRequest with a value of the wrong type is refused where it is built.

`GenerationRequest(sampler={...})` was accepted and failed later, inside the worker, with AttributeError;
a text given as `stop` became one stop string per character.
"""

from __future__ import annotations

import pytest

from engine import GenerationRequest, SamplerSettings


def test_a_dict_as_sampler_is_refused_with_how_to_build_one():
    with pytest.raises(TypeError) as e:
        GenerationRequest(prompt="hi", sampler={"temperature": 0.5})
    assert "sampler must be an engine.SamplerSettings, got dict" in str(e.value)
    assert "SamplerSettings.from_dict" in str(e.value)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"prompt": 42}, "prompt must be text"),
    ({"prompt": "hi", "stop": "\n"}, "stop must be a list"),
    ({"prompt": "hi", "stop": [""]}, "stop must be a list of non-empty texts"),
    ({"messages": "hello"}, "messages must be a list"),
    ({"messages": {"role": "user", "content": "x"}}, "messages must be a list"),
    ({"prompt_ids": 5}, "prompt_ids must be a list"),
    ({"prompt": "hi", "forced_tokens": [1.5]}, "forced_tokens must hold token ids"),
    ({"prompt": "hi", "record_stages": "yes"}, "record_stages must be True or False"),
    ({"prompt": "hi", "ignore_eos": 1}, "ignore_eos must be True or False"),
    ({"prompt": "hi", "top_n": True}, "top_n must be an integer"),
])
def test_wrong_types_are_refused_in_words(kwargs, words):
    with pytest.raises((TypeError, ValueError), match=words):
        GenerationRequest(**kwargs)


def test_right_types_still_pass_and_lists_become_tuples():
    r = GenerationRequest(messages=[{"role": "user", "content": "hi"}], sampler=SamplerSettings(temperature=0),
                          stop=["\n\n"], forced_tokens=[3], assistant_prefix=[1, 2])
    assert r.stop == ("\n\n",) and r.forced_tokens == (3,) and r.assistant_prefix == (1, 2)
    assert isinstance(r.messages, tuple)
