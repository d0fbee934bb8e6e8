"""The MLX backend's research runners, with mlx-lm's left-padded `BatchKVCache` (engine.capabilities.BatchRunner,
PositionRunner)."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

from engine.backends.chunks import chunk_spans, left_pad, positions_per_chunk, stack_logprobs
from engine.capabilities import RowState


class MlxRunner:
    """The same moves on mlx-lm models, with mlx-lm's left-padded `BatchKVCache`."""

    def __init__(self, model: Any, pad_id: int = 0):
        import mlx.core as mx

        self.mx = mx
        self.model = model
        self.pad_id = pad_id
        self.forward_calls = 0
        self.reused_prompt_tokens: tuple[int, ...] = ()  # left-padded rows: every prompt runs in full
        self._cache: list[Any] | None = None  # BatchKVCache per layer, once started

    def _new_cache(self, left_padding: Sequence[int]) -> list:
        from mlx_lm.models.cache import BatchKVCache

        return [BatchKVCache(list(left_padding)) for _ in range(len(self.model.layers))]

    def _last_logits(self, ids: np.ndarray, cache: list[Any] | None) -> np.ndarray:  # mlx_lm's cache, one per layer
        mx = self.mx
        self.forward_calls += 1
        logits = self.model(mx.array(ids, dtype=mx.int32), cache=cache)[:, -1].astype(mx.float32)  # (B, V)
        mx.eval(logits)
        return np.array(logits)

    def close(self) -> None:
        """Nothing of its own to free: the cache goes with the runner (`BatchRunner.close`)."""

    def start(self, prompts: Sequence[Sequence[int]]) -> np.ndarray:
        self.reused_prompt_tokens = (0,) * len(prompts)
        ids, mask = left_pad(prompts, self.pad_id)
        self._cache = self._new_cache((mask == 0).sum(1).tolist())
        return self._last_logits(ids, self._cache)

    def step(self, tokens: Sequence[int]) -> np.ndarray:
        return self._last_logits(np.asarray(tokens, dtype=np.int64)[:, None], self._cache)

    def reorder(self, rows: Sequence[int]) -> None:
        idx = self.mx.array(list(rows), dtype=self.mx.int32)
        for c in self._cache or ():
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
            past: list[Any] = [rows[i][0] for i in members]  # each row's (K, V) per layer, or None
            past_lens = [0 if st is None else st[0][0].shape[1] for st in past]
            lmax = max(past_lens)
            cache = self._new_cache([lmax - p for p in past_lens])
            if lmax:
                template = next(st for st in past if st is not None)
                for layer, c in enumerate(cache):
                    h, d = template[layer][0].shape[0], template[layer][0].shape[2]
                    ks, vs = [], []
                    for i, p in zip(members, past_lens):
                        pad = mx.zeros((h, lmax - p, d), dtype=template[layer][0].dtype)
                        st: Any = rows[i][0]
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
        return np.stack(out_logits), states  # type: ignore[arg-type]  # every row is in one group

    @staticmethod
    def state_nbytes(state: RowState) -> int:
        return sum(k.nbytes + v.nbytes for k, v in state)

    # --- every position of one sequence (teacher-forced scoring) -------------------

    def position_logits(self, ids: Sequence[int], first: int = 0, chunk: int | None = None
                        ) -> Generator[np.ndarray, None, None]:
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
