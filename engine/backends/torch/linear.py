"""Which kernel multiplies one row by a weight in a CPU decode step: torch's own or oneDNN's.

A decode step on the CPU is mostly matrix-vector products, one per weight, so its speed is how fast
the kernel streams each weight from memory. torch's float32 linear calls MKL, and how close MKL comes
to the memory's speed depends on the CPU and the weight's shape. On a 2-core AMD EPYC
(bench/cpu_linear.py) MKL read the default model's 113 MB output head at 9.9 GB/s, while oneDNN's
matmul (in x86 builds of torch as `torch.ops.mkldnn._linear_pointwise`) read it at 16.8 GB/s; a
plain sum of the same bytes runs at 22. oneDNN won there for the tall weights (qkv, gate/up, head) and lost for
the square and wide ones (o, down); on other CPUs MKL may win everywhere. So the lean step measures
both on its own weights, once per model load, and keeps the faster per weight role.

Both compute in float32 and differ by rounding only (~1e-6 relative). Torch's kernel is the one
transformers' forward uses, so it is kept unless another is clearly faster: logits then stay equal
to transformers' bit for bit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from engine.backends.torch.compile import relative_logit_error

log = logging.getLogger(__name__)

Linear = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]
# How much faster another kernel must be to replace torch's: below this, timing noise could pick it,
# and torch's own kernel keeps the logits identical to transformers'.
MARGIN = 0.05
ROUNDS = 3
# Two kernels agree when their results differ by rounding only, relative to the largest output (or 1).
AGREEMENT = 1e-4


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # A plain (not pre-packed) weight: the model's own tensor, so no second copy of it is made.
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


KERNELS: dict[str, Linear] = {"torch": F.linear, "onednn": onednn_linear}


# oneDNN's linear as an op torch.compile keeps whole (static_lean.py): inductor has a lowering for
# `mkldnn._linear_pointwise` only with the pre-packed weights of its freezing pass and fails on a plain one.
# Eager steps call `onednn_linear` itself, without the custom op's dispatch.
@torch.library.custom_op("logitlab::onednn_linear", mutates_args=())
def onednn_linear_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return onednn_linear(x, weight, bias)


@onednn_linear_op.register_fake
def _onednn_linear_shape(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


COMPILABLE_KERNELS: dict[str, Linear] = {"torch": F.linear, "onednn": onednn_linear_op}


def candidates(weight: torch.Tensor) -> list[str]:
    """The kernels worth timing for `weight`: oneDNN only for float32 on the CPU where this torch has it."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return ["torch"]
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return ["torch"]
    return ["torch", "onednn"]


def _sweep(kernel: Linear, x: torch.Tensor, weights: Sequence[torch.Tensor], biases: Sequence) -> float:
    start = time.perf_counter()
    for weight, bias in zip(weights, biases):
        kernel(x, weight, bias)
    return time.perf_counter() - start


def _agrees(name: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether kernel `name` runs on this weight and gives torch's result up to rounding."""
    try:
        ours = KERNELS[name](x, weight, bias)
    except Exception as exc:  # a torch build whose op refuses this weight: not a candidate
        log.debug("linear kernel %s is unusable here (%s: %s)", name, type(exc).__name__, exc)
        return False
    reference = F.linear(x, weight, bias)
    return ours.shape == reference.shape and relative_logit_error(ours, reference) <= AGREEMENT


@torch.inference_mode()
def fastest(
    weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None], names: Sequence[str] | None = None,
    rows: int = 1,
) -> tuple[str, dict[str, float]]:
    """The fastest kernel for `rows` rows times each of `weights` (same shape: one role across the layers).

    One row is a decode step; several are the rows a batch runner steps together (the loom's children),
    where the other kernel may win: on the 2-core EPYC, 8 rows took 51 ms a step with oneDNN everywhere
    and 58 ms with MKL everywhere, while one row was faster with MKL for the square weights.

    Times a sweep over all of them, as a decode step meets them (each weight cold after the others),
    ROUNDS times, best sweep per kernel. Returns the name and the seconds per sweep of each candidate.
    """
    names = list(names or candidates(weights[0]))
    if len(names) == 1:
        return names[0], {}
    # A generator of its own: loading a model must not move torch's global random state.
    generator = torch.Generator(device=weights[0].device).manual_seed(0)
    x = torch.randn(rows, weights[0].shape[1], dtype=weights[0].dtype, device=weights[0].device, generator=generator)
    names = [n for n in names if n == "torch" or _agrees(n, x, weights[0], biases[0])]
    if len(names) == 1:
        return names[0], {}
    best = {n: float("inf") for n in names}
    for _ in range(ROUNDS):
        for n in names:
            best[n] = min(best[n], _sweep(KERNELS[n], x, weights, biases))
    pick = min(best, key=lambda n: best[n])
    if "torch" in best and best[pick] > best["torch"] * (1 - MARGIN):
        pick = "torch"
    return pick, best
