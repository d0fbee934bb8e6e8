"""A device row, as the torch chain's stages (engine.sampling.torch_stages, torch_stateful) see it.

A row is (ids, vals): ids None while it is the whole (V,) row (position = token id; -inf = removed), else the
survivors' ascending ids with their scores. Here: the row's type, the model row's head (`DeviceHead`), what a
stage is handed (`DeviceContext`) and the few operations every stage uses on a row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

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


def finite_entries(row: Row) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The row's finite entries as (ids, scores): survivors cut in place keep -inf entries (`cut_row`)."""
    ids, vals = row
    finite = (vals > -math.inf).nonzero().squeeze(1)
    if finite.numel() == vals.numel():
        return ids, vals
    return (finite if ids is None else ids[finite]), vals[finite]


def score_of(row: Row, token: int) -> float:
    """The row's score of `token` (-inf when removed): one read."""
    import torch

    ids, vals = row
    if ids is None:
        return float(vals[token])
    pos = torch.searchsorted(ids, torch.tensor([token], device=ids.device)).clamp_(max=ids.numel() - 1)
    return float(torch.where(ids[pos] == token, vals[pos], -math.inf))
