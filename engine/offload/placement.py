"""Which tier each decoder-layer tensor lives on, decided from sizes alone (pure, no torch).

FlexLLMGen's rule, applied to every layer separately: walk the layer's
tensors in order, and put each on the tier in whose share the *midpoint* of
its cumulative size falls. Splitting every layer the same way (rather than
putting the first layers on the GPU and the last ones on disk) gives every
layer the same amount to fetch, so each fetch can hide behind one layer's
compute instead of a run of layers that are all fetch-bound.

The rule is exact at 0% and 100% and otherwise off by at most half of the
largest tensor of a layer (a Llama MLP matrix is about a quarter of its
layer); `Placement.bytes_on` gives the shares actually reached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from engine.offload.policy import OffloadPolicy


class Tier(str, Enum):
    GPU = "gpu"  # the compute device
    CPU = "cpu"  # host memory (pinned when the compute device is a GPU)
    DISK = "disk"  # the model's safetensors file, memory-mapped and read for each use


_LABEL = {Tier.GPU: "GPU", Tier.CPU: "CPU", Tier.DISK: "disk"}


@dataclass(frozen=True)
class Placement:
    tiers: tuple[tuple[Tier, ...], ...]  # [layer][tensor], tensors in the order they were given
    sizes: tuple[tuple[int, ...], ...]  # bytes, same shape as `tiers`

    def bytes_on(self, tier: Tier) -> int:
        return sum(s for ts, ss in zip(self.tiers, self.sizes) for t, s in zip(ts, ss) if t is tier)

    def layer_bytes_on(self, layer: int, tier: Tier) -> int:
        return sum(s for t, s in zip(self.tiers[layer], self.sizes[layer]) if t is tier)

    @property
    def total_bytes(self) -> int:
        return sum(sum(ss) for ss in self.sizes)

    def percent_on(self, tier: Tier) -> float:
        total = self.total_bytes
        return 100.0 * self.bytes_on(tier) / total if total else 0.0

    def describe(self) -> str:
        """'weights 0.0% GPU, 50.0% CPU, 50.0% disk (135.0 MiB / 270.0 MiB / 270.0 MiB)'."""
        parts = [f"{self.percent_on(t):.1f}% {_LABEL[t]}" for t in Tier]
        mib = " / ".join(f"{self.bytes_on(t) / 2**20:.1f} MiB" for t in Tier)
        return f"weights {', '.join(parts)} ({mib})"


def choose_tier(midpoint_percent: float, gpu_percent: float, cpu_percent: float) -> Tier:
    """The tier whose share [0, gpu) / [gpu, gpu+cpu) / [gpu+cpu, 100] contains the point."""
    if midpoint_percent < gpu_percent:
        return Tier.GPU
    if midpoint_percent < gpu_percent + cpu_percent:
        return Tier.CPU
    return Tier.DISK


def place_layer(sizes: Sequence[int], gpu_percent: float, cpu_percent: float) -> tuple[Tier, ...]:
    total = sum(sizes)
    if total == 0:
        return tuple(Tier.GPU for _ in sizes)  # nothing to move: keep empty tensors where compute is
    tiers = []
    cumulative = 0
    for size in sizes:
        if size < 0:
            raise ValueError(f"tensor sizes must be non-negative, got {size}")
        midpoint = 100.0 * (cumulative + size / 2) / total
        tiers.append(choose_tier(midpoint, gpu_percent, cpu_percent))
        cumulative += size
    return tuple(tiers)


def place(layer_sizes: Sequence[Sequence[int]], policy: OffloadPolicy) -> Placement:
    """Assign every tensor of every decoder layer to a tier. `layer_sizes[i][j]`: bytes of tensor j of layer i."""
    tiers = tuple(place_layer(sizes, policy.weights_gpu_percent, policy.weights_cpu_percent) for sizes in layer_sizes)
    return Placement(tiers=tiers, sizes=tuple(tuple(int(s) for s in sizes) for sizes in layer_sizes))


def cache_host_layers(num_layers: int, cache_gpu_percent: int) -> frozenset[int]:
    """Layers whose KV cache lives in CPU memory: the same midpoint rule over equal-sized per-layer caches.

    Whole layers rather than a split inside each layer, because transformers'
    cache offloads and prefetches per layer.
    """
    if num_layers < 0:
        raise ValueError(f"num_layers must be non-negative, got {num_layers}")
    return frozenset(i for i in range(num_layers) if 100.0 * (i + 0.5) / num_layers >= cache_gpu_percent)
