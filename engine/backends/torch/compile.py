"""A `torch.compile`d single-token decode step, built in a background thread after the model loads.

Compilation takes seconds to minutes, so it never runs on the path of an
answer: a daemon thread compiles the step on a scratch cache, checks its
logits against the eager model on the same tokens, and only then publishes
it. The backend uses it from its next decode step on, when it is ready; until
then (and forever if building fails) the eager step runs.

The compiled step runs the model over a `GrowingCache` in its fixed-shape
mode (`GrowingCache.static_step`), compiled with dynamic shapes so that the
cache growing to a larger buffer does not recompile. Caches with sliding-
window layers keep the eager step.
"""

from __future__ import annotations

import logging
import os
import threading

import torch

from engine.backends.torch.cache import GrowingCache
from engine.background_threads import BackgroundThread
from engine.backends.torch.compat import with_cache

log = logging.getLogger(__name__)

ENV_SWITCH = "LOGITLAB_TORCH_COMPILE"  # "1" on, "0" off; unset: on for CUDA, off for the CPU
PROBE_TOKENS = (1, 2, 3, 4, 5, 6, 7, 8)  # a scratch prompt for the build's check; any ids in every vocabulary
PROBE_STEPS = 3


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


def _logits(model, ids: torch.Tensor, cache) -> torch.Tensor:
    return model(input_ids=ids, **with_cache(model, cache), use_cache=True, logits_to_keep=1).logits


class CompiledDecodeStep:
    """Builds the compiled step in a daemon thread; `step` is None until it is built and checked."""

    def __init__(self, model, *, tolerance: float = 1e-3):
        self.step = None  # (ids (1, 1), GrowingCache) -> logits (1, 1, V), once ready
        self.error: BaseException | None = None
        self._model = model
        self._tolerance = tolerance
        self._built = threading.Event()
        # Stoppable: a build still running at close or at interpreter exit is ended, never left inside
        # torch while the interpreter is torn down (that aborts the process: issue 31).
        self._thread = BackgroundThread(self._build, name="torch-compile-step")
        self._thread.start()

    def close(self, timeout: float = 5.0) -> bool:
        """Stop a build still under way (it is never published) and wait for its thread; True when it ended."""
        return self._thread.stop(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the build finished (for tests and benchmarks); True when the step is usable."""
        self._built.wait(timeout)
        return self.step is not None

    def _build(self) -> None:
        try:
            compiled = torch.compile(_logits, dynamic=True)
            with torch.inference_mode():
                self._check(compiled)
            self.step = compiled
            log.info("compiled decode step ready")
        except Exception as e:  # a compiler missing or failing costs speed, never an answer
            self.error = e
            log.warning("torch.compile of the decode step failed; decoding stays eager: %s: %s", type(e).__name__, e)
        finally:
            self._model = None
            self._built.set()

    def _check(self, compiled) -> None:
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
        for _ in range(PROBE_STEPS):
            with ours.static_step():
                got = compiled(model, token, ours)
            want = _logits(model, token, eager)
            err = relative_logit_error(got, want)
            if not err <= self._tolerance:
                raise RuntimeError(f"compiled logits differ from eager by {err:.3g} of the largest logit")
            token = want[:, -1].argmax(-1, keepdim=True)
