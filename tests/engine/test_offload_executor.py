"""The layer-streaming executor on the CPU: same tokens and logprobs as the resident model, bounded residency.

Runs through the engine's own decode path (`generate_events` on a
TorchBackend whose model is offloaded), greedy, for the policies
all-in-memory, half-on-disk and all-on-disk. Against a resident model whose
weights sit in ordinary memory the results are bit-identical. Against
`from_pretrained` as loaded (weights are views into the mapped file, 8-byte
aligned) logprobs are compared to 2e-5: BLAS kernels round differently for
differently aligned weights, ~5e-6 on the default model, never the tokens.
"""

from __future__ import annotations

import pytest
import torch

from engine.decode.loop import generate_events
from engine.events import TokenEvent
from engine.offload import OffloadPolicy, Tier, attach, load_offloaded
from engine.offload.checkpoint import Checkpoint
from engine.offload.layout import decoder_layers
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings

POLICIES = {
    "all-in-memory": OffloadPolicy(weights_gpu_percent=0, weights_cpu_percent=100),
    "half-on-disk": OffloadPolicy(weights_gpu_percent=0, weights_cpu_percent=50),
    "all-on-disk": OffloadPolicy(weights_gpu_percent=0, weights_cpu_percent=0),
    "all-on-disk-no-overlap": OffloadPolicy(weights_gpu_percent=0, weights_cpu_percent=0, overlap=False),
}
PROMPT = (1, 504, 3458, 282, 4649, 314, 253, 1345, 30, 378, 1029)


def greedy(backend, n: int, prompt=PROMPT) -> list[tuple[int, float]]:
    backend.trim_cache(0)
    req = GenerationRequest(
        prompt_ids=prompt, sampler=SamplerSettings(temperature=0.0), max_new_tokens=n, top_n=5, ignore_eos=True
    )
    events = [e for e in generate_events(backend, req) if isinstance(e, TokenEvent)]
    assert len(events) == n
    return [(e.token_id, e.logprob) for e in events]


def assert_same(got, want, atol=2e-5):
    assert [t for t, _ in got] == [t for t, _ in want]
    for (_, a), (_, b) in zip(got, want):
        assert a == pytest.approx(b, abs=atol)


def layer_bytes(handle) -> float:
    return handle.placement.total_bytes / len(handle.placement.tiers)


@pytest.fixture(autouse=True)
def tiny_torch_without_lean_step(tiny_torch, monkeypatch):
    """tiny_torch decoding through transformers' forward, as a backend with offloaded weights does: its lean
    step holds the resident weights, so with it the tests below would not run the offloaded ones."""
    monkeypatch.setattr(tiny_torch, "lean", None)


def _resident_backend(folder):
    """The reference: the same model resident, through transformers' forward (no lean step, whose matmul
    kernel may be oneDNN's and round differently), on tiny_torch's fixed one thread (a thread count chosen per
    answer from the machine's load could differ between the two runs, and sum in another order)."""
    from engine.backends.torch.backend import TorchBackend

    backend = TorchBackend(folder, spec="tiny", display_name="tiny", n_threads=1)
    backend.lean = None
    return backend


@pytest.fixture(scope="module")
def tiny_reference(tiny_llama_folder):
    backend = _resident_backend(tiny_llama_folder)
    ref = greedy(backend, 12)
    backend.close()
    return ref


@pytest.mark.parametrize("name", list(POLICIES))
def test_tiny_attach_in_place_matches(tiny_torch, tiny_llama_folder, tiny_reference, name):
    handle = attach(tiny_torch.model, tiny_llama_folder, POLICIES[name])
    try:
        assert_same(greedy(tiny_torch, 12), tiny_reference)
        # Between forwards every streamed weight is a shape-only placeholder again.
        _, layers = decoder_layers(tiny_torch.model)
        for i, tiers in enumerate(handle.placement.tiers):
            params = list(layers[i].parameters())
            assert [p.device.type == "meta" for p in params] == [t is Tier.DISK for t in tiers]
    finally:
        handle.close()


@pytest.fixture(scope="module")
def tiny_aligned_reference(tiny_llama_folder):
    """The resident run with every weight copied into ordinary (aligned) memory, like the offloaded ones."""
    backend = _resident_backend(tiny_llama_folder)
    for module in backend.model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = torch.nn.Parameter(p.detach().clone(), requires_grad=False)
    ref = greedy(backend, 12)
    backend.close()
    return ref


@pytest.mark.parametrize("name", list(POLICIES))
def test_tiny_load_offloaded_is_bit_identical(
    tiny_torch, tiny_llama_folder, tiny_aligned_reference, monkeypatch, name
):
    model, handle = load_offloaded(tiny_llama_folder, POLICIES[name], device="cpu", dtype=torch.float32)
    monkeypatch.setattr(tiny_torch, "model", model)
    try:
        assert greedy(tiny_torch, 12) == tiny_aligned_reference  # same tokens, same logprobs to the bit
        assert handle.residency.peak <= (2 if name.startswith("all-on-disk") else 30) * layer_bytes(handle)
    finally:
        handle.close()


def test_bfloat16_compute_from_a_float32_file(tiny_llama_folder):
    # Streamed weights are converted on the way in, as from_pretrained converts them at load.
    from engine.backends.torch.backend import TorchBackend

    backend = TorchBackend(tiny_llama_folder, spec="tiny", display_name="tiny", dtype="bfloat16", n_threads=1)
    try:
        want = greedy(backend, 6)
        handle = attach(backend.model, tiny_llama_folder, POLICIES["half-on-disk"])
        assert_same(greedy(backend, 6), want, atol=1e-6)
        handle.close()
    finally:
        backend.close()


def test_automatic_policy_fits_here(tiny_llama_folder):
    model, handle = load_offloaded(tiny_llama_folder, None, device="cpu", dtype=torch.float32)
    try:
        assert handle.policy == OffloadPolicy(0, 100)  # a tiny model fits this machine's RAM
        assert handle.report().disk_bytes == 0
    finally:
        handle.close()


def test_close_restore_gives_a_plain_model(tiny_torch, tiny_llama_folder, tiny_reference):
    handle = attach(tiny_torch.model, tiny_llama_folder, POLICIES["all-on-disk"])
    greedy(tiny_torch, 2)
    handle.close(restore=True)
    assert not any(p.device.type == "meta" for p in tiny_torch.model.parameters())
    assert not tiny_torch.model.model.layers[0]._forward_pre_hooks
    assert_same(greedy(tiny_torch, 12), tiny_reference)


def test_a_forward_that_raises_leaves_memory_bounded(tiny_torch, tiny_llama_folder, tiny_reference):
    handle = attach(tiny_torch.model, tiny_llama_folder, POLICIES["all-on-disk"])
    boom = tiny_torch.model.model.layers[1].mlp.register_forward_pre_hook(lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        greedy(tiny_torch, 2)
    boom.remove()
    try:
        assert_same(greedy(tiny_torch, 12), tiny_reference)
        assert handle.residency.peak <= 2 * layer_bytes(handle)
    finally:
        handle.close()
    assert handle.residency.current == 0


def test_checkpoint_reads_shards_and_matches_safetensors(tmp_path, tiny_llama_folder):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_folder))
    model.save_pretrained(tmp_path, max_shard_size="2MB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    want = load_file(str(tiny_llama_folder / "model.safetensors"))
    with Checkpoint(tmp_path) as ckpt:
        assert set(ckpt.entries) == set(want)
        for name, tensor in want.items():
            assert torch.equal(ckpt.read(name), tensor)
        buf = torch.empty(3, dtype=torch.float32)
        with pytest.raises(ValueError, match="contiguous CPU"):
            ckpt.read_into("model.norm.weight", buf)


def test_report_says_where_weights_live(tiny_torch, tiny_llama_folder):
    handle = attach(tiny_torch.model, tiny_llama_folder, POLICIES["half-on-disk"])
    try:
        r = handle.report()
        assert r.gpu_bytes == 0 and r.cpu_bytes > 0 and r.disk_bytes > 0
        assert r.streamed_bytes_per_token == r.disk_bytes  # on the CPU only the disk tier moves
        assert r.num_layers == 2 and r.cache_host_layers == 0
        assert "disk" in r.summary()
        assert handle.recommended_threads(8) == 7  # one core for the prefetch thread
    finally:
        handle.close()
    handle = attach(tiny_torch.model, tiny_llama_folder, OffloadPolicy(0, 100))
    assert handle.recommended_threads(8) == 8  # nothing streams: no prefetch thread
    handle.close()


# --- the default model (SmolLM2-135M, 30 layers) ------------------------------------------------------


@pytest.fixture(scope="module")
def default_reference(default_torch):
    return greedy(default_torch, 4)


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize("name", ["all-in-memory", "half-on-disk", "all-on-disk"])
def test_default_model_matches(default_torch, default_model_folder, default_reference, monkeypatch, name):
    model, handle = load_offloaded(default_model_folder, POLICIES[name], device="cpu", dtype=torch.float32)
    monkeypatch.setattr(default_torch, "model", model)
    try:
        assert_same(greedy(default_torch, 4), default_reference)
        per_layer = layer_bytes(handle)
        if name == "all-on-disk":
            # The acceptance bound: never more than two layers' weights held (embeddings/head not counted).
            assert 1.5 * per_layer < handle.residency.peak <= 2 * per_layer
        if name == "half-on-disk":
            resident = handle.placement.bytes_on(Tier.CPU)
            assert handle.residency.peak <= resident + 2 * handle.placement.layer_bytes_on(0, Tier.DISK)
    finally:
        default_torch.trim_cache(0)  # its KV cache was built by the offloaded model object
        handle.close()


# --- the KV cache ---------------------------------------------------------------------------------------


def test_kv_cache_on_cpu_is_a_plain_dynamic_cache(tiny_torch):
    from transformers import DynamicCache

    from engine.offload import make_kv_cache

    cache = make_kv_cache(tiny_torch.model.config, OffloadPolicy(cache_gpu_percent=0), torch.device("cpu"))
    assert type(cache) is DynamicCache


class _NoStream:
    """Stands in for the side stream transformers creates, so the layer choice is testable without a driver."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_partly_offloaded_cache_moves_only_host_layers(tiny_torch, monkeypatch):
    # What is tested is which layers move; the CUDA side (streams) is replaced, so this runs on CPU-only
    # torch and on a CUDA build without a driver alike. The real cache on a GPU is tested below.
    from engine.offload import make_kv_cache
    from engine.offload.kv_cache import PartlyOffloadedCache

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "Stream", _NoStream)
    cache = make_kv_cache(tiny_torch.model.config, OffloadPolicy(cache_gpu_percent=50), torch.device("cuda"))
    assert isinstance(cache, PartlyOffloadedCache) and cache.host_layers == (1,)
    calls = []
    for i, layer in enumerate(cache.layers):
        layer.offload = lambda i=i: calls.append(("offload", i))
        layer.prefetch = lambda i=i: calls.append(("prefetch", i))
    cache.offload(0)
    cache.offload(1)
    cache.prefetch(1)  # asked during layer 0's update: the next host layer is 1
    cache.prefetch(2)  # asked during the last layer's update: wraps to layer 1 for the next token
    assert calls == [("offload", 1), ("prefetch", 1), ("prefetch", 1)]


def test_kv_cache_for_cuda_without_a_usable_gpu_is_a_clear_error(tiny_torch, monkeypatch):
    # The CUDA build of torch on a machine without a driver reports is_available() == False; nothing
    # else about CUDA may be touched then (transformers' cache would raise from torch.Stream()).
    from engine.errors import UsageError
    from engine.offload import make_kv_cache

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError, match="not available.*--device cpu"):
        make_kv_cache(tiny_torch.model.config, OffloadPolicy(cache_gpu_percent=50), torch.device("cuda"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="moves KV layers between a GPU and CPU memory: needs a CUDA GPU")
def test_partly_offloaded_cache_on_a_gpu_keeps_host_layers_in_cpu_memory(tiny_torch):
    from engine.offload import make_kv_cache

    cfg = tiny_torch.model.config
    cache = make_kv_cache(cfg, OffloadPolicy(cache_gpu_percent=50), torch.device("cuda"))
    heads, dim = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    for layer in range(cfg.num_hidden_layers):
        kv = torch.randn(1, heads, 3, dim, device="cuda")
        keys, _ = cache.update(kv, kv.clone(), layer)
        assert keys.device.type == "cuda" and torch.equal(keys.cpu(), kv.cpu())  # the layer computes on the GPU
    torch.cuda.synchronize()
    assert cache.layers[0].keys.device.type == "cuda"
    assert cache.layers[1].keys.device.type == "cpu"  # host layer: back in CPU memory between uses
