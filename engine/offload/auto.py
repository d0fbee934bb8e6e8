"""Choosing a policy that fits: from the model's size and the free GPU and CPU memory.

`auto_policy` is pure (numbers in, policy out) so it is tested without a GPU,
and this module does not import torch, so the app can plan before loading.
Priorities, all else being equal: the KV cache on the GPU first (an
offloaded cache layer crosses the link twice per token, a CPU-tier weight
once), then as many weights on the GPU as fit, then in CPU memory, the rest
on disk. Once anything streams, room for two layers (the one computing and
the one arriving) is kept free on the compute device.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.offload.placement import Tier, place
from engine.offload.policy import OffloadPolicy

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

HEADROOM = 0.10  # share of free memory left alone: allocator slack, activations, other programs


@dataclass(frozen=True)
class MemoryInfo:
    free_gpu_bytes: int | None  # None: computing on the CPU
    free_cpu_bytes: int


def _percent_of(nbytes: float, total: int) -> int:
    return max(0, min(100, math.floor(100 * nbytes / total))) if total > 0 else 100


def auto_policy(
    model_bytes: int,
    free_gpu_bytes: int | None,
    free_cpu_bytes: int,
    *,
    resident_bytes: int = 0,
    cache_bytes: int = 0,
    layer_bytes: int = 0,
    layer_sizes: Sequence[Sequence[int]] | None = None,
    headroom: float = HEADROOM,
) -> OffloadPolicy:
    """A policy under which `model_bytes` of decoder-layer weights fit the free memory.

    `resident_bytes`: embeddings/head/norm (always on the compute device).
    `cache_bytes`: the KV cache at the context length to plan for.
    `layer_bytes`: the largest decoder layer (the streaming working set is two).
    `layer_sizes`: per-layer tensor sizes; if given, the GPU share is lowered
    until the midpoint placement really fits (it can overshoot a percentage
    by half a tensor per layer). `free_gpu_bytes=None` plans for CPU compute,
    where the resident share is reported as CPU and the cache stays in RAM.
    Raises ValueError when even streaming everything from disk cannot fit.
    """
    if model_bytes <= 0:
        raise ValueError(f"model_bytes must be positive, got {model_bytes}")
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom must be in [0, 1), got {headroom}")
    cpu = free_cpu_bytes * (1 - headroom)
    working_set = 2 * layer_bytes

    if free_gpu_bytes is None:  # compute on the CPU: RAM is both the device and the host tier
        usable = cpu - resident_bytes - cache_bytes
        if usable < 0:
            raise ValueError(
                f"the embeddings, head and KV cache ({(resident_bytes + cache_bytes) / 2**20:.0f} MiB) "
                f"do not fit in free memory ({free_cpu_bytes / 2**20:.0f} MiB)"
            )
        if usable >= model_bytes:
            return OffloadPolicy(weights_gpu_percent=0, weights_cpu_percent=100)
        usable -= working_set
        if usable < 0:
            raise ValueError(f"not even two decoder layers ({working_set / 2**20:.0f} MiB) fit in free memory")
        return OffloadPolicy(weights_gpu_percent=0, weights_cpu_percent=min(99, _percent_of(usable, model_bytes)))

    gpu = free_gpu_bytes * (1 - headroom) - resident_bytes
    if gpu < 0:
        raise ValueError(
            f"the embeddings and head ({resident_bytes / 2**20:.0f} MiB) do not fit in free GPU memory "
            f"({free_gpu_bytes / 2**20:.0f} MiB)"
        )
    if gpu >= model_bytes + cache_bytes:
        return OffloadPolicy()  # everything fits: no offloading
    gpu -= working_set
    if gpu < 0:
        raise ValueError(f"not even two decoder layers ({working_set / 2**20:.0f} MiB) fit in free GPU memory")
    cache_gpu_percent = _percent_of(min(cache_bytes, gpu), cache_bytes)
    gpu -= cache_bytes * cache_gpu_percent / 100
    cpu -= cache_bytes * (100 - cache_gpu_percent) / 100
    weights_gpu = min(99, _percent_of(gpu, model_bytes))
    if layer_sizes is not None:
        while weights_gpu > 0 and place(layer_sizes, OffloadPolicy(weights_gpu, 0)).bytes_on(Tier.GPU) > gpu:
            weights_gpu -= 1
    # The disk tier on a GPU also stages each fetched layer in pinned host memory.
    weights_cpu = min(100 - weights_gpu, _percent_of(max(0.0, cpu - working_set), model_bytes))
    return OffloadPolicy(
        weights_gpu_percent=weights_gpu, weights_cpu_percent=weights_cpu, cache_gpu_percent=cache_gpu_percent
    )


def kv_cache_bytes(config: Any, tokens: int, dtype: torch.dtype) -> int:
    """Keys and values for `tokens` positions over all layers: 2 * layers * kv_heads * head_dim * tokens * size."""
    cfg = config.get_text_config(decoder=True)
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * heads * head_dim * tokens * dtype.itemsize


def free_cpu_bytes() -> int:
    """Memory available to a new allocation without swapping: MemAvailable on Linux, else psutil or sysconf."""
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    try:
        import psutil  # optional; not a dependency

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")  # free pages only: an underestimate
    except (ValueError, OSError, AttributeError):
        log.warning("cannot tell how much memory is free; assuming 4 GiB")
        return 4 * 2**30


def free_memory(device: torch.device | str) -> MemoryInfo:
    """Free memory on `device` (None when it is the CPU) and in RAM. Imports torch only for a GPU."""
    gpu = None
    if str(device).startswith("cuda"):
        import torch

        from engine.devices import require_available

        require_available(torch.device(device))
        gpu = int(torch.cuda.mem_get_info(torch.device(device))[0])
    return MemoryInfo(free_gpu_bytes=gpu, free_cpu_bytes=free_cpu_bytes())
