"""The research runner on llama.cpp: many sequences in one context, several rows per `llama_batch`.

A second llama.cpp context on the backend's model (the weights are shared)
holds up to `max_seqs` sequences in one unified KV cache. Each row of a
batch is its own sequence with its own positions, so no padding is needed:

- `start` / `step`: every row's tokens go into one `llama_batch` (split only
  when a prefill exceeds `n_batch` tokens), one `llama_decode` per step for
  the whole batch;
- `reorder` (beam search, the loom's drops): sequences are re-pointed with
  `llama_memory_seq_cp`, which in a unified cache shares cells instead of
  copying them; cells no row needs any more are kept by a graveyard sequence
  rather than freed (see `reorder`);
- `forward_rows` (the token trie): a row's cached prefix state is the bytes
  of its KV cache (`llama_state_seq_get_data`), restored into a sequence with
  `llama_state_seq_set_data`, so the trie can keep and evict states like
  any other bytes; then all rows' new tokens run in one `llama_batch`;
- `position_logits` (teacher-forced scoring): one sequence in chunks of
  positions, every position of a chunk asking for logits
  (`llama_get_logits_ith(i)`), the KV cache carried from chunk to chunk.
  `LlamaCppBackend.position_runner` builds a runner sized for that (one
  sequence, a cache of the text's length, a chunk of logits rows).
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import llama_cpp
import numpy as np

from engine.backends.llamacpp import native
from engine.backends.llamacpp.kv_share import reuse_backend_state
from engine.backends.llamacpp import threads as llamacpp_threads
from engine.backends.llamacpp.threads import usable_cpus
from engine.cache_schedule import pieces_upto
from engine.backend import shared_prefix_length
from engine.backends.chunks import chunk_spans, stack_logprobs

log = logging.getLogger(__name__)

RowState = tuple[int, bytes]  # (cached positions, llama_state_seq_get_data bytes)
# Prompts that begin alike compute their common beginning once when it is at least this long (shorter: the
# extra llama_decode call costs about what it saves).
MIN_SHARED_PREFIX = 8
# The most one-token rows of different sequences one `llama_batch` carries (see `_run`): 64 went wrong, 40 did not.
MULTI_SEQUENCE_TOKENS = 24


class LlamaCppRunner:
    def __init__(
        self,
        backend: Any,
        max_seqs: int = 128,
        n_batch: int = 512,
        *,
        n_ctx: int | None = None,
        n_outputs: int | None = None,
    ):
        """`n_ctx`: cache cells (default: the backend's context); `n_outputs`: logits rows one decode may
        return (default: one per sequence; `position_logits` needs one per position of a chunk)."""
        self.backend = backend
        self.pad_id = max(0, backend.tokenizer.pad_token_id)
        self.n_vocab = backend.n_vocab
        self.max_seqs = max_seqs
        self.n_batch = n_batch
        self.forward_calls = 0
        self.tokens_evaluated = 0
        self.reused_prompt_tokens: tuple[int, ...] = ()  # per prompt of the last start: tokens not computed for it
        # The first row's prompt as computed by the last start (RecordsCacheSchedule); () when rows differ.
        self._prompt_pieces: tuple[tuple[int, int], ...] = ()
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx or backend.n_ctx
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = max_seqs + 1  # + the graveyard (`reorder`)
        self._grave = max_seqs  # the sequence id that keeps the cells rows left behind
        self._grave_used = False
        self.n_outputs = n_outputs or max_seqs
        # By default one row of logits per sequence per decode, never more (llama.cpp asks room for every
        # sequence id, the graveyard included).
        params.n_outputs_max = max(self.n_outputs, max_seqs + 1)
        params.kv_unified = True  # one pool of cells shared by every sequence: seq_cp shares, not copies
        params.swa_full = True
        params.n_threads, params.n_threads_batch = self._threads = backend.n_threads, backend.n_threads_batch
        self._rechoose_at = 0.0  # time.monotonic() at which the rows' steps look at the free cores again
        params.offload_kqv = backend.gpu_plan.offload_kqv
        params.no_perf = True
        self.ctx = llama_cpp.llama_init_from_model(backend.model, params)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not create a research context: {native.take_recent_errors()}")
        self._mem = llama_cpp.llama_get_memory(self.ctx)
        self._batch = native.Batch(n_batch, max_seqs)
        self._lens: list[int] = []  # positions cached per sequence (row i is sequence i)
        self._helper: ThreadPoolExecutor | None = None  # made on the first step_in_background

    # --- helpers -------------------------------------------------------------------

    def _clear(self) -> None:
        # The cells' metadata only: a cell is written before any row attends to it, and zeroing the buffers of
        # a whole context (~190 MB at the default model's 8,192) cost ~10 ms per scored text.
        llama_cpp.llama_memory_clear(self._mem, False)
        self._grave_used = False

    def _follow_threads(self) -> None:
        """Run the coming call on the threads an answer would get now (the cores other programs leave free:
        the backend's `choose_threads`); a runner made at load would otherwise keep that moment's count."""
        self._set_threads(self.backend.choose_threads())

    def _set_threads(self, wanted: tuple[int, int]) -> None:
        self._rechoose_at = time.monotonic() + llamacpp_threads.RECHOOSE_EVERY_S
        if wanted != self._threads:
            llama_cpp.llama_set_n_threads(self.ctx, *wanted)
            self._threads = wanted

    def leaves_a_core_free(self) -> bool:
        """Whether llama.cpp's threads for the coming call leave a CPU free. `llama_decode` runs without the GIL
        (ctypes), so batch scoring then reports one text on that CPU while the next text's forward runs
        (engine/experiments/batch_score.py `_one_ahead`). When its threads take every CPU, the overlap slows the
        forward more than it saves (2 cores, idle: 7.3 s -> 9.7 s for bench/score.py's 100 texts; 1 thread:
        12.4 s -> 10.5 s)."""
        return max(self.backend.choose_threads()) < usable_cpus()

    def _check_rows(self, b: int, spare: int = 0) -> None:
        if b + spare > self.max_seqs:
            raise ValueError(f"at most {self.max_seqs // (2 if spare else 1)} rows at once on llama.cpp, got {b}")

    def _run(self, rows: Sequence[tuple[int, int, Sequence[int]]]) -> np.ndarray:
        """Decode (seq_id, start_pos, tokens) rows; returns the (B, V) logits of each row's last token.

        Rows of one token each (a decode step) share a `llama_batch`, at most
        `MULTI_SEQUENCE_TOKENS` rows per batch. A row of several tokens (a prompt, a trie's
        new tokens) gets batches of its own, split every `n_batch` tokens (the earlier part
        only fills the cache). Why: llama.cpp computes a batch that mixes sequences wrongly once
        it holds enough tokens (llama.cpp #24962, unified KV cache; here, 0.3.36 on the CPU
        with flash attention: two 32-token prompts in one batch, or 64 one-token steps, gave
        logits up to 1.6 away from each sequence decoded alone), while one sequence per batch,
        and up to 40 one-token steps of different sequences together, match a single-sequence
        context bit for bit (tests/engine/test_llamacpp_research.py checks both).
        """
        out = np.empty((len(rows), self.n_vocab), dtype=np.float32)
        pending: list[tuple[int, int]] = []  # (row, batch index) whose logits this batch yields
        self._batch.clear()
        for r, (seq, start, toks) in enumerate(rows):
            if len(toks) > 1 and self._batch.n:
                self._flush(pending, out)  # a prompt starts a batch of its own
            if len(toks) == 1 and self._batch.n >= MULTI_SEQUENCE_TOKENS:
                self._flush(pending, out)
            for j, t in enumerate(toks):
                if self._batch.n == self.n_batch:
                    self._flush(pending, out)
                last = j == len(toks) - 1
                idx = self._batch.add(int(t), start + j, seq, last)
                if last:
                    pending.append((r, idx))
            if len(toks) > 1:
                self._flush(pending, out)
        self._flush(pending, out)
        return out

    def _flush(self, pending: list[tuple[int, int]], out: np.ndarray) -> None:
        if self._batch.n == 0:
            return
        try:
            native.decode(self.ctx, self._batch)
        except native.DecodeError as e:
            if e.code != 1 or not self._grave_used:
                raise
            # The cache is full of cells rows left behind: free them (llama.cpp restored the cache as it was
            # before the failed call) and go on, with numbers that may now differ slightly (see `reorder`).
            log.info("llama.cpp research context full: freeing the cells dropped rows left behind")
            llama_cpp.llama_memory_seq_rm(self._mem, self._grave, -1, -1)
            self._grave_used = False
            native.decode(self.ctx, self._batch)
        self.forward_calls += 1
        self.tokens_evaluated += self._batch.n
        for r, idx in pending:
            out[r] = native.logits_row(self.ctx, idx, self.n_vocab)
        pending.clear()
        self._batch.clear()

    # --- the runner moves -------------------------------------------------------------

    def start(self, prompts: Sequence[Sequence[int]]) -> np.ndarray:
        """Prefill every prompt (row i is sequence i); (len(prompts), V) logits of each one's last token.

        What all the prompts begin with (a chat template's system prompt, a shared document) is computed once,
        or taken from the backend's own cache where it holds it, and its cells are shared by every row
        (`llama_memory_seq_cp` in the unified cache); each row then computes only its own rest. The rows' keys
        and values are the same either way (tests/engine/test_llamacpp_research.py), so the logits are too.
        """
        self._check_rows(len(prompts))
        self._follow_threads()
        self._clear()
        self._lens = [len(p) for p in prompts]
        shared = shared_prefix_length(prompts, MIN_SHARED_PREFIX)  # every row keeps at least one token to run
        self._prompt_pieces = self._pieces(0, len(prompts[0])) if len(prompts) == 1 else ()
        if not shared:
            self.reused_prompt_tokens = (0,) * len(prompts)
            return self._run([(i, 0, list(p)) for i, p in enumerate(prompts)])
        have = reuse_backend_state(self.backend, self.ctx, prompts[0][:shared], 0, limit=shared)
        # The first row computes the common beginning (past what the backend's cache held); the others copy it.
        self.reused_prompt_tokens = (have,) + (shared,) * (len(prompts) - 1)
        if have < shared:
            self._run([(0, have, [int(t) for t in prompts[0][have:shared]])])
        for i in range(1, len(prompts)):
            llama_cpp.llama_memory_seq_cp(self._mem, 0, i, -1, -1)
        return self._run([(i, shared, [int(t) for t in p[shared:]]) for i, p in enumerate(prompts)])

    def start_from_backend_cache(self, prompt: Sequence[int]) -> tuple[np.ndarray, int]:
        """`start([prompt])` from the backend's own KV cache of the prompt's first tokens (StartsFromBackendCache):
        the chat's prompt is cached there after an answer, so the loom computes only what is new."""
        self._follow_threads()
        self._clear()
        reused = reuse_backend_state(self.backend, self.ctx, prompt, 0, limit=len(prompt) - 1)  # >= 1 token runs
        self.reused_prompt_tokens = (reused,)
        self._prompt_pieces = self.backend.cache_schedule(reused) + self._pieces(reused, len(prompt))
        self._lens = [len(prompt)]
        return self._run([(0, reused, [int(t) for t in prompt[reused:]])]), reused

    def cache_schedule(self, upto: int) -> tuple[tuple[int, int], ...]:
        """The llama_decode calls the first row's prompt came from (RecordsCacheSchedule), the backend's own for
        what `start_from_backend_cache` took from its cache: a single answer computed in these pieces (an audit's
        rerun) has the row's very keys and values."""
        return pieces_upto(self._prompt_pieces, upto)

    def _pieces(self, start: int, end: int) -> tuple[tuple[int, int], ...]:
        """The calls `_run` makes for one row of tokens start..end: a batch of its own, split every `n_batch`."""
        sizes = (min(self.n_batch, end - lo) for lo in range(start, end, self.n_batch))
        return tuple((n, n) for n in sizes)

    def admit(self, prompts: Sequence[Sequence[int]]) -> np.ndarray:
        """New rows after the current ones (AdmitsRows): each prompt a new sequence, computed in a batch of its
        own as `start`'s are (so the rows there are untouched: other sequences' cells are masked out of it),
        into cells no row has used (the graveyard keeps those rows left; see `reorder`)."""
        b = len(self._lens)
        self._check_rows(b + len(prompts))
        logits = self._run([(b + i, 0, [int(t) for t in p]) for i, p in enumerate(prompts)])
        self._lens += [len(p) for p in prompts]
        return logits

    def step(self, tokens: Sequence[int]) -> np.ndarray:
        if time.monotonic() >= self._rechoose_at:  # the rows' steps follow the free cores, as an answer's do
            self._set_threads(self.backend.threads_during() or self._threads)  # None: the count stays
        logits = self._run([(i, self._lens[i], [int(t)]) for i, t in enumerate(tokens)])
        self._lens = [n + 1 for n in self._lens]
        return logits

    def step_in_background(self, tokens: Sequence[int]) -> Future[np.ndarray]:
        """`step` on a helper thread (BackgroundStep): `llama_decode` releases the GIL for the whole forward,
        so the caller's Python (the loom's reports of the tokens just chosen) runs on the core llama.cpp's
        threads leave free."""
        if self._helper is None:
            self._helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llamacpp-runner")
        return self._helper.submit(self.step, list(tokens))

    def reorder(self, rows: Sequence[int]) -> None:
        """Row j continues old row `rows[j]` (beam search's parents; the loom's rows still running).

        Cells that no row needs any more are not freed but kept by the graveyard sequence (masked out of every
        row's attention, as any other sequence's cells are): llama.cpp 0.3.36 (CPU, flash attention) puts the
        next tokens into freed cells, and then computes the remaining rows' logits up to ~1 away from the same
        sequence decoded alone (a 6-row loom after its first row ended; keeping the cells: bit for bit,
        tests/engine/test_decode_core.py). When the cache fills up, the graveyard is freed (`_flush`).
        """
        b = len(self._lens)
        self._check_rows(b, spare=len(rows))  # each new row is parked under a spare sequence id
        for j, src in enumerate(rows):  # park each new row's source under a spare id first
            llama_cpp.llama_memory_seq_cp(self._mem, src, b + j, -1, -1)
        for i in range(b):
            llama_cpp.llama_memory_seq_cp(self._mem, i, self._grave, -1, -1)  # its cells stay taken
            llama_cpp.llama_memory_seq_rm(self._mem, i, -1, -1)
        self._grave_used = True
        for j in range(len(rows)):
            llama_cpp.llama_memory_seq_cp(self._mem, b + j, j, -1, -1)
            llama_cpp.llama_memory_seq_rm(self._mem, b + j, -1, -1)
        self._lens = [self._lens[src] for src in rows]

    # --- rows that each continue their own cached prefix --------------------------------

    def supports_row_states(self) -> bool:
        return True

    def forward_rows(
        self, rows: Sequence[tuple[RowState | None, Sequence[int]]], keep_states: bool = True
    ) -> tuple[np.ndarray, list[RowState | None]]:
        """One `llama_batch` over rows (past_state_i, new_tokens_i); returns (B, V) logits and each row's state."""
        self._check_rows(len(rows))
        self._clear()
        starts = []
        for i, (state, _) in enumerate(rows):
            if state is None:
                starts.append(0)
                continue
            n_pos, data = state
            buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
            if llama_cpp.llama_state_seq_set_data(self.ctx, buf, len(data), i) == 0:
                raise RuntimeError(f"llama.cpp could not restore a cached prefix: {native.take_recent_errors()}")
            starts.append(n_pos)
        logits = self._run([(i, starts[i], list(toks)) for i, (_, toks) in enumerate(rows)])
        states: list[RowState | None] = [None] * len(rows)
        if keep_states:
            for i, (_, toks) in enumerate(rows):
                states[i] = (starts[i] + len(toks), self._seq_bytes(i))
        self._clear()
        return logits, states

    def _seq_bytes(self, seq: int) -> bytes:
        size = llama_cpp.llama_state_seq_get_size(self.ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        n = llama_cpp.llama_state_seq_get_data(self.ctx, buf, size, seq)
        return bytes(buf)[:n]

    @staticmethod
    def state_nbytes(state: RowState) -> int:
        return len(state[1])

    # --- every position of one sequence (teacher-forced scoring) -------------------------

    def position_logits(self, ids: Sequence[int], first: int = 0, chunk: int | None = None
                        ) -> Generator[np.ndarray, None, None]:
        """Logits of positions `first`..T-1 of `ids`, as (n, V) float32 chunks in order (row t predicts t + 1).

        One `llama_decode` per `chunk` positions (at most `n_batch` and `n_outputs`) as
        sequence 0, every wanted position flagged for logits; the cache is cleared before and after.
        """
        chunk = min(chunk or self.n_outputs, self.n_batch, self.n_outputs)
        ids = [int(t) for t in ids]
        bad = [t for t in ids if not 0 <= t < self.n_vocab]
        if bad:  # llama.cpp aborts on an out-of-range id
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{self.n_vocab - 1})")
        spans = list(chunk_spans(len(ids), chunk, first))
        self._follow_threads()
        self._clear()
        try:
            for lo, hi, keep in spans:
                self._batch.clear()
                for pos in range(lo, hi):
                    self._batch.add(ids[pos], pos, 0, hi - pos <= keep)
                native.decode(self.ctx, self._batch)
                self.forward_calls += 1
                self.tokens_evaluated += hi - lo
                if keep > 0:
                    yield self._output_rows(keep)  # (keep, V)
        finally:
            self._batch.clear()
            self._clear()

    def _output_rows(self, n: int) -> np.ndarray:
        """The last decode's `n` rows of logits, in batch order, as one (n, V) float32 copy.

        llama.cpp keeps the rows of the positions flagged for logits next to each other in batch order
        (`llama_get_logits`), so one copy of the block replaces a `llama_get_logits_ith` copy per row and then
        `np.stack`'s second copy of all of them (two passes over n x 49k floats per text; same bytes).
        """
        ptr = llama_cpp.llama_get_logits(self.ctx)
        if not ptr:
            raise RuntimeError("llama.cpp has no logits for the last decode")
        return np.ctypeslib.as_array(ptr, shape=(n, self.n_vocab)).copy()

    def sequence_logprobs(self, ids: Sequence[int]) -> np.ndarray:
        """(T, V) float32 log-probs at every position of `ids` (row t: the distribution of token t + 1)."""
        return stack_logprobs(self.position_logits(ids))

    def close(self) -> None:
        if self._helper is not None:
            self._helper.shutdown(wait=True)  # a step still running uses the context
            self._helper = None
        native.free_context(self.ctx, self._batch)
        self.ctx = self._batch = None  # type: ignore[assignment]  # closed: a later use fails
