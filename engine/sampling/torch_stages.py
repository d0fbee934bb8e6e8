"""The torch chain's stages (engine.sampling.torch_chain): each numpy stage's arithmetic on a device row.

A row is (ids, vals): ids None while it is the whole (V,) row (position = token id; -inf = removed), else the
survivors' ascending ids with their scores. A stage takes the row and a `DeviceContext` (the twin's generator,
the model row's head, the history) and returns the row it leaves; the stateful ones (mirostat, adaptive-p, a
constraint) also take the picked token (`accept`) and keep their state on the host. What each reads on the
host, and why, is in torch_chain's docstring.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.sampling.adaptive import _EXACT_SUM_MAX, _INV_WIDTH, _PEAK, _SHARPNESS
from engine.sampling.distribution import TopList
from engine.sampling.dry import DryPenalties, Vocabulary
from engine.sampling.grammar import TOP_DISALLOWED, GrammarStage, GrammarStep
from engine.sampling.registry import dry_penalties, logit_bias_tokens
from engine.sampling.settings import SamplerSettings
from engine.sampling.shaping import _EXACT_ENTROPY_MAX, _MIN_DYNAMIC_TEMPERATURE, _llamacpp_normalized_entropy
from engine.sampling.stage_row import BuildContext

if TYPE_CHECKING:  # torch is imported inside the functions: importing the engine never needs it
    import torch


Row = tuple["torch.Tensor | None", "torch.Tensor"]

class DeviceHead:
    """The entries of the model's (V,) row near its max, found when first asked, as `engine.sampling.head.RowHead`.

    Shared by top-k's cut (when top-k sees the model's own row), the report's top N and the rank, so that each
    looks at a few hundred entries instead of V. Exact: every entry at or above the head's floor is in it, in
    ascending id order. The row is read whole once, for the maxima of its blocks of `BLOCK` entries (its max
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
        self._block_ids = block_ids  # (nb, BLOCK) the ids of each block's entries
        v = row.numel()
        nb = -(-v // BLOCK)
        if v % BLOCK:  # the last block padded with -inf
            padded = torch.full((nb * BLOCK,), -math.inf, dtype=row.dtype, device=row.device)
            padded[:v] = row
            self._blocks = padded.view(nb, BLOCK)
        else:
            self._blocks = row.view(nb, BLOCK)
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


EMPTY_HISTORY = np.zeros(0, dtype=np.int64)

# Blocks of the model's row whose maxima place its head (`DeviceHead`): 192 of them at 49k, 1,024 at 262k.
BLOCK = 256


@dataclass(frozen=True, slots=True)
class DeviceContext:
    rng: np.random.Generator
    head: DeviceHead
    history: np.ndarray  # (T,) token ids so far, prompt included, on the host (the penalties read it)


DeviceStage = Callable[[Row, DeviceContext], Row]


def cut_row(row: Row, keep: torch.Tensor) -> Row:
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


def exp_weights(vals: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """float32 `exp(s - m)`, as numpy's `np.exp(vals - m)` (0 for -inf)."""
    return (vals - m).exp_()


def _top_k(k: int) -> DeviceStage:
    def top_k(row: Row, ctx: DeviceContext) -> Row:
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
        return cut_row(row, vals >= kth)

    return top_k


def _top_p(p: float) -> DeviceStage:
    def top_p(row: Row, ctx: DeviceContext) -> Row:
        import torch

        vals = row[1]
        desc = torch.sort(vals, descending=True).values
        cum = exp_weights(desc, desc[0]).to(torch.float64).cumsum(0)  # Z is its last entry
        # transformers' rule forwards: the token whose mass crosses the target is kept too (stages._prefix_end)
        j = torch.searchsorted(cum, cum[-1:] * p, right=False).clamp_(max=desc.numel() - 1)
        return cut_row(row, vals >= desc[j])  # -inf only when rounding kept the target out of reach: keep all

    return top_p


def _min_p(p: float) -> DeviceStage:
    log_p = float(np.float32(math.log(p)))  # prob >= p * top  <=>  s >= max + log p, in float32 as numpy

    def min_p(row: Row, ctx: DeviceContext) -> Row:
        vals = row[1]
        return cut_row(row, vals >= vals.max() + log_p)

    return min_p


def _typical_p(p: float) -> DeviceStage:
    def typical_p(row: Row, ctx: DeviceContext) -> Row:
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
        return cut_row(row, (shift <= shift[order[i]]) & finite)

    return typical_p


def _top_n_sigma(n: float) -> DeviceStage:
    def top_n_sigma(row: Row, ctx: DeviceContext) -> Row:
        import torch

        vals = row[1]
        finite = vals > -math.inf
        count = finite.sum()
        mean = torch.where(finite, vals.double(), 0.0).sum() / count
        dev = torch.where(finite, vals - mean.float(), 0.0).double()  # float32 differences, as numpy's
        std = ((dev * dev).sum() / count).sqrt()
        cut = (vals.max().double() - n * std).float()
        cut = torch.where(count > 1, cut, -math.inf)  # one finite token or none: keep all (no sync to ask)
        return cut_row(row, (vals >= cut) & finite)

    return top_n_sigma


def _xtc(probability: float, threshold: float) -> DeviceStage:
    def xtc(row: Row, ctx: DeviceContext) -> Row:
        import torch

        if ctx.rng.random() >= probability:  # drawn every step, fired or not (stages.make_xtc): decided on the host
            return row
        vals = row[1]
        m = vals.max()
        w = exp_weights(vals, m)
        z = w.sum(dtype=torch.float64)
        above = w >= (z * threshold).float()  # prob >= threshold, in float32 weights as numpy compares them
        least = torch.where(above, vals, math.inf).min()
        drop = above & (vals > least) & (above.sum() >= 2)  # only when two or more are above; the least stays
        return cut_row(row, ~drop)

    return xtc


def _penalties(repetition: float, presence: float, frequency: float, last_n: int) -> DeviceStage:
    """`stages.make_penalties` on the device: the history's distinct ids and counts are found on the host (a
    few dozen ids, which the host has), and only their scores change on the device, in float32 as there."""
    rep = float(np.float32(repetition))
    additive = presence != 0 or frequency != 0

    def penalties(row: Row, ctx: DeviceContext) -> Row:
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

    def logit_bias(row: Row, ctx: DeviceContext) -> Row:
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

    def dry(row: Row, ctx: DeviceContext) -> Row:
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

    def smoothing(row: Row, ctx: DeviceContext) -> Row:
        import torch

        ids, vals = row
        m = vals.max()
        diff = vals - m
        out = -(k * diff * diff) + c * diff * diff * diff + m
        return ids, torch.where(vals > -math.inf, out, -math.inf)

    return smoothing


class DeviceMirostat:
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

    def __call__(self, row: Row, ctx: DeviceContext) -> Row:
        import torch

        self.settle()
        ids, vals = row
        if self.version == 2:
            m = vals.max()
            lse = m.double() + exp_weights(vals, m).double().sum().log()
            # -log2(p) <= mu  <=>  s - lse >= -mu * ln 2; the top token always survives
            cut = torch.minimum(lse - float(self.mu) * math.log(2.0), m.double()).float()
            out = cut_row(row, vals >= cut)
        else:
            out = self._mirostat1(row, ctx)
        self._kept = out
        return out

    def _mirostat1(self, row: Row, ctx: DeviceContext) -> Row:
        import torch

        vals = row[1]
        n = int((vals > -math.inf).sum())  # survivors cut in place keep -inf entries (`cut_row`)
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
        return cut_row(row, vals >= kth)

    def accept(self, token: torch.Tensor) -> None:
        import torch

        if self._kept is None:  # it did not run in this pick
            return
        ids, vals = self._kept
        m = vals.max()
        lse = m.double() + exp_weights(vals, m).double().sum().log()
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
    """The row's finite entries as (ids, scores): survivors cut in place keep -inf entries (`cut_row`)."""
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

    def temperature(row: Row, ctx: DeviceContext) -> Row:
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


class DeviceAdaptiveP:
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

    def __call__(self, row: Row, ctx: DeviceContext) -> Row:
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


class DeviceGrammar:
    """A request's constraint (`grammar.GrammarStage`) on a device row.

    llguidance makes the mask on the host, as always; it crosses as V bools and cuts the row on the device.
    The step's record for the event (how many tokens were allowed, the mass they kept, the most likely removed
    ones) is made from a few numbers read back, as `GrammarStage.__call__` makes it; the run's state (the
    parser, the log mass kept) is the numpy stage's own object, which the answer's row reads too.
    """

    def __init__(self, stage: GrammarStage) -> None:
        self.stage = stage

    def __call__(self, row: Row, ctx: DeviceContext) -> Row:
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
        w = exp_weights(vals, top)
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
        return row if count == 0 else cut_row(row, live)

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

    def temperature(row: Row, ctx: DeviceContext) -> Row:
        ids, vals = row
        return ids, vals / t32

    return temperature


def make_device_stage(name: str, s: SamplerSettings, vocab: Vocabulary | None, constraint: GrammarStage | None) -> DeviceStage:
    if name == "grammar":
        assert constraint is not None  # the twin names the stage only with a constraint
        return DeviceGrammar(constraint)
    if name == "logit_bias":
        return _logit_bias(*logit_bias_tokens(s, BuildContext(vocab, None)))
    if name == "smoothing":
        return _smoothing(s.smoothing_factor, s.smoothing_curve)
    if name == "dry":
        return _dry(dry_penalties(s, BuildContext(vocab, None)))
    if name == "mirostat":
        return DeviceMirostat(s.mirostat, s.mirostat_tau, s.mirostat_eta)
    if name == "adaptive_p":
        return DeviceAdaptiveP(s.adaptive_target, s.adaptive_decay)
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
