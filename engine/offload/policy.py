"""What share of the decoder-layer weights lives on the GPU, in CPU memory and on disk, and where the KV cache lives.

The idea is FlexLLMGen's `Policy`, reduced to what a single-sequence decoder
needs. "GPU" means the compute device: on a machine without one, compute runs
on the CPU and the GPU and CPU shares are both simply resident in RAM, so
only the disk share is streamed. Embeddings, the final norm and the LM head
are not covered by the percentages: they always stay on the compute device
(they are needed at both ends of every forward, so streaming them would be
paid twice per token).

The CLI form is `weights=GPU%,CPU% cache=GPU%`, e.g. "weights=0,50 cache=100":
no weights on the GPU, half in CPU memory, the other half read from disk
for each use; the whole KV cache on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OffloadPolicy:
    weights_gpu_percent: int = 100
    weights_cpu_percent: int = 0  # the disk share is 100 - gpu - cpu
    cache_gpu_percent: int = 100  # the rest of the KV cache lives in CPU memory
    pin_cpu_weights: bool = True  # page-locked host copies: async, full-speed host-to-device copies on CUDA
    overlap: bool = True  # fetch layer i+1 while layer i computes (off: fetch each layer when it is reached)

    def __post_init__(self) -> None:
        for name in ("weights_gpu_percent", "weights_cpu_percent", "cache_gpu_percent"):
            value = getattr(self, name)
            # bool is an int subclass; True would silently mean 1%.
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer percentage, got {value!r}")
            if not 0 <= value <= 100:
                raise ValueError(f"{name} must be between 0 and 100, got {value}")
        if self.weights_gpu_percent + self.weights_cpu_percent > 100:
            raise ValueError(
                f"weights on GPU ({self.weights_gpu_percent}%) and on CPU ({self.weights_cpu_percent}%) "
                f"add up to more than 100%"
            )
        for name in ("pin_cpu_weights", "overlap"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")

    @property
    def weights_disk_percent(self) -> int:
        return 100 - self.weights_gpu_percent - self.weights_cpu_percent

    @property
    def cache_cpu_percent(self) -> int:
        return 100 - self.cache_gpu_percent

    @property
    def is_resident(self) -> bool:
        """Everything on the compute device: offloading changes nothing."""
        return self.weights_gpu_percent == 100 and self.cache_gpu_percent == 100

    def spec(self) -> str:
        """The CLI form; `parse_offload(p.spec()) == p`."""
        text = f"weights={self.weights_gpu_percent},{self.weights_cpu_percent} cache={self.cache_gpu_percent}"
        if not self.pin_cpu_weights:
            text += " pin=off"
        if not self.overlap:
            text += " overlap=off"
        return text

    def describe(self) -> str:
        """One line for people: 'weights 0% GPU, 50% CPU, 50% disk; KV cache 100% GPU'."""
        return (
            f"weights {self.weights_gpu_percent}% GPU, {self.weights_cpu_percent}% CPU, "
            f"{self.weights_disk_percent}% disk; KV cache {self.cache_gpu_percent}% GPU"
        )


_SWITCH = {"on": True, "off": False, "1": True, "0": False, "true": True, "false": False, "yes": True, "no": False}


def _percent(text: str, what: str) -> int:
    raw = text.strip().removesuffix("%").strip()
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{what} must be a whole percentage like 50 or 50%, got {text!r}") from None


def parse_offload(text: str) -> OffloadPolicy:
    """Parse `weights=GPU%,CPU% cache=GPU%` (either part optional, any order; also `pin=off`, `overlap=off`).

    Missing parts keep their defaults (all weights and all cache on the GPU).
    "auto" is not a policy: callers check for it first and use `auto_policy`.
    """
    if not text or not text.strip():
        raise ValueError("empty offload policy; expected e.g. 'weights=0,50 cache=100'")
    fields: dict[str, object] = {}
    seen: set[str] = set()
    for part in text.replace(";", " ").split():
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or not value:
            raise ValueError(f"offload policy part {part!r} is not key=value; expected e.g. 'weights=0,50 cache=100'")
        if key in seen:
            raise ValueError(f"offload policy gives {key!r} twice")
        seen.add(key)
        if key == "weights":
            shares = value.split(",")
            if len(shares) != 2:
                raise ValueError(f"weights takes two percentages GPU%,CPU% (disk gets the rest), got {value!r}")
            fields["weights_gpu_percent"] = _percent(shares[0], "the weights' GPU share")
            fields["weights_cpu_percent"] = _percent(shares[1], "the weights' CPU share")
        elif key == "cache":
            fields["cache_gpu_percent"] = _percent(value, "the KV cache's GPU share")
        elif key in ("pin", "overlap"):
            if value.lower() not in _SWITCH:
                raise ValueError(f"{key} takes on or off, got {value!r}")
            fields["pin_cpu_weights" if key == "pin" else "overlap"] = _SWITCH[value.lower()]
        else:
            raise ValueError(f"unknown offload policy key {key!r}; known: weights, cache, pin, overlap")
    return OffloadPolicy(**fields)  # type: ignore[arg-type]  # each field's value checked above
