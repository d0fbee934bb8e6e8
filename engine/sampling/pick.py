"""One chosen token and its statistics: what `SamplerChain.choose` keeps and `Choice.report` turns into a `Pick`.

Also the row helpers the chain's stage loop uses: a filter's mask applied to
the whole row or to the survivors alone, and back.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from engine.events import TokenProb
from engine.lazy_tuple import LazyTuple
from engine.sampling.alternatives import TokenNames
from engine.sampling.distribution import Dist, TopList, mass_kept
from engine.sampling.head import RowHead
from engine.sampling.stages import NEG_INF

Alternatives = tuple[TokenProb, ...]

# The name under which a pick's banned tokens (banned strings) are recorded when recording stages.
BANNED_STAGE = "banned_strings"


@dataclass(frozen=True, slots=True)
class StageStats:
    """What one stage did, as small Python values.

    Attributes:
        name: the stage ("top_p", ...).
        survivors: tokens with a finite score after this stage.
        mass_kept: probability mass, under the distribution *entering* this
            stage, of the tokens that survive it (1.0 for reshaping stages).
        entropy: entropy (nats) of the distribution after this stage.
        top: top-N `TokenProb` after this stage, most likely first.
        removed: the tokens worth showing (the model's top N, the chosen one, and any an earlier
            stage listed) that this stage removed: a view can say "cut" (or "banned", for a
            logit bias of -inf) for them even where `top` is cut at N and says nothing.
    """

    name: str
    survivors: int
    mass_kept: float
    entropy: float
    top: Alternatives
    removed: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Pick:
    """Everything the UI needs about one chosen token; small Python values only.

    Attributes:
        token_id: the chosen token.
        logprob: its log-prob under the model (log_softmax of the raw logits).
        sampler_logprob: its log-prob under the final sampler distribution;
            0.0 when greedy; -inf when forced to a token the chain filtered out.
        rank: 0 = the model's most likely token; the number of tokens whose
            raw logit is strictly larger.
        entropy: entropy (nats) of the model distribution.
        top_model: top-N `TokenProb` under the model, most likely first.
        top_sampler: top-N `TokenProb` under the final sampler distribution,
            survivors only (greedy: the argmax alone, at log-prob 0).
        stages: one entry per stage run, when recording was asked for: a tuple, or a `LazyTuple` that
            builds the last ones when first read (`deferred_stage_records`).
        forced: the token was given (`force_token`), not drawn.

    Alternatives are `TokenProb`, the type `TokenEvent` carries, named with the
    chain's tokenizer (`text` is "" when the chain was built without one).
    """

    token_id: int
    logprob: float
    sampler_logprob: float
    rank: int
    entropy: float
    top_model: Alternatives
    top_sampler: Alternatives
    stages: Sequence[StageStats] | None
    forced: bool


# One recorded stage: (name, ids, scores after it) with ids None for a (V,) row, or (name, None, None)
# when the stage changed nothing.
Step = tuple[str, "np.ndarray | None", "np.ndarray | None"]

class Choice:
    """A token `SamplerChain.choose` chose, and what `report` needs to describe it.

    Attributes:
        token_id: the chosen token.
        forced: it was given (`force_token`), not drawn.
    """

    __slots__ = ("_best", "_final", "_head", "_names", "_scores", "_steps", "forced", "token_id")

    def __init__(
        self, token: int, forced: bool, scores: np.ndarray, steps: list[Step] | None, final: Dist | None, best: int,
        names: TokenNames | None = None, head: RowHead | None = None,
    ) -> None:
        self.token_id = token
        self.forced = forced
        self._scores = scores  # (V,) the model's row; never written to
        self._steps = steps
        self._final = final  # the distribution drawn from (None when greedy)
        self._best = best  # the greedy argmax (-1 when sampling)
        self._names = names if names is not None else TokenNames(None)
        self._head = head  # the top of `scores` the chain found (engine.sampling.head), None when not

    def final_distribution(self) -> np.ndarray:
        """(V,) float32 log-probs of the distribution the token was drawn from; -inf for removed tokens.

        Every stage has run, in the chain's order (custom stages included). Greedy: log-prob 0 at the argmax
        the chain took, -inf elsewhere. A full-vocabulary array: for research code, not the per-token path.
        """
        v = self._scores.size
        if self._final is None:
            out = np.full(v, NEG_INF, dtype=np.float32)
            out[self._best] = 0.0
            return out
        dist = self._final
        lp = (dist.vals - np.float32(dist.lse)).astype(np.float32)
        return lp if dist.ids is None else expand(dist.ids, lp, v)

    def report(self, top_n: int = 20) -> Pick:
        """The token's statistics: the model's view, the sampler's, and each recorded stage (see `Pick`)."""
        scores, token, names, head = self._scores, self.token_id, self._names, self._head
        model = Dist(scores, head=head)
        model_top = model.top(top_n)
        # The stages' records: those of the short rows at the end are built when read (deferred_stage_records).
        recorded = (deferred_stage_records(self._steps, self._names, token, model, model_top, top_n)
                    if self._steps is not None else None)
        if self._final is None:  # greedy
            best = self._best
            sampler_logprob = 0.0 if token == best else -math.inf
            top_sampler: TopList = ((best, 0.0),) if top_n > 0 else ()
        else:
            sampler_logprob = self._final.logprob(token)
            top_sampler = self._final.top(top_n)
        return Pick(
            token_id=token,
            logprob=model.logprob(token),
            sampler_logprob=sampler_logprob,
            rank=head.rank(token) if head is not None else int(np.count_nonzero(scores > scores[token])),
            entropy=model.entropy,
            top_model=names(model_top),
            top_sampler=names(top_sampler),
            stages=recorded,
            forced=self.forced,
        )


def stage_records(steps: list[Step], names: TokenNames, token_id: int, model: Dist, model_top: TopList,
                  top_n: int) -> list[StageStats]:
    """What each recorded stage did, in order, from the distribution entering the first (`model`).

    `steps`: each stage's row after it ran, (name, ids, vals), vals None where it changed nothing; the numpy
    chain keeps them, and the torch chain (engine.sampling.torch_chain) brings its rows to the host for this.
    """
    recorded: list[StageStats] = []
    watched = dict.fromkeys([t for t, _ in model_top] + [token_id])  # the rows a view shows
    _record(steps, names, top_n, model, watched, recorded)
    return recorded


# A stage row of at most this many survivors is kept for a record built when read (`deferred_stage_records`);
# a bigger one (a (V,) row, a wide first cut) is recorded at once, so that no answer holds rows of V per token.
DEFER_MAX = 4096


def deferred_stage_records(steps: list[Step], names: TokenNames, token_id: int, model: Dist, model_top: TopList,
                           top_n: int) -> Sequence[StageStats]:
    """`stage_records`, the same values, with the records of the short rows at the end built when first read.

    The window's default chain cuts the row at its first filter (top-k) and every stage after sees a few dozen
    survivors: those records are most of a token's report and are read only when the stage view opens, the
    answer is stored or a served answer is recorded. The stages up to the last one that left a long row are
    recorded now (their rows are not kept); the rest keep their short rows, the watched tokens and the part of
    the row entering them that their records read (`Dist.part`), and are built by whoever reads them.
    """
    last_long = max((i for i, (_, ids, vals) in enumerate(steps)
                     if vals is not None and (ids is None or vals.size > DEFER_MAX)), default=-1)
    tail = steps[last_long + 1:]
    if not any(vals is not None for _, _, vals in tail):  # nothing worth deferring
        return tuple(stage_records(steps, names, token_id, model, model_top, top_n))
    recorded: list[StageStats] = []
    watched = dict.fromkeys([t for t, _ in model_top] + [token_id])
    entering = _record(steps[: last_long + 1], names, top_n, model, watched, recorded)
    # What the tail's records read of the row entering it: its values at the first short row's survivors (the
    # later ones are among them) and at the watched tokens, its sums and the top list it gave.
    first_ids = next(ids for _, ids, vals in tail if vals is not None)
    assert first_ids is not None
    shown = np.fromiter(watched, dtype=np.int64, count=len(watched))
    entering = entering.part(np.concatenate((first_ids, shown)))
    entering.top(top_n)  # known already (asked above or by the report): a part can give only that list

    def build() -> tuple[StageStats, ...]:
        rest: list[StageStats] = []
        _record(tail, names, top_n, entering, dict(watched), rest)
        return (*recorded, *rest)

    return LazyTuple(build)


def _record(steps: list[Step], names: TokenNames, top_n: int, dist: Dist, watched: dict[int, None],
            out: list[StageStats]) -> Dist:
    """Append the records of `steps`, from `dist` entering the first; returns the distribution after the last.

    `watched`: the tokens a view shows (the model's top N, the chosen one, each stage's top N as it comes),
    in the order first watched; updated in place.
    """
    for name, ids, vals in steps:
        if vals is None:  # the stage changed nothing
            out.append(StageStats(name, dist.count, 1.0, dist.entropy, names(dist.top(top_n))))
            continue
        after = Dist(vals, ids)
        top = after.top(top_n)
        # The watched tokens this stage removed, in the order they were first watched.
        shown = np.fromiter(watched, dtype=np.int64, count=len(watched))
        gone = shown[dist.finite_at(shown) & ~after.finite_at(shown)]
        removed = tuple(int(t) for t in gone)
        out.append(StageStats(name, after.count, mass_kept(dist, after), after.entropy, names(top), removed))
        watched.update(dict.fromkeys(t for t, _ in top))
        dist = after
    return dist


def apply_keep(
    ids: np.ndarray | None, vals: np.ndarray, keep: np.ndarray | None, v: int
) -> tuple[np.ndarray | None, np.ndarray]:
    """A filter's `keep` mask applied to the row (ids, vals); the same objects when it keeps everything.

    A (V,) row cut to a quarter of the vocabulary or less becomes its survivors (ascending ids, finite
    scores): the stages after it then see a few hundred entries instead of V.
    """
    if keep is None:
        return ids, vals
    if keep.dtype != np.bool_:  # the kept positions of a (V,) row, ascending (FilterStage)
        if ids is not None or keep.size * 4 > v:
            keep = _mask(keep, vals.size if ids is None else ids.size)
        else:
            return _finite_only(keep, vals[keep])
    n = int(np.count_nonzero(keep))
    if n == vals.size:
        return ids, vals
    if ids is not None:
        return ids[keep], vals[keep]
    if n * 4 > v:
        return None, np.where(keep, vals, NEG_INF)
    kept = np.flatnonzero(keep)
    return _finite_only(kept, vals[kept])


def _finite_only(kept: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if out.size and out.min() == NEG_INF:  # a mask may name removed tokens too
        finite = out > NEG_INF
        kept, out = kept[finite], out[finite]
    return kept, out


def _mask(positions: np.ndarray, size: int) -> np.ndarray:
    mask = np.zeros(size, dtype=bool)
    mask[positions] = True
    return mask


def expand(ids: np.ndarray, vals: np.ndarray, v: int) -> np.ndarray:
    """The (V,) row of survivors (ids, vals): -inf everywhere else."""
    out = np.full(v, NEG_INF, dtype=np.float32)
    out[ids] = vals
    return out


def ban(scores: np.ndarray, banned: Collection[int]) -> np.ndarray:
    """`scores` without the banned tokens; unchanged if banning them would leave no token."""
    ids = np.fromiter((t for t in banned if 0 <= t < scores.size), dtype=np.int64)
    out = scores.copy()
    out[ids] = NEG_INF
    if out.max() == NEG_INF:
        return scores
    return out
