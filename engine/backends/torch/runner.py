"""The torch backend's research runners: a batch of sequences in one KV cache, and every position of one.

Implements engine.capabilities.BatchRunner and PositionRunner over transformers'
forward with left-padded rows (engine.backends.chunks.left_pad), position ids
that continue each row's own past, and transformers' `DynamicCache` (or the
offload policy's cache for scoring an offloaded model). Steps of rows with no
padding that stand at one position (the loom's children, beam search) go
through the lean step for rows (lean_rows.py) when the model has one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from engine.backends.chunks import chunk_spans, left_pad, positions_per_chunk, stack_logprobs
from engine.backends.torch.compat import with_cache
from engine.backends.torch.foreground import foreground_step
from engine.capabilities import RowState

if TYPE_CHECKING:  # both imported where used: making a runner imports neither
    import torch
    from transformers.cache_utils import Cache

log = logging.getLogger(__name__)
ROWS_GROW_STEP = 128  # positions: the rows' cache grows by doubling, from at least this many
MIN_REUSE = 16  # shared tokens: below this, copying the backend's keys and values costs more than running them


def _holds_keys(layer: object) -> bool:
    """Whether a cache layer holds keys and values (transformers' placeholder layers hold none)."""
    from engine.backends.torch.compat import holds_keys

    return holds_keys(layer)


class TorchRunner:
    def __init__(self, model: Any, pad_id: int = 0, new_cache: Callable[[], Any] | None = None, lean: Any = None,
                 lean_tolerance: float = 1e-4, backend_cache: Callable[[], tuple[Sequence[int], Any]] | None = None):
        """`new_cache` makes the KV cache of `position_logits` (default: transformers' `DynamicCache`);
        `lean`: the model's LeanDecodeStep, for steps of unpadded rows at one position, trusted once its first
        step is within `lean_tolerance` (of the largest logit) of transformers' forward; `backend_cache`: the
        backend's (cached tokens, cache), for `start_from_backend_cache`."""
        import torch

        self.torch = torch
        self.model = model
        self.lean = lean
        self.lean_tolerance = lean_tolerance
        self._backend_cache = backend_cache
        self._level = False  # every row real from its first position on, all at one position: the lean step fits
        self.device = next(model.parameters()).device
        self.pad_id = pad_id
        self.new_cache = new_cache
        self.forward_calls = 0
        self.reused_prompt_tokens: tuple[int, ...] = ()  # left-padded rows: every prompt runs in full
        self._cache: Any = None  # transformers' cache of the rows (None before `start`)
        self._mask: Any = None  # (B, T_so_far) 0/1: which cached positions are real
        self._next_pos: Any = None  # (B,) position id of each row's next token

    def _call(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Cache) -> np.ndarray:
        foreground_step()  # a compile under way in the background pauses while the loom runs
        self.forward_calls += 1
        with self.torch.inference_mode():
            out = self.model(
                input_ids=ids, attention_mask=mask, position_ids=positions,
                **with_cache(self.model, cache), use_cache=True, logits_to_keep=1,
            )
        return out.logits[:, -1].float().cpu().numpy()  # (B, V)

    def close(self) -> None:
        """Nothing of its own to free: the cache goes with the runner (`BatchRunner.close`)."""

    def start(self, prompts: Sequence[Sequence[int]]) -> np.ndarray:
        torch = self.torch
        self.reused_prompt_tokens = (0,) * len(prompts)
        ids, mask = left_pad(prompts, self.pad_id)
        ids_t = torch.from_numpy(ids).to(self.device)
        self._mask = torch.from_numpy(mask).to(self.device)
        positions = (self._mask.cumsum(-1) - 1).clamp(min=0)  # pads get 0; real tokens 0..n-1
        self._next_pos = self._mask.sum(-1)
        self._cache = self._rows_cache()
        self._level = bool(self._mask.all())
        return self._call(ids_t, self._mask, positions, self._cache)

    def start_from_backend_cache(self, prompt: Sequence[int]) -> tuple[np.ndarray, int]:
        """`start([prompt])`, its first tokens' keys and values copied from the backend's own cache where it holds
        them (StartsFromBackendCache): after a chat answer the prompt is cached there, so only what is new runs.
        Full-attention layers of the preallocated cache only; anything else computes the whole prompt."""
        from engine.backend import common_prefix_len
        from engine.backends.torch.cache import GrowingLayer

        cached, source = self._backend_cache() if self._backend_cache is not None else ((), None)
        shared = min(common_prefix_len(cached, prompt), len(prompt) - 1)  # at least one token runs: the logits
        layers = list(getattr(source, "layers", ()))
        copyable = [isinstance(layer, GrowingLayer) and not layer.is_sliding and layer.is_initialized
                    and layer.length >= shared and layer.start == 0 for layer in layers]
        if shared < MIN_REUSE or not any(copyable) or not all(ok or not _holds_keys(layer)
                                                               for ok, layer in zip(copyable, layers)):
            return self.start([prompt]), 0
        torch = self.torch
        self._cache = self._rows_cache()
        for index, (ok, layer) in enumerate(zip(copyable, layers)):
            if ok:  # written into the rows' own buffers: the backend's cache is only read
                self._cache.update(layer.keys[:, :, :shared], layer.values[:, :, :shared], index)
        self._mask = torch.ones((1, len(prompt)), dtype=torch.long, device=self.device)
        self._next_pos = torch.tensor([len(prompt)], device=self.device)
        self._level = True
        rest = torch.tensor([[int(t) for t in prompt[shared:]]], dtype=torch.long, device=self.device)
        positions = torch.arange(shared, len(prompt), device=self.device)[None]
        return self._call(rest, self._mask, positions, self._cache), shared

    def _rows_cache(self) -> Cache:
        """The rows' KV cache: the preallocated one (a step writes in place; transformers' `DynamicCache`
        copies every row's whole cache with `torch.cat` each step), in small growth steps since a batch
        can hold many rows; `DynamicCache` for layer types it does not cover."""
        from transformers import DynamicCache

        from engine.backends.torch.cache import GrowingCache, UnsupportedCacheLayout

        try:
            return GrowingCache(self.model.config, grow_step=ROWS_GROW_STEP)
        except UnsupportedCacheLayout:
            return DynamicCache(config=self.model.config)

    def step(self, tokens: Sequence[int]) -> np.ndarray:
        torch = self.torch
        b = len(tokens)
        self._mask = torch.cat([self._mask, self._mask.new_ones(b, 1)], dim=1)
        ids = torch.tensor(list(tokens), dtype=torch.long, device=self.device)[:, None]  # (B, 1)
        if self._level and self.lean is not None:
            logits = self._lean_rows(ids[:, 0], int(self._next_pos[0]))
        else:
            logits = self._call(ids, self._mask, self._next_pos[:, None], self._cache)
        self._next_pos = self._next_pos + 1
        return logits

    def _lean_rows(self, ids: torch.Tensor, position: int) -> np.ndarray:
        """One step of every row through the lean step; its first use per model is checked against transformers."""
        from engine.backends.torch.compile import relative_logit_error
        from engine.backends.torch.lean_rows import step_rows

        lean = self.lean
        if lean.rows_verified:
            foreground_step()
            self.forward_calls += 1
            return step_rows(lean, ids, position, self._cache).float().cpu().numpy()
        try:
            ours = step_rows(lean, ids, position, self._cache)
        except Exception as e:  # a model the step misjudged costs speed, never the answer
            self.lean = None
            log.warning("the lean step for rows failed (%s: %s); batch steps use transformers' forward",
                        type(e).__name__, e)
            ours = None
        layers = self._cache.attention_layers() if hasattr(self._cache, "attention_layers") else self._cache.layers
        for layer in layers:  # the same position again, through transformers (in the layers it reached)
            layer.crop(position - layer.get_seq_length())
        theirs = self._call(ids[:, None], self._mask, self._next_pos[:, None], self._cache)
        if ours is None:
            return theirs
        err = relative_logit_error(ours, self.torch.from_numpy(theirs))
        if err <= self.lean_tolerance:
            lean.rows_verified = True
        else:
            self.lean = None
            log.warning("the lean step for rows differs from transformers' forward by %.3g of the largest logit; "
                        "batch steps use the latter", err)
        return theirs

    def reorder(self, rows: Sequence[int]) -> None:
        idx = self.torch.tensor(list(rows), dtype=self.torch.long, device=self.device)
        self._cache.reorder_cache(idx)
        self._mask = self._mask[idx]
        self._next_pos = self._next_pos[idx]

    # --- rows that each continue their own cached prefix -----------------------

    def supports_row_states(self) -> bool:
        from transformers import DynamicCache

        return not any(getattr(layer, "is_sliding", False) for layer in DynamicCache(config=self.model.config).layers)

    def forward_rows(
        self, rows: Sequence[tuple[RowState | None, Sequence[int]]], keep_states: bool = True
    ) -> tuple[np.ndarray, list[RowState | None]]:
        """One forward over rows (past_state_i, new_tokens_i); returns (B, V) logits and each row's new state.

        Layout per row, along time: [past pads][past][new pads][new]. Pads are
        masked out; position ids continue each row's own past, so every real
        token sees exactly what it would see unbatched. The new tokens are
        left-padded so that every row ends at the last position and only one
        position's logits are computed.
        """
        from transformers import DynamicCache

        torch = self.torch
        past_lens = [0 if s is None else s[0][0].shape[1] for s, _ in rows]
        new_lens = [len(t) for _, t in rows]
        b, lmax, smax = len(rows), max(past_lens), max(new_lens)
        cache = DynamicCache(config=self.model.config)
        if lmax:
            template = next(s for s, _ in rows if s is not None)
            for layer, (k0, v0) in enumerate(template):
                k = k0.new_zeros((b, k0.shape[0], lmax, k0.shape[2]))  # (B, H, Lmax, D)
                v = v0.new_zeros((b, v0.shape[0], lmax, v0.shape[2]))
                for i, (state, _) in enumerate(rows):
                    if state is not None:
                        k[i, :, lmax - past_lens[i] :] = state[layer][0]
                        v[i, :, lmax - past_lens[i] :] = state[layer][1]
                cache.update(k, v, layer)
        ids = torch.full((b, smax), self.pad_id, dtype=torch.long)
        mask = torch.zeros((b, lmax + smax), dtype=torch.long)
        positions = torch.zeros((b, smax), dtype=torch.long)
        for i, (_, toks) in enumerate(rows):
            n, p = new_lens[i], past_lens[i]
            ids[i, smax - n :] = torch.tensor(list(toks))
            mask[i, lmax - p : lmax] = 1
            mask[i, lmax + smax - n :] = 1
            positions[i, smax - n :] = torch.arange(p, p + n)
        logits = self._call(ids.to(self.device), mask.to(self.device), positions.to(self.device), cache)
        states: list[RowState | None] = [None] * b
        if keep_states:
            for i in range(b):
                p, n = past_lens[i], new_lens[i]
                states[i] = tuple(
                    (
                        torch.cat([layer.keys[i, :, lmax - p : lmax], layer.keys[i, :, lmax + smax - n :]], dim=1),
                        torch.cat([layer.values[i, :, lmax - p : lmax], layer.values[i, :, lmax + smax - n :]], dim=1),
                    )
                    for layer in cast(Any, cache).layers  # full-attention layers: keys and values
                )  # per layer: (H, p+n, D) keys and values
        return logits, states

    @staticmethod
    def state_nbytes(state: RowState) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in state)

    # --- every position of one sequence (teacher-forced scoring) -------------------

    def position_logits(self, ids: Sequence[int], first: int = 0, chunk: int | None = None
                        ) -> Generator[np.ndarray, None, None]:
        """Logits of positions `first`..T-1 of `ids`, as (n, V) float32 chunks in order (row t predicts t + 1).

        One forward per `chunk` positions on a fresh KV cache carried from chunk to
        chunk; only the wanted positions go through the head (`logits_to_keep`).
        The batch state of `start`/`step` is not touched.
        """
        from transformers import DynamicCache

        torch = self.torch
        chunk = chunk or positions_per_chunk(int(self.model.config.get_text_config().vocab_size))
        spans = list(chunk_spans(len(ids), chunk, first))
        cache = self.new_cache() if self.new_cache is not None else DynamicCache(config=self.model.config)
        ids_t = torch.tensor([list(ids)], dtype=torch.long, device=self.device)  # (1, T)
        for lo, hi, keep in spans:
            foreground_step()
            self.forward_calls += 1
            with torch.inference_mode():
                out = self.model(
                    input_ids=ids_t[:, lo:hi], **with_cache(self.model, cache), use_cache=True,
                    logits_to_keep=max(keep, 1),
                )
                logits = out.logits[0, -keep:].float().cpu().numpy() if keep > 0 else None  # (keep, V)
            del out  # hold only the numpy copy while the caller works on it
            if logits is not None:
                yield logits

    def sequence_logprobs(self, ids: Sequence[int]) -> np.ndarray:
        """(T, V) float32 log-probs at every position of `ids` (row t: the distribution of token t + 1)."""
        return stack_logprobs(self.position_logits(ids))
