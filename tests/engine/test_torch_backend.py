"""The torch backend on the real default model and on a tiny random Llama: cache reuse is exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.backend import prefill
from engine.decode.loop import generate_events
from engine.events import Done
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings

# An argument transformers has announced it will remove (`past_key_values` -> `cache`, ...) is an error here, so a
# rename inside the admitted transformers range fails these tests rather than a user's model a release later.
pytestmark = pytest.mark.filterwarnings("error:.*(is deprecated|will be removed).*:FutureWarning")

GREEDY = SamplerSettings(temperature=0.0)


def _full_logits(backend, ids) -> np.ndarray:
    """Reference: the last logits of `ids` computed from scratch, no cache, no chunking."""
    with torch.inference_mode():
        out = backend.model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0, -1].float().numpy()


@pytest.mark.slow
def test_default_model_says_paris(fresh_default_torch):
    req = GenerationRequest(prompt="The capital of France is", sampler=GREEDY, max_new_tokens=8)
    events = list(generate_events(fresh_default_torch, req))
    assert isinstance(events[-1], Done)
    assert "Paris" in events[-1].stats.text
    assert events[-1].stats.finish_reason in ("length", "eos")


def test_info_describes_the_default_model(default_torch):
    info = default_torch.info
    assert info.architecture == "LlamaForCausalLM"
    assert 130e6 < info.parameters < 140e6
    assert info.vocab_size == 49152 and info.context_length == 8192
    assert info.dtype == "float32" and info.backend == "torch" and info.device.startswith("cpu")


def test_prefix_reuse_trims_and_matches_recompute(tiny_torch):
    tok = tiny_torch.tokenizer
    first = tok.encode("one two three four five six seven eight nine ten")
    second = first[:6] + tok.encode(" alpha beta gamma")
    _, reused = prefill(tiny_torch, first)
    assert reused == 0
    logits, reused = prefill(tiny_torch, second)
    assert reused == 6  # only the new tokens were run
    assert list(tiny_torch.cached_tokens()) == second
    np.testing.assert_allclose(logits, _full_logits(tiny_torch, second), atol=1e-4, rtol=1e-4)


def test_identical_prompt_reruns_only_its_last_token(tiny_torch):
    ids = tiny_torch.tokenizer.encode("the same prompt twice")
    prefill(tiny_torch, ids)
    logits, reused = prefill(tiny_torch, ids)
    assert reused == len(ids) - 1
    np.testing.assert_allclose(logits, _full_logits(tiny_torch, ids), atol=1e-4, rtol=1e-4)


def test_chunked_prefill_equals_one_shot(tiny_torch):
    ids = tiny_torch.tokenizer.encode("a b c d e f g h i j k l m n o p q r s t u v w x y z " * 3)
    logits, _ = prefill(tiny_torch, ids, chunk=7)
    np.testing.assert_allclose(logits, _full_logits(tiny_torch, ids), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_cached_greedy_decode_matches_transformers_generate(fresh_default_torch):
    backend = fresh_default_torch
    prompt = backend.tokenizer.chat_ids([{"role": "user", "content": "Name three fruits."}])
    req = GenerationRequest(prompt_ids=tuple(prompt), sampler=GREEDY, max_new_tokens=24)
    ours = [e.token_id for e in generate_events(backend, req) if not isinstance(e, Done)]
    with torch.inference_mode():
        ref = backend.model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt) :]
    assert ours == ref.tolist()[: len(ours)]


def test_cancel_between_prefill_chunks_keeps_what_ran(tiny_torch):
    ids = tiny_torch.tokenizer.encode("a b c d e f g h i j k l m n o p")
    calls = iter([False, False, True])
    logits, _ = prefill(tiny_torch, ids, chunk=4, cancelled=lambda: next(calls))
    assert logits is None and list(tiny_torch.cached_tokens()) == ids[:8]
    logits, reused = prefill(tiny_torch, ids, chunk=4)  # the next request picks up where it stopped
    assert reused == 8
    np.testing.assert_allclose(logits, _full_logits(tiny_torch, ids), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("policy", ["weights=0,0 cache=100", "weights=0,50 cache=100"])
def test_offloaded_backend_decodes_like_the_resident_one(tiny_llama_folder, tiny_torch, policy):
    from engine.backends.torch.backend import TorchBackend

    req = GenerationRequest(prompt="offload me", sampler=GREEDY, max_new_tokens=12, ignore_eos=True, top_n=5)
    resident = list(generate_events(tiny_torch, req))
    streamed_backend = TorchBackend(tiny_llama_folder, spec="tiny", display_name="tiny", offload=policy)
    try:
        streamed = list(generate_events(streamed_backend, req))
        assert "offload" in streamed_backend.info.device
    finally:
        streamed_backend.close()
    assert resident[-1].stats.token_ids == streamed[-1].stats.token_ids
    for a, b in zip(resident[:-1], streamed[:-1]):
        assert abs(a.logprob - b.logprob) < 1e-4
