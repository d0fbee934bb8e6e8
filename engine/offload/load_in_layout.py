"""Loading a model straight into its offloaded layout, never holding all of its weights at once.

The model is built from its config with every parameter on the meta device
(shape only; buffers such as RoPE frequencies are real, they are computed,
not loaded), then `attach` reads from the safetensors files exactly the
tensors the policy keeps resident. Peak memory is the resident share plus
two streamed layers, not the model.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from engine.errors import ModelLoadError
from engine.offload.auto import auto_policy, free_memory, kv_cache_bytes
from engine.offload.apply import attach
from engine.offload.executor import OffloadHandle
from engine.offload.layout import decoder_layers, layer_tensors
from engine.offload.policy import OffloadPolicy

log = logging.getLogger(__name__)

PLAN_CONTEXT_TOKENS = 4096  # the context length auto_policy reserves KV cache for (capped by the model's)


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Every nn.Parameter registered inside goes to the meta device; buffers stay real.

    Like accelerate's init_empty_weights(include_buffers=False): weight init
    then runs on meta tensors and costs nothing.
    """
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=False)
        original(module, name, param)

    nn.Module.register_parameter = register  # type: ignore[method-assign,assignment]  # patched for the build
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]  # and put back


def build_empty(folder: Path, dtype: torch.dtype, trust_remote_code: bool = False) -> nn.Module:
    """The model of `folder` with shape-only parameters, in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    try:
        config = AutoConfig.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
        with parameters_on_meta():
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
    except Exception as e:
        raise ModelLoadError(f"could not build the model in {folder}: {type(e).__name__}: {e}") from e
    try:  # from_pretrained would read it too; generate() uses its defaults
        model.generation_config = GenerationConfig.from_pretrained(str(folder))
    except OSError:
        pass  # no generation_config.json: keep the one derived from the config
    return model.eval()


def plan_policy(
    model: nn.Module, device: torch.device | str, context_tokens: int = PLAN_CONTEXT_TOKENS
) -> OffloadPolicy:
    """auto_policy for this (possibly meta) model on `device`, from the memory free right now."""
    device = torch.device(device)
    prefix, layers = decoder_layers(model)
    sizes = [[t.nbytes for t in ts] for ts in layer_tensors(prefix, layers)]
    layer_total = sum(map(sum, sizes))
    resident = sum(
        p.numel() * p.element_size() for n, p in model.named_parameters() if not n.startswith(prefix + ".")
    )
    cfg = model.config.get_text_config()  # type: ignore[union-attr,operator]  # a transformers model's
    tokens = min(context_tokens, int(getattr(cfg, "max_position_embeddings", 0) or context_tokens))
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    mem = free_memory(device)
    try:
        policy = auto_policy(
            layer_total,
            mem.free_gpu_bytes,
            mem.free_cpu_bytes,
            resident_bytes=resident,
            cache_bytes=kv_cache_bytes(model.config, tokens, dtype),
            layer_bytes=max(map(sum, sizes)),
            layer_sizes=sizes,
        )
    except ValueError as e:
        raise ModelLoadError(f"the model cannot be offloaded to fit this machine: {e}") from e
    log.info("automatic offload policy for %s: %s", device, policy.describe())
    return policy


def load_offloaded(
    folder: Path,
    policy: OffloadPolicy | None,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    trust_remote_code: bool = False,
) -> tuple[nn.Module, OffloadHandle]:
    """Build the model of `folder` on `device` with its decoder layers placed by `policy` (None: automatic)."""
    device = torch.device(device)
    model = build_empty(Path(folder), dtype, trust_remote_code)
    if policy is None:
        policy = plan_policy(model, device)
    handle = attach(model, Path(folder), policy, device=device)
    return model, handle
