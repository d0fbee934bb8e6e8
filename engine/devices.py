"""Compute devices named by the user: checked by their spelling without torch, and by availability with it.

The rule this module keeps: nothing touches CUDA (streams, events, pinned
memory, device queries) unless `torch.cuda.is_available()`. The CUDA build of
torch imports fine on a machine without a driver, and then the first CUDA call
raises deep inside a library; asking for "cuda" there must fail here, in words.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from engine.errors import UsageError

if TYPE_CHECKING:
    import torch

# The device types this project computes on (torch's own list is longer: meta, hip, ...).
DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu")
_DEVICE = re.compile(r"^(?P<type>[a-z]+)(?::(?P<index>\d+))?$")


def check_device_name(text: str) -> str:
    """`text` normalised ("CUDA:0" -> "cuda:0"); UsageError if it is not cpu, cuda[:N], mps or xpu[:N]."""
    name = text.strip().lower()
    m = _DEVICE.match(name)
    if not m or m["type"] not in DEVICE_TYPES or (m["type"] in ("cpu", "mps") and m["index"] not in (None, "0")):
        raise UsageError(f"unknown device {text!r}; use one of cpu, cuda, cuda:N, mps, xpu")
    return name


def cuda_available() -> bool:
    """True only when CUDA can really be used: a CUDA build of torch *and* a driver with a device."""
    import torch

    return bool(torch.cuda.is_available())


def require_available(device: "torch.device") -> None:
    """UsageError unless `device` can be computed on here; touches CUDA only through `is_available`."""
    import torch

    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise UsageError(
                f"device {str(device)!r} is not available: torch {torch.__version__} ({build}) finds no usable "
                f"CUDA GPU or driver here; use --device cpu"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"device {str(device)!r} does not exist: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise UsageError("device 'mps' is not available: it needs Apple Silicon with a Metal build of torch; use --device cpu")
    elif device.type == "xpu":
        if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
            raise UsageError(f"device {str(device)!r} is not available here; use --device cpu")
