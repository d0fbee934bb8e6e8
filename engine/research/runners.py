"""Batched forward passes for the research APIs, one small class per backend.

A runner holds one batch of sequences in a KV cache and offers three moves:
`start` (prefill left-padded prompts), `step` (one new token per row) and
`reorder` (beam search picks rows), plus `forward_rows`, which extends rows
that each start from their own cached prefix state (the token trie's KV
states) in a single forward pass. All return last-position logits as a
float32 numpy array of shape (B, V). `forward_calls` counts model calls so
tests can check that batching really batches.

`position_logits` / `sequence_logprobs` are the one exception: every
position's logits of one sequence, in chunks (engine/research/positions.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from engine.research.positions import chunk_spans, positions_per_chunk, stack_logprobs

RowState = Any  # backend-specific KV of one sequence; `state_nbytes` measures it


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(B, T) ids and (B, T) 0/1 mask with each row right-aligned."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        if len(r):
            ids[i, width - len(r) :] = r
            mask[i, width - len(r) :] = 1
    return ids, mask


class TorchRunner:
    def __init__(self, model: Any, pad_id: int = 0, new_cache: Callable[[], Any] | None = None):
        """`new_cache` makes the KV cache of `position_logits` (default: transformers' `DynamicCache`)."""
        import torch

        self.torch = torch
        self.model = model
        self.device = next(model.parameters()).device
        self.pad_id = pad_id
        self.new_cache = new_cache
        self.forward_calls = 0
        self._cache = None
        self._mask = None  # (B, T_so_far) 0/1: which cached positions are real
        self._next_pos = None  # (B,) position id of each row's next token

    def _call(self, ids, mask, positions, cache):
        self.forward_calls += 1
        with self.torch.inference_mode():
            out = self.model(
                input_ids=ids, attention_mask=mask, position_ids=positions,
                past_key_values=cache, use_cache=True, logits_to_keep=1,
            )
        return out.logits[:, -1].float().cpu().numpy()  # (B, V)

    def start(self, prompts: Sequence[Sequence[int]]) -> np.ndarray:
        from transformers import DynamicCache

        torch = self.torch
        ids, mask = left_pad(prompts, self.pad_id)
        ids_t = torch.from_numpy(ids).to(self.device)
        self._mask = torch.from_numpy(mask).to(self.device)
        positions = (self._mask.cumsum(-1) - 1).clamp(min=0)  # pads get 0; real tokens 0..n-1
        self._next_pos = self._mask.sum(-1)
        self._cache = DynamicCache(config=self.model.config)
        return self._call(ids_t, self._mask, positions, self._cache)

    def step(self, tokens: Sequence[int]) -> np.ndarray:
        torch = self.torch
        b = len(tokens)
        self._mask = torch.cat([self._mask, self._mask.new_ones(b, 1)], dim=1)
        ids = torch.tensor(list(tokens), dtype=torch.long, device=self.device)[:, None]  # (B, 1)
        logits = self._call(ids, self._mask, self._next_pos[:, None], self._cache)
        self._next_pos = self._next_pos + 1
        return logits

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
                    for layer in cache.layers
                )  # per layer: (H, p+n, D) keys and values
        return logits, states

    @staticmethod
    def state_nbytes(state: RowState) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in state)

    # --- every position of one sequence (teacher-forced scoring) -------------------

    def position_logits(self, ids: Sequence[int], first: int = 0, chunk: int | None = None) -> Iterator[np.ndarray]:
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
            self.forward_calls += 1
            with torch.inference_mode():
                out = self.model(
                    input_ids=ids_t[:, lo:hi], past_key_values=cache, use_cache=True, logits_to_keep=max(keep, 1)
                )
                logits = out.logits[0, -keep:].float().cpu().numpy() if keep > 0 else None  # (keep, V)
            del out  # hold only the numpy copy while the caller works on it
            if logits is not None:
                yield logits

    def sequence_logprobs(self, ids: Sequence[int]) -> np.ndarray:
        """(T, V) float32 log-probs at every position of `ids` (row t: the distribution of token t + 1)."""
        return stack_logprobs(self.position_logits(ids))


class MlxRunner:
    """The same moves on mlx-lm models, with mlx-lm's left-padded `BatchKVCache`."""

    def __init__(self, model: Any, pad_id: int = 0):
        import mlx.core as mx

        self.mx = mx
        self.model = model
        self.pad_id = pad_id
        self.forward_calls = 0
        self._cache = None

    def _new_cache(self, left_padding: Sequence[int]) -> list:
        from mlx_lm.models.cache import BatchKVCache

        return [BatchKVCache(list(left_padding)) for _ in range(len(self.model.layers))]

    def _last_logits(self, ids: np.ndarray, cache) -> np.ndarray:
        mx = self.mx
        self.forward_calls += 1
        logits = self.model(mx.array(ids, dtype=mx.int32), cache=cache)[:, -1].astype(mx.float32)  # (B, V)
        mx.eval(logits)
        return np.array(logits)

    def start(self, prompts: Sequence[Sequence[int]]) -> np.ndarray:
        ids, mask = left_pad(prompts, self.pad_id)
        self._cache = self._new_cache((mask == 0).sum(1).tolist())
        return self._last_logits(ids, self._cache)

    def step(self, tokens: Sequence[int]) -> np.ndarray:
        return self._last_logits(np.asarray(tokens, dtype=np.int64)[:, None], self._cache)

    def reorder(self, rows: Sequence[int]) -> None:
        idx = self.mx.array(list(rows), dtype=self.mx.int32)
        for c in self._cache:
            c.filter(idx)

    def supports_row_states(self) -> bool:
        from mlx_lm.models.cache import KVCache, make_prompt_cache

        return all(type(c) is KVCache for c in make_prompt_cache(self.model))

    def forward_rows(
        self, rows: Sequence[tuple[RowState | None, Sequence[int]]], keep_states: bool = True
    ) -> tuple[np.ndarray, list[RowState | None]]:
        """As `TorchRunner.forward_rows`. BatchKVCache has no holes, so rows are grouped by new-token count
        and each group is one forward: past left-padded, new tokens appended without padding."""
        mx = self.mx
        groups: dict[int, list[int]] = {}
        for i, (_, toks) in enumerate(rows):
            groups.setdefault(len(toks), []).append(i)
        out_logits: list[np.ndarray | None] = [None] * len(rows)
        states: list[RowState | None] = [None] * len(rows)
        for n, members in groups.items():
            past_lens = [0 if rows[i][0] is None else rows[i][0][0][0].shape[1] for i in members]
            lmax = max(past_lens)
            cache = self._new_cache([lmax - p for p in past_lens])
            if lmax:
                template = next(rows[i][0] for i in members if rows[i][0] is not None)
                for layer, c in enumerate(cache):
                    h, d = template[layer][0].shape[0], template[layer][0].shape[2]
                    ks, vs = [], []
                    for i, p in zip(members, past_lens):
                        pad = mx.zeros((h, lmax - p, d), dtype=template[layer][0].dtype)
                        st = rows[i][0]
                        ks.append(mx.concatenate([pad, st[layer][0]], axis=1) if st is not None else mx.zeros((h, lmax, d), pad.dtype))
                        vs.append(mx.concatenate([pad, st[layer][1]], axis=1) if st is not None else mx.zeros((h, lmax, d), pad.dtype))
                    c.update_and_fetch(mx.stack(ks), mx.stack(vs))  # (B, H, Lmax, D); offsets become the true lengths
            ids = np.asarray([list(rows[i][1]) for i in members], dtype=np.int64)  # (b, n)
            logits = self._last_logits(ids, cache)
            for j, i in enumerate(members):
                out_logits[i] = logits[j]
                if keep_states:
                    p = past_lens[j]
                    states[i] = tuple(
                        (c.keys[j, :, lmax - p : lmax + n], c.values[j, :, lmax - p : lmax + n]) for c in cache
                    )
        return np.stack(out_logits), states

    @staticmethod
    def state_nbytes(state: RowState) -> int:
        return sum(k.nbytes + v.nbytes for k, v in state)

    # --- every position of one sequence (teacher-forced scoring) -------------------

    def position_logits(self, ids: Sequence[int], first: int = 0, chunk: int | None = None) -> Iterator[np.ndarray]:
        """As `TorchRunner.position_logits`, on mlx-lm's own prompt cache. A chunk with no wanted
        position evaluates only the cache, so its (n, V) head projection is never computed (MLX is lazy)."""
        from mlx_lm.models.cache import make_prompt_cache

        mx = self.mx
        chunk = chunk or positions_per_chunk(_mlx_vocab_size(self.model))
        spans = list(chunk_spans(len(ids), chunk, first))
        cache = make_prompt_cache(self.model)
        ids_m = mx.array(list(ids), dtype=mx.int32)[None]  # (1, T)
        for lo, hi, keep in spans:
            self.forward_calls += 1
            logits = self.model(ids_m[:, lo:hi], cache=cache)  # (1, n, V), lazy
            if keep <= 0:
                mx.eval([c.state for c in cache])
                continue
            rows = logits[0, -keep:].astype(mx.float32)  # (keep, V)
            mx.eval(rows, [c.state for c in cache])
            yield np.array(rows)

    def sequence_logprobs(self, ids: Sequence[int]) -> np.ndarray:
        """(T, V) float32 log-probs at every position of `ids` (row t: the distribution of token t + 1)."""
        return stack_logprobs(self.position_logits(ids))


def _mlx_vocab_size(model: Any) -> int:
    """The vocabulary size an mlx-lm model declares (0 when it declares none: the largest chunk is used)."""
    args = getattr(model, "args", None)
    for source in (args, getattr(args, "text_config", None)):
        size = source.get("vocab_size") if isinstance(source, dict) else getattr(source, "vocab_size", None)
        if size:
            return int(size)
    return 0


def runner_for(backend: Any) -> TorchRunner | MlxRunner:
    """The runner for a loaded TorchBackend or MlxBackend (or RemoteBackend: see remote_runner.py)."""
    if backend.name == "remote":  # top-N log-probs from a server, -inf elsewhere
        from engine.research.remote_runner import RemoteRunner

        return RemoteRunner(backend)
    if backend.name == "llamacpp":  # several sequences per llama_batch: see llamacpp_runner.py
        from engine.research.llamacpp_runner import LlamaCppRunner

        return LlamaCppRunner(backend)
    pad = getattr(backend.tokenizer.hf, "pad_token_id", None) or 0
    if backend.name == "torch":
        return TorchRunner(backend.model, pad)
    if backend.name == "mlx":
        return MlxRunner(backend.model, pad)
    raise ValueError(f"the research APIs need the torch or mlx backend, not {backend.name!r}")
