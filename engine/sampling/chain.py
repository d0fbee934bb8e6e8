"""The sampler chain: settings -> stages -> one chosen token, plus what the UI shows.

One numpy implementation serves every backend (the libraries disagree on the
order of stages: transformers applies temperature first, mlx-lm last), so
the same seed, settings and logits give the same token everywhere.

Default order (`DEFAULT_ORDER`, llama.cpp's, see `engine.sampling.settings`)::

    logit_bias -> penalties -> dry -> top_n_sigma -> smoothing -> top_k -> typical_p
    -> top_p -> min_p -> xtc -> temperature -> mirostat -> adaptive_p

A custom stage (`SamplerSettings.with_stage`, engine.sampling.custom_stage) runs where its name stands in
the order, on the whole row, and is recorded under its name like the others.

Bias and penalties come first because they change what the model "said"
and the filters should see that. The filters then cut on the model's own
(penalized) distribution and temperature reshapes only the survivors, last
(llama.cpp / mlx-lm order): a cut then means "the model found this unlikely",
not "the temperature made it look unlikely", and raising the temperature
cannot let junk from the far tail back in. The order is a setting; a stage
missing from it, or at its neutral value, is not run. Unlike llama.cpp,
which drops every other filter when mirostat is on and lets mirostat or
adaptive-p draw the token, all stages here run as ordered and the chain
draws from the last distribution: each stage's effect stays visible.

Stages with per-run state (mirostat's mu, adaptive-p's moving average) are
objects the chain owns (`engine.sampling.adaptive`); after each pick the
chain tells them the token (`accept`). `state()` / `restore()` let the
decode loop step back to an earlier token (banned strings).

Per token the chain also reports the model's own view of the chosen token
(log-prob, rank, entropy, top-N) and, when asked, what every stage did. Only
small Python values leave `pick`; full-vocabulary arrays stay inside.
`pick` is `choose` (the stages and the draw: what the next forward waits
for) then `Choice.report` (the statistics), so the decode loop can build a
token's report while the model computes the next one.

Speed: once a filter has cut the row to a quarter of the vocabulary or less,
the stages that look only at scores (`_ON_SURVIVORS`) run on the survivors
alone, a few dozen entries instead of 262k; a stage that needs token ids
(penalties, a grammar, mirostat) gets the whole row back. The draws and the
recorded numbers are those of the whole row (the same float32 values, the
same float64 sums over them).

Randomness: a chain owns one PCG64 generator (the same stream on every
platform), seeded from `settings.seed` or a fresh seed it exposes, so use one
chain per generation run. Per step, XTC (when in the chain) takes one number
and a non-greedy pick takes one more, even when the token is forced, so the
stream position depends only on the step. The draw is an inverse CDF over
the survivors in token-id order; greedy takes no number.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection

import numpy as np

from engine.sampling.alternatives import TokenNames
from engine.sampling.custom_stage import run_custom_stage
from engine.sampling.distribution import Dist
from engine.sampling.dry import Vocabulary
from engine.sampling.grammar import GrammarStage
from engine.sampling.head import RowHead
from engine.sampling.pick import (
    BANNED_STAGE,
    Choice,
    Pick,
    Step,
    apply_keep,
    ban,
    expand,
)
from engine.sampling.registry import ARGMAX_PRESERVING, ON_SURVIVORS, STAGE_ROWS, BuildContext
from engine.sampling.settings import SamplerSettings
from engine.sampling.stages import NEG_INF, FilterStage, Stage, StageContext, StatefulStage

# The fast paths' facts about each stage (engine.sampling.registry): greedy may stop before the stages that
# never move the argmax, and the stages that look only at scores may run on a filter's survivors alone.
_ARGMAX_PRESERVING = ARGMAX_PRESERVING
_ON_SURVIVORS = ON_SURVIVORS


class SamplerChain:
    """Builds the stage list once from `SamplerSettings`, then picks tokens.

    One chain per generation run: it holds the run's random stream and the
    state of mirostat and adaptive-p.

    Attributes:
        settings: what the chain was built from.
        seed: the seed of its generator (settings.seed, or a fresh one drawn
            here), so a run can be replayed with `settings.with_(seed=...)`.
        stage_names: the stages that run, in order (neutral ones left out).
    """

    def __init__(
        self, settings: SamplerSettings, vocab: Vocabulary | None = None, constraint: GrammarStage | None = None
    ) -> None:
        """
        Args:
            settings: the sampler settings.
            vocab: the model's tokenizer; needed for DRY's sequence breakers
                and for logit biases given as text; names the reported alternatives
                (`TokenProb.text`, "" without it).
            constraint: this run's `grammar` stage (engine.sampling.grammar); it runs
                where the order puts "grammar", first when the order leaves it out.

        Raises:
            ValueError: a setting needs the tokenizer and none was given.
        """
        self.settings = settings
        self.seed: int = settings.seed if settings.seed is not None else secrets.randbits(63)
        self._rng = np.random.default_rng(self.seed)  # PCG64: same stream on every platform
        self._greedy = settings.greedy
        self._names = TokenNames(vocab)  # alternatives as TokenProb, named with the tokenizer
        self._stateful: list[StatefulStage] = []  # mirostat, adaptive-p, a constraint: in stage order
        stages: list[tuple[str, Stage]] = []
        build = BuildContext(vocab, constraint)
        order = settings.order if constraint is None or "grammar" in settings.order else ("grammar", *settings.order)
        for name in order:
            stage = self._make(name, settings, build)
            if stage is not None:
                if isinstance(stage, StatefulStage):  # per-run state: told every pick, stepped back with the run
                    self._stateful.append(stage)
                stages.append((name, stage))
        self._stages = tuple(stages)
        self.stage_names: tuple[str, ...] = tuple(n for n, _ in stages)
        # Greedy without recording can stop after the last stage that may move the
        # argmax: the ones after it cannot change the pick. (Earlier ones can,
        # through a later penalty or XTC that sees what they removed.)
        keep = len(stages)
        while keep and stages[keep - 1][0] in _ARGMAX_PRESERVING:
            keep -= 1
        self._greedy_stages = self._stages[:keep]

    def _make(self, name: str, s: SamplerSettings, build: BuildContext) -> Stage | None:
        """The stage function for `name` (its registry row's factory), or None when the setting makes it a no-op."""
        row = STAGE_ROWS.get(name)
        if row is not None:
            return row.build(s, build)
        custom = s.custom_stage(name)
        if custom is not None:  # the user's own stage (engine.sampling.custom_stage): always runs
            return run_custom_stage(custom)
        raise ValueError(f"unknown sampler stage {name!r}")  # settings validation prevents this

    @property
    def stages(self) -> tuple[tuple[str, Stage], ...]:
        """(name, stage function) of the stages that run, in order (for benches and tools)."""
        return self._stages

    def state(self) -> tuple[object, ...]:
        """The run's stage state (mirostat's mu, adaptive-p's average), for `restore`.

        The random stream is not part of it: a step back draws fresh numbers,
        which a replay with the same seed draws again.
        """
        return tuple(obj.state() for obj in self._stateful)

    def restore(self, state: tuple[object, ...]) -> None:
        """Put the stage state back to what `state()` returned earlier in this run."""
        for obj, st in zip(self._stateful, state, strict=True):
            obj.restore(st)

    def pick(
        self,
        logits: np.ndarray,
        history: np.ndarray,
        *,
        top_n: int = 20,
        record_stages: bool = False,
        force_token: int | None = None,
        banned: Collection[int] = (),
    ) -> Pick:
        """Run the stages on one row of logits and choose a token.

        Args:
            logits: (V,) raw model logits (any float dtype; used as float32).
            history: (T,) token ids so far, prompt included (for penalties).
            top_n: how many alternatives to report per distribution (0 = none).
            record_stages: also report what every stage did (costs a little).
            force_token: take this token instead of drawing one (branching
                from an alternative); everything is still reported. The
                random stream advances as if a token had been drawn.
            banned: tokens that may not be picked here (a banned string began
                with them at this position); removed before every stage and,
                when recording, shown as a `banned_strings` stage.

        Returns:
            The chosen token and its statistics.

        Raises:
            ValueError: on a malformed row (not 1-D, NaN, +inf, no finite
                value) or a `force_token` outside the vocabulary.
        """
        choice = self.choose(logits, history, record_stages=record_stages, force_token=force_token, banned=banned)
        return choice.report(top_n)

    def choose(
        self,
        logits: np.ndarray,
        history: np.ndarray,
        *,
        record_stages: bool = False,
        force_token: int | None = None,
        banned: Collection[int] = (),
    ) -> Choice:
        """`pick` in two halves: run the stages and choose the token now; `Choice.report` describes it later.

        The decode loop starts the next forward as soon as the token is known
        and builds this token's report while the model runs. Everything that
        moves the chain's state (the random stream, mirostat's mu, a grammar's
        parser) happens here; `report` only reads what this call kept, so it
        may run on another thread while the chain chooses the next token.
        Arguments and errors as in `pick`.
        """
        scores = np.ascontiguousarray(logits, dtype=np.float32)
        if scores.ndim != 1 or scores.size == 0:
            raise ValueError(f"logits must be one non-empty row (V,), got shape {scores.shape}")
        top = np.max(scores)  # NaN if any entry is NaN
        if not np.isfinite(top):
            raise ValueError(f"logits must be finite or -inf with at least one finite value (max is {top})")
        v = scores.size
        if force_token is not None and not 0 <= force_token < v:
            raise ValueError(f"force_token {force_token} is outside the vocabulary [0, {v})")
        head = RowHead(scores, top)  # the row's top, found once for top-k, the top N and the rank
        ctx = StageContext(np.asarray(history, dtype=np.int64), self._rng, head)

        stages = self._stages if (record_stages or not self._greedy) else self._greedy_stages
        # The row as it goes through the stages: the whole (V,) row (ids None), or, once a filter has cut
        # it to a quarter of the vocabulary or less, the survivors alone (ascending ids, finite scores).
        ids: np.ndarray | None = None
        vals = scores
        steps: list[Step] | None = [] if record_stages else None
        if banned:
            vals = ban(scores, banned)
            if steps is not None:
                steps.append((BANNED_STAGE, None, vals))
        for name, stage in stages:
            if ids is not None and name not in _ON_SURVIVORS:  # it needs each token's id: back to a (V,) row
                vals, ids = expand(ids, vals, v), None
            if isinstance(stage, FilterStage):
                new_ids, new_vals = apply_keep(ids, vals, stage.keep(vals, ctx), v)
            else:
                new_ids, new_vals = ids, stage(vals, ctx)
                if ids is not None and new_vals is not vals and new_vals.min() == NEG_INF:
                    finite = new_vals > NEG_INF
                    new_ids, new_vals = ids[finite], new_vals[finite]
            if steps is not None:
                steps.append((name, None, None) if new_vals is vals else (name, new_ids, new_vals))
            ids, vals = new_ids, new_vals

        final: Dist | None = None
        if self._greedy:
            best = int(np.argmax(vals))
            best = best if ids is None else int(ids[best])
            token = best if force_token is None else int(force_token)
        else:
            best = -1
            final = Dist(vals, ids)
            u = self._rng.random()  # drawn even when forced: the stream stays aligned
            token = final.draw(u) if force_token is None else int(force_token)
        for obj in self._stateful:
            obj.accept(token)
        return Choice(token, force_token is not None, scores, steps, final, best, self._names, head)
