"""`LanguageModel.generate` ends rows at end-of-sequence by default, says each row's length, and pads with -1."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from engine.backends.llamacpp import LlamaCppBackend  # noqa: E402
from engine.research.batch_generate import PAD  # noqa: E402
from engine.research.lm import LanguageModel  # noqa: E402


@pytest.fixture(scope="module")
def lm(tiny_gguf):
    model = LanguageModel(LlamaCppBackend(tiny_gguf, spec="tiny", display_name="tiny"))
    yield model
    model.close()


def test_rows_stop_at_end_of_sequence_by_default_with_lengths_and_no_token_padding(lm, monkeypatch):
    prompts = [lm.tokenizer.encode("Once upon a time"), lm.tokenizer.encode("x")]
    free = lm.generate_output(prompts, max_new_tokens=8, stop=())  # no stop: every row runs 8 tokens
    assert free.lengths.tolist() == [8, 8]
    eos = free.generated(0)[2]  # make row 0's third token an end-of-sequence token
    monkeypatch.setattr(lm.tokenizer, "eos_token_ids", frozenset({eos}))

    out = lm.generate_output(prompts, max_new_tokens=8)
    assert out.generated(0) == free.generated(0)[:3]  # the end-of-sequence token kept, nothing after it
    assert out.lengths[0] == 3
    w = out.prompt_width
    assert (out.sequences[0, w + 3 :] == PAD).all() and np.isnan(out.logprobs[0, 3:]).all()
    assert out.sequences[1, : w - len(prompts[1])].tolist() == [PAD] * (w - len(prompts[1]))  # left of the prompt
    assert PAD < 0  # no token has it: a pad cell never reads as text
    assert (lm.generate(prompts, max_new_tokens=8) == out.sequences).all()


def test_the_default_model_stops_at_im_end(default_model_folder):
    """The defect as a user met it: the chat answer ran past <|im_end|> into an invented next turn."""
    from engine.sources import resolve_spec

    source = resolve_spec(None)
    lm = LanguageModel(LlamaCppBackend(source.path, spec="default", display_name=source.name))
    try:
        im_end = lm.tokenizer.encode("<|im_end|>", add_special_tokens=False)
        assert len(im_end) == 1 and im_end[0] in lm.tokenizer.eos_token_ids
        # A question with one short answer: "Say hello in two words" ended after 12 tokens on some CPUs and ran
        # to the limit ("Aw, wow, wow, ...") on an AVX-512 one, whose kernels round differently.
        prompt = lm.tokenizer.encode("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
                                     add_special_tokens=False)
        out = lm.generate_output([prompt], max_new_tokens=48)
        n = int(out.lengths[0])
        assert n < 48 and out.generated(0)[-1] == im_end[0]
        assert (out.sequences[0, out.prompt_width + n :] == PAD).all()
        assert im_end[0] not in out.generated(0)[:-1]
    finally:
        lm.close()


# --- the research API speaks SamplerSettings (issue 35 item 3, first part) ---------------------------------


def test_generate_takes_a_sampler_with_stages_the_old_knobs_lacked(lm):
    from engine.sampling import SamplerSettings

    prompt = [lm.tokenizer.encode("Once upon a time")]
    greedy = lm.generate_output(prompt, max_new_tokens=4, stop=())
    first = greedy.generated(0)[0]
    banned = SamplerSettings(temperature=0.0, logit_bias={first: float("-inf")})  # a stage generate had no knob for
    out = lm.generate_output(prompt, max_new_tokens=4, stop=(), sampler=banned)
    assert out.generated(0)[0] != first
    one = SamplerSettings(temperature=1.5, top_k=1, seed=3)  # top-k 1 leaves the argmax alone: greedy again
    assert lm.generate_output(prompt, max_new_tokens=4, stop=(), sampler=one).generated(0) == greedy.generated(0)
    with pytest.raises(ValueError, match="not both"):
        lm.generate(prompt, max_new_tokens=2, temperature=0.7, sampler=one)
    with pytest.raises(TypeError, match="SamplerSettings"):
        lm.generate(prompt, max_new_tokens=2, sampler={"temperature": 0.7})


def test_sample_and_batch_sample_take_a_sampler(lm):
    from engine.sampling import SamplerSettings

    prompt = lm.tokenizer.encode("Once upon a time")
    plain = lm.sample(prompt, 6, temperature=0.9, seed=11)
    assert lm.sample(prompt, 6, sampler=SamplerSettings(temperature=0.9, seed=11)) == plain
    assert lm.sample(prompt, 6, seed=11, sampler=SamplerSettings(temperature=0.9)) == plain  # seed= fills it in
    greedy = lm.sample(prompt, 6, sampler=SamplerSettings(temperature=0.0))
    assert greedy[0] == lm.generate_output([prompt], max_new_tokens=6, stop=()).generated(0)
    rows = lm.batch_sample([prompt, prompt], 6, sampler=SamplerSettings(temperature=0.9, seed=11))
    assert rows[0] == plain  # row 0 draws with the seed, row 1 with seed + 1
    assert rows[1] == lm.sample(prompt, 6, temperature=0.9, seed=12)
    with pytest.raises(ValueError, match="not both"):
        lm.sample(prompt, 2, temperature=0.5, sampler=SamplerSettings())


def test_the_chain_and_its_pick_are_public():
    import engine

    assert {"SamplerChain", "Pick"} <= set(engine.__all__)
    chain = engine.SamplerChain(engine.SamplerSettings(temperature=0.0))
    pick = chain.pick(np.array([0.1, 2.0, 1.0], dtype=np.float32), np.zeros(0, dtype=np.int64), top_n=2)
    assert isinstance(pick, engine.Pick) and pick.token_id == 1 and pick.rank == 0
