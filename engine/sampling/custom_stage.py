"""Your own sampler stage: a Python function `logprobs, history -> logprobs`, run at a named place in the order.

The public hook of the chain (what llama-cpp-python's and transformers' logits processors are elsewhere)::

    def no_the(logprobs, history):
        logprobs[THE] = -np.inf          # ban a token
        return logprobs

    settings = SamplerSettings(temperature=0.7, top_k=40).with_stage("no_the", no_the, after="top_k")

The stage runs where its name stands in `settings.order`, is recorded under that name in the per-stage
snapshots like any built-in stage, and works wherever the chain samples: `Engine.generate`, the loom, and the
research API (`LanguageModel.generate/sample/batch_sample(..., sampler=settings)`).

What the function gets and gives:
- `logprobs`: (V,) float32, the distribution entering the stage as log-probs (normalised over the tokens
  still in; -inf for tokens an earlier stage removed). A fresh array: the function may write into it.
- `history`: (T,) int64 token ids so far, prompt included; read-only.
- it returns (V,) log-probs (or any scores on the same scale; they need not sum to 1). A token it leaves
  as it was keeps its score exactly; -inf removes a token. A token an earlier stage removed stays removed
  (the stage snapshots rely on stages never bringing a token back). NaN, +inf, a wrong shape, or removing
  every token is an error that names the stage.

A custom stage is Python code: it cannot be written to llama.cpp JSON, a preset, a trace or the database,
and a server that samples itself cannot run it. Each of those says so in words (`CustomStageError`) rather
than dropping it. Its state, if it keeps any, is its own: the chain's `state()/restore()` (banned-string
step-backs) does not rewind it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# `fn(logprobs: (V,) float32 ndarray, history: (T,) int64 ndarray) -> (V,) log-probs`. numpy is imported
# only where the stage runs: the settings module stays numpy-free.
StageHook = Callable[[Any, Any], Any]

MAX_NAME_CHARS = 40


class CustomStageError(ValueError):
    """A custom stage was asked to go where Python code cannot: a file, a database, a server's sampler."""


@dataclass(frozen=True)
class CustomStage:
    """A stage of your own, run where `name` stands in `SamplerSettings.order` (see the module docstring).

    Attributes:
        name: what the order and the stage snapshots call it; not a built-in stage's name.
        fn: `fn(logprobs, history) -> logprobs`.
    """

    name: str
    fn: StageHook

    def __repr__(self) -> str:
        return f"CustomStage({self.name!r}, {getattr(self.fn, '__qualname__', type(self.fn).__name__)})"


def custom_stage_problems(stages: Any, builtin: tuple[str, ...], order: Any) -> list[str]:
    """Every problem with `custom_stages`, in words (empty if fine)."""
    if not isinstance(stages, tuple) or not all(isinstance(c, CustomStage) for c in stages):
        return [f"custom_stages must be a list of CustomStage(name, fn), got {stages!r}; "
                "add one with settings.with_stage(name, fn, after=...)"]
    errors: list[str] = []
    names = [c.name for c in stages]
    for c in stages:
        if not isinstance(c.name, str) or not c.name.strip() or len(c.name) > MAX_NAME_CHARS:
            errors.append(f"a custom stage's name must be a text of 1 to {MAX_NAME_CHARS} characters, got {c.name!r}")
        elif c.name in builtin:
            errors.append(f"the custom stage name {c.name!r} is a built-in stage's; choose another name")
        elif names.count(c.name) > 1:
            errors.append(f"two custom stages are named {c.name!r}; give each its own name")
        elif not callable(c.fn):
            errors.append(f"the custom stage {c.name!r} needs a function fn(logprobs, history) -> logprobs, "
                          f"got {c.fn!r}")
        elif isinstance(order, tuple) and c.name not in order:
            errors.append(f"the custom stage {c.name!r} is not in the order {list(order)}; put its name where it "
                          "should run (settings.with_stage(name, fn, after=...) does)")
    return errors


def refuse_custom_stages(stages: tuple[CustomStage, ...], where: str) -> None:
    """Raise `CustomStageError` naming the custom stages that cannot go `where` (nothing when there are none)."""
    if stages:
        names = ", ".join(repr(c.name) for c in stages)
        one = len(stages) == 1
        raise CustomStageError(
            f"the custom sampler stage{'' if one else 's'} {names} {'is' if one else 'are'} Python code and cannot "
            f"go {where}; remove {'it' if one else 'them'} first (settings.without_custom_stages()), "
            "or keep sampling with this chain in Python"
        )


def custom_stage_words(settings: Any) -> str:
    """What a server that samples itself is told it cannot run (one entry of its refusal)."""
    names = ", ".join(repr(c.name) for c in settings.custom_stages)
    return f"custom stage {names} (Python code: it runs only where we sample, in we-sample mode)"


def run_custom_stage(stage: CustomStage) -> Callable[[Any, Any], Any]:
    """The chain's stage function for `stage`: `(scores (V,), ctx) -> scores (V,)` around `stage.fn`."""
    import numpy as np

    from engine.sampling.stages import NEG_INF, exp_sums

    name, fn = stage.name, stage.fn

    def custom(scores: np.ndarray, ctx: Any) -> np.ndarray:
        m = scores.max()
        some_removed = scores.min() == NEG_INF
        z, _ = exp_sums(scores, m)
        lse = np.float32(float(m) + math.log(z))
        history = ctx.history.view()
        history.flags.writeable = False
        try:
            given = fn(scores - lse, history)  # a fresh array: the function may write into it
        except Exception as e:
            e.add_note(f"(raised in the custom sampler stage {name!r})")
            raise
        try:
            out = np.asarray(given, dtype=np.float32)
        except (TypeError, ValueError):
            raise ValueError(f"custom stage {name!r} must return an array of {scores.size} log-probs, "
                             f"got {type(given).__name__}") from None
        if out.shape != scores.shape:
            raise ValueError(f"custom stage {name!r} must return {scores.size} log-probs (one per token), "
                             f"got shape {out.shape}")
        top = np.max(out)
        if np.isnan(top) or top == np.inf:  # max is NaN when any entry is
            raise ValueError(f"custom stage {name!r} returned NaN or +inf; return log-probs, -inf to remove a token")
        unchanged = out == scores - lse  # compared with the log-probs as given (the function may have written into them)
        if unchanged.all():
            return scores  # nothing changed: recorded as such, and the scores stay bit for bit
        # Back on the scores' scale (later stages such as the penalties read the logits' sign), untouched
        # tokens exactly as they were; a token removed before stays removed.
        result = np.where(unchanged, scores, out + lse).astype(np.float32, copy=False)
        if some_removed:
            result[scores == NEG_INF] = NEG_INF
        if np.max(result) == NEG_INF:
            raise ValueError(f"custom stage {name!r} removed every token; leave at least one")
        return result

    custom.__name__ = f"custom_{name}"
    return custom
