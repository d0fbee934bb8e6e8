"""The sampler chain: settings -> stages -> one chosen token, plus what the UI shows.

One numpy implementation serves every backend (the libraries disagree on the
order of stages: transformers applies temperature first, mlx-lm last), so
the same seed, settings and logits give the same token everywhere.

Default order (`DEFAULT_ORDER`, llama.cpp's, see `engine.sampling.settings`)::

    logit_bias -> penalties -> dry -> top_n_sigma -> smoothing -> top_k -> typical_p
    -> top_p -> min_p -> xtc -> temperature -> mirostat -> adaptive_p

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

Randomness: a chain owns one PCG64 generator (the same stream on every
platform), seeded from `settings.seed` or a fresh seed it exposes, so use one
chain per generation run. Per step, XTC (when in the chain) takes one number
and a non-greedy pick takes one more, even when the token is forced, so the
stream position depends only on the step. The draw is an inverse CDF over
the survivors in token-id order; greedy takes no number.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.sampling.adaptive import AdaptiveP, Mirostat, Mirostat2
from engine.sampling.dry import Vocabulary, breaker_sequences, make_dry
from engine.sampling.grammar import GrammarStage
from engine.sampling.settings import SamplerSettings
from engine.sampling.shaping import make_logit_bias, make_smoothing, make_temperature_ext, make_top_n_sigma
from engine.sampling.stages import (
    CHUNK,
    NEG_INF,
    Stage,
    StageContext,
    exp_sums,
    finite_part,
    make_min_p,
    make_penalties,
    make_temperature,
    make_top_k,
    make_top_p,
    make_typical_p,
    make_xtc,
)

TopList = tuple[tuple[int, float], ...]

# Stages that never change which token has the highest score (these filters keep
# the top token and its ties; temperature is monotone). Typical-p is not one.
_ARGMAX_PRESERVING = frozenset({"top_k", "top_p", "min_p", "top_n_sigma", "temperature"})
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
        top: top-N (token_id, logprob) after this stage, most likely first.
    """

    name: str
    survivors: int
    mass_kept: float
    entropy: float
    top: TopList


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
        top_model: top-N (id, logprob) under the model, most likely first.
        top_sampler: top-N (id, logprob) under the final sampler distribution,
            survivors only (greedy: the argmax alone, at log-prob 0).
        stages: one entry per stage run, when recording was asked for.
        forced: the token was given (`force_token`), not drawn.
    """

    token_id: int
    logprob: float
    sampler_logprob: float
    rank: int
    entropy: float
    top_model: TopList
    top_sampler: TopList
    stages: tuple[StageStats, ...] | None
    forced: bool


class _Dist:
    """Softmax summary of one score row.

    Once a filter has run, the finite entries are usually a few hundred out of
    the vocabulary: they are then gathered (`ids`, `vals`) and everything
    after is cheap. When most entries are finite the row itself is used, its
    -inf entries weighing 0, since gathering 262k entries costs more than it
    saves. Nothing full-size is copied.
    """

    __slots__ = ("ids", "vals", "count", "m", "z", "lse", "entropy")

    def __init__(self, scores: np.ndarray) -> None:
        v = scores.size
        count = v if scores.min() > NEG_INF else int(np.count_nonzero(scores > NEG_INF))
        self.count = count  # tokens with a finite score
        if count * 4 <= v:
            self.ids, self.vals = finite_part(scores)
        else:
            self.ids, self.vals = None, scores  # ids None: position = token id
        m = self.vals.max()
        z, ed = exp_sums(self.vals, m, entropy=True, all_finite=count == self.vals.size)
        self.m = float(m)
        self.z = z
        self.lse = self.m + math.log(z)
        # H = log Z - sum(e * (s - m)) / Z: both terms >= 0, no cancellation.
        self.entropy = max(math.log(z) - ed / z, 0.0)

    def token_id(self, local: int) -> int:
        return local if self.ids is None else int(self.ids[local])

    def top(self, n: int) -> TopList:
        """Top-n (id, logprob), most likely first; ties broken by lower id."""
        n = min(n, self.count)
        if n <= 0:
            return ()
        local = _top_local(self.vals, n)
        ids = local if self.ids is None else self.ids[local]
        vals = self.vals[local]
        order = np.lexsort((ids, -vals))
        lse = self.lse
        return tuple((int(ids[i]), float(vals[i]) - lse) for i in order)

    def draw(self, u: float) -> int:
        """Inverse-CDF draw for u in [0, 1): the first token, in id order, whose
        cumulative weight exceeds u * Z.

        Weights are float32 `exp(s - max)`, accumulated in float64 chunk by
        chunk exactly as `exp_sums` does, so the same logits and u give the
        same token on every backend and every run.
        """
        vals, n = self.vals, self.vals.size
        m = np.float32(self.m)
        target = u * self.z
        acc = 0.0
        last = 0
        for i in range(0, n, CHUNK):
            w = np.exp(vals[i : i + CHUNK] - m)
            t = float(w.sum(dtype=np.float64))
            if acc + t > target:
                cum = np.cumsum(w, dtype=np.float64)
                cum += acc
                j = int(np.searchsorted(cum, target, side="right"))
                if j >= w.size:  # rounding between the two sums: last token with weight
                    j = int(np.flatnonzero(w)[-1])
                return self.token_id(i + j)
            if t > 0:
                last = i + int(np.flatnonzero(w)[-1])
            acc += t
        return self.token_id(last)  # u * Z rounded up to Z


# How far below the top score the top-N search looks on each try (nats).
_TOP_REACH: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def _top_local(vals: np.ndarray, n: int) -> np.ndarray:
    """Positions of the n largest `vals`; among ties at the cut, the lowest positions.

    `n` must not exceed the number of finite entries.

    An argpartition over 262k floats costs ~1 ms; counting the entries within
    `reach` of the max costs ~0.03 ms, so widen the reach until it holds n
    candidates and partition only those.
    """
    k = vals.size
    if n >= k:
        return np.arange(k)
    m = vals.max()
    mask = np.empty(k, dtype=bool)
    cand = None
    for reach in _TOP_REACH:
        np.greater_equal(vals, m - np.float32(reach), out=mask)
        c = int(np.count_nonzero(mask))
        if c >= n:
            if c * 4 <= k:  # else a flat row: the candidates are most of it anyway
                cand = np.flatnonzero(mask)
            break
    pool = vals if cand is None else vals[cand]
    kth = np.partition(pool, pool.size - n)[pool.size - n]  # the n-th largest value
    above = np.flatnonzero(pool > kth)
    tied = np.flatnonzero(pool == kth)[: n - above.size]  # ascending: lowest ids first
    local = np.concatenate((above, tied))
    return local if cand is None else cand[local]


def _lookup(dist: _Dist, scores: np.ndarray, token: int) -> float:
    """log-prob of `token` under `dist` (the softmax of `scores`)."""
    s = float(scores[token])
    return s - dist.lse if s != -math.inf else -math.inf


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
                and for logit biases given as text.
            constraint: this run's `grammar` stage (engine.sampling.grammar); it runs
                where the order puts "grammar", first when the order leaves it out.

        Raises:
            ValueError: a setting needs the tokenizer and none was given.
        """
        self.settings = settings
        self.seed: int = settings.seed if settings.seed is not None else secrets.randbits(63)
        self._rng = np.random.default_rng(self.seed)  # PCG64: same stream on every platform
        self._greedy = settings.greedy
        self._vocab = vocab
        self._stateful: list[Any] = []  # Mirostat / AdaptiveP objects, in stage order
        stages: list[tuple[str, Stage]] = []
        self._constraint = constraint
        order = settings.order if constraint is None or "grammar" in settings.order else ("grammar", *settings.order)
        for name in order:
            stage = self._make(name, settings)
            if stage is not None:
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

    def _make(self, name: str, s: SamplerSettings) -> Stage | None:
        """The stage function for `name`, or None when the setting makes it a no-op."""
        if name == "grammar":  # a constraint's mask: per-run state, like mirostat's
            if self._constraint is not None:
                self._stateful.append(self._constraint)
            return self._constraint
        if name == "penalties":
            off = s.penalty_last_n == 0 or (
                s.repetition_penalty == 1 and s.presence_penalty == 0 and s.frequency_penalty == 0
            )
            return None if off else make_penalties(
                s.repetition_penalty, s.presence_penalty, s.frequency_penalty, s.penalty_last_n
            )
        if name == "top_k":
            return make_top_k(s.top_k) if s.top_k > 0 else None
        if name == "top_p":
            return make_top_p(s.top_p) if s.top_p < 1 else None
        if name == "min_p":
            return make_min_p(s.min_p) if s.min_p > 0 else None
        if name == "typical_p":
            return make_typical_p(s.typical_p) if s.typical_p < 1 else None
        if name == "xtc":
            return make_xtc(s.xtc_probability, s.xtc_threshold) if s.xtc_probability > 0 else None
        if name == "temperature":
            # 0 = greedy (argmax in `pick`), 1 = identity: neither needs a stage.
            if s.temperature == 0 or (s.temperature == 1 and s.dynatemp_range == 0):
                return None
            if s.dynatemp_range > 0:
                return make_temperature_ext(s.temperature, s.dynatemp_range, s.dynatemp_exponent)
            return make_temperature(s.temperature)
        if name == "top_n_sigma":
            return make_top_n_sigma(s.top_n_sigma) if s.top_n_sigma > 0 else None
        if name == "smoothing":
            return make_smoothing(s.smoothing_factor, s.smoothing_curve) if s.smoothing_factor > 0 else None
        if name == "logit_bias":
            return self._logit_bias(s) if s.logit_bias else None
        if name == "dry":
            return self._dry(s) if s.dry_multiplier > 0 and s.dry_penalty_last_n != 0 else None
        if name == "mirostat":
            if s.mirostat == 0:
                return None
            obj = Mirostat(s.mirostat_tau, s.mirostat_eta) if s.mirostat == 1 else Mirostat2(s.mirostat_tau, s.mirostat_eta)
            self._stateful.append(obj)
            return obj
        if name == "adaptive_p":
            if s.adaptive_target < 0:
                return None
            obj = AdaptiveP(s.adaptive_target, s.adaptive_decay)
            self._stateful.append(obj)
            return obj
        raise ValueError(f"unknown sampler stage {name!r}")  # settings validation prevents this

    @property
    def stages(self) -> tuple[tuple[str, Stage], ...]:
        """(name, stage function) of the stages that run, in order (for benches and tools)."""
        return self._stages

    def _needs_vocab(self, what: str) -> Vocabulary:
        if self._vocab is None:
            raise ValueError(f"{what} needs the model's tokenizer, and this sampler was built without one")
        return self._vocab

    def _logit_bias(self, s: SamplerSettings) -> Stage:
        """llama.cpp server's rule: a text biases every token of its tokenization (no special tokens)."""
        ids: list[int] = []
        biases: list[float] = []
        for key, bias in s.logit_bias:
            if isinstance(key, str):
                toks = self._needs_vocab(f"the logit bias for the text {key!r}").encode(key, add_special_tokens=False)
                if not toks:
                    raise ValueError(f"the logit bias text {key!r} has no tokens in this model's vocabulary")
            else:
                toks = [key]
            ids += toks
            biases += [bias] * len(toks)
        return make_logit_bias(ids, biases)

    def _dry(self, s: SamplerSettings) -> Stage:
        """DRY; its breakers are found in the vocabulary on the first pick (when its size is known)."""
        vocab = self._needs_vocab("DRY's sequence breakers") if s.dry_sequence_breakers else None
        built: list[Stage] = []

        def dry(scores: np.ndarray, ctx: StageContext) -> np.ndarray:
            if not built:
                breakers = breaker_sequences(vocab, s.dry_sequence_breakers, scores.size) if vocab is not None else {}
                built.append(make_dry(s.dry_multiplier, s.dry_base, s.dry_allowed_length, s.dry_penalty_last_n, breakers))
            return built[0](scores, ctx)

        return dry

    def state(self) -> tuple:
        """The run's stage state (mirostat's mu, adaptive-p's average), for `restore`.

        The random stream is not part of it: a step back draws fresh numbers,
        which a replay with the same seed draws again.
        """
        return tuple(obj.state() for obj in self._stateful)

    def restore(self, state: tuple) -> None:
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
        scores = np.ascontiguousarray(logits, dtype=np.float32)
        if scores.ndim != 1 or scores.size == 0:
            raise ValueError(f"logits must be one non-empty row (V,), got shape {scores.shape}")
        top = scores.max()  # NaN if any entry is NaN
        if not np.isfinite(top):
            raise ValueError(f"logits must be finite or -inf with at least one finite value (max is {top})")
        v = scores.size
        if force_token is not None and not 0 <= force_token < v:
            raise ValueError(f"force_token {force_token} is outside the vocabulary [0, {v})")
        ctx = StageContext(np.asarray(history, dtype=np.int64), self._rng)

        model = _Dist(scores)
        stages = self._stages if (record_stages or not self._greedy) else self._greedy_stages
        out = scores
        dist: _Dist | None = model  # summary of `out`, when known
        recorded: list[StageStats] | None = [] if record_stages else None
        if banned:
            out = _ban(scores, banned)
            if recorded is not None:
                dist = _Dist(out)
                recorded.append(StageStats(BANNED_STAGE, dist.count, _mass_kept(model, dist, out), dist.entropy, dist.top(top_n)))
            else:
                dist = None
        for name, stage in stages:
            new = stage(out, ctx)
            if recorded is not None:
                assert dist is not None  # kept up to date while recording
                if new is out:  # the stage changed nothing
                    recorded.append(StageStats(name, dist.count, 1.0, dist.entropy, dist.top(top_n)))
                    continue
                after = _Dist(new)
                recorded.append(
                    StageStats(name, after.count, _mass_kept(dist, after, new), after.entropy, after.top(top_n))
                )
                dist = after
            elif new is not out:
                dist = None
            out = new

        if self._greedy:
            best = int(np.argmax(out))
            token = best if force_token is None else int(force_token)
            sampler_logprob = 0.0 if token == best else -math.inf
            top_sampler: TopList = ((best, 0.0),) if top_n > 0 else ()
        else:
            if dist is None:
                dist = _Dist(out)
            u = self._rng.random()  # drawn even when forced: the stream stays aligned
            token = dist.draw(u) if force_token is None else int(force_token)
            sampler_logprob = _lookup(dist, out, token)
            top_sampler = dist.top(top_n)

        for obj in self._stateful:
            obj.accept(token)
        raw = scores[token]
        return Pick(
            token_id=token,
            logprob=_lookup(model, scores, token),
            sampler_logprob=sampler_logprob,
            rank=int(np.count_nonzero(scores > raw)),
            entropy=model.entropy,
            top_model=model.top(top_n),
            top_sampler=top_sampler,
            stages=tuple(recorded) if recorded is not None else None,
            forced=force_token is not None,
        )


def _ban(scores: np.ndarray, banned: Collection[int]) -> np.ndarray:
    """`scores` without the banned tokens; unchanged if banning them would leave no token."""
    ids = np.fromiter((t for t in banned if 0 <= t < scores.size), dtype=np.int64)
    out = scores.copy()
    out[ids] = NEG_INF
    if out.max() == NEG_INF:
        return scores
    return out


def _mass_kept(before: _Dist, after: _Dist, scores_after: np.ndarray) -> float:
    """Mass, under `before`, of the tokens still finite in `after`.

    Stages never bring a removed token back, so an unchanged count means an
    unchanged set.
    """
    if after.count == before.count:
        return 1.0
    m = np.float32(before.m)
    if after.ids is not None:  # few survivors: look them up
        ids = after.ids if before.ids is None else np.searchsorted(before.ids, after.ids)
        kept = float(np.exp(before.vals[ids] - m).sum(dtype=np.float64))
    else:  # most survive (both rows are full-size): sum by chunks, where `after` is finite
        kept = 0.0
        for i in range(0, scores_after.size, CHUNK):
            w = np.exp(before.vals[i : i + CHUNK] - m)
            kept += float(w.sum(dtype=np.float64, where=scores_after[i : i + CHUNK] > NEG_INF))
    return min(max(kept / before.z, 0.0), 1.0)
