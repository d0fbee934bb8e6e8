"""The torch chain's stateful stages: mirostat 1 and 2, adaptive-p and a request's constraint, on a device row.

Each keeps its state on the host, as its numpy twin does, and also takes the picked token (`accept`); what each
reads on the host, and why, is in torch_chain's docstring. The row and its helpers: engine.sampling.torch_row.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from engine.sampling.adaptive import _EXACT_SUM_MAX, _INV_WIDTH, _PEAK, _SHARPNESS
from engine.sampling.distribution import TopList
from engine.sampling.grammar import TOP_DISALLOWED, GrammarStage, GrammarStep
from engine.sampling.torch_row import DeviceContext, Row, cut_row, exp_weights, finite_entries, score_of

if TYPE_CHECKING:  # torch is imported inside the functions: importing the engine never needs it
    import torch


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
        ids, vals = finite_entries(row)
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
        if forced is not None and not (forced < v and score_of(row, forced) > -math.inf):
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
