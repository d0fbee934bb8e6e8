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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.sampling.chain import SamplerChain
from engine.sampling.distribution import Dist, TopList
from engine.sampling.dry import Vocabulary
from engine.sampling.grammar import GrammarStage
from engine.sampling.pick import Pick, StageStats, Step, stage_records
from engine.sampling.registry import ARGMAX_PRESERVING, STAGE_ROWS, stage_active
from engine.sampling.settings import SamplerSettings
from engine.sampling.torch_row import BLOCK, EMPTY_HISTORY, DeviceContext, DeviceHead, Row, exp_weights
from engine.sampling.torch_stages import make_device_stage
from engine.sampling.torch_stateful import DeviceAdaptiveP, DeviceGrammar, DeviceMirostat

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
        self._all_stages = tuple((name, make_device_stage(name, settings, vocab, constraint)) for name in self.stage_names)
        keep = len(self._all_stages)
        if self._greedy:
            while keep and self._all_stages[keep - 1][0] in ARGMAX_PRESERVING:
                keep -= 1
        self._stages = self._all_stages[:keep]
        self._stateful = tuple(stage for _, stage in self._all_stages
                               if isinstance(stage, (DeviceGrammar, DeviceMirostat, DeviceAdaptiveP)))
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
        head = DeviceHead(scores, self._buffers.ready(scores).block_ids)
        ctx = DeviceContext(self._rng, head, EMPTY_HISTORY if history is None else np.asarray(history, dtype=np.int64))
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
        w = exp_weights(vals, m)
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
    for the head (`DeviceHead`). A chain's reports run one at a time (they share the work rows).
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
            nb = -(-v // BLOCK)
            work = torch.zeros((2, nb * BLOCK), dtype=torch.float32, device=like.device)
            self.d, self.e = work[0, :v], work[1, :v]
            self.pair = work.view(2, nb, BLOCK)  # the two rows by blocks: their block sums in one op
            self.block_ids = torch.arange(nb * BLOCK, device=like.device).view(nb, BLOCK)
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

    def __init__(self, names: Any, buffers: _Buffers, head: DeviceHead, token: torch.Tensor, forced: bool,
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
            finite = v > -math.inf  # survivors cut in place keep -inf entries (`cut_row`); a record counts the rest
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
