"""Where llama.cpp runs: GPU layers from the engine's offload policy. Pure functions.

(The context size is chosen by engine.runtime_settings.choose_context, for every backend.)

llama.cpp splits a model by whole layers: `n_gpu_layers` of them live in
GPU memory, the rest compute on the CPU from the memory-mapped file. The
engine's policy ("weights=GPU%,CPU% cache=GPU%") maps onto that: the GPU
share of the weights becomes a share of the layers (rounded down), and the
KV cache goes with its layers onto the GPU unless `cache=0` (llama.cpp's
`offload_kqv`, all or nothing). CPU and disk shares need no setting: the file
is memory-mapped, so the operating system keeps in RAM what fits and reads
the rest from disk as it is used.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from engine.offload.auto import HEADROOM
from engine.offload.policy import OffloadPolicy, parse_offload

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuPlan:
    n_gpu_layers: int  # 0: CPU only
    offload_kqv: bool
    reason: str  # one line for the device string / log


def plan_gpu_layers(
    offload: OffloadPolicy | str | None,
    *,
    n_layers: int,
    gpu_build: bool,
    model_bytes: int,
    cache_bytes: int,
    free_gpu_bytes: int | None,
) -> GpuPlan:
    """How many of `n_layers` go to the GPU.

    Args:
        offload: None (everything on the GPU when the build has one, like the torch backend), a policy,
            its CLI form, or "auto" (as many layers as fit in `free_gpu_bytes` with the KV cache).
        gpu_build: whether llama.cpp was built with Metal/CUDA/Vulkan (`llama_supports_gpu_offload`).
        model_bytes / cache_bytes: the weights and the KV cache at the planned context, for "auto".
        free_gpu_bytes: free memory of the GPU, None when unknown.
    """
    if not gpu_build:
        asked = offload is not None and offload != "auto" and _policy(offload).weights_gpu_percent > 0
        reason = "CPU build of llama.cpp" + (": the policy's GPU share runs on the CPU" if asked else "")
        return GpuPlan(0, False, reason)
    if offload is None:
        return GpuPlan(n_layers, True, "all layers on the GPU")
    if offload == "auto":
        if free_gpu_bytes is None:
            return GpuPlan(n_layers, True, "all layers on the GPU (free GPU memory unknown)")
        usable = free_gpu_bytes * (1 - HEADROOM)
        if usable >= model_bytes + cache_bytes:
            return GpuPlan(n_layers, True, "all layers fit on the GPU")
        per_layer = (model_bytes + cache_bytes) / max(1, n_layers)
        layers = max(0, min(n_layers, int(usable // per_layer)))
        return GpuPlan(layers, layers > 0, f"{layers} of {n_layers} layers fit in free GPU memory")
    policy = _policy(offload)
    layers = n_layers * policy.weights_gpu_percent // 100
    kqv = policy.cache_gpu_percent > 0 and layers > 0
    return GpuPlan(layers, kqv, f"{policy.weights_gpu_percent}% of the weights on the GPU")


def layers_as_asked(n_gpu_layers: int, n_layers: int, *, gpu_build: bool) -> GpuPlan:
    """The user's own layer count (-1 or more than the model has: all of them), with the KV cache beside them."""
    if not gpu_build:
        asked = n_gpu_layers != 0
        return GpuPlan(0, False, "CPU build of llama.cpp" + (": the GPU layers asked for run on the CPU" if asked else ""))
    layers = n_layers if n_gpu_layers < 0 else min(n_gpu_layers, n_layers)
    return GpuPlan(layers, layers > 0, f"{layers} of {n_layers} layers on the GPU, as asked")


def _policy(offload: OffloadPolicy | str) -> OffloadPolicy:
    return parse_offload(offload) if isinstance(offload, str) else offload
