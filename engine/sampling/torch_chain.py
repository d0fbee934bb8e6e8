"""The sampler chain on torch tensors: the stages, the draw and the per-token report on the logits' device.

When a torch backend's logits are a tensor on an accelerator, copying the whole (V,) row to the host every
token (262k floats for Gemma 3) and running the numpy chain (engine.sampling.chain) there costs more than the
step itself on a fast GPU (issue 49 item 1). `TorchChain` runs the same chain with torch ops on the row's own
device, and only the report's few dozen numbers cross to the host, in one `.tolist()` a token
(`TorchChoice.report`). A torch CPU tensor is a device too: that is how the tests check it against the numpy
chain without a GPU (tests/engine/test_torch_chain.py).

The numpy chain stays the reference and the path for every other backend. This module runs every built-in
stage of it, a request's constraint included, in the user's order, each by its numpy stage's arithmetic
(engine.sampling.stages, shaping.py, dry.py, adaptive.py): float32 scores, float32 weights `exp(s - max)`
summed in float64, the same boundary rules (ties at a cut all kept, the token that crosses top-p's mass kept),
and the draw an inverse CDF over the survivors in token-id order. Randomness comes from a numpy twin: a
`SamplerChain` of the same settings whose PCG64 generator draws the uniforms (XTC's, then the draw's, in the
same order as the numpy chain), which go to the device as plain floats; the same seed gives the same tokens on
both chains. What is read on the host:
- the history's ids and counts for the penalties, and DRY's amounts (by dry.py's own code), as small arrays;
- mirostat's mu and adaptive-p's moving average: their state is the host's, learned from the picked token's
  probability, which the device computes at the pick and the host reads at the next one;
- mirostat 1's top 100 scores (its k), and, for dynamic temperature's entropy and adaptive-p's sum, up to 64k
  survivors (usually a few dozen), whose float32 sums must be llama.cpp's, in its order;
- a constraint: llguidance makes its mask on the host, which crosses as V bools; its step's record (allowed,
  mass kept, the ten most likely removed tokens) is read back, and the parser takes the token there.

Not here, and said so instead of a different answer: custom stages (Python code on numpy rows) and banned
strings (they step the answer back and ban tokens per pick). `TorchChain.supports(settings)` is then false
with the reason in words, `TorchChain(settings)` raises, and the caller uses `SamplerChain`. Per-stage records
(`record_stages`) keep each stage's row on the device, and the report makes the records on the host with the
numpy chain's code from those rows and the model's row (`pick.stage_records`): the one path here that
copies a whole row to the host.

Once a filter has run, the row is carried as its survivors (ascending ids and their scores), as the numpy
chain does, so the stages after top-k see a few dozen entries. That compaction has a data-dependent size: on
CUDA each one is an implicit synchronisation (no data moves but the count). A fixed-shape form, for a CUDA
graph of the whole step, is later work.

The caller is the decode loop (engine/decode/), through the `SamplesOnDevice` capability: a torch backend
whose rows are on an accelerator (or told to, `TorchBackend(sample_on_device=True)`) hands each answer whose
settings `supports` accepts an `OnDeviceChain` and forwards that leave the row on the device
(engine/backends/torch/device_rows.py). Every other answer, and the loom's and the server's batched rows, stay
on the numpy chain.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.sampling.chain import SamplerChain
from engine.sampling.distribution import Dist, TopList
from engine.sampling.dry import DryPenalties, Vocabulary
from engine.sampling.grammar import TOP_DISALLOWED, GrammarStage, GrammarStep
from engine.sampling.pick import Pick, StageStats, Step, stage_records
from engine.sampling.registry import ARGMAX_PRESERVING, STAGE_ROWS, dry_penalties, logit_bias_tokens, stage_active
from engine.sampling.adaptive import _EXACT_SUM_MAX, _INV_WIDTH, _PEAK, _SHARPNESS
from engine.sampling.settings import SamplerSettings
from engine.sampling.shaping import _EXACT_ENTROPY_MAX, _MIN_DYNAMIC_TEMPERATURE, _llamacpp_normalized_entropy
from engine.sampling.stage_row import BuildContext

if TYPE_CHECKING:  # torch is imported inside the functions: importing the engine never needs it
    import torch

# The stages this module runs on the device; every other active stage sends the caller to the numpy chain.
COVERED: frozenset[str] = frozenset({
    "logit_bias", "penalties", "dry", "top_n_sigma", "smoothing", "top_k", "typical_p", "top_p", "min_p", "xtc",
    "temperature", "mirostat", "adaptive_p",
})

_NOT_COVERED_WHY: dict[str, str] = {}  # (every built-in stage is covered; the grammar's is given as `constraint`)


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
        elif name not in COVERED and stage_active(name, settings):
            reasons.append(_NOT_COVERED_WHY.get(name, f"{name} is not on the device yet"))
    if settings.banned_strings:
        reasons.append("banned strings step the answer back and ban tokens per pick, which this chain does not take")
    if reasons:
        return Support(False, "; ".join(reasons) + " (use engine.sampling.chain.SamplerChain)")
    return Support(True)


# ------------------------------------------------------------------------------------------------ the stages
# A row is (ids, vals): ids None while it is the whole (V,) row (position = token id; -inf = removed), else the
# survivors' ascending ids with their finite scores. A stage takes the row and a `_Ctx` (the twin's generator,
# the model row's head).

Row = tuple["torch.Tensor | None", "torch.Tensor"]

class _Head:
    """The entries of the model's (V,) row near its max, found when first asked, as `engine.sampling.head.RowHead`.

    Shared by top-k's cut (when top-k sees the model's own row), the report's top N and the rank, so that each
    looks at a few hundred entries instead of V. Exact: every entry at or above the head's floor is in it, in
    ascending id order. The row is read whole once, for the maxima of its blocks of `_BLOCK` entries (its max
    falls out of them). For a head of n entries the floor is the n-th largest block maximum: n blocks reach it,
    so at least n entries do, and only the blocks that reach it are looked inside. One try, where
    `RowHead` widens a reach until it holds enough: on the CPU each torch op costs several numpy ones (a
    comparison over 262k entries ~6x), so the fewer whole-row passes and ops the better. The head's size is a
    shape the host reads (a sync on CUDA, no transfer).
    """

    __slots__ = ("_block_ids", "_blocks", "_bmax", "floor", "ids", "m", "row", "vals")

    def __init__(self, row: torch.Tensor, block_ids: torch.Tensor) -> None:
        import torch

        self.row = row
        self._block_ids = block_ids  # (nb, _BLOCK) the ids of each block's entries
        v = row.numel()
        nb = -(-v // _BLOCK)
        if v % _BLOCK:  # the last block padded with -inf
            padded = torch.full((nb * _BLOCK,), -math.inf, dtype=row.dtype, device=row.device)
            padded[:v] = row
            self._blocks = padded.view(nb, _BLOCK)
        else:
            self._blocks = row.view(nb, _BLOCK)
        self._bmax = self._blocks.amax(dim=1)
        self.m = self._bmax.max()  # the row's max; NaN if any entry is NaN (the report says so)
        self.ids: torch.Tensor | None = None  # None with `vals` the whole row: a flat row, or not looked at yet
        self.vals: torch.Tensor | None = None
        self.floor: torch.Tensor | float = math.inf  # every entry >= floor is in the head

    def ensure(self, n: int) -> None:
        """Make the head hold at least `n` entries (or be the whole row)."""
        import torch

        if self.vals is not None and self.vals.numel() >= n:
            return
        nb = self._bmax.numel()
        if 0 < n and n * 4 <= nb:
            floor = torch.topk(self._bmax, n).values[n - 1]
            blocks = (self._bmax >= floor).nonzero().squeeze(1)  # >= n of them (ties)
            if blocks.numel() * 4 <= nb:  # else most of the row (a flat one, or -inf blocks): take it whole
                cand = self._blocks.index_select(0, blocks).reshape(-1)
                local = (cand >= floor).nonzero().squeeze(1)
                if local.numel() >= n:  # fewer only with a NaN in the row, which the report refuses
                    self.ids = self._block_ids.index_select(0, blocks).view(-1)[local]
                    self.vals, self.floor = cand[local], floor
                    return
        self.ids, self.vals, self.floor = None, self.row, -math.inf

    def kth_largest(self, k: int) -> torch.Tensor:
        """The k-th largest score of the row (0 < k < V), as a 0-d tensor."""
        import torch

        self.ensure(k)
        assert self.vals is not None
        return torch.topk(self.vals, k).values[k - 1]


_EMPTY = np.zeros(0, dtype=np.int64)

# Blocks of the model's row whose maxima place its head (`_Head`): 192 of them at 49k, 1,024 at 262k.
_BLOCK = 256


@dataclass(frozen=True, slots=True)
class _Ctx:
    rng: np.random.Generator
    head: _Head
    history: np.ndarray  # (T,) token ids so far, prompt included, on the host (the penalties read it)


DeviceStage = Callable[[Row, _Ctx], Row]


def _cut(row: Row, keep: torch.Tensor) -> Row:
    """The row without the entries where `keep` (a bool tensor over `vals`) is False.

    A whole row becomes its kept entries (ascending ids); survivors already gathered get -inf where they are
    cut (one op where gathering them again is four: on the CPU each torch op's fixed cost is most of a pick).
    Removed tokens (-inf) may thus stay among the survivors; they weigh 0 in every sum, the draw passes over
    them and the report leaves them out, as they do in a whole row.
    """
    import torch

    ids, vals = row
    if ids is None:
        kept = keep.nonzero().squeeze(1)
        return kept, vals[kept]
    return ids, torch.where(keep, vals, -math.inf)


def _weights(vals: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """float32 `exp(s - m)`, as numpy's `np.exp(vals - m)` (0 for -inf)."""
    return (vals - m).exp_()


def _top_k(k: int) -> DeviceStage:
    def top_k(row: Row, ctx: _Ctx) -> Row:
        import torch

        ids, vals = row
        if k >= vals.numel():
            return row
        head = ctx.head
        if ids is None and vals is head.row:  # the model's own row: cut within its head
            kth = head.kth_largest(k)  # the k-th largest; every tie with it is kept
            if head.ids is not None:
                assert head.vals is not None
                kept = (head.vals >= kth).nonzero().squeeze(1)  # the head is finite: its floor is
                return head.ids[kept], head.vals[kept]
        else:
            kth = torch.topk(vals, k).values[k - 1]
        return _cut(row, vals >= kth)

    return top_k


def _top_p(p: float) -> DeviceStage:
    def top_p(row: Row, ctx: _Ctx) -> Row:
        import torch

        vals = row[1]
        desc = torch.sort(vals, descending=True).values
        cum = _weights(desc, desc[0]).to(torch.float64).cumsum(0)  # Z is its last entry
        # transformers' rule forwards: the token whose mass crosses the target is kept too (stages._prefix_end)
        j = torch.searchsorted(cum, cum[-1:] * p, right=False).clamp_(max=desc.numel() - 1)
        return _cut(row, vals >= desc[j])  # -inf only when rounding kept the target out of reach: keep all

    return top_p


def _min_p(p: float) -> DeviceStage:
    log_p = float(np.float32(math.log(p)))  # prob >= p * top  <=>  s >= max + log p, in float32 as numpy

    def min_p(row: Row, ctx: _Ctx) -> Row:
        vals = row[1]
        return _cut(row, vals >= vals.max() + log_p)

    return min_p


def _typical_p(p: float) -> DeviceStage:
    def typical_p(row: Row, ctx: _Ctx) -> Row:
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
    def top_n_sigma(row: Row, ctx: _Ctx) -> Row:
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
    def xtc(row: Row, ctx: _Ctx) -> Row:
        import torch

        if ctx.rng.random() >= probability:  # drawn every step, fired or not (stages.make_xtc): decided on the host
            return row
        vals = row[1]
        m = vals.max()
        w = _weights(vals, m)
        z = w.sum(dtype=torch.float64)
        above = w >= (z * threshold).float()  # prob >= threshold, in float32 weights as numpy compares them
        least = torch.where(above, vals, math.inf).min()
        drop = above & (vals > least) & (above.sum() >= 2)  # only when two or more are above; the least stays
        return _cut(row, ~drop)

    return xtc


def _penalties(repetition: float, presence: float, frequency: float, last_n: int) -> DeviceStage:
    """`stages.make_penalties` on the device: the history's distinct ids and counts are found on the host (a
    few dozen ids, which the host has), and only their scores change on the device, in float32 as there."""
    rep = float(np.float32(repetition))
    additive = presence != 0 or frequency != 0

    def penalties(row: Row, ctx: _Ctx) -> Row:
        import torch

        ids, vals = row
        hist = ctx.history[-last_n:] if last_n > 0 else ctx.history
        hist = hist[(hist >= 0) & (hist < ctx.head.row.numel())]
        if last_n == 0 or hist.size == 0:
            return row
        seen, counts = np.unique(hist, return_counts=True)
        seen_t = torch.from_numpy(seen).to(vals.device)

        def penalised(sel: torch.Tensor, sub: np.ndarray | None) -> torch.Tensor:
            if repetition != 1:
                sel = torch.where(sel < 0, sel * rep, sel / rep)
            if sub is not None:
                sel = sel - torch.from_numpy(sub).to(vals.device)
            return sel

        sub = (presence + frequency * counts).astype(np.float32) if additive else None
        if ids is None:  # the whole row: the seen ids' scores, changed in place of a copy
            out = vals.clone()
            out[seen_t] = penalised(vals[seen_t], sub)
            return None, out
        # survivors: each one's place among the seen ids, so no index is written twice (a seen token a stage
        # removed is not among them: it stays removed, as its -inf does in a whole row)
        pos = torch.searchsorted(seen_t, ids).clamp_(max=seen.size - 1)
        hit = seen_t[pos] == ids
        sel = penalised(vals, None)
        if sub is not None:
            sel = sel - torch.from_numpy(sub).to(vals.device)[pos]
        return ids, torch.where(hit, sel, vals)

    return penalties


def _logit_bias(token_ids: list[int], biases: list[float]) -> DeviceStage:
    """`shaping.make_logit_bias` on the device: each bias added to its token's score (an id named twice gets
    both, in turn, as `np.add.at` adds them); a bias of -inf removes the token."""
    ids_np = np.asarray(token_ids, dtype=np.int64)
    bias_np = np.asarray(biases, dtype=np.float32)
    on: dict[Any, tuple[torch.Tensor, torch.Tensor]] = {}  # the two tensors per device, made once

    def logit_bias(row: Row, ctx: _Ctx) -> Row:
        import torch

        ids, vals = row
        v = ctx.head.row.numel()
        if ids_np.size and int(ids_np.max()) >= v:
            raise ValueError(f"logit_bias names token {int(ids_np.max())}, but this model's vocabulary has {v} tokens")
        if vals.device not in on:
            on[vals.device] = (torch.from_numpy(ids_np).to(vals.device), torch.from_numpy(bias_np).to(vals.device))
        return _add_at(row, *on[vals.device])

    return logit_bias


def _add_at(row: Row, at: torch.Tensor, amounts: torch.Tensor) -> Row:
    """The row with `amounts` added to the scores of tokens `at` (an id named twice gets both, in turn); on
    survivors, a token a stage removed stays removed (-inf plus a finite amount)."""
    import torch

    ids, vals = row
    out = vals.clone()
    if ids is None:
        return None, out.index_add_(0, at, amounts)
    pos = torch.searchsorted(ids, at).clamp_(max=ids.numel() - 1)
    hit = torch.take(ids, pos) == at
    return ids, out.index_add_(0, pos, torch.where(hit, amounts, 0.0))


def _dry(penalties: DryPenalties) -> DeviceStage:
    """DRY on the device: which tokens lose how much is found from the history on the host, by the numpy
    stage's own code (`dry.make_dry_penalties`); only those tokens' scores change on the device."""

    def dry(row: Row, ctx: _Ctx) -> Row:
        import torch

        found = penalties(ctx.history, ctx.head.row.numel())
        if found is None:
            return row
        tokens, penalty = found
        device = row[1].device
        return _add_at(row, torch.from_numpy(tokens).to(device), torch.from_numpy(-penalty).to(device))

    return dry


def _smoothing(factor: float, curve: float) -> DeviceStage:
    """`shaping.make_smoothing` on the device, in float32 as there (-inf entries stay -inf)."""
    k = float(np.float32((3.0 - curve) / 2.0 * factor))
    c = float(np.float32((curve - 1.0) / 2.0 * factor))

    def smoothing(row: Row, ctx: _Ctx) -> Row:
        import torch

        ids, vals = row
        m = vals.max()
        diff = vals - m
        out = -(k * diff * diff) + c * diff * diff * diff + m
        return ids, torch.where(vals > -math.inf, out, -math.inf)

    return smoothing


class _DeviceMirostat:
    """Mirostat 1 or 2 (`adaptive.Mirostat`, `Mirostat2`) on the device, with its `mu` on the host.

    After each pick `mu` learns from the picked token's probability under what this stage kept, as the numpy
    stage's `accept` does. The device computes that log-probability when the token is chosen (`accept`), and
    the host reads it at the next pick (`settle`), so choosing a token waits for no transfer. Mirostat 1 also
    reads its row's top 100 scores on the host each pick: its k comes from them by the numpy stage's arithmetic.
    """

    def __init__(self, version: int, tau: float, eta: float, m: int = 100) -> None:
        self.version, self.tau, self.eta, self.m = version, tau, eta, m
        self.mu = np.float32(2.0 * tau)
        self._kept: Row | None = None  # the last output, until its token is accepted
        self._pending: torch.Tensor | None = None  # the picked token's log-prob under it (0-d, float64)

    def settle(self) -> None:
        """Fold the last accepted token into `mu` (one host read)."""
        if self._pending is None:
            return
        lp = float(self._pending)
        self._pending = None
        p = math.exp(lp) if lp != -math.inf else 0.0
        if p > 0:  # a forced token the stage had cut says nothing about its target
            self.mu = np.float32(self.mu - self.eta * (-math.log2(p) - self.tau))

    def __call__(self, row: Row, ctx: _Ctx) -> Row:
        import torch

        self.settle()
        ids, vals = row
        if self.version == 2:
            m = vals.max()
            lse = m.double() + _weights(vals, m).double().sum().log()
            # -log2(p) <= mu  <=>  s - lse >= -mu * ln 2; the top token always survives
            cut = torch.minimum(lse - float(self.mu) * math.log(2.0), m.double()).float()
            out = _cut(row, vals >= cut)
        else:
            out = self._mirostat1(row, ctx)
        self._kept = out
        return out

    def _mirostat1(self, row: Row, ctx: _Ctx) -> Row:
        import torch

        vals = row[1]
        n = int((vals > -math.inf).sum())  # survivors cut in place keep -inf entries (`_cut`)
        if n <= 1:
            return row
        n_top = min(self.m, n)
        top = torch.topk(vals, n_top).values.double().cpu().numpy()  # descending, finite
        i = np.arange(n_top - 1, dtype=np.float64)
        t = np.log((i + 2) / (i + 1))
        b = top[:-1] - top[1:]  # log(p_i / p_(i+1))
        s_hat = float((t * b).sum() / (t * t).sum())
        eps = s_hat - 1.0
        v = ctx.head.row.numel()  # llama.cpp uses the vocabulary size here, not the survivors
        with np.errstate(all="ignore"):
            k = (eps * 2.0 ** float(self.mu) / (1.0 - v ** (-eps))) ** (1.0 / s_hat)
        k_int = max(int(k), 1) if math.isfinite(k) and k < v else v
        if k_int >= n:
            return row
        kth = torch.topk(vals, k_int).values[k_int - 1]
        return _cut(row, vals >= kth)

    def accept(self, token: torch.Tensor) -> None:
        import torch

        if self._kept is None:  # it did not run in this pick
            return
        ids, vals = self._kept
        m = vals.max()
        lse = m.double() + _weights(vals, m).double().sum().log()
        if ids is None:
            s = torch.take(vals, token)
        else:
            pos = torch.searchsorted(ids, token.reshape(1)).clamp_(max=ids.numel() - 1).squeeze(0)
            s = torch.where(torch.take(ids, pos) == token, torch.take(vals, pos), -math.inf)
        self._pending = s.double() - lse
        self._kept = None

    def state(self) -> float:
        self.settle()
        return float(self.mu)

    def restore(self, state: float) -> None:
        self.mu, self._pending, self._kept = np.float32(state), None, None


def _finite(row: Row) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The row's finite entries as (ids, scores): survivors cut in place keep -inf entries (`_cut`)."""
    ids, vals = row
    finite = (vals > -math.inf).nonzero().squeeze(1)
    if finite.numel() == vals.numel():
        return ids, vals
    return (finite if ids is None else ids[finite]), vals[finite]


def _dynamic_temperature(t: float, delta: float, exponent: float) -> DeviceStage:
    """`shaping.make_temperature_ext` (llama.cpp's dynamic temperature) on the device.

    The normalized entropy of the survivors is found as the numpy stage finds it: up to 64k survivors with
    llama.cpp's float32 sums in its order (`shaping._llamacpp_normalized_entropy`, on the host: the
    survivors cross, usually a few dozen after the filters), beyond that in float64 on the device. The
    temperature that comes of it is a host number, then divides the row on the device.
    """
    lo = max(np.float32(0.0), np.float32(t) - np.float32(delta))
    hi = np.float32(t) + np.float32(delta)
    exp32 = np.float32(exponent)

    def temperature(row: Row, ctx: _Ctx) -> Row:
        import torch

        ids, vals = _finite(row)
        n = vals.numel()
        if n <= 1:
            return row
        if n <= _EXACT_ENTROPY_MAX:
            normalized = _llamacpp_normalized_entropy(vals.cpu().numpy())
        else:
            m = vals.max()
            d = vals - m
            e = d.exp()
            z = e.double().sum()
            ed = (d * e).double().sum()
            normalized = np.float32(max(float(z.log() - ed / z), 0.0) / math.log(n))
        dyn = np.float32(lo + (hi - lo) * np.float32(normalized**exp32))
        if dyn < _MIN_DYNAMIC_TEMPERATURE:  # llama.cpp keeps only the (first) top token
            best = vals.argmax().reshape(1)
            return (best if ids is None else ids[best]), vals[best]
        return ids, vals / float(dyn)  # (the finite entries: a removed token stays removed)

    return temperature


class _DeviceAdaptiveP:
    """Adaptive-p (`adaptive.AdaptiveP`, llama.cpp's) on the device, its moving average on the host.

    The survivors' probabilities are normalized as the numpy stage does: up to 64k of them by llama.cpp's
    float32 sum in its order (on the host: the survivors cross, usually a few dozen), beyond in float64 on
    the device. The picked token's probability entering the stage is computed on the device at the pick and
    read by the host at the next one (`settle`), as mirostat's.
    """

    def __init__(self, target: float, decay: float) -> None:
        self.target, self.decay = target, decay
        self.weighted_sum = np.float32(target / (1.0 - decay))
        self.total_weight = np.float32(1.0 / (1.0 - decay))
        self._seen: tuple[torch.Tensor | None, torch.Tensor] | None = None  # (ids, probs) entering, this pick
        self._pending: torch.Tensor | float | None = None  # the picked token's probability entering

    def settle(self) -> None:
        if self._pending is None:
            return
        p = float(self._pending)
        self._pending = None
        decay = np.float32(self.decay)  # float32 arithmetic, as llama.cpp
        self.weighted_sum = np.float32(p) + decay * self.weighted_sum
        self.total_weight = np.float32(1.0) + decay * self.total_weight

    def __call__(self, row: Row, ctx: _Ctx) -> Row:
        import torch

        self.settle()
        ids, vals = _finite(row)
        m = vals.max()
        probs = (vals - m).exp()
        if probs.numel() <= _EXACT_SUM_MAX:  # llama.cpp's float32 sum, one term after another (host)
            total = float(np.cumsum(probs.cpu().numpy(), dtype=np.float32)[-1])
        else:
            total = float(np.float32(float(probs.double().sum())))
        probs = probs / total
        self._seen = (ids, probs)
        target = min(max(self.target, 0.0), 1.0)
        adapted = float(np.float32(min(max(2.0 * target - float(self.weighted_sum) / float(self.total_weight), 0.0),
                                       1.0)))
        d = ((probs - adapted) * float(_INV_WIDTH)).abs_()
        new = d * float(_SHARPNESS)  # ((10 * d) * d) / (1 + d): llama.cpp's order of operations
        new = new * d / (d + 1.0)
        return ids, float(_PEAK) - new

    def accept(self, token: torch.Tensor) -> None:
        import torch

        if self._seen is None:  # it did not run in this pick: the numpy stage folds in a probability of 0
            self._pending = 0.0
            return
        ids, probs = self._seen
        if ids is None:
            self._pending = torch.take(probs, token)
        else:
            pos = torch.searchsorted(ids, token.reshape(1)).clamp_(max=ids.numel() - 1).squeeze(0)
            self._pending = torch.where(torch.take(ids, pos) == token, torch.take(probs, pos), 0.0)
        self._seen = None

    def state(self) -> tuple[float, float]:
        self.settle()
        return float(self.weighted_sum), float(self.total_weight)

    def restore(self, state: tuple[float, float]) -> None:
        self.weighted_sum, self.total_weight = np.float32(state[0]), np.float32(state[1])
        self._pending = self._seen = None


class _DeviceGrammar:
    """A request's constraint (`grammar.GrammarStage`) on a device row.

    llguidance makes the mask on the host, as always; it crosses as V bools and cuts the row on the device.
    The step's record for the event (how many tokens were allowed, the mass they kept, the most likely removed
    ones) is made from a few numbers read back, as `GrammarStage.__call__` makes it; the run's state (the
    parser, the log mass kept) is the numpy stage's own object, which the answer's row reads too.
    """

    def __init__(self, stage: GrammarStage) -> None:
        self.stage = stage

    def __call__(self, row: Row, ctx: _Ctx) -> Row:
        import torch

        stage, run = self.stage, self.stage.run
        ids, vals = row
        v = ctx.head.row.numel()
        forced = run.fast_forward()
        if forced is not None and not (forced < v and _score(row, forced) > -math.inf):
            forced = None
        if forced is not None:
            keep = np.zeros(v, dtype=np.bool_)
            keep[forced] = True
            note = "fast-forward: the grammar forces this token"
        else:  # the mask reads only the row's size (a server's mask its candidates: not a torch row's)
            keep = run.allowed(np.broadcast_to(np.float32(0.0), (v,)))
            note = ""
        keep_t = torch.from_numpy(np.ascontiguousarray(keep)).to(vals.device)
        live = (keep_t if ids is None else keep_t[ids]) & (vals > -math.inf)
        removed = ~live & (vals > -math.inf)
        top = vals.max()
        w = _weights(vals, top)
        n_f, count_f, top_f, z, kept = torch.stack([
            live.sum().double(), removed.sum().double(), top.double(), w.double().sum(),
            torch.where(live, w, 0.0).double().sum()]).tolist()  # one read
        n, count = int(n_f), int(count_f)
        lse = top_f + math.log(z)
        disallowed = self._top_removed(ids, vals, removed, count, lse)
        if n == 0:
            run.fail(stage.dead_end_reason(keep))
            stage.last = GrammarStep(0, 0.0, disallowed, False, run.note)
            return row
        mass = min(max(kept / z, 0.0), 1.0)
        run.record(math.log(mass) if mass > 0 else -math.inf)
        if n == 1 and not note:
            note = "the only token the grammar allows"
        notes = "; ".join(x for x in (note, run.note) if x)
        stage.last = GrammarStep(n, mass, disallowed, n == 1, notes)
        return row if count == 0 else _cut(row, live)

    @staticmethod
    def _top_removed(ids: torch.Tensor | None, vals: torch.Tensor, removed: torch.Tensor, count: int,
                     lse: float) -> TopList:
        """`grammar._top_removed`: the most likely removed tokens, ties by the lower id, as (id, log-prob)."""
        import torch

        if count == 0:
            return ()
        want = min(TOP_DISALLOWED, count)
        gone = torch.where(removed, vals, -math.inf)
        kth = torch.topk(gone, want).values[want - 1]
        cand = ((gone >= kth) & removed).nonzero().squeeze(1)  # every tie with the last one, in id order
        cand_ids = (cand if ids is None else ids[cand]).tolist()
        cand_vals = vals[cand].tolist()
        ranked = sorted(zip(cand_ids, cand_vals), key=lambda t: (-t[1], t[0]))[:want]
        return tuple((int(t), s - lse) for t, s in ranked)

    def accept(self, token: torch.Tensor) -> None:
        self.stage.accept(int(token))  # the parser moves on the host: the token's one read

    def state(self) -> tuple[int, int]:
        return self.stage.state()

    def restore(self, state: tuple[int, int]) -> None:
        self.stage.restore(state)


def _score(row: Row, token: int) -> float:
    """The row's score of `token` (-inf when removed): one read."""
    import torch

    ids, vals = row
    if ids is None:
        return float(vals[token])
    pos = torch.searchsorted(ids, torch.tensor([token], device=ids.device)).clamp_(max=ids.numel() - 1)
    return float(torch.where(ids[pos] == token, vals[pos], -math.inf))


def _temperature(t: float) -> DeviceStage:
    t32 = float(np.float32(t))

    def temperature(row: Row, ctx: _Ctx) -> Row:
        ids, vals = row
        return ids, vals / t32

    return temperature


def _make(name: str, s: SamplerSettings, vocab: Vocabulary | None, constraint: GrammarStage | None) -> DeviceStage:
    if name == "grammar":
        assert constraint is not None  # the twin names the stage only with a constraint
        return _DeviceGrammar(constraint)
    if name == "logit_bias":
        return _logit_bias(*logit_bias_tokens(s, BuildContext(vocab, None)))
    if name == "smoothing":
        return _smoothing(s.smoothing_factor, s.smoothing_curve)
    if name == "dry":
        return _dry(dry_penalties(s, BuildContext(vocab, None)))
    if name == "mirostat":
        return _DeviceMirostat(s.mirostat, s.mirostat_tau, s.mirostat_eta)
    if name == "adaptive_p":
        return _DeviceAdaptiveP(s.adaptive_target, s.adaptive_decay)
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
        if s.dynatemp_range > 0:
            return _dynamic_temperature(s.temperature, s.dynatemp_range, s.dynatemp_exponent)
        return _temperature(s.temperature)
    if name == "penalties":
        return _penalties(s.repetition_penalty, s.presence_penalty, s.frequency_penalty, s.penalty_last_n)
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

    def __init__(self, settings: SamplerSettings, vocab: Vocabulary | None = None,
                 constraint: GrammarStage | None = None) -> None:
        """
        Args:
            settings: the sampler settings; `supports(settings)` must hold.
            vocab: the model's tokenizer, naming the reported alternatives (`TokenProb.text`).
            constraint: this run's constraint stage (engine.sampling.grammar.grammar_stage), as
                `SamplerChain`'s: run first unless the order names "grammar".

        Raises:
            ValueError: the settings need a stage this chain does not have (the reason in words).
        """
        support = _support(settings)
        if not support:
            raise ValueError(f"the torch sampler chain cannot run these settings: {support.reason}")
        self.settings = settings
        self.twin = SamplerChain(settings, vocab, constraint=constraint)
        self.seed = self.twin.seed
        self._rng: np.random.Generator = self.twin._rng  # the twin's PCG64 stream: the same draws as the twin
        self._names = self.twin._names
        self._greedy = settings.greedy
        self.stage_names = self.twin.stage_names
        # Recording runs every stage; greedy without recording may stop after the last stage that can move the
        # argmax, as the numpy chain does.
        self._all_stages = tuple((name, _make(name, settings, vocab, constraint)) for name in self.stage_names)
        keep = len(self._all_stages)
        if self._greedy:
            while keep and self._all_stages[keep - 1][0] in ARGMAX_PRESERVING:
                keep -= 1
        self._stages = self._all_stages[:keep]
        self._stateful = tuple(stage for _, stage in self._all_stages
                               if isinstance(stage, (_DeviceGrammar, _DeviceMirostat, _DeviceAdaptiveP)))
        self._buffers = _Buffers()

    def state(self) -> tuple[object, ...]:
        """The run's stage state (mirostat's mu), for `restore`, as `SamplerChain.state`."""
        return tuple(obj.state() for obj in self._stateful)

    def restore(self, state: tuple[object, ...]) -> None:
        for obj, st in zip(self._stateful, state, strict=True):
            obj.restore(st)  # type: ignore[arg-type]  # each stage's own state() value

    def _accept(self, token: torch.Tensor) -> None:
        for obj in self._stateful:  # those that ran in this pick: greedy may have stopped before them
            obj.accept(token)

    @staticmethod
    def supports(settings: SamplerSettings) -> Support:
        """Whether this chain runs `settings` (truthy), else `reason` in words: use `SamplerChain` then."""
        return _support(settings)

    def pick(self, logits: torch.Tensor, *, top_n: int = 20, force_token: int | None = None,
             record_stages: bool = False, history: np.ndarray | None = None) -> Pick:
        """`SamplerChain.pick` for a torch row (without banned tokens): `choose`, then `report`."""
        return self.choose(logits, force_token=force_token, record_stages=record_stages,
                           history=history).report(top_n)

    def choose(self, logits: torch.Tensor, *, force_token: int | None = None,
               record_stages: bool = False, history: np.ndarray | None = None) -> TorchChoice:
        """Run the stages and choose the token on the row's device.

        No value crosses to the host here: the token stays a 0-d tensor (`TorchChoice.token`). The sizes of
        the head and of each cut are read by the host as shapes (`nonzero`), a synchronisation on CUDA.
        The random stream moves here (XTC's number, the draw's), as in `SamplerChain.choose`.

        Args:
            logits: (V,) raw logits, a torch tensor on any device (any float dtype; used as float32).
            force_token: take this token instead of drawing one; the random stream advances as if drawn.
            record_stages: keep each stage's row (on the device) for the report's stage records.
            history: (T,) token ids so far, prompt included, for the penalties (None: none yet).

        Raises:
            ValueError: a row that is not one non-empty 1-D tensor, or `force_token` outside it. A NaN or
                +inf row is found by `TorchChoice.report` (which the host reads anyway), not here.
        """
        import torch

        with torch.inference_mode():  # no autograd bookkeeping: each op's fixed cost is most of a pick on the CPU
            return self._choose(logits, force_token, record_stages, history)

    def _choose(self, logits: torch.Tensor, force_token: int | None, record: bool = False,
                history: np.ndarray | None = None) -> TorchChoice:
        import torch


        if not isinstance(logits, torch.Tensor) or logits.ndim != 1 or logits.numel() == 0:
            shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise ValueError(f"logits must be one non-empty torch row (V,), got {shape}")
        scores = logits.detach() if logits.requires_grad else logits
        if scores.dtype != torch.float32 or not scores.is_contiguous():
            scores = scores.to(torch.float32).contiguous()
        v = scores.numel()
        if force_token is not None and not 0 <= force_token < v:
            raise ValueError(f"force_token {force_token} is outside the vocabulary [0, {v})")
        head = _Head(scores, self._buffers.ready(scores).block_ids)
        ctx = _Ctx(self._rng, head, _EMPTY if history is None else np.asarray(history, dtype=np.int64))
        row: Row = (None, scores)
        steps: list[tuple[str, Row | None]] | None = [] if record else None
        for name, stage in self._all_stages if record else self._stages:
            after = stage(row, ctx)
            if steps is not None:  # None: the stage changed nothing (it handed the row back)
                steps.append((name, None if after is row else after))
            row = after
        ids, vals = row
        forced = None if force_token is None else torch.tensor(force_token, device=scores.device)
        if self._greedy:
            best = vals.argmax()  # the first of equal maxima: the lowest id, as np.argmax
            best = best if ids is None else torch.take(ids, best)  # take: no sync, where ids[best] reads best
            self._accept(best if forced is None else forced)
            return TorchChoice(self._names, self._buffers, head, best if forced is None else forced, force_token is not None,
                               best=best, steps=steps)
        m = vals.max()
        w = _weights(vals, m)
        cum = w.double().cumsum(0)
        u = self._rng.random()  # drawn even when forced: the stream stays aligned
        # inverse CDF: the first token, in id order, whose cumulative weight exceeds u * Z (distribution.Dist.draw)
        z = cum[-1:]
        j = torch.searchsorted(cum, z * u, right=True)
        last = torch.searchsorted(cum, z, right=False)  # the last token with weight: for u * Z rounded up to Z
        j = torch.minimum(j, last).squeeze(0)
        token = j if ids is None else torch.take(ids, j)
        final = _Final(ids, vals, m, z.squeeze(0), j)
        self._accept(token if forced is None else forced)
        return TorchChoice(self._names, self._buffers, head, token if forced is None else forced, force_token is not None,
                           final=final, steps=steps)


class OnDeviceChain:
    """`SamplerChain`'s face on a `TorchChain`, for the decode loop's `AnswerRow` (engine/decode/row.py).

    The loop calls `choose(logits, history, record_stages=..., force_token=..., banned=...)`, `state()`,
    `restore()` and reads `seed`, as it does the numpy chain's. A host row (the prompt's last logits, which
    `prefill` returns as numpy) is moved to the device first; the device's own rows are used as they are.
    """

    def __init__(self, chain: TorchChain, device: Any) -> None:
        self.torch_chain = chain
        self.device = device
        self.seed = chain.seed

    def state(self) -> tuple[object, ...]:
        return self.torch_chain.state()

    def restore(self, state: tuple[object, ...]) -> None:
        self.torch_chain.restore(state)

    def choose(self, logits: Any, history: Any = None, *, record_stages: bool = False,
               force_token: int | None = None, banned: Any = ()) -> TorchChoice:
        """`SamplerChain.choose` on the device (`history`, on the host, for the penalties).

        Raises:
            ValueError: banned tokens asked for (`SamplesOnDevice` never hands this chain such an answer:
                banned strings are the numpy chain's).
        """
        import torch

        if len(banned):
            raise ValueError("the device chain bans no tokens: use SamplerChain")
        if not isinstance(logits, torch.Tensor):
            logits = torch.from_numpy(np.ascontiguousarray(logits)).to(self.device)
        return self.torch_chain.choose(logits, force_token=force_token, record_stages=record_stages,
                                       history=None if history is None else np.asarray(history))


class _Buffers:
    """What a chain keeps from one token to the next for a row of V entries on one device.

    Two float32 work rows for the report's whole-row arithmetic, padded with zeros to whole blocks: a fresh
    1 MB tensor per token is a fresh mapping from the OS on the CPU (glibc hands blocks that large to mmap),
    paid in page faults every token -- measured, a new row made `scores - m` 1.5x slower and `exp` 1.3x at
    262k (engine.sampling.stages.CHUNK is numpy's answer to the same). And the ids of each block's entries,
    for the head (`_Head`). A chain's reports run one at a time (they share the work rows).
    """

    __slots__ = ("block_ids", "d", "e", "pair", "v")

    def __init__(self) -> None:
        self.v = -1  # no rows yet
        self.d: Any = None
        self.e: Any = None
        self.pair: Any = None
        self.block_ids: Any = None

    def ready(self, like: torch.Tensor) -> _Buffers:
        import torch

        v = like.numel()
        if v != self.v or self.d.device != like.device:
            nb = -(-v // _BLOCK)
            work = torch.zeros((2, nb * _BLOCK), dtype=torch.float32, device=like.device)
            self.d, self.e = work[0, :v], work[1, :v]
            self.pair = work.view(2, nb, _BLOCK)  # the two rows by blocks: their block sums in one op
            self.block_ids = torch.arange(nb * _BLOCK, device=like.device).view(nb, _BLOCK)
            self.v = v
        return self


@dataclass(frozen=True, slots=True)
class _Final:
    """The distribution a seeded draw used, on the device: the row after the stages, its max and Z."""

    ids: Any  # torch.Tensor | None (None: the whole row)
    vals: Any
    m: Any
    z: Any  # float64 sum of the float32 weights
    drawn: Any  # the drawn token's position in `vals`


def _top(ids: torch.Tensor | None, vals: torch.Tensor, n: int, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The n most likely (ids, float64 log-probs), most likely first, ties to the lowest id (`Dist.top`).

    Removed tokens (-inf) may come last when fewer than n are finite: the host leaves them out.
    """
    import torch

    n = min(n, vals.numel())
    if n <= 0:
        return vals.new_zeros(0, dtype=torch.int64), vals.new_zeros(0, dtype=torch.float64)
    local: torch.Tensor | None = None
    if vals.numel() > 256:  # a long row: the n-th largest value first, then only the entries at or above it
        local = (vals >= torch.topk(vals, n).values[n - 1]).nonzero().squeeze(1)  # ascending: ties in id order
        vals = vals[local]
    top = torch.sort(vals, descending=True, stable=True)  # stable: among ties, the lower id first
    pos = top.indices[:n] if local is None else local[top.indices[:n]]
    return (pos if ids is None else ids[pos]), top.values[:n].double() - lse


def _pairs(ids: list[float], logprobs: list[float]) -> tuple[tuple[int, float], ...]:
    """(id, log-prob) pairs from the transfer, without the removed tokens a short row's top N ends with."""
    return tuple((int(i), lp) for i, lp in zip(ids, logprobs) if lp != -math.inf)


class TorchChoice:
    """A token `TorchChain.choose` chose, on the device, and what `report` needs to describe it.

    Attributes:
        token: the chosen token as a 0-d tensor on the row's device (for the next input without a transfer).
        forced: it was given (`force_token`), not drawn.
    """

    __slots__ = ("_best", "_buffers", "_final", "_head", "_id", "_names", "_scores", "_steps", "forced", "token")

    def __init__(self, names: Any, buffers: _Buffers, head: _Head, token: torch.Tensor, forced: bool,
                 best: torch.Tensor | None = None, final: _Final | None = None,
                 steps: list[tuple[str, Row | None]] | None = None) -> None:
        self._names = names
        self._buffers = buffers  # the chain's two (V,) work rows: a chain's reports run one at a time
        self._head = head  # the model's row, its max and the entries near it
        self._scores = head.row
        self.token = token
        self.forced = forced
        self._best = best  # greedy: the argmax (None when sampling)
        self._final = final  # sampling: the distribution drawn from
        self._steps = steps  # each stage's row on the device (None: unchanged), when recording
        self._id: int | None = None

    @property
    def token_id(self) -> int:
        """The token as a host int (`Choice.token_id`): one read of the device (a sync on CUDA), kept."""
        if self._id is None:
            self._id = int(self.token)
        return self._id

    def report(self, top_n: int = 20) -> Pick:
        """The token's statistics as `Choice.report` gives them: one transfer to the host (stage records: see
        `_stage_stats`)."""
        import torch

        with torch.inference_mode():
            return self._report(top_n)

    def _report(self, top_n: int) -> Pick:
        import torch


        scores, token, m = self._scores, self.token, self._head.m
        bufs = self._buffers.ready(scores)
        d, e = bufs.d, bufs.e
        torch.sub(scores, m, out=d).clamp_(min=-1e30)  # exp(-1e30) * -1e30 is 0; exp(-inf) * -inf is NaN (exp_sums)
        torch.exp(d, out=e)
        d.mul_(e)  # float32 products, as numpy's einsum in exp_sums
        # float32 sums of blocks of 256 added in float64: as close to numpy's float64 sums as float32 terms let
        # any sum be, without the whole-row float64 copy `sum(dtype=float64)` makes
        ed, z = bufs.pair.sum(2).double().sum(1).unbind()
        log_z = z.log()
        lse = m.double() + log_z
        s_tok = torch.take(scores, token)
        # the rank from the head when the token is in it (all the larger entries are); -1 asks for the whole row
        hd = self._head
        hd.ensure(max(top_n, 1))
        assert hd.vals is not None
        rank_t = torch.where(s_tok >= hd.floor, (hd.vals > s_tok).sum(), -1)
        # (torch.stack and torch.cat promote the ints and float32s to float64: exact, and no op each to convert)
        head = [token, m, s_tok - lse, rank_t, torch.clamp(log_z - ed / z, min=0.0)]
        model_ids, model_lp = _top(hd.ids, hd.vals, top_n, lse)
        fin = self._final
        if fin is None:  # greedy: the argmax alone, at log-prob 0
            assert self._best is not None
            head.append(self._best)
            samp_ids = samp_lp = scores.new_zeros(0, dtype=torch.float64)
        else:
            lse_f = fin.m.double() + fin.z.log()
            if not self.forced:
                head.append(torch.take(fin.vals, fin.drawn) - lse_f)
            elif fin.ids is None:
                head.append(torch.take(fin.vals, token) - lse_f)
            else:  # a forced token: its score among the survivors, -inf when a stage removed it
                pos = torch.searchsorted(fin.ids, token.reshape(1)).clamp_(max=fin.ids.numel() - 1).squeeze(0)
                head.append(torch.where(torch.take(fin.ids, pos) == token, torch.take(fin.vals, pos) - lse_f,
                                        -math.inf))
            samp_ids, samp_lp = _top(fin.ids, fin.vals, top_n, lse_f)
        k_m, k_s = model_ids.numel(), samp_ids.numel()
        out = torch.cat([torch.stack(head), model_ids, model_lp, samp_ids, samp_lp]).tolist()  # the one transfer
        tok, top, logprob, rank, entropy, last = out[:6]
        if not math.isfinite(top):
            raise ValueError(f"logits must be finite or -inf with at least one finite value (max is {top})")
        if rank < 0:  # the token lies below the head (forced, or a flat row's tail): count over the whole row
            rank = int((scores > s_tok).sum())
        rest = out[6:]
        top_model = _pairs(rest[:k_m], rest[k_m: 2 * k_m])
        rest = rest[2 * k_m:]
        token_id = int(tok)
        top_sampler: TopList
        if fin is None:
            best = int(last)
            sampler_logprob = 0.0 if token_id == best else -math.inf
            top_sampler = ((best, 0.0),) if top_n > 0 else ()
        else:
            sampler_logprob = last
            top_sampler = _pairs(rest[:k_s], rest[k_s: 2 * k_s])
        names = self._names
        stages = None if self._steps is None else tuple(self._stage_stats(token_id, top_model, top_n))
        return Pick(token_id=token_id, logprob=logprob, sampler_logprob=sampler_logprob, rank=int(rank),
                    entropy=entropy, top_model=names(top_model), top_sampler=names(top_sampler), stages=stages,
                    forced=self.forced)

    def _stage_stats(self, token_id: int, top_model: TopList, top_n: int) -> list[StageStats]:
        """Each stage's record, made on the host by the numpy chain's own code (`pick.stage_records`) from the rows the
        stages left: the filters' survivors (a few dozen), and the model's whole row, which the first stage's
        "before" and a stage that ran on the whole row need. So recording stages costs that row's copy to the
        host each token, which the rest of the device path avoids; the numbers are the numpy chain's."""
        host: list[Step] = []
        for name, row in self._steps or ():
            if row is None:
                host.append((name, None, None))
                continue
            ids, vals = row
            v = vals.float().cpu().numpy()
            if ids is None:
                host.append((name, None, v))
                continue
            i = ids.cpu().numpy().astype(np.int64)
            finite = v > -math.inf  # survivors cut in place keep -inf entries (`_cut`); a record counts the rest
            host.append((name, i[finite], v[finite]) if not finite.all() else (name, i, v))
        scores = self._scores.cpu().numpy()
        model = Dist(scores)
        return stage_records(host, self._names, token_id, model, top_model, top_n)

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
