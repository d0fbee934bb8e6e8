"""The torch backend's preallocated KV cache: same tokens as transformers, growth, compaction, trimming, reuse.

A tiny random-weight Gemma 3 (sliding window 16, one full-attention layer in
four) is built here so generations run far past the window in a second.
Small grow steps and reaches make growth and compaction happen often.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.backends.torch import cache as torch_cache
from engine.backend import prefill
from engine.backends.torch.cache import GrowingCache
from engine.decode.loop import generate_events
from engine.events import Done
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings

# An argument transformers has announced it will remove (`past_key_values` -> `cache`, ...) is an error here, so a
# rename inside the admitted transformers range fails these tests rather than a user's model a release later.
pytestmark = pytest.mark.filterwarnings("error:.*(is deprecated|will be removed).*:FutureWarning")

GREEDY = SamplerSettings(temperature=0.0)
WINDOW = 16


@pytest.fixture(scope="module")
def tiny_gemma_folder(tmp_path_factory, default_model_folder):
    """A 4-layer random-weight Gemma 3 text model (sliding window 16) with the default model's tokenizer."""
    from tiny_models import TINY_DECODER, save_with_default_tokenizer
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    folder = tmp_path_factory.mktemp("tiny-gemma3")
    config = Gemma3TextConfig(
        **{**TINY_DECODER, "num_hidden_layers": 4, "max_position_embeddings": 1024},
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():  # larger logits than the default init, so greedy choices are not near-ties
        model.model.embed_tokens.weight.normal_(0, 1.0)
    return save_with_default_tokenizer(model, folder, default_model_folder)


@pytest.fixture
def small_steps(monkeypatch):
    """Grow in 32-token steps and keep only 8 tokens past a sliding window: growth and compaction every few steps."""
    monkeypatch.setattr(torch_cache, "GROW_STEP", 32)
    monkeypatch.setattr(torch_cache, "SLIDING_REACH", 8)


@pytest.fixture
def gemma(tiny_gemma_folder, small_steps):
    from engine.backends.torch.backend import TorchBackend

    backend = TorchBackend(tiny_gemma_folder, spec="tiny-gemma", display_name="tiny-gemma")
    yield backend
    backend.close()


def _full_logits(backend, ids) -> np.ndarray:
    """Reference: the last logits of `ids` computed from scratch, no cache."""
    with torch.inference_mode():
        out = backend.model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0, -1].float().numpy()


def _greedy(backend, prompt, n) -> list[int]:
    req = GenerationRequest(prompt_ids=tuple(prompt), sampler=GREEDY, max_new_tokens=n, ignore_eos=True)
    done = list(generate_events(backend, req))[-1]
    assert isinstance(done, Done)
    return list(done.stats.token_ids)


def _generate_reference(backend, prompt, n) -> list[int]:
    """transformers' own generate (its DynamicCache), the oracle."""
    with torch.inference_mode():
        out = backend.model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt) :].tolist()


def test_gemma_far_past_the_window_matches_transformers_generate(gemma):
    prompt = gemma.tokenizer.encode("a tiny model writing far past its sliding window")
    ours = _greedy(gemma, prompt, 6 * WINDOW)
    assert isinstance(gemma._cache, GrowingCache)
    layers = gemma._cache.layers
    assert layers[0].start > 0, "the sliding layers compacted (dropped positions older than window + reach)"
    assert layers[3].start == 0 and layers[3].capacity >= len(prompt) + 6 * WINDOW - 1
    assert ours == _generate_reference(gemma, prompt, 6 * WINDOW)


def test_gemma_branch_after_a_long_prompt_reuses_the_prefix(gemma):
    tok = gemma.tokenizer
    prompt = tok.encode("one two three four five six seven eight nine ten " * 8)  # several windows long
    assert len(prompt) > 4 * WINDOW
    _greedy(gemma, prompt, 6)  # the answer sits right after the prompt: a branch trims back 6 tokens
    branch = prompt + tok.encode(" and another ending")
    req = GenerationRequest(prompt_ids=tuple(branch), sampler=GREEDY, max_new_tokens=4, ignore_eos=True)
    done = list(generate_events(gemma, req))[-1]
    assert done.stats.reused_tokens == len(prompt)  # only the branch's own tokens were prefilled
    logits, reused = prefill(gemma, branch)  # the same branch again: only its last token runs
    assert reused == len(branch) - 1
    np.testing.assert_allclose(logits, _full_logits(gemma, branch), atol=1e-4, rtol=1e-4)


def test_trim_within_reach_is_exact_and_beyond_it_recomputes(gemma):
    ids = gemma.tokenizer.encode("x y z " * 40)
    prefill(gemma, ids, chunk=4)  # small chunks: the sliding layers fill up and drop old positions
    n = len(ids)
    layer = gemma._cache.layers[0]
    assert layer.start > 0
    # The token after `keep` attends from keep - WINDOW + 1; the layer holds that from `start` on.
    reachable = layer.start + WINDOW - 1
    assert 0 < reachable < n - 1
    kept = gemma.trim_cache(reachable)
    assert kept == reachable and gemma._cache.get_seq_length() == reachable
    logits = gemma.forward(ids[reachable : reachable + 3])
    np.testing.assert_allclose(logits, _full_logits(gemma, ids[: reachable + 3]), atol=1e-4, rtol=1e-4)
    start = gemma._cache.layers[0].start
    assert gemma.trim_cache(start + WINDOW - 2) == 0  # one token too far back: the window is gone, start over
    assert list(gemma.cached_tokens()) == []


def test_chunked_prefill_across_windows_matches_recompute(gemma):
    ids = gemma.tokenizer.encode("the quick brown fox jumps over the lazy dog " * 6)
    logits, _ = prefill(gemma, ids, chunk=WINDOW + 5)
    np.testing.assert_allclose(logits, _full_logits(gemma, ids), atol=1e-4, rtol=1e-4)


def test_full_attention_cache_grows_and_trims_in_place(tiny_torch, small_steps):
    tiny_torch.trim_cache(0)
    ids = tiny_torch.tokenizer.encode("grow me " * 30)
    prefill(tiny_torch, ids, chunk=20)
    cache = tiny_torch._cache
    assert isinstance(cache, GrowingCache)
    slots = 32
    while slots < len(ids):  # 32-token first step, then doubling
        slots *= 2
    assert cache.layers[0].capacity == slots and cache.get_seq_length() == len(ids)
    assert cache.nbytes() == 2 * 2 * (2 * slots * 16) * 4  # layers x (k, v) x (kv heads x slots x head_dim) x fp32
    assert tiny_torch.trim_cache(10) == 10
    logits = tiny_torch.forward(ids[10:14])
    np.testing.assert_allclose(logits, _full_logits(tiny_torch, ids[:14]), atol=1e-4, rtol=1e-4)
    tiny_torch.trim_cache(0)


@pytest.mark.slow
def test_default_model_long_greedy_matches_the_dynamic_cache(fresh_default_torch, monkeypatch):
    """Crossing several growth steps changes no token against transformers' generate (DynamicCache)."""
    # Not shorter: 100 tokens of the default model are what crosses more than 8 growths of 16 (asserted below).
    monkeypatch.setattr(torch_cache, "GROW_STEP", 16)  # five growths in this generation
    backend = fresh_default_torch
    prompt = backend.tokenizer.chat_ids([{"role": "user", "content": "Tell me a story about a lighthouse."}])
    n = 100
    ours = _greedy(backend, prompt, n)
    assert backend._cache.layers[0].capacity >= len(prompt) + n - 1 > 8 * 16
    assert ours == _generate_reference(backend, prompt, n)


def _compiler_available() -> bool:
    import shutil as sh

    return sh.which("cc") is not None or sh.which("gcc") is not None or sh.which("clang") is not None


@pytest.mark.slow
@pytest.mark.every_python  # dynamo reads this Python minor's own bytecode: CI builds it on each
@pytest.mark.skipif(not _compiler_available(), reason="torch.compile (inductor) needs a C compiler on the CPU")
def test_compiled_step_gives_the_eager_tokens_and_logprobs(tiny_llama_folder, small_steps):
    """Built in the background, swapped in when ready, crossing a buffer growth: same greedy run as eager."""
    # Not faster: inductor's build is ~50 s of CPU here, the same with one layer (measured: kernels are shared).
    from engine.backends.torch.backend import TorchBackend
    from engine.backends.torch.static_lean import SPAN_FLOOR

    req = GenerationRequest(prompt="compile me", sampler=GREEDY, max_new_tokens=40, ignore_eos=True, top_n=5)
    compiled = TorchBackend(tiny_llama_folder, spec="tiny", display_name="tiny", compile_step=True)
    try:
        first = list(generate_events(compiled, req))  # runs at once, eager or compiled: the build never blocks it
        assert compiled.compiled.wait(600), f"the compiled step failed to build: {compiled.compiled.error!r}"
        compiled.trim_cache(0)
        calls = []
        step = compiled.compiled.step
        compiled.compiled.step = lambda *a: calls.append(1) or step(*a)
        with_compile = list(generate_events(compiled, req))
        assert len(calls) == 39  # every decode step after the first token ran compiled
        # Grew from 32 slots while compiled: the compiled lean step keeps the buffer longer than its attention
        # span (static_lean.py), at least SPAN_FLOOR + 1 slots.
        assert compiled._cache.layers[0].capacity > SPAN_FLOOR
    finally:
        compiled.close()
    eager = TorchBackend(tiny_llama_folder, spec="tiny", display_name="tiny", compile_step=False)
    try:
        assert eager.compiled is None
        reference = list(generate_events(eager, req))
    finally:
        eager.close()
    assert with_compile[-1].stats.token_ids == reference[-1].stats.token_ids == first[-1].stats.token_ids
    for a, b in zip(with_compile[:-1], reference[:-1]):
        assert abs(a.logprob - b.logprob) < 1e-4
        assert [t.token_id for t in a.top_model] == [t.token_id for t in b.top_model]
