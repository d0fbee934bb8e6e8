"""How much memory a model needs to run here, estimated from its facts, and whether this machine has it.

The estimate is the weights as the chosen backend holds them, plus the KV
cache of the context the model would open with here (the engine's own
choice, `runtime_settings.choose_context`: the model's context, capped so its
cache fits the memory available; `ESTIMATE_CONTEXT` tokens when that is not
known), plus a margin for compute buffers. Backends hold weights
differently: llama.cpp and MLX run the stored (often quantized) weights;
torch on a CPU runs float32, so a bfloat16 folder needs twice its size there
(half of that on a GPU; the library does not import torch to ask).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from engine.backends.select import weighs_parameters_in_float32
from engine.runtime_settings import choose_context
from engine.library.entry import Fit, ModelFacts

log = logging.getLogger(__name__)

ESTIMATE_CONTEXT = 8192  # tokens of KV cache counted when the memory available is not known
OVERHEAD_SHARE = 0.05
OVERHEAD_BYTES = 128 * 2**20
TORCH_CPU_BYTES_PER_PARAMETER = 4  # float32
FITS_SHARE = 0.9  # of available memory: the rest is other programs' and the window's


@dataclass(frozen=True)
class MachineMemory:
    total_bytes: int
    available_bytes: int


def machine_memory() -> MachineMemory:
    """This machine's RAM: total, and available without swapping."""
    from engine.offload.auto import free_cpu_bytes  # plain Python: no torch

    total = 0
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # Windows has no sysconf
        try:
            import psutil

            total = int(psutil.virtual_memory().total)
        except ImportError:
            log.debug("cannot tell the machine's total memory")
    available = free_cpu_bytes()
    return MachineMemory(total_bytes=max(total, available), available_bytes=available)


def estimate_bytes(facts: ModelFacts, backend: str, available_bytes: int | None = None) -> int:
    """Bytes needed to run a model with these facts on `backend`, with `available_bytes` of memory available
    (None: not known); 0 when the facts are too thin to say."""
    if weighs_parameters_in_float32(backend) and facts.parameters:
        weights, kv_value_bytes = facts.parameters * TORCH_CPU_BYTES_PER_PARAMETER, 4
    else:
        weights, kv_value_bytes = facts.weight_bytes, 2
    if not weights:
        return 0
    per_token = facts.kv_bytes_per_token * kv_value_bytes // 2  # facts count 2-byte values
    if available_bytes is None:
        context = min(facts.context_length or ESTIMATE_CONTEXT, ESTIMATE_CONTEXT)
    else:  # the context the model opens with by default here, as the backends choose it
        context = choose_context(facts.context_length, None, kv_bytes_per_token=per_token,
                                 available_bytes=available_bytes).n_ctx
    kv = per_token * context
    return int((weights + kv) * (1 + OVERHEAD_SHARE)) + OVERHEAD_BYTES


def fit(need_bytes: int, machine: MachineMemory) -> Fit:
    """"fits" in memory available now, "tight" in the machine's total (close programs first), else "too big"."""
    if need_bytes <= 0 or machine.total_bytes <= 0:
        return "unknown"
    if need_bytes <= machine.available_bytes * FITS_SHARE:
        return "fits"
    if need_bytes <= machine.total_bytes * FITS_SHARE:
        return "tight"
    return "too big"
