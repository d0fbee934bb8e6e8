"""The sampler chain on torch tensors: the stages, the draw and the per-token report on the logits' device.

When a torch backend's logits are a tensor on an accelerator, copying the whole (V,) row to the host every
token (262k floats for Gemma 3) and running the numpy chain (engine.sampling.chain) there costs more than the
step itself on a fast GPU (issue 49 item 1). `TorchChain` runs the same chain with torch ops on the row's own
device, and only the report's few dozen numbers cross to the host, in one `.tolist()` a token
(`TorchChoice.report`). A torch CPU tensor is a device too: that is how the tests check it against the numpy
chain without a GPU (tests/engine/test_torch_chain.py).

The numpy chain stays the reference and the path for every other backend. This module covers part of it, and
says so instead of giving a different answer: `TorchChain.supports(settings)` is false, with the reason in words,
for any stage it does not have (penalties, DRY, logit bias, smoothing, dynamic temperature, mirostat,
adaptive-p, a grammar, custom stages) and for banned strings; `TorchChain(settings)` then raises, and the caller
uses `SamplerChain`. Per-stage records (`record_stages`) are not built here either.

Covered, in the user's order: top_n_sigma, top_k, typical_p, top_p, min_p, xtc, temperature, and the greedy or
seeded draw. Each follows its numpy stage's arithmetic (engine.sampling.stages, shaping.py): float32 scores,
float32 weights `exp(s - max)` summed in float64, the same boundary rules (ties at a cut all kept, the token
that crosses top-p's mass kept), and the draw an inverse CDF over the survivors in token-id order. Randomness
comes from a numpy twin: a `SamplerChain` of the same settings whose PCG64 generator draws the uniforms (XTC's,
then the draw's, in the same order as the numpy chain), which go to the device as plain floats; the same seed
gives the same tokens on both chains.

Once a filter has run, the row is carried as its survivors (ascending ids and their scores), as the numpy
chain does, so the stages after top-k see a few dozen entries. That compaction has a data-dependent size:
on CUDA each one is an implicit synchronisation (no data moves but the count). A fixed-shape form, for a
CUDA graph of the whole step, is later work.

Not wired in yet: the torch backend's decode step (engine.backends.torch, through engine/decode/) still
hands its logits to the host and the numpy chain. The caller will be that step, choosing `TorchChain` when
`supports` says so and the row is on an accelerator; that waits for the static-cache step of issue 49 item 2
and the overlap of item 3, which change how the step returns its logits, and for a GPU to measure it on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.sampling.chain import SamplerChain
from engine.sampling.dry import Vocabulary
from engine.sampling.pick import Pick
from engine.sampling.registry import ARGMAX_PRESERVING, STAGE_ROWS, stage_active
from engine.sampling.settings import SamplerSettings

if TYPE_CHECKING:  # torch is imported inside the functions: importing the engine never needs it
    import torch

# The stages this module runs on the device; every other active stage sends the caller to the numpy chain.
COVERED: frozenset[str] = frozenset({"top_n_sigma", "top_k", "typical_p", "top_p", "min_p", "xtc", "temperature"})

_NOT_COVERED_WHY = {
    "grammar": "a grammar's mask is built by its parser on the host",
    "logit_bias": "logit bias is not on the device yet",
    "penalties": "the repetition penalties are not on the device yet",
    "dry": "DRY is not on the device yet",
    "smoothing": "quadratic smoothing is not on the device yet",
    "mirostat": "mirostat is not on the device yet",
    "adaptive_p": "adaptive-p is not on the device yet",
}


@dataclass(frozen=True, slots=True)
class Support:
    """Whether `TorchChain` runs some settings exactly as the numpy chain would; `reason` says why not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


def _support(settings: SamplerSettings) -> Support:
    reasons: list[str] = []
    for name in settings.order:
        if name not in STAGE_ROWS:  # validation allows only built-in and custom names
            reasons.append(f"the custom stage {name!r} is Python code on numpy rows")
        elif name == "temperature":
            if settings.dynatemp_range > 0 and settings.temperature != 0:
                reasons.append("the dynamic temperature (dynatemp_range > 0) is not on the device yet")
        elif name not in COVERED and stage_active(name, settings):
            reasons.append(_NOT_COVERED_WHY.get(name, f"{name} is not on the device yet"))
    if settings.banned_strings:
        reasons.append("banned strings step the answer back and ban tokens per pick, which this chain does not take")
    if reasons:
        return Support(False, "; ".join(reasons) + " (use engine.sampling.chain.SamplerChain)")
    return Support(True)


# ------------------------------------------------------------------------------------------------ the stages
# A row is (ids, vals): ids None while it is the whole (V,) row (position = token id; -inf = removed), else the
# survivors' ascending ids with their finite scores. A stage takes the row and the twin's generator.

Row = tuple["torch.Tensor | None", "torch.Tensor"]
DeviceStage = Callable[[Row, np.random.Generator], Row]


def _cut(row: Row, keep: torch.Tensor) -> Row:
    """The row's entries where `keep` (a bool tensor over `vals`) holds: the survivors, ascending ids."""
    ids, vals = row
    if ids is None:
        kept = keep.nonzero().squeeze(1)
        return kept, vals[kept]
    return ids[keep], vals[keep]


def _weights(vals: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """float32 `exp(s - m)`, as numpy's `np.exp(vals - m)` (0 for -inf)."""
    return (vals - m).exp_()


def _top_k(k: int) -> DeviceStage:
    def top_k(row: Row, rng: np.random.Generator) -> Row:
        import torch

        vals = row[1]
        if k >= vals.numel():
            return row
        kth = torch.topk(vals, k, sorted=False).values.min()  # the k-th largest; every tie with it is kept
        return _cut(row, (vals >= kth) & (vals > -math.inf))

    return top_k


def _top_p(p: float) -> DeviceStage:
    def top_p(row: Row, rng: np.random.Generator) -> Row:
        import torch

        vals = row[1]
        m = vals.max()
        target = _weights(vals, m).sum(dtype=torch.float64) * p
        desc = torch.sort(vals, descending=True).values
        cum = _weights(desc, m).to(torch.float64).cumsum(0)
        # transformers' rule forwards: the token whose mass crosses the target is kept too (stages._prefix_end)
        j = torch.searchsorted(cum, target.reshape(1), right=False).clamp_(max=desc.numel() - 1)
        return _cut(row, (vals >= desc[j]) & (vals > -math.inf))

    return top_p


def _min_p(p: float) -> DeviceStage:
    log_p = float(np.float32(math.log(p)))  # prob >= p * top  <=>  s >= max + log p, in float32 as numpy

    def min_p(row: Row, rng: np.random.Generator) -> Row:
        vals = row[1]
        return _cut(row, vals >= vals.max() + log_p)

    return min_p


def _typical_p(p: float) -> DeviceStage:
    def typical_p(row: Row, rng: np.random.Generator) -> Row:
        import torch

        vals = row[1]
        finite = vals > -math.inf
        m = vals.max()
        d = vals - m
        e = d.exp()
        z = e.sum(dtype=torch.float64)
        ed = torch.where(finite, e.double() * d.double(), 0.0).sum()
        log_z = z.log()
        ent = log_z - ed / z
        # |surprise - entropy| = |s - center| (stages.make_typical_p), in float32 as there
        center = (m.double() + log_z - ent).float()
        shift = (vals - center).abs()
        order = torch.argsort(shift)
        cum = e[order].double().cumsum(0)
        # the smallest shift whose tokens weigh >= p * Z (stages._typical_cut); rounding past the end: keep all
        i = torch.searchsorted(cum, (z * p).reshape(1), right=False).clamp_(max=order.numel() - 1)
        return _cut(row, (shift <= shift[order[i]]) & finite)

    return typical_p


def _top_n_sigma(n: float) -> DeviceStage:
    def top_n_sigma(row: Row, rng: np.random.Generator) -> Row:
        import torch

        vals = row[1]
        finite = vals > -math.inf
        count = finite.sum()
        mean = torch.where(finite, vals.double(), 0.0).sum() / count
        dev = torch.where(finite, vals - mean.float(), 0.0).double()  # float32 differences, as numpy's
        std = ((dev * dev).sum() / count).sqrt()
        cut = (vals.max().double() - n * std).float()
        cut = torch.where(count > 1, cut, -math.inf)  # one finite token or none: keep all (no sync to ask)
        return _cut(row, (vals >= cut) & finite)

    return top_n_sigma


def _xtc(probability: float, threshold: float) -> DeviceStage:
    def xtc(row: Row, rng: np.random.Generator) -> Row:
        import torch

        if rng.random() >= probability:  # drawn every step, fired or not (stages.make_xtc): decided on the host
            return row
        vals = row[1]
        m = vals.max()
        w = _weights(vals, m)
        z = w.sum(dtype=torch.float64)
        above = w >= (z * threshold).float()  # prob >= threshold, in float32 weights as numpy compares them
        least = torch.where(above, vals, math.inf).min()
        drop = above & (vals > least) & (above.sum() >= 2)  # only when two or more are above; the least stays
        return _cut(row, ~drop & (vals > -math.inf))

    return xtc


def _temperature(t: float) -> DeviceStage:
    t32 = float(np.float32(t))

    def temperature(row: Row, rng: np.random.Generator) -> Row:
        ids, vals = row
        return ids, vals / t32

    return temperature


def _make(name: str, s: SamplerSettings) -> DeviceStage:
    if name == "top_k":
        return _top_k(s.top_k)
    if name == "top_p":
        return _top_p(s.top_p)
    if name == "min_p":
        return _min_p(s.min_p)
    if name == "typical_p":
        return _typical_p(s.typical_p)
    if name == "top_n_sigma":
        return _top_n_sigma(s.top_n_sigma)
    if name == "xtc":
        return _xtc(s.xtc_probability, s.xtc_threshold)
    if name == "temperature":
        return _temperature(s.temperature)
    raise ValueError(f"stage {name!r} is not on the device")  # `supports` keeps such settings out


# ------------------------------------------------------------------------------------------------- the chain


class TorchChain:
    """`SamplerChain` for a torch row on its device, for the settings `supports` accepts.

    One chain per generation run, like the numpy one: its twin holds the seed and the random stream.

    Attributes:
        settings: what the chain was built from.
        seed: the twin's seed (settings.seed, or a fresh one), so a run replays on either chain.
        stage_names: the stages that run, in order (neutral ones left out), as the twin names them.
        twin: the numpy chain of the same settings, whose generator draws this chain's uniforms.
    """

    def __init__(self, settings: SamplerSettings, vocab: Vocabulary | None = None) -> None:
        """
        Args:
            settings: the sampler settings; `supports(settings)` must hold.
            vocab: the model's tokenizer, naming the reported alternatives (`TokenProb.text`).

        Raises:
            ValueError: the settings need a stage this chain does not have (the reason in words).
        """
        support = _support(settings)
        if not support:
            raise ValueError(f"the torch sampler chain cannot run these settings: {support.reason}")
        self.settings = settings
        self.twin = SamplerChain(settings, vocab)
        self.seed = self.twin.seed
        self._rng: np.random.Generator = self.twin._rng  # the twin's PCG64 stream: the same draws as the twin
        self._names = self.twin._names
        self._greedy = settings.greedy
        self.stage_names = self.twin.stage_names
        names = list(self.stage_names)
        if self._greedy:  # as the numpy chain: greedy may stop after the last stage that can move the argmax
            while names and names[-1] in ARGMAX_PRESERVING:
                names.pop()
        self._stages = tuple((name, _make(name, settings)) for name in names)

    @staticmethod
    def supports(settings: SamplerSettings) -> Support:
        """Whether this chain runs `settings` (truthy), else `reason` in words: use `SamplerChain` then."""
        return _support(settings)

    def pick(self, logits: torch.Tensor, *, top_n: int = 20, force_token: int | None = None) -> Pick:
        """`SamplerChain.pick` for a torch row (without history, recording or banned tokens): `choose`, `report`."""
        return self.choose(logits, force_token=force_token).report(top_n)

    def choose(self, logits: torch.Tensor, *, force_token: int | None = None) -> TorchChoice:
        """Run the stages and choose the token on the row's device; nothing crosses to the host here.

        Args:
            logits: (V,) raw logits, a torch tensor on any device (any float dtype; used as float32).
            force_token: take this token instead of drawing one; the random stream advances as if drawn.

        Raises:
            ValueError: a row that is not one non-empty 1-D tensor, or `force_token` outside it. A NaN or
                +inf row is found by `TorchChoice.report` (which the host reads anyway), not here.
        """
        import torch

        if not isinstance(logits, torch.Tensor) or logits.ndim != 1 or logits.numel() == 0:
            shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise ValueError(f"logits must be one non-empty torch row (V,), got {shape}")
        scores = logits.detach().to(torch.float32).contiguous()
        v = scores.numel()
        if force_token is not None and not 0 <= force_token < v:
            raise ValueError(f"force_token {force_token} is outside the vocabulary [0, {v})")
        row: Row = (None, scores)
        for _, stage in self._stages:
            row = stage(row, self._rng)
        ids, vals = row
        forced = None if force_token is None else torch.tensor(force_token, device=scores.device)
        if self._greedy:
            best = vals.argmax()  # the first of equal maxima: the lowest id, as np.argmax
            best = best if ids is None else ids[best]
            return TorchChoice(self._names, scores, best if forced is None else forced, force_token is not None,
                               best=best)
        m = vals.max()
        w = _weights(vals, m)
        cum = w.double().cumsum(0)
        u = self._rng.random()  # drawn even when forced: the stream stays aligned
        # inverse CDF: the first token, in id order, whose cumulative weight exceeds u * Z (distribution.Dist.draw)
        j = torch.searchsorted(cum, (cum[-1] * u).reshape(1), right=True).squeeze(0)
        last = w.numel() - 1 - torch.argmax((w.flip(0) > 0).to(torch.uint8))  # u * Z rounded up to Z
        j = torch.minimum(j, last)
        token = j if ids is None else ids[j]
        final = _Final(ids, vals, m, cum[-1], j)
        return TorchChoice(self._names, scores, token if forced is None else forced, force_token is not None,
                           final=final)


@dataclass(frozen=True, slots=True)
class _Final:
    """The distribution a seeded draw used, on the device: the row after the stages, its max and Z."""

    ids: Any  # torch.Tensor | None (None: the whole row)
    vals: Any
    m: Any
    z: Any  # float64 sum of the float32 weights
    drawn: Any  # the drawn token's position in `vals`


def _top(ids: torch.Tensor | None, vals: torch.Tensor, n: int, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The n most likely (ids, float64 log-probs), most likely first, ties to the lowest id (`Dist.top`)."""
    import torch

    size = vals.numel()
    n = min(n, size)
    if n <= 0:
        return vals.new_zeros(0, dtype=torch.int64), vals.new_zeros(0, dtype=torch.float64)
    if size > 256:  # a long row: the n-th largest value first, then only the entries at or above it
        kth = torch.topk(vals, n, sorted=False).values.min()
        local = ((vals >= kth) & (vals > -math.inf)).nonzero().squeeze(1)  # ascending: ties in id order
    else:
        local = (vals > -math.inf).nonzero().squeeze(1)
    cand = vals[local]
    order = torch.sort(cand, descending=True, stable=True).indices[:n]  # stable: among ties, the lower id first
    local = local[order]
    top_ids = local if ids is None else ids[local]
    return top_ids, vals[local].double() - lse


class TorchChoice:
    """A token `TorchChain.choose` chose, on the device, and what `report` needs to describe it.

    Attributes:
        token: the chosen token as a 0-d tensor on the row's device (for the next input without a transfer).
        forced: it was given (`force_token`), not drawn.
    """

    __slots__ = ("_best", "_final", "_names", "_scores", "forced", "token")

    def __init__(self, names: Any, scores: torch.Tensor, token: torch.Tensor, forced: bool,
                 best: torch.Tensor | None = None, final: _Final | None = None) -> None:
        self._names = names
        self._scores = scores
        self.token = token
        self.forced = forced
        self._best = best  # greedy: the argmax (None when sampling)
        self._final = final  # sampling: the distribution drawn from

    def report(self, top_n: int = 20) -> Pick:
        """The token's statistics as `Choice.report` gives them (no stage records): one transfer to the host."""
        import torch

        scores, token = self._scores, self.token
        m = scores.max()  # NaN if any entry is NaN
        d = scores - m
        e = d.exp()
        z = e.sum(dtype=torch.float64)
        ed = torch.where(e > 0, e.double() * d.double(), 0.0).sum()
        log_z = z.log()
        lse = m.double() + log_z
        s_tok = scores[token]
        head = [token.double(), m.double(), s_tok.double() - lse, (scores > s_tok).sum().double(),
                torch.clamp(log_z - ed / z, min=0.0)]
        model_ids, model_lp = _top(None, scores, top_n, lse)
        fin = self._final
        if fin is None:  # greedy: the argmax alone, at log-prob 0
            head.append(self._best.double())
            samp_ids = samp_lp = scores.new_zeros(0, dtype=torch.float64)
        else:
            lse_f = fin.m.double() + fin.z.log()
            if not self.forced:
                head.append(fin.vals[fin.drawn].double() - lse_f)
            elif fin.ids is None:
                head.append(fin.vals[token].double() - lse_f)
            else:  # a forced token: its score among the survivors, -inf when a stage removed it
                pos = torch.searchsorted(fin.ids, token.reshape(1)).clamp_(max=fin.ids.numel() - 1).squeeze(0)
                head.append(torch.where(fin.ids[pos] == token, fin.vals[pos].double() - lse_f, -math.inf))
            samp_ids, samp_lp = _top(fin.ids, fin.vals, top_n, lse_f)
        k_m, k_s = model_ids.numel(), samp_ids.numel()
        out = torch.cat([torch.stack(head), model_ids.double(), model_lp, samp_ids.double(), samp_lp]).tolist()
        tok, top, logprob, rank, entropy, last = out[:6]
        if not math.isfinite(top):
            raise ValueError(f"logits must be finite or -inf with at least one finite value (max is {top})")
        rest = out[6:]
        top_model = tuple((int(i), lp) for i, lp in zip(rest[:k_m], rest[k_m: 2 * k_m]))
        rest = rest[2 * k_m:]
        token_id = int(tok)
        if fin is None:
            best = int(last)
            sampler_logprob = 0.0 if token_id == best else -math.inf
            top_sampler = ((best, 0.0),) if top_n > 0 else ()
        else:
            sampler_logprob = last
            top_sampler = tuple((int(i), lp) for i, lp in zip(rest[:k_s], rest[k_s: 2 * k_s]))
        names = self._names
        return Pick(token_id=token_id, logprob=logprob, sampler_logprob=sampler_logprob, rank=int(rank),
                    entropy=entropy, top_model=names(top_model), top_sampler=names(top_sampler), stages=None,
                    forced=self.forced)

    def final_distribution(self) -> np.ndarray:
        """(V,) float32 log-probs the token was drawn from, as `Choice.final_distribution`: a full-row transfer,
        for tests and research code, not the per-token path."""
        import torch

        v = self._scores.numel()
        out = torch.full((v,), -math.inf, dtype=torch.float32, device=self._scores.device)
        fin = self._final
        if fin is None:
            out[self._best] = 0.0
            return out.cpu().numpy()
        lp = fin.vals - (fin.m.double() + fin.z.log()).float()  # float32, as numpy's vals - float32(lse)
        if fin.ids is None:
            return lp.cpu().numpy()
        out[fin.ids] = lp
        return out.cpu().numpy()
