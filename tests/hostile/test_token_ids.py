"""Issue 36 item 2: a token id outside the vocabulary is refused in words, wherever it enters.

On llama.cpp an id past the vocabulary aborted the whole process (SIGABRT,
`std::out_of_range`): `tokenizer.decode([1000000])`, or an imported tree's id
1,000,000 or -7 then Continue. Each case runs the real default model in a
child process, so an abort fails the test instead of killing the suite; the
child prints the error it got, and the test reads that line.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine import GenerationRequest, SamplerSettings, TokenIdError
from engine.tokenizer import check_token_array, check_token_ids

ROOT = Path(__file__).resolve().parents[2]

pytestmark = []


def _child(body: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run `body` in a child Python with the default model loaded as `eng` (llama.cpp); it prints one line."""
    script = "from engine import Engine, GenerationRequest, SamplerSettings, TokenIdError\n" \
             "eng = Engine.load()\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _said(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, f"the child died (exit {result.returncode}): {result.stderr[-2000:]}"
    return [line for line in result.stdout.splitlines() if line.startswith("REFUSED ") or line.startswith("OK ")]


# --- the one check, without a model ------------------------------------------------------------------


@pytest.mark.parametrize("bad", [1_000_000, 49152, -7, 2**40, 2**63, 3.0, True, "5", None])
def test_every_bad_id_is_one_error_in_words(bad):
    with pytest.raises(TokenIdError) as e:
        check_token_ids([1, 2, bad], 49152)
    assert str(bad if not isinstance(bad, str) else repr(bad)) in str(e.value)
    assert "vocabulary (0..49151)" in str(e.value) or "not an integer" in str(e.value)


def test_good_ids_pass_and_arrays_are_checked_without_a_loop():
    import numpy as np

    check_token_ids([0, 49151], 49152)
    check_token_array(np.arange(49152), 49152)
    with pytest.raises(TokenIdError, match="token id 1000000 is outside this model's vocabulary"):
        check_token_array(np.array([5, 1_000_000, 3]), 49152)


def test_a_request_refuses_negative_and_non_integer_ids_where_it_is_built():
    with pytest.raises(TokenIdError, match="-7"):
        GenerationRequest(prompt="hi", assistant_prefix=(5, -7))
    with pytest.raises(TypeError, match="token ids"):
        GenerationRequest(prompt_ids=(1, 2.5))
    with pytest.raises(TypeError, match="token ids"):
        GenerationRequest(prompt="hi", forced_tokens=("a",))


# --- the real model, where a crash would abort -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.model
def test_llamacpp_never_aborts_on_an_id_past_its_vocabulary():
    result = _child("""
        tok = eng.tokenizer
        n = tok.token_count()
        def attempt(what, fn):
            try:
                fn()
                print("OK", what)
            except TokenIdError as e:
                print("REFUSED", what, "|", e)
        attempt("decode", lambda: tok.decode([1000000]))
        attempt("decode-negative", lambda: tok.decode([5, -7]))
        attempt("token_text", lambda: tok.token_text(n))
        attempt("token_bytes", lambda: tok.token_bytes(2**40))
        greedy = SamplerSettings(temperature=0)
        def run(**kw):
            list(eng.generate(GenerationRequest(sampler=greedy, max_new_tokens=2, **kw)))
        attempt("prompt_ids", lambda: run(prompt_ids=(1, 2, 1000000)))
        attempt("continue", lambda: run(prompt="Hello", assistant_prefix=(1000000,)))
        attempt("branch", lambda: run(prompt="Hello", forced_tokens=(n,)))
        attempt("good", lambda: run(prompt="Hello"))
        print("OK vocabulary", n)
    """)
    said = _said(result)
    refused = {line.split()[1]: line for line in said if line.startswith("REFUSED")}
    assert set(refused) == {"decode", "decode-negative", "token_text", "token_bytes", "prompt_ids", "continue", "branch"}, said
    n = int(next(line for line in said if line.startswith("OK vocabulary")).split()[-1])
    assert f"token id 1000000 is outside this model's vocabulary (0..{n - 1})" in refused["decode"]
    assert "-7" in refused["decode-negative"]
    assert "prompt token id 1000000" in refused["prompt_ids"]
    assert "answer token id 1000000" in refused["continue"]
    assert f"forced token id {n}" in refused["branch"]
    assert "OK good" in said  # the engine still answers after the refusals


@pytest.mark.slow
@pytest.mark.model
def test_the_research_api_refuses_an_id_past_the_vocabulary():
    result = _child("""
        eng.close()
        from engine.research.lm import LanguageModel
        lm = LanguageModel.load(None, backend="llamacpp")
        for what, ids in (("huge", [1, 2**40]), ("negative", [-1]), ("vocab", [lm.n_vocab])):
            try:
                lm.next_token_logprobs_sync(ids)
                print("OK", what)
            except TokenIdError as e:
                print("REFUSED", what, "|", e)
        try:
            lm.generate([[1, 2, 10**6]], max_new_tokens=1)
            print("OK generate")
        except TokenIdError as e:
            print("REFUSED generate |", e)
        print("OK rows", lm.next_token_logprobs_sync([1, 2]).shape[0])
    """)
    said = _said(result)
    assert [line.split()[1] for line in said if line.startswith("REFUSED")] == ["huge", "negative", "vocab", "generate"], said
    assert any("token id 1099511627776 is outside" in line for line in said)
