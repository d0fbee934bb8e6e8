"""The torch chain's stages (engine.sampling.torch_chain): each numpy stage's arithmetic on a device row.

A stage takes the row (engine.sampling.torch_row: the row, its head and helpers) and a `DeviceContext` (the
twin's generator, the model row's head, the history) and returns the row it leaves. The stateless stages are
here, with `make_device_stage`, which builds any stage; the stateful ones (mirostat, adaptive-p, a constraint)
are in torch_stateful: they also take the picked token (`accept`) and keep their state on the host. What each
reads on the host, and why, is in torch_chain's docstring.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.sampling.dry import DryPenalties, Vocabulary
from engine.sampling.grammar import GrammarStage
from engine.sampling.registry import dry_penalties, logit_bias_tokens
from engine.sampling.settings import SamplerSettings
from engine.sampling.shaping import _EXACT_ENTROPY_MAX, _MIN_DYNAMIC_TEMPERATURE, _llamacpp_normalized_entropy
from engine.sampling.stage_row import BuildContext
from engine.sampling.torch_row import DeviceContext, DeviceStage, Row, cut_row, exp_weights, finite_entries
from engine.sampling.torch_stateful import DeviceAdaptiveP, DeviceGrammar, DeviceMirostat

if TYPE_CHECKING:  # torch is imported inside the functions: importing the engine never needs it
    import torch


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
        ids, vals = finite_entries(row)
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
