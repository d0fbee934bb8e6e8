"""The llama.cpp backend: GGUF files run natively (quantized), on CPU, Metal, CUDA or Vulkan.

One llama.cpp context holds one sequence (seq 0). `forward` decodes the new
tokens with only the last one asking for logits, and copies that one (V,)
row (`llama_get_logits_ith(ctx, -1)`); `trim_cache` removes positions from
the KV cache (`llama_memory_seq_rm`), so a new turn or a branch runs only
its new tokens. Sampling stays ours (`engine.sampling`), as on torch and MLX.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, TypeVar

import llama_cpp
import numpy as np

from engine.backend import CachedTokens, process_peak_rss_bytes
from engine.backends.chunks import positions_per_chunk
from engine.backends.llamacpp import native
from engine.backends.llamacpp.abort import ABORTED, AbortSwitch
from engine.backends.llamacpp.gguf_header import GGUFHeader, kv_bytes_per_token, read_header
from engine.backends.llamacpp.placement import GpuPlan, layers_as_asked, plan_gpu_layers
from engine.backends.llamacpp.runner import LlamaCppRunner
from engine.backends.llamacpp.steering import LlamaCppSteering
from engine.backends.llamacpp import threads as llamacpp_threads
from engine.backends.llamacpp.threads import default_threads
from engine.cache_schedule import CacheSchedule
from engine.backends.llamacpp.tokenizer import LlamaCppTokenizer
from engine.cpu_load import ThreadsPerAnswer, threads_text
from engine.errors import ContextLengthError, ModelLoadError
from engine.layer_capture import LayerCapture
from engine.fingerprints.record import NumericSetup
from engine.model_info import ModelInfo
from engine.offload.auto import free_cpu_bytes
from engine.offload.policy import OffloadPolicy
from engine.runtime_settings import RuntimeFacts, RuntimeSettings, choose_context

log = logging.getLogger(__name__)
T = TypeVar("T")

N_BATCH = 512  # tokens per llama_decode (llama.cpp's default micro-batch); a cancel stops inside one
NO_GPU = "this llama.cpp build runs on the CPU only (no Metal, CUDA or Vulkan), so no layers can go to a GPU"


def _gpu_plan(header: GGUFHeader, offload: OffloadPolicy | str | None, n_gpu_layers: int | None, n_layers: int,
              cache_bytes: int, gpus: list[native.GpuDevice]) -> GpuPlan:
    """Which layers run on the GPU: `n_gpu_layers` as asked, else what `offload` says for this model and cache
    in the first GPU's free memory (none on a CPU build)."""
    gpu_build = bool(llama_cpp.llama_supports_gpu_offload())
    if n_gpu_layers is not None:
        return layers_as_asked(n_gpu_layers, n_layers, gpu_build=gpu_build)
    return plan_gpu_layers(offload, n_layers=n_layers, gpu_build=gpu_build, model_bytes=header.file_bytes,
                           cache_bytes=cache_bytes, free_gpu_bytes=gpus[0].free_bytes if gpus else None)


class LlamaCppBackend(CachedTokens, LlamaCppSteering):  # steering: control vectors (steering.py)
    name = "llamacpp"

    def __init__(
        self,
        path: Path,
        *,
        spec: str,
        display_name: str,
        offload: OffloadPolicy | str | None = None,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        n_gpu_layers: int | None = None,
        n_batch: int | None = None,
        flash_attn: bool | None = None,
    ) -> None:
        """Load `path` (a .gguf file).

        Args:
            offload: None (all layers on the GPU of a GPU build), an `OffloadPolicy` or its CLI form
                (the weights' GPU share becomes a share of the layers), or "auto" (what fits in free GPU memory).
            n_ctx: the context to allocate; None takes the file's context length, capped so its KV cache
                fits a memory budget (engine.runtime_settings.choose_context).
            n_threads: CPU threads while decoding; None: one fewer than the usable CPUs, at most the
                physical cores (engine/backends/llamacpp/threads.py says why).
            n_threads_batch: CPU threads for prompts; None: as n_threads.
            n_gpu_layers: layers on the GPU (-1: all), instead of what `offload` would choose.
            n_batch: tokens per llama_decode call (prefill chunk); None: N_BATCH.
            flash_attn: llama.cpp's fused attention; None lets llama.cpp decide (on where supported).
        """
        path = Path(path)
        header = read_header(path)  # raises ModelLoadError on a file llama.cpp might abort on
        native.init()
        native.take_recent_errors()
        self.path = path
        self.header = header
        if n_gpu_layers is not None and offload is not None:
            raise ValueError("give either n_gpu_layers or offload, not both: both say which layers run on the GPU")
        self._choose_threads(n_threads, n_threads_batch)
        n_batch = n_batch or N_BATCH
        n_layers = int(header.arch_value("block_count", 0) or 0)
        per_token = kv_bytes_per_token(header)
        self.context = choose_context(
            header.context_length, n_ctx, kv_bytes_per_token=per_token, available_bytes=free_cpu_bytes()
        )
        self.n_ctx = self.context.n_ctx
        ctx_reason = self.context.capped or ("as asked" if n_ctx is not None else "the model's context length")
        gpus = native.gpu_devices()
        self.gpu_plan = _gpu_plan(header, offload, n_gpu_layers, n_layers, per_token * self.n_ctx, gpus)
        log.info("llama.cpp: n_ctx %d (%s); %s; %d decode threads, %d prompt threads",
                 self.n_ctx, ctx_reason, self.gpu_plan.reason, self.n_threads, self.n_threads_batch)

        mparams = native.model_params(self.gpu_plan.n_gpu_layers)
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), mparams)
        if not self.model:
            why = native.take_recent_errors() or "see the log"
            raise ModelLoadError(f"llama.cpp could not load {path.name}: {why}")
        self.ctx = None
        self._batch: native.Batch = None  # type: ignore[assignment]  # made below; None only once closed
        try:
            self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model)))
            self.flash_attn = "auto" if flash_attn is None else "on" if flash_attn else "off"
            self.ctx = llama_cpp.llama_init_from_model(self.model, self._context_params(n_batch, flash_attn))
            if not self.ctx:
                why = native.take_recent_errors() or "out of memory?"
                raise ModelLoadError(f"llama.cpp could not create a context of {self.n_ctx} tokens: {why}")
            # llama.cpp rounds the cache up (to 256 cells); the limit we enforce stays the one chosen.
            self.n_ctx = min(self.n_ctx, int(llama_cpp.llama_n_ctx(self.ctx)))
            self._memory = llama_cpp.llama_get_memory(self.ctx)
            self._abort = AbortSwitch(self.ctx)  # stops a long prompt chunk when the caller cancels
            self._batch = native.Batch(n_batch)
            self.n_batch = n_batch
            self.tokenizer = LlamaCppTokenizer(self.model, header.chat_template)
            self.info = self._describe(spec, display_name, gpus)
        except BaseException:
            self.close()
            raise
        self._tokens: list[int] = []
        self._schedule = CacheSchedule()  # the llama_decode calls of each cached position (exact replays)
        self.tokens_evaluated = 0  # every token run through the model, for tests and stats
        self._overlap_pool: ThreadPoolExecutor | None = None  # made on the first forward_during

    def _choose_threads(self, n_threads: int | None, n_threads_batch: int | None) -> None:
        self.n_threads = n_threads or default_threads()
        self.n_threads_batch = n_threads_batch or self.n_threads  # as llama.cpp: the prompt's follow the decode's
        # Not asked for: chosen again for each answer from the cores free then (engine/cpu_load.py).
        self._threads_per_answer = ThreadsPerAnswer(fallback=self.n_threads) if not n_threads else None
        self._batch_threads_follow = not n_threads_batch
        self._rechoose_at = 0.0  # time.monotonic() at which an answer's decode steps look at the free cores again
        self._answer_threads = (self.n_threads, self.n_threads_batch)  # the counts the last answer started on

    def _context_params(self, n_batch: int, flash_attn: bool | None) -> Any:
        """llama.cpp's context parameters for this model: one sequence, logits of one position, the chosen
        threads, and the sliding-window layers kept whole."""
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = self.n_ctx
        cparams.n_batch = cparams.n_ubatch = n_batch
        cparams.n_seq_max = 1
        # Only the last position's logits are ever asked for: without this llama.cpp reserves room
        # for n_batch rows of logits (512 x 49k floats = 96 MiB for the default model).
        cparams.n_outputs_max = 1
        cparams.n_threads, cparams.n_threads_batch = self.n_threads, self.n_threads_batch
        cparams.offload_kqv = self.gpu_plan.offload_kqv
        cparams.swa_full = True  # sliding-window layers keep every position, so trimming stays exact
        cparams.no_perf = True
        if flash_attn is not None:
            cparams.flash_attn_type = int(flash_attn)  # LLAMA_FLASH_ATTN_TYPE_DISABLED 0 / ENABLED 1
        return cparams

    def _describe(self, spec: str, display_name: str, gpus: list[native.GpuDevice]) -> ModelInfo:
        plan = self.gpu_plan
        n_layers = int(llama_cpp.llama_model_n_layer(self.model))
        if plan.n_gpu_layers > 0 and gpus:
            gpu = f"{gpus[0].name} ({gpus[0].description})" if gpus[0].description else gpus[0].name
            on_gpu = min(plan.n_gpu_layers, n_layers)
            device = f"{gpu}: {on_gpu}/{n_layers} layers" + ("" if plan.offload_kqv else ", KV cache on CPU")
            if on_gpu < n_layers:
                device += f"; cpu ({self._threads_text()}) for the rest"
        else:
            device = f"cpu ({self._threads_text()})"
        desc = ctypes_desc(self.model)
        return ModelInfo(
            name=display_name,
            spec=spec,
            path=str(self.path),
            architecture=self.header.architecture or desc,
            parameters=int(llama_cpp.llama_model_n_params(self.model)),
            dtype=self.header.quantization or "gguf",
            context_length=self.n_ctx,
            vocab_size=self.n_vocab,
            bytes=int(llama_cpp.llama_model_size(self.model)),
            backend=self.name,
            device=f"{device}; llama.cpp",
            quantization=self.header.quantization,
            file_bytes=self.header.file_bytes,
            runtime=self._runtime_facts(),
        )

    def _runtime_facts(self) -> RuntimeFacts:
        """What it runs with, for the window's runtime settings dialog and status bar."""
        gpu_build = bool(llama_cpp.llama_supports_gpu_offload())
        takes = tuple(n for n in RuntimeSettings.names() if gpu_build or n != "n_gpu_layers")
        in_use = RuntimeSettings(
            n_threads=self.n_threads, n_threads_batch=self.n_threads_batch, n_ctx=self.n_ctx,
            n_gpu_layers=self.gpu_plan.n_gpu_layers, n_batch=self.n_batch,
        )
        return RuntimeFacts(
            in_use=in_use,
            trained_context=self.context.trained,
            kv_cache_bytes=self.context.kv_bytes_per_token * self.n_ctx,
            context_note=self.context.capped,
            takes=takes,
            reasons=() if gpu_build else (("n_gpu_layers", NO_GPU),),
        )

    def _threads_text(self) -> str:
        if self._threads_per_answer is not None:  # no count chosen: each answer takes the cores free then
            per_answer = self._threads_per_answer.describe()
            return per_answer if self._batch_threads_follow else f"{per_answer}; {self.n_threads_batch} for prompts"
        if self.n_threads == self.n_threads_batch:
            return threads_text(self.n_threads)
        count, unit = threads_text(self.n_threads).split()
        return f"{count} decode {unit}, {self.n_threads_batch} for prompts"

    # --- the Backend protocol -------------------------------------------------

    def _cut_cache(self, keep: int) -> bool:
        # False e.g. for a recurrent model, whose state cannot be cut back: then start over
        cut = bool(llama_cpp.llama_memory_seq_rm(self._memory, 0, keep, -1))
        if cut:
            self._schedule.trim(keep)
        return cut

    def _clear_cache(self) -> None:
        self._schedule.clear()
        self._reset()

    def cache_schedule(self, upto: int) -> tuple[tuple[int, int], ...]:
        """The llama_decode calls the first `upto` cached positions came from (RecordsCacheSchedule): on the CPU a
        call's size changes the numbers, so an exact replay computes its prompt in these pieces."""
        return self._schedule.upto(upto)

    def forward(self, token_ids: Sequence[int]) -> np.ndarray:
        ids = [int(t) for t in token_ids]
        if not ids:
            raise ValueError("forward needs at least one token")
        if len(self._tokens) + len(ids) > self.n_ctx:
            raise ContextLengthError(
                f"{len(self._tokens) + len(ids)} tokens do not fit the context of {self.n_ctx} "
                f"(raise n_ctx, up to the model's {self.header.context_length})"
            )
        bad = [t for t in ids if not 0 <= t < self.n_vocab]
        if bad:  # llama.cpp aborts on an out-of-range id
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{self.n_vocab - 1})")
        if len(ids) == 1 and self._threads_per_answer is not None and time.monotonic() >= self._rechoose_at:
            self._follow_free_cores()  # a decode step: the free cores looked at again, four times a second
        start = len(self._tokens)
        try:
            for lo in range(0, len(ids), self.n_batch):
                chunk = ids[lo : lo + self.n_batch]
                self._batch.clear()
                for j, t in enumerate(chunk):
                    self._batch.add(t, start + lo + j, 0, lo + j == len(ids) - 1)
                native.decode(self.ctx, self._batch)
                self.tokens_evaluated += len(chunk)
                self._tokens.extend(chunk)
                self._schedule.ran(len(chunk))
        except BaseException:
            # A failed decode may leave part of a chunk in the cache: cut back to what we know.
            llama_cpp.llama_memory_seq_rm(self._memory, 0, len(self._tokens), -1)
            raise
        # One (V,) float32 row for our sampler (~0.2 MB at 49k): the only copy of logits per step.
        return native.logits_row(self.ctx, -1, self.n_vocab)

    def forward_until(self, token_ids: Sequence[int], cancelled: Callable[[], bool]) -> np.ndarray | None:
        """`forward`, stopped within milliseconds once `cancelled()` is true: then None (InterruptibleForward).

        The llama_decode calls that finished stay cached; the one stopped leaves nothing behind.
        `cancelled` is polled from a helper thread.
        """
        self.choose_threads()  # every answer's prompt comes this way (engine.backend.prefill)
        with self._abort.watching(cancelled):
            try:
                return self.forward(token_ids)
            except native.DecodeError as e:
                if e.code == ABORTED and self._abort.tripped:
                    return None
                raise

    def choose_threads(self) -> tuple[int, int]:
        """llama.cpp's threads for the answer (or the runner's call) about to start: every core other programs
        leave free now, unless the user chose a count. Returns (decode, prompt) threads."""
        if self._threads_per_answer is None or not self.ctx:
            return self.n_threads, self.n_threads_batch
        self._set_threads(self._threads_per_answer.now())
        self._answer_threads = (self.n_threads, self.n_threads_batch)
        return self.n_threads, self.n_threads_batch

    def threads_during(self) -> tuple[int, int] | None:
        """The (decode, prompt) counts for the rest of a run under way, from the cores free over the last
        `RECHOOSE_EVERY_S` (threads.py) only; None when the user chose the counts or nothing can be measured
        (keep the counts then)."""
        if self._threads_per_answer is None:
            return None
        n = self._threads_per_answer.during(llamacpp_threads.RECHOOSE_EVERY_S)
        if n is None:
            return None
        return n, (n if self._batch_threads_follow else self.n_threads_batch)

    def _follow_free_cores(self) -> None:
        """Between two decode steps of an answer, every `RECHOOSE_EVERY_S` (threads.py): the count again, from
        the cores free over that last stretch only. The count at the answer's start read the second before it,
        and a client that imported its libraries just before it sent the request looks like a busy program
        there: the whole answer then ran on one thread of two (`bench/serve.py`'s client, 0.67-0.70 of the
        direct rate). And a program that starts mid-answer now takes its core back within a stretch, where two
        threads beside it fall to a few tokens a second (threads.py). llama.cpp's CPU floats do not depend on
        the count (its threads split rows, not sums), so the answer's numbers are the same either way."""
        counts = self.threads_during()  # None: nothing measured this time, so the count stays
        self._set_threads(self.n_threads if counts is None else counts[0])

    def _set_threads(self, n: int) -> None:
        self._rechoose_at = time.monotonic() + llamacpp_threads.RECHOOSE_EVERY_S
        batch = n if self._batch_threads_follow else self.n_threads_batch
        if (n, batch) != (self.n_threads, self.n_threads_batch):
            llama_cpp.llama_set_n_threads(self.ctx, n, batch)
            log.debug("llama.cpp: %d decode threads, %d prompt threads", n, batch)
            self.n_threads, self.n_threads_batch = n, batch

    def forward_during(self, token_ids: Sequence[int], work: Callable[[], T]) -> tuple[np.ndarray, T]:
        """`forward` on this thread, `work()` on a helper thread meanwhile (OverlappedForward).

        `llama_decode` releases the GIL for the whole forward, so the helper's Python (the decode loop's
        report of the previous token) runs on another core while llama.cpp computes; llama.cpp's own
        threads are not disturbed, and the forward itself is the same call as `forward`.
        """
        if self._overlap_pool is None:
            self._overlap_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llamacpp-overlap")
        pending = self._overlap_pool.submit(work)
        try:
            logits = self.forward(token_ids)
        except BaseException:
            wait([pending])
            raise
        return logits, pending.result()

    def peak_memory_bytes(self) -> int:
        return process_peak_rss_bytes()

    def close(self) -> None:
        pool = getattr(self, "_overlap_pool", None)
        if pool is not None:
            pool.shutdown()
            self._overlap_pool = None
        tokenizer = getattr(self, "tokenizer", None)
        if tokenizer is not None:
            tokenizer.detach()
        native.free_context(self.ctx, self._batch)
        self.ctx = self._batch = None  # type: ignore[assignment]  # closed: a later use fails
        if self.model:
            llama_cpp.llama_model_free(self.model)
        self.model = None
        self._tokens = []

    # --- capabilities (engine.capabilities) ----------------------------------------------

    def numeric_facts(self) -> NumericSetup:
        """What changes the numbers here (NumericFacts): the library, the threads this answer started on (its
        decode steps may follow the free cores after: `_follow_free_cores`), the batch sizes (a prompt is summed
        in n_ubatch-token pieces), flash attention, the layers on a GPU."""
        device = "cpu" if self.gpu_plan.n_gpu_layers <= 0 else self.info.device.split(":")[0]
        n_threads, n_threads_batch = self._answer_threads
        return NumericSetup.of(
            ("llama-cpp-python",), device=device, n_threads=n_threads, n_threads_batch=n_threads_batch,
            n_batch=self.n_batch, n_ubatch=self.n_batch, flash_attn=self.flash_attn,
            n_gpu_layers=self.gpu_plan.n_gpu_layers, kv_cache="f16", gpu_offload=bool(llama_cpp.llama_supports_gpu_offload()),
        )

    def layer_capture(self, token_ids: Sequence[int], positions: Sequence[int], *, top_k: int = 10,
                      attention: bool = False) -> list[LayerCapture]:
        """Each layer's prediction at `positions` and, when asked, attention (LayerLens: llamacpp/lens.py)."""
        from engine.backends.llamacpp.lens import layer_capture

        return layer_capture(self, token_ids, positions, top_k=top_k, attention=attention)

    def batch_runners_admit_rows(self) -> bool:
        """JoinableBatches: every `LlamaCppRunner` row is a sequence of its own, so a new one can start any time."""
        return True

    def batch_runner(self) -> LlamaCppRunner:
        """Several sequences per llama_batch on a second context over the same weights (BatchRunners). Each
        `start` takes the threads an answer would get then (the cores other programs leave free)."""
        return LlamaCppRunner(self)

    def position_runner(self, n_tokens: int) -> LlamaCppRunner:
        """Every position of one sequence (PositionRunners): one sequence, a cache of just this text,
        room for one chunk of logits rows. Its threads are chosen as an answer's are (the cores other
        programs leave free now): the scoring context takes the backend's counts when it is made."""
        self.choose_threads()
        chunk = positions_per_chunk(self.n_vocab)
        return LlamaCppRunner(self, max_seqs=1, n_batch=chunk, n_ctx=max(n_tokens, chunk), n_outputs=chunk)

    def _reset(self) -> None:
        self._schedule.clear()
        llama_cpp.llama_memory_clear(self._memory, True)
        self._tokens = []


def ctypes_desc(model: llama_cpp.llama_model_p) -> str:
    import ctypes

    buf = ctypes.create_string_buffer(256)
    llama_cpp.llama_model_desc(model, buf, 256)
    return buf.value.decode("utf-8", errors="replace")
