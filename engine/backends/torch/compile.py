"""A `torch.compile`d single-token decode step, built in a background thread after the model loads.

Compilation takes seconds to minutes, so it never runs on the path of an
answer: a daemon thread compiles the step on a scratch cache, checks its
logits against the eager model on the same tokens, and only then publishes
it. The backend uses it from its next decode step on, when it is ready; until
then (and forever if building fails) the eager step runs.

The compiled step runs over a `GrowingCache` in its fixed-shape mode
(`GrowingCache.static_step`), compiled with dynamic shapes so that the
cache growing to a larger buffer does not recompile. For a model the lean
step takes (lean.py), what is compiled is the lean step's arithmetic in
fixed shapes (static_lean.py), attending over a power-of-two span of the
buffer; for any other, transformers' forward, attending over the whole
buffer. Caches with sliding-window layers keep the eager step.

The build yields to the foreground (foreground.py: it pauses while an answer
runs model steps, at the lowest CPU priority), and a build that fails, its
check included, is reported once and never tried again for that model and
form (compile_failures.py).

The check: the compiled logits against the eager model's, step by step,
relative to the largest logit. In float32 they must agree within 1e-3
(kernels differ by ~1e-6). In half precision both are rounded differently by
kernels that sum in another order, so the bound is 4x the eager model's own
disagreement with itself (the cached step against the same position
recomputed from scratch), never under `TOLERANCE_FLOOR` for the dtype. On
the CPU, a random-weight bfloat16 Llama compiled by inductor differs from
eager by 0.006 of its largest logit, the same as eager differs from float32
(0.0066), while a cache position off by one differs by 0.037: a fixed 5e-2
let such a bug through.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, Protocol

import torch

from engine.backends.torch.cache import GrowingCache
from engine.background_threads import BackgroundThread
from engine.backends.torch.compat import HFModel, cache_argument
from engine.backends.torch.compile_failures import known_failure, model_key, remember_failure
from engine.backends.torch.foreground import yielding_to_foreground

log = logging.getLogger(__name__)


class FixedShapeStep(Protocol):
    """A step in compile.py's call form whose `core` is what gets compiled (static_lean.StaticLeanStep: named
    here by its shape, as static_lean imports the lean step, whose kernels' check imports this module)."""

    core: Callable[..., torch.Tensor]

    def __call__(self, model: HFModel, ids: torch.Tensor, cache: object) -> torch.Tensor: ...

ENV_SWITCH = "LOGITLAB_TORCH_COMPILE"  # "1" on, "0" off; unset: on for CUDA, off for the CPU
PROBE_TOKENS = (1, 2, 3, 4, 5, 6, 7, 8)  # a scratch prompt for the build's check; any ids in every vocabulary
PROBE_STEPS = 3
# The least difference, relative to the largest logit, the check tolerates: float16 carries 3 more mantissa bits
# than bfloat16, so 8x finer rounding.
TOLERANCE_FLOOR = {torch.float32: 1e-3, torch.float16: 2e-3, torch.bfloat16: 1e-2}
NOISE_FACTOR = 4  # half precision: the bound is this many times eager's own rounding disagreement, if larger


def compile_wanted(device: torch.device, requested: bool | None) -> bool:
    """Whether to build the compiled step: `requested` if given, else the environment, else CUDA yes / CPU no.

    On the CPU, measured on the default 135M model, the compiled step did not
    pay for its build time (see bench/decode.py and the backend's notes).
    """
    if requested is not None:
        return requested
    env = os.environ.get(ENV_SWITCH, "").strip()
    if env in ("0", "1"):
        return env == "1"
    return device.type == "cuda"


def relative_logit_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """The largest difference between two logit tensors, relative to the larger of 1 and their largest logit.

    The two may live on different devices (the loom's check compares the GPU's logits with a host copy):
    both are compared on the host, where every device's tensors can go."""
    ours, theirs = ours.detach().float().cpu(), theirs.detach().float().cpu()
    err = (ours - theirs).abs().max().item()
    return err / max(theirs.abs().max().item(), 1.0)


def _logits_under(name: str) -> Callable[[HFModel, torch.Tensor, object], torch.Tensor]:
    """The step's function, the cache handed over under `name` (resolved here: the compiled graph sees a constant)."""

    def logits(model: HFModel, ids: torch.Tensor, cache: object) -> torch.Tensor:
        return model(input_ids=ids, **{name: cache}, use_cache=True, logits_to_keep=1).logits

    return logits


def _mode(model: HFModel) -> str | None:
    """torch.compile's mode: "reduce-overhead" on CUDA, where it captures the step as a CUDA graph (one launch a
    token, not one per kernel: a single-token step is bound by launches); the default elsewhere, as CUDA graphs
    exist only on CUDA and the CPU's build was measured in the default mode."""
    return "reduce-overhead" if next(model.parameters()).device.type == "cuda" else None


def _logits(model: HFModel, ids: torch.Tensor, cache: object) -> torch.Tensor:
    return _logits_under(cache_argument(model))(model, ids, cache)


class CompiledDecodeStep:
    """Builds the compiled step in a daemon thread; `step` is None until it is built and checked."""

    def __init__(self, model: HFModel, *, tolerance: float | None = None, lean: FixedShapeStep | None = None) -> None:
        """`tolerance`: a fixed bound on the check's relative error (default: per dtype, see the module's notes);
        `lean`: the model's lean step in fixed shapes, compiled instead of transformers' forward."""
        self.step: Callable[..., Any] | None = None  # (model, ids (1, 1), GrowingCache) -> logits (1, 1, V), once ready
        self.error: BaseException | None = None
        self.form = "transformers' forward" if lean is None else "the lean step's arithmetic"
        self._model = model
        self._lean = lean
        self._tolerance = tolerance
        self._built = threading.Event()
        self._key = model_key(model, self.form)
        self._thread: BackgroundThread | None = None
        earlier = known_failure(self._key)
        if earlier is not None:  # reported when it happened; building again would fail again
            self.error = RuntimeError(f"an earlier build of this model's compiled step failed: {earlier}")
            log.debug("compiled decode step not built: %s", self.error)
            self._model = None
            self._built.set()
            return
        # Stoppable: a build still running at close or at interpreter exit is ended, never left inside
        # torch while the interpreter is torn down (that aborts the process: issue 31).
        self._thread = BackgroundThread(self._build, name="torch-compile-step")
        self._thread.start()

    def close(self, timeout: float = 5.0) -> bool:
        """Stop a build still under way (it is never published) and wait for its thread; True when it ended."""
        return True if self._thread is None else self._thread.stop(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the build finished (for tests and benchmarks); True when the step is usable."""
        self._built.wait(timeout)
        return self.step is not None

    def _build(self) -> None:
        try:
            compiled = self._compiled()
            with torch.inference_mode(), yielding_to_foreground():
                self._check(compiled)
            self.step = compiled
            log.info("compiled decode step ready (%s)", self.form)
        except Exception as e:  # a compiler missing or failing costs speed, never an answer
            self.error = e
            if self._thread is not None and self._thread.stop_requested:
                # Closed mid-build: torch's compiler can hand the stop back wrapped in its own exception type, and
                # a build that was ended is no build that failed, so nothing is kept against the model.
                log.debug("compiled decode step stopped while building: %s: %s", type(e).__name__, e)
                return
            remember_failure(self._key, f"{type(e).__name__}: {e}")
            log.warning("torch.compile of the decode step failed; decoding stays eager (not tried again for this "
                        "model): %s: %s", type(e).__name__, e)
        finally:
            self._model = self._lean = None
            self._built.set()

    def _compiled(self) -> Callable[[HFModel, torch.Tensor, object], torch.Tensor]:
        """The step to check, compiled lazily (torch.compile compiles at the first call, inside the check)."""
        model = self._model
        if self._lean is None:
            return torch.compile(_logits_under(cache_argument(model)), dynamic=True, mode=_mode(model))
        # The span of the buffer attention reads is the core's one int argument: dynamic, so a longer context
        # reuses the graph (on CUDA, one recorded graph per span).
        mode = _mode(model)
        # Off CUDA, inductor's wrapper that calls the graph's ~300 kernels is C++, not Python: measured on the
        # default model (2-core EPYC), the Python one cost the step ~10% against the eager lean step; the C++
        # one took it to par, for a build of 77 s instead of 55. CUDA graphs replay without any wrapper.
        options: dict[str, str | int | bool | Callable[..., Any]] | None = (
            None if mode is not None else {"cpp_wrapper": True})
        self._lean.core = torch.compile(self._lean.core, dynamic=True, mode=mode, options=options)
        return self._lean

    def _check(self, compiled: Callable[[HFModel, torch.Tensor, object], torch.Tensor]) -> None:
        """Compile on a scratch cache and require the same logits as the eager model, step by step."""
        model = self._model
        device = next(model.parameters()).device
        ids = torch.tensor([PROBE_TOKENS], device=device)
        ours, eager = GrowingCache(model.config), GrowingCache(model.config)
        _logits(model, ids, ours)
        _logits(model, ids, eager)
        if not ours.supports_static_step:
            raise RuntimeError("this model's cache has sliding-window layers; the compiled step needs full attention")
        token = ids[:, -1:].clone()  # contiguous (1, 1), like the ids forward() passes: no recompile later
        seen = ids
        for _ in range(PROBE_STEPS):
            with ours.static_step():
                got = compiled(model, token, ours)
            want = _logits(model, token, eager)
            seen = torch.cat([seen, token], dim=1)
            err, bound = relative_logit_error(got, want), self._bound(model, want, seen)
            if not err <= bound:
                raise RuntimeError(f"compiled logits differ from eager by {err:.3g} of the largest logit "
                                   f"(tolerated: {bound:.3g})")
            token = want[:, -1].argmax(-1, keepdim=True)

    def _bound(self, model: HFModel, want: torch.Tensor, seen: torch.Tensor) -> float:
        """How far the compiled logits may be from eager's `want` (the logits after `seen`)."""
        if self._tolerance is not None:
            return self._tolerance
        dtype = want.dtype
        floor = TOLERANCE_FLOOR.get(dtype, TOLERANCE_FLOOR[torch.bfloat16])
        if dtype == torch.float32:
            return floor
        again = _logits(model, seen, GrowingCache(model.config))  # the same position, recomputed from scratch
        return max(floor, NOISE_FACTOR * relative_logit_error(want, again))
