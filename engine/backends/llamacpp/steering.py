"""Steering on llama.cpp: its control-vector API, and the layer outputs vectors are trained on.

`llama_set_adapter_cvec(ctx, data, len, n_embd, il_start, il_end)` takes an
n_embd x (n_layer - 1) float buffer starting from layer 1 and adds row
`il - 1` to layer `il`'s output (`build_cvec` just before `l_out-il` in every
model's graph) for il_start <= il <= il_end; NULL data clears it. The
backend's context gets the combined vector of its `Steering`
(engine/steering/settings.py); when the steering changes, the KV cache it
computed is dropped, because a steered prefix's keys and values are not an
unsteered one's.

`steered_logits` runs on a context of its own with the steering asked for,
starting from the backend's cached KV state only where that state was
computed under the same steering. `last_token_states` reads every layer's
`l_out-N` at each prompt's last token with the eval callback the layer view
uses (lens.py), several prompts per `llama_decode`, a prefix they share run once.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from typing import Any

import llama_cpp
import numpy as np

from engine.backends.llamacpp import native
from engine.backends.llamacpp.kv_share import reuse_backend_state
from engine.backends.llamacpp.lens import _Recorder
from engine.lens import check_positions
from engine.steering.settings import Steering, SteeringKey, key_of
from engine.steering.shape import ResidualShape
from engine.steering.shared_prefix import shared_prefix_length

log = logging.getLogger(__name__)

STATES_SEQS = 32  # prompts per llama_decode when reading layer outputs (each its own sequence)


def residual_shape(backend: Any) -> ResidualShape:
    return ResidualShape(
        n_layer=int(llama_cpp.llama_model_n_layer(backend.model)),
        n_embd=int(llama_cpp.llama_model_n_embd(backend.model)),
        model_hint=backend.header.architecture or "",
    )


def set_cvec(ctx: Any, shape: ResidualShape, steering: Steering | None) -> None:
    """Put `steering` on `ctx` (None or inactive: clear it); SteeringError before anything changes."""
    if steering is None or not steering.active:
        rc = llama_cpp.llama_set_adapter_cvec(ctx, None, 0, shape.n_embd, -1, -1)
    else:
        combined = steering.combined(shape)  # checks fit first
        start, end = steering.layer_range(shape.n_layer)
        data = np.ascontiguousarray(combined[1:], dtype=np.float32)  # the buffer starts from layer 1
        ptr = data.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        rc = llama_cpp.llama_set_adapter_cvec(ctx, ptr, data.size, shape.n_embd, start, end)
    if rc != 0:
        raise RuntimeError(f"llama.cpp refused the control vector (code {rc}): {native.take_recent_errors()}")


class LlamaCppSteering:
    """`Steerable` and `ResidualStates` for `LlamaCppBackend` (mixed in; state kept under `_steering_*`)."""

    model: Any
    ctx: Any
    n_batch: int
    n_vocab: int

    def residual_shape(self) -> ResidualShape:
        return residual_shape(self)

    def current_steering(self) -> Steering | None:
        return getattr(self, "_steering_now", None)

    def steering_key(self) -> SteeringKey | None:
        """The key of the steering the cached tokens were computed under (None: unsteered)."""
        return key_of(self.current_steering())

    def set_steering(self, steering: Steering | None) -> None:
        if steering is not None and not steering.active:
            steering = None
        if key_of(steering) == self.steering_key():
            return
        set_cvec(self.ctx, self.residual_shape(), steering)  # raises before anything changes
        self._steering_now = steering
        self.trim_cache(0)  # type: ignore[attr-defined]  # (CachedTokens) the old prefix was computed otherwise
        log.debug("llama.cpp steering: %s", steering.describe() if steering else "none")

    def steered_logits(self, token_ids: Sequence[int], positions: Sequence[int], steering: Steering | None) -> np.ndarray:
        ids, wanted = check_positions(token_ids, positions, self.n_vocab)
        shape = self.residual_shape()
        reads = [p - 1 for p in wanted]  # the row whose output predicts each wanted token
        read_set = set(reads)
        first, end = reads[0], reads[-1] + 1
        n_out = min(len(reads), self.n_batch)
        params = _context_params(self, max(end, len(self.cached_tokens())) + 1, n_out)  # type: ignore[attr-defined]  # (CachedTokens)
        ctx = llama_cpp.llama_init_from_model(self.model, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context for steering: {native.take_recent_errors()}")
        batch = native.Batch(self.n_batch)
        rows: list[np.ndarray] = []
        try:
            set_cvec(ctx, shape, steering)
            done = 0
            if key_of(steering) == self.steering_key():  # the backend's cache was computed under this steering
                done = reuse_backend_state(self, ctx, ids[:first], steering_key=self.steering_key())
            pos = done
            while pos < end:
                hi = min(end, pos + self.n_batch)
                if pos < first:
                    hi = min(hi, first)  # the prefix without outputs, then the rows read (as the layer view does)
                batch.clear()
                outs = []
                for p in range(pos, hi):
                    out = p in read_set
                    index = batch.add(ids[p], p, 0, out)
                    if out:
                        outs.append(index)
                    if len(outs) == n_out:
                        hi = p + 1
                        break
                native.decode(ctx, batch)
                rows.extend(native.logits_row(ctx, r, self.n_vocab) for r in outs)
                pos = hi
        finally:
            native.free_context(ctx, batch)
        return np.stack(rows).astype(np.float32, copy=False)

    def last_token_states(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
        shape = self.residual_shape()
        seqs = [[int(t) for t in s] for s in sequences]
        if not seqs or any(not s for s in seqs):
            raise ValueError("every sequence needs at least one token")
        bad = [t for s in seqs for t in s if not 0 <= t < self.n_vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{self.n_vocab - 1})")
        # A prefix every prompt shares (a pair set's chat template and persona) runs once, in sequence 0, and is
        # shared with the others (`seq_cp`: the same cells), so each decode runs only the prompts' own tokens.
        shared = shared_prefix_length(seqs)
        rest = [len(s) - shared for s in seqs]
        # A decode's tokens: one micro-batch, so the callback sees them all at once; no more room than they need.
        room = max(min(self.n_batch, sum(rest)), max(rest), min(shared, self.n_batch))
        n_seq = min(STATES_SEQS, len(seqs))
        params = _context_params(self, shared + room + 1, n_seq)
        params.n_batch = params.n_ubatch = room
        params.n_seq_max = n_seq
        params.kv_unified = True  # one pool of cells: the sequences of a decode share the context's room
        recorder = _Recorder(shape.n_layer, attention=False)
        params.cb_eval = recorder.callback
        ctx = llama_cpp.llama_init_from_model(self.model, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context for reading layers: {native.take_recent_errors()}")
        batch = native.Batch(room, n_seq_max=n_seq)
        memory = llama_cpp.llama_get_memory(ctx)
        out = np.empty((len(seqs), shape.n_layer, shape.n_embd), dtype=np.float32)
        try:
            recorder.begin(0, [], [])  # the shared prefix is not read: only the prompts' last tokens are
            for lo in range(0, shared, room):
                batch.clear()
                for p in range(lo, min(shared, lo + room)):
                    batch.add(seqs[0][p], p, 0, False)
                native.decode(ctx, batch)
            for seq_id in range(1, n_seq if shared else 0):
                llama_cpp.llama_memory_seq_cp(memory, 0, seq_id, 0, shared)
            for group in _groups(rest, room, n_seq):
                llama_cpp.llama_memory_seq_rm(memory, -1, shared, -1)  # the previous group's own tokens
                for i in range(shape.n_layer):
                    recorder.hidden[i].clear()
                batch.clear()
                rows = []
                for seq_id, index in enumerate(group):
                    s = seqs[index]
                    for p in range(shared, len(s)):
                        row = batch.add(s[p], p, seq_id, p == len(s) - 1)
                        if p == len(s) - 1:
                            rows.append(row)
                recorder.begin(sum(rest[i] for i in group), rows, [len(seqs[i]) - 1 for i in group])
                native.decode(ctx, batch)
                recorder.check()
                for layer in range(shape.n_layer):
                    out[group, layer] = np.concatenate(recorder.hidden[layer])
        finally:
            recorder.armed = False
            native.free_context(ctx, batch)
        return out


def _groups(lengths: list[int], limit: int, n_seq: int) -> list[list[int]]:
    """Indices of prompts packed into decodes of at most `limit` tokens and `n_seq` prompts (their `lengths`)."""
    groups: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for i, n in enumerate(lengths):
        if current and (tokens + n > limit or len(current) == n_seq):
            groups.append(current)
            current, tokens = [], 0
        current.append(i)
        tokens += n
    if current:
        groups.append(current)
    return groups


def _context_params(backend: Any, n_ctx: int, n_outputs: int) -> Any:
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = params.n_ubatch = max(backend.n_batch, 1)
    params.n_seq_max = 1
    params.n_outputs_max = n_outputs
    params.n_threads, params.n_threads_batch = backend.n_threads, backend.n_threads_batch
    params.offload_kqv = backend.gpu_plan.offload_kqv
    params.swa_full = True  # as the backend's context, so its KV state loads here
    params.no_perf = True
    return params
