"""The `grammar` stage: a constraint's token mask, and what it took away.

First in the default order, so what it reports is measured on the model's
own distribution: how many tokens the constraint allows, the share of the
probability it keeps, and the most likely tokens it removed. A step where
the constraint leaves one token, or where llguidance's fast-forward names
the token the grammar forces, is marked forced: nothing was chosen there.

The stage object is made per decode run around that run's
`engine.constraints.ConstraintRun` (the matcher lives there, never on the
settings); the chain owns it like mirostat's state and tells it each picked
token (`accept`), and `state()` / `restore()` roll the matcher back.

A dead end (no token is allowed, or every allowed one was removed by an
earlier stage) leaves the scores as they are and sets `run.failure`; the
decode loop then stops with that message instead of taking a token.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from engine.constraints.matcher import ConstraintRun, start_run
from engine.constraints.spec import Constraint
from engine.events import ConstraintStep, TokenEvent, TokenProb
from engine.tokenizer import partial_token_bytes
from engine.sampling.stages import NEG_INF, StageContext, keep_only

TopList = tuple[tuple[int, float], ...]
TOP_DISALLOWED = 10  # how many removed tokens a step reports
_REACH: tuple[float, ...] = (4.0, 8.0, 16.0, 32.0)  # nats below the top where removed tokens are looked for first


@dataclass(frozen=True, slots=True)
class GrammarStep:
    """What the constraint did at one step, as small Python values.

    Attributes:
        allowed: tokens the constraint allowed (1 when forced).
        mass_kept: the allowed tokens' share of the probability entering the stage.
        disallowed: the most likely removed tokens, (id, log-prob under the entering distribution).
        forced: the constraint left one token (fast-forward or a single allowed token): no choice.
        note: how the mask was made, when that matters ("mask applied to the server's top 20 only").
    """

    allowed: int
    mass_kept: float
    disallowed: TopList
    forced: bool
    note: str = ""


class GrammarStage:
    """The stage function (`stage(scores, ctx) -> scores`) for one run's constraint.

    The stage makes the mask and applies it; its record (the mass kept, the most likely removed tokens: a
    softmax over the whole row) is built when first read (`last`), which the decode loop does when it makes
    the token's event, after the token is chosen: with an overlapped forward (engine/decode), while the model
    computes the next token. Under cProfile that took the stage's share of a pick from 0.58 to 0.32 ms a token
    at 49k tokens, on every token of an answer with tools (bench/tools.py, `ratio_tools_vs_same_prompt`). A
    record no one read is built at the next call, before the stage's buffer is reused, so at most one row waits.
    """

    def __init__(self, run: ConstraintRun) -> None:
        self.run = run
        self._last: GrammarStep | _PendingStep | None = None  # the latest call's record, or what builds it
        self._w: np.ndarray | None = None  # the exp row, reused (see _exp_buffer)

    @property
    def last(self) -> GrammarStep | None:
        """The latest call's record (the decode loop puts it on the event), built now if it was not yet."""
        return self._settle()

    @last.setter
    def last(self, step: GrammarStep | None) -> None:  # the torch chain's grammar stage records its own
        self._last = step

    def _settle(self) -> GrammarStep | None:
        last = self._last
        if isinstance(last, _PendingStep):
            last = self._last = last.build()
        return last

    def __call__(self, scores: np.ndarray, ctx: StageContext) -> np.ndarray:
        self._settle()  # the previous step's record, built before its buffer is this step's
        run = self.run
        v = scores.size
        forced = run.fast_forward()
        if forced is not None and forced < v and scores[forced] > NEG_INF:
            keep = np.zeros(v, dtype=np.bool_)
            keep[forced] = True
            note = "fast-forward: the grammar forces this token"
        else:
            keep = run.allowed(scores)
            note = ""
            forced = None
        live = keep & (scores > NEG_INF)
        n = int(np.count_nonzero(live))
        # The ids not kept, when they are few (a text-or-call grammar bans a few dozen tokens): the report
        # and the masked row are then made from them alone instead of from passes over the whole row.
        dead = np.flatnonzero(~live) if (v - n) * 8 <= v else None
        if n == 0:
            run.fail(self.dead_end_reason(keep))
            self._last = self._record(scores, live, None, 0, None, run.note)  # the answer ends here: built now
            return scores
        if n == 1 and not note:
            note = "the only token the grammar allows"
        notes = "; ".join(x for x in (note, run.note) if x)
        # A copy: the stages after this one may change the row they are handed in place.
        pending = _PendingStep(self, scores.copy(), live, dead, n, forced, notes)
        run.record(pending.log_mass_kept)
        self._last = pending
        if dead is None:
            return keep_only(scores, live)
        if dead.size == 0:
            return scores
        out = scores.copy()  # the same row as keep_only's np.where, by writing only the few removed entries
        out[dead] = NEG_INF
        return out

    def _record(self, scores: np.ndarray, live: np.ndarray, dead: np.ndarray | None, n: int, forced: int | None,
                notes: str) -> GrammarStep:
        """The step's record: the allowed tokens' share of the entering distribution, the most likely removed."""
        top = float(scores.max())  # the chain guarantees one finite score
        w = self._exp_buffer(scores)
        np.subtract(scores, np.float32(top), out=w)
        np.exp(w, out=w)  # (V,) unnormalised probabilities; -inf -> 0
        z = float(w.sum(dtype=np.float64))
        lse = top + math.log(z)
        if n == 0:
            return GrammarStep(0, 0.0, _top_removed(scores, live, top, lse), False, notes)
        # One kept token: the masked sum is that one value (0.0 + x, exact), without a masked pass.
        if n == 1:
            kept = float(w[forced if forced is not None else int(np.flatnonzero(live)[0])])
        else:
            kept = float(w.sum(dtype=np.float64, where=live))
        mass = min(max(kept / z, 0.0), 1.0)
        return GrammarStep(n, mass, _top_removed(scores, live, top, lse, dead=dead), n == 1, notes)

    def _exp_buffer(self, scores: np.ndarray) -> np.ndarray:
        """A row like `scores` reused every step: a fresh 49k-262k temporary each token costs page faults."""
        buf = self._w
        if buf is None or buf.shape != scores.shape or buf.dtype != scores.dtype:
            buf = self._w = np.empty_like(scores)
        return buf

    def dead_end_reason(self, keep: np.ndarray) -> str:
        if self.run.failure:
            return self.run.failure
        if not keep.any():
            if self.run.state()[0] == 0:  # nothing read yet: no text at all matches it
                return (f"the {self.run.constraint.label} allows no answer at all: no text matches it "
                        "(check that every rule can end and that its character classes are not empty)")
            return "dead end: the constraint allows no token of this model here (the grammar cannot go on)"
        return ("dead end: every token the constraint allows here was removed by an earlier stage "
                "(logit bias or banned strings); loosen them or move the grammar stage first")

    # Per-run state, like mirostat's: the chain calls these.
    def accept(self, token: int) -> None:
        self.run.accept(token)

    def state(self) -> tuple[int, int]:
        return self.run.state()

    def restore(self, state: tuple[int, int]) -> None:
        self.run.restore(state)


class _PendingStep:
    """A grammar step's record, built once when first asked for (by `GrammarStage.last`, or by the answer's
    `log_mass_kept`), from the entering row and mask kept for it; then it lets go of them."""

    __slots__ = ("_args", "_lock", "_stage", "step")

    def __init__(self, stage: GrammarStage, scores: np.ndarray, live: np.ndarray, dead: np.ndarray | None, n: int,
                 forced: int | None, notes: str) -> None:
        self._stage = stage
        self._args: tuple[Any, ...] | None = (scores, live, dead, n, forced, notes)
        self._lock = threading.Lock()  # the loop's report thread and the next pick may both ask
        self.step: GrammarStep | None = None

    def build(self) -> GrammarStep:
        with self._lock:
            if self.step is None:
                assert self._args is not None
                self.step = self._stage._record(*self._args)
                self._args = None
            return self.step

    def log_mass_kept(self) -> float:
        mass = self.build().mass_kept
        return math.log(mass) if mass > 0 else -math.inf


def _top_removed(scores: np.ndarray, live: np.ndarray, top: float, lse: float, n: int = TOP_DISALLOWED,
                 dead: np.ndarray | None = None) -> TopList:
    """The n most likely tokens not in `live`, (id, log-prob under softmax(scores)), most likely first.

    Looks among the tokens near the top score first and widens only when fewer than n removed tokens are
    there. `dead`: the ids not in `live`, ascending, when the caller has them (few): the search then runs
    on them alone. Either way each reach's candidates are the same ids in the same order, so the same
    tokens come out (ties included).
    """
    if dead is not None:
        removed_ids = dead[scores[dead] > NEG_INF]
        count = int(removed_ids.size)
        if count == 0:
            return ()
        want = min(n, count)
        cand = None
        for reach in _REACH:
            c = removed_ids[scores[removed_ids] >= np.float32(top - reach)]
            if c.size >= want:
                cand = c
                break
        if cand is None:
            cand = removed_ids
        return _ranked(scores, cand, want, lse)
    removed = ~live & (scores > NEG_INF)
    count = int(np.count_nonzero(removed))
    if count == 0:
        return ()
    want = min(n, count)
    cand = None
    for reach in _REACH:
        # The tokens within reach are few: find them with one comparison, then keep the removed ones.
        near = np.flatnonzero(scores >= np.float32(top - reach))
        c = near[removed[near]]
        if c.size >= want:
            cand = c
            break
    if cand is None:
        cand = np.flatnonzero(removed)
    return _ranked(scores, cand, want, lse)


def _ranked(scores: np.ndarray, cand: np.ndarray, want: int, lse: float) -> TopList:
    """The `want` best of the candidate ids `cand` by score, ties by id, as (id, log-prob)."""
    vals = scores[cand]
    part = np.argpartition(-vals, want - 1)[:want] if want < cand.size else np.arange(cand.size)
    order = part[np.lexsort((cand[part], -vals[part]))]
    return tuple((int(cand[i]), float(vals[i]) - lse) for i in order)


def grammar_stage(constraint: Constraint | None, tok: Any, info: Any) -> GrammarStage | None:
    """This run's `grammar` stage for `constraint` on a model (its tokenizer and `ModelInfo`), or None.

    Raises:
        ConstraintError: the constraint cannot work with this model's vocabulary.
    """
    if constraint is None:
        return None
    n_vocab = int(getattr(info, "vocab_size", 0) or 0) or None
    return GrammarStage(start_run(constraint, tok, n_vocab, int(getattr(info, "reports_top_n", 0) or 0)))


def constraint_step(event: TokenEvent, stage: GrammarStage, tok: Any) -> TokenEvent:
    """`event` with what the constraint did at its step (texts for the removed tokens)."""
    step = stage.last
    if step is None:
        return event
    removed = tuple(_token_prob(tok, t, lp) for t, lp in step.disallowed)
    return replace(event, constraint=ConstraintStep(step.allowed, step.mass_kept, removed, step.forced, step.note))


def _token_prob(tok: Any, token_id: int, logprob: float) -> TokenProb:
    text = tok.token_text(token_id)
    return TokenProb(token_id, text, logprob, partial_token_bytes(tok, token_id, text))
