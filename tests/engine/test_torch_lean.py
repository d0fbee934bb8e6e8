"""The lean decode step (engine/backends/torch/lean.py): same logits and tokens as transformers, or not used at all.

Llama (the tiny random one and the default model) and a tiny Qwen2 with
q/k/v biases run through it; Gemma 3 and a Llama layer with an extra module
must be refused; a step that disagrees with transformers on its first use
must be dropped for the rest of the backend's life.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from engine.backends.torch import linear as cpu_linear
from engine.backends.torch.backend import TorchBackend
from engine.backends.torch.compat import with_cache
from engine.backends.torch.lean import LeanDecodeStep
from engine.decode.loop import generate_events
from engine.events import Done, TokenEvent
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings

# An argument transformers has announced it will remove (`past_key_values` -> `cache`, ...) is an error here, so a
# rename inside the admitted transformers range fails these tests rather than a user's model a release later.
pytestmark = pytest.mark.filterwarnings("error:.*(is deprecated|will be removed).*:FutureWarning")

GREEDY = SamplerSettings(temperature=0.0)


def _greedy_tokens(backend, prompt_ids, n: int) -> list[int]:
    backend.trim_cache(0)
    req = GenerationRequest(prompt_ids=tuple(prompt_ids), sampler=GREEDY, max_new_tokens=n, ignore_eos=True)
    done = list(generate_events(backend, req))[-1]
    assert isinstance(done, Done) and done.stats.generated_tokens == n
    return list(done.stats.token_ids)


def _count_lean_steps(backend, monkeypatch) -> list[int]:
    calls: list[int] = []
    real = backend.lean.step
    monkeypatch.setattr(backend.lean, "step", lambda token, cache: calls.append(token) or real(token, cache))
    return calls


@pytest.fixture(scope="module")
def tiny_qwen2_folder(tmp_path_factory, default_model_folder):
    """A 2-layer random-weight Qwen2 (q/k/v projections with biases) with the default model's tokenizer."""
    from tiny_models import TINY_DECODER, save_with_default_tokenizer
    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder = tmp_path_factory.mktemp("tiny-qwen2")
    config = Qwen2Config(
        **TINY_DECODER,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(1)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # larger logits and non-zero biases, so both matter to the result
        model.model.embed_tokens.weight.normal_(0, 1.0)
        model.lm_head.weight.normal_(0, 0.25)
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return save_with_default_tokenizer(model, folder, default_model_folder)


@contextmanager
def _kernels(lean, kernel: str):
    """The lean step with every matmul on `kernel` (skipped where this torch lacks it), then as it was."""
    if kernel not in cpu_linear.candidates(lean.head):
        pytest.skip(f"no {kernel} kernel in this torch build")
    before = lean.choose_kernels(kernel)
    try:
        yield
    finally:
        lean.choose_kernels(before)


@pytest.mark.parametrize("kernel", ["torch", "onednn"])
def test_lean_step_equals_transformers_forward_step_by_step(tiny_torch, kernel):
    """Torch's matmul kernel: bit for bit (transformers' own ops, below GROUPED_ATTENTION_FROM positions);
    oneDNN's: within float rounding."""
    backend = tiny_torch
    assert backend.lean is not None
    ids = backend.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    backend.trim_cache(0)
    backend.forward(ids)
    cache, token = backend._cache, ids[-1]
    with _kernels(backend.lean, kernel), torch.inference_mode():
        assert set(backend.lean.kernels.values()) == {kernel}
        for _ in range(24):
            ours = backend.lean.step(token, cache)
            cache.crop(-1)  # the same position again, through transformers
            theirs = backend.model(
                input_ids=torch.tensor([[token]]), **with_cache(backend.model, cache), use_cache=True, logits_to_keep=1
            ).logits
            assert ours.shape == theirs.shape
            if kernel == "torch":
                assert torch.equal(ours, theirs)
            else:
                torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
            token = int(theirs[0, -1].argmax())


def test_decode_goes_through_the_lean_step_and_keeps_transformers_tokens(tiny_torch, monkeypatch):
    backend = tiny_torch
    prompt = backend.tokenizer.encode("Once upon a time")
    calls = _count_lean_steps(backend, monkeypatch)
    ours = _greedy_tokens(backend, prompt, 40)
    assert backend.lean.verified
    assert len(calls) == 39  # every step after the prefill's token
    with torch.inference_mode():
        ref = backend.model.generate(
            torch.tensor([prompt]), max_new_tokens=40, min_new_tokens=40, do_sample=False
        )[0, len(prompt) :]
    assert ours == ref.tolist()


def test_fused_weights_are_the_models_own_memory(tiny_torch):
    """The model's q/k/v and gate/up weights are views into the fused tensors: no second copy."""
    layer, fused = tiny_torch.model.model.layers[0], tiny_torch.lean.layers[0]
    base = fused.qkv.untyped_storage().data_ptr()
    for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
        assert proj.weight.untyped_storage().data_ptr() == base
    assert layer.mlp.up_proj.weight.untyped_storage().data_ptr() == fused.gate_up.untyped_storage().data_ptr()
    assert fused.qkv.shape[0] == sum(
        p.weight.shape[0] for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)
    )


def test_qwen2_with_attention_biases(tiny_qwen2_folder, monkeypatch):
    backend = TorchBackend(tiny_qwen2_folder, spec="tiny-qwen2", display_name="tiny-qwen2")
    try:
        assert backend.lean is not None and backend.lean.layers[0].qkv_bias is not None
        prompt = backend.tokenizer.encode("Once upon a time")
        calls = _count_lean_steps(backend, monkeypatch)
        ours = _greedy_tokens(backend, prompt, 24)
        assert backend.lean is not None and backend.lean.verified and len(calls) == 23
        with torch.inference_mode():
            ref = backend.model.generate(
                torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False
            )[0, len(prompt) :]
        assert ours == ref.tolist()
    finally:
        backend.close()


def test_other_shapes_keep_transformers_forward():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    small = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1)
    gemma = Gemma3ForCausalLM(Gemma3TextConfig(**small, head_dim=16, sliding_window=8))
    assert LeanDecodeStep.for_model(gemma) is None
    llama = LlamaForCausalLM(LlamaConfig(**small))
    llama.model.layers[1].self_attn.q_norm = torch.nn.LayerNorm(16)  # Qwen3/OLMo-style: math the step lacks
    q_before = llama.model.layers[0].self_attn.q_proj.weight
    assert LeanDecodeStep.for_model(llama) is None
    assert llama.model.layers[0].self_attn.q_proj.weight is q_before  # a refused model is left as it was
    half_biased = LlamaForCausalLM(LlamaConfig(**small))
    half_biased.model.layers[0].self_attn.k_proj.bias = torch.nn.Parameter(torch.zeros(16))
    assert LeanDecodeStep.for_model(half_biased) is None
    assert LeanDecodeStep.for_model(LlamaForCausalLM(LlamaConfig(**small))) is not None  # the control


def test_a_step_that_disagrees_is_dropped_on_first_use(tiny_torch, monkeypatch, caplog):
    backend = tiny_torch
    prompt = backend.tokenizer.encode("Once upon a time")
    reference = _greedy_tokens(backend, prompt, 12)  # verified lean step: transformers' tokens (test above)

    backend.lean.verified = False
    real = backend.lean.step
    monkeypatch.setattr(backend.lean, "step", lambda token, cache: real(token, cache) + 1.0)
    with caplog.at_level(logging.WARNING, logger="engine.backends.torch.backend"):
        assert _greedy_tokens(backend, prompt, 12) == reference
    assert backend.lean is None
    assert "lean decode step differs" in caplog.text


_WITHOUT_LEAN: dict[str, list[int]] = {}  # the long run without the lean step, shared by both kernels' tests


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["torch", "onednn"])
def test_default_model_long_greedy_run_is_unchanged(fresh_default_torch, kernel):
    """SmolLM2 (the Llama the product ships) through the lean step, with each matmul kernel it can pick:
    100 tokens, the same as without it, and the step verified against transformers on first use."""
    backend = fresh_default_torch
    assert backend.lean is not None
    prompt = backend.tokenizer.chat_ids([{"role": "user", "content": "Describe a walk along a river at dawn."}])
    lean = backend.lean
    with _kernels(lean, kernel):
        with_lean = _greedy_tokens(backend, prompt, 100)
        assert backend.lean is lean and lean.verified
    if "without" not in _WITHOUT_LEAN:  # the reference is the same for both kernels: run it once (~11 s)
        backend.lean = None
        try:
            _WITHOUT_LEAN["without"] = _greedy_tokens(backend, prompt, 100)
        finally:
            backend.lean = lean
    without = _WITHOUT_LEAN["without"]
    assert with_lean == without
    assert np.unique(with_lean).size > 20  # a real answer, not one token repeated


def test_a_step_that_fails_on_first_use_costs_speed_not_the_answer(tiny_torch, monkeypatch, caplog):
    backend = tiny_torch
    prompt = backend.tokenizer.encode("Once upon a time")
    reference = _greedy_tokens(backend, prompt, 12)
    backend.lean.verified = False

    def broken(token, cache):
        cache.attention_layers()[0]._make_room(1)  # as far as a real step gets before a bad shape
        raise RuntimeError("shape mismatch in a layer")

    monkeypatch.setattr(backend.lean, "step", broken)
    with caplog.at_level(logging.WARNING, logger="engine.backends.torch.backend"):
        assert _greedy_tokens(backend, prompt, 12) == reference
    assert backend.lean is None
    assert "lean decode step failed (RuntimeError: shape mismatch" in caplog.text


def test_grouped_attention_for_long_contexts_keeps_the_tokens(tiny_torch, monkeypatch):
    """Past GROUPED_ATTENTION_FROM positions the query heads of a KV head attend as one group: the same
    logits within float rounding and the same greedy tokens (the tiny model's context is 512, so the
    threshold is lowered to put the whole run past it)."""
    from engine.backends.torch import lean as torch_lean

    backend = tiny_torch
    assert backend.lean.heads != backend.lean.kv_heads  # grouped-query attention: the path under test
    prompt = backend.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    reference = _greedy_tokens(backend, prompt, 40)  # transformers' SDPA call below the threshold
    monkeypatch.setattr(torch_lean, "GROUPED_ATTENTION_FROM", 4)
    assert _greedy_tokens(backend, prompt, 40) == reference
    cache, token = backend._cache, reference[-1]
    with torch.inference_mode():
        ours = backend.lean.step(token, cache)
        cache.crop(-1)
        theirs = backend.model(
            input_ids=torch.tensor([[token]]), **with_cache(backend.model, cache), use_cache=True, logits_to_keep=1
        ).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
