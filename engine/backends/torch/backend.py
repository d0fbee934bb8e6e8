"""The torch backend: transformers' AutoModelForCausalLM with our own KV-cache handling.

CUDA when available, else CPU with every usable core. One KV cache is kept
between requests so a request sharing a prefix with the previous one only
runs its new tokens. The cache is our preallocated `GrowingCache`
(engine.backends.torch.cache): a decode step writes in place instead of
copying the whole cache, so a step grows only by attention over the cached
tokens as an answer gets long (docs/torch.md has the figures). Models whose
layer types it does not know, and offloaded models, use transformers'
`DynamicCache`.

A decode step (one token) of a Llama-shaped model runs through the lean
step (engine.backends.torch.lean) rather than transformers' forward: the same
arithmetic on the same weights in fewer ops (on the CPU, each weight through
the faster of MKL's and oneDNN's kernels on this machine: cpu_linear), checked
against transformers on its first use. Prefill, other architectures and
offloaded models go through transformers; on CUDA a compiled step
(engine.backends.torch.compile) takes over from both once it is built.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from pathlib import Path

import numpy as np
import torch

from engine.backend import CachedTokens, process_peak_rss_bytes
from engine.cpu_load import ThreadsPerAnswer, threads_text
from engine.backends.torch.compat import with_cache
from engine.backends.torch.device_rows import TorchDeviceRows
from engine.backends.torch.compile import CompiledDecodeStep, compile_wanted, relative_logit_error
from engine.backends.torch.foreground import foreground_step
from engine.backends.torch.lean import LeanDecodeStep
from engine.backends.torch.static_lean import StaticLeanStep
from engine.backends.torch.overlap import OverlapPool
from engine.backends.torch.runner import TorchRunner
from engine.backends.torch.steering import TorchSteering
from engine.devices import check_device_name, require_available
from engine.layer_capture import LayerCapture
from engine.offload.policy import OffloadPolicy
from engine.errors import ModelLoadError
from engine.fingerprints.record import NumericSetup
from engine.model_info import ModelInfo
from engine.runtime_settings import RuntimeFacts, RuntimeSettings
from engine.sampling.settings import SamplerSettings
from engine.sampling.torch_chain import TorchChain
from engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")

# The runtime settings torch leaves to itself, and why (the runtime dialog shows it under each).
TORCH_TAKES = ("n_threads",)  # engine.backends.select.RUNTIME_SETTINGS_TAKEN says the same before loading
TORCH_CHOOSES_FIELDS = tuple(name for name in RuntimeSettings.names() if name not in TORCH_TAKES)
TORCH_CHOOSES = (
    "torch chooses it: its cache grows with the text, a prompt is read in one call on the same threads, and "
    "layers are placed by offload; context length, prompt threads, GPU layers and batch size are settings of "
    "llama.cpp models (.gguf files)"
)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# How far the lean decode step may be from transformers' forward, relative to the largest logit: float32
# is bit-identical on the CPU with torch's matmul kernel and ~1e-6 off with oneDNN's (cpu_linear, checked);
# half precision may round differently when kernels differ.
LEAN_TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}


def pick_device(device: str | None) -> torch.device:
    """The compute device: `device` when it is usable here (else a UsageError), CUDA when present, else the CPU."""
    if device:
        chosen = torch.device(check_device_name(device))
        require_available(chosen)  # a CUDA build of torch without a driver must fail here, not inside a library
        return chosen
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype:
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
        return DTYPES[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    # bf16 matmuls are slower than fp32 on CPUs without AMX, and 135M-parameter models fit easily.
    return torch.float32


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


class TorchBackend(CachedTokens, TorchSteering):  # steering: a hook on the decoder layers (steering.py)
    name = "torch"

    def __init__(
        self,
        folder: Path,
        *,
        spec: str,
        display_name: str,
        device: str | None = None,
        dtype: str | None = None,
        trust_remote_code: bool = False,
        offload: OffloadPolicy | str | None = None,
        compile_step: bool | None = None,
        n_threads: int | None = None,
        sample_on_device: bool | None = None,
    ) -> None:
        """`compile_step`: build a torch.compile'd decode step in the background (None: the
        LOGITLAB_TORCH_COMPILE environment variable, else on for CUDA and off for the CPU). `n_threads`: CPU
        threads for every answer (None: the cores other programs leave free at each answer's start, see
        engine/cpu_load.py). A fixed count makes two runs sum in the same order, so their floats repeat bit for
        bit whatever else the machine does; it is set again at each answer, as torch's count is per process.
        `sample_on_device`: keep each answer's rows on the model's device and run the sampler chain there
        (SamplesOnDevice, engine/backends/torch/device_rows.py; None: on an accelerator, not on the CPU, where the
        row is in host memory already and the numpy chain is the faster)."""
        from transformers import AutoModelForCausalLM

        self.device = pick_device(device)
        if n_threads is not None and self.device.type != "cpu":
            raise ValueError(f"{self._threads_not_taken()}, so leave them out")
        self._threads_per_answer = None  # on the CPU: threads chosen for each answer (engine/cpu_load.py)
        self._fixed_threads = n_threads if self.device.type == "cpu" else None
        if self.device.type == "cpu":
            torch.set_num_threads(n_threads or usable_cores())
            if not n_threads:
                self._threads_per_answer = ThreadsPerAnswer(fallback=usable_cores())
        self.dtype = pick_dtype(dtype, self.device)
        self.sample_on_device = self.device.type != "cpu" if sample_on_device is None else sample_on_device
        self.tokenizer = Tokenizer.from_folder(folder, trust_remote_code)
        self.offload = None  # OffloadHandle when weights are streamed (engine.offload)
        self._overlap: OverlapPool | None = None  # made on the first forward_during
        try:
            if offload is not None:
                from engine.offload import load_offloaded, parse_offload

                policy = None if offload == "auto" else parse_offload(offload) if isinstance(offload, str) else offload
                model, self.offload = load_offloaded(
                    Path(folder), policy, device=self.device, dtype=self.dtype, trust_remote_code=trust_remote_code
                )
            else:
                model = AutoModelForCausalLM.from_pretrained(
                    str(folder), dtype=self.dtype, trust_remote_code=trust_remote_code
                ).to(self.device)  # type: ignore[arg-type]  # transformers' stub of `to` wants a model
        except (ValueError, ModelLoadError):
            raise
        except Exception as e:
            raise ModelLoadError(f"could not load the model in {folder}: {type(e).__name__}: {e}") from e
        self.model = model.eval()
        self._cache: Any = None  # GrowingCache (or transformers' own), made by the first forward
        self._tokens: list[int] = []
        self.info = self._describe(folder, spec, display_name)
        self.compiled = None  # CompiledDecodeStep, swapped in by forward() once its thread has built it
        self.lean = None  # LeanDecodeStep for Llama-shaped models: decode steps without transformers' overhead
        if self.offload is None:
            self.lean = LeanDecodeStep.for_model(self.model)
            if compile_wanted(self.device, compile_step):
                # The lean step's arithmetic where the model has one; its check's tolerance is per dtype.
                static = StaticLeanStep(self.lean) if self.lean is not None else None
                self.compiled = CompiledDecodeStep(self.model, lean=static)

    def _describe(self, folder: Path, spec: str, display_name: str) -> ModelInfo:
        cfg = self.model.config.get_text_config()
        params = sum(p.numel() for p in self.model.parameters())
        nbytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        device = str(self.device)
        if self.device.type == "cuda":
            device = f"cuda ({torch.cuda.get_device_name(self.device)})"
        elif self.device.type == "cpu":
            per_answer = self._threads_per_answer
            device = f"cpu ({per_answer.describe() if per_answer else threads_text(torch.get_num_threads())})"
        if self.offload is not None:
            device += f"; offload {self.offload.policy.describe()}"
        return ModelInfo(
            name=display_name,
            spec=spec,
            path=str(folder),
            architecture=(self.model.config.architectures or [type(self.model).__name__])[0],
            parameters=params,
            dtype=str(self.dtype).removeprefix("torch."),
            context_length=int(getattr(cfg, "max_position_embeddings", 0) or 0),
            vocab_size=int(cfg.vocab_size),
            bytes=nbytes,
            backend=self.name,
            device=device,
            runtime=self._runtime_facts(),
        )

    def _runtime_facts(self) -> RuntimeFacts:
        """What the runtime settings dialog may set: the CPU threads, on the CPU; the rest is llama.cpp's."""
        on_cpu = self.device.type == "cpu"
        threads = (self._fixed_threads or torch.get_num_threads()) if on_cpu else None
        gpu = () if on_cpu else (("n_threads", self._threads_not_taken()),)
        return RuntimeFacts(in_use=RuntimeSettings(n_threads=threads), takes=TORCH_TAKES if on_cpu else (),
                            reasons=gpu + tuple((name, TORCH_CHOOSES) for name in TORCH_CHOOSES_FIELDS))

    def _threads_not_taken(self) -> str:
        return f"threads (n_threads) are the CPU's; this model runs on {self.device}"

    def numeric_facts(self) -> NumericSetup:
        """What changes the numbers here (NumericFacts): the libraries, device and dtype, the CPU threads of
        this answer (a matmul split another way sums in another order), which decode step ran, attention."""
        step = "compiled" if self.compiled is not None else "lean" if self.lean is not None else "transformers"
        if getattr(self, "_lean_checked", False):  # the first lean step is checked: that step is transformers'
            step += ", one step transformers' (the lean step's check)"
        return NumericSetup.of(
            (("torch", str(torch.__version__)), "transformers"),  # torch's own version names its build (+cu130)
            device=str(self.device), dtype=str(self.dtype).removeprefix("torch."),
            n_threads=torch.get_num_threads() if self.device.type == "cpu" else None, decode_step=step,
            attention=str(getattr(self.model.config, "_attn_implementation", "") or ""),
            matmul_precision=torch.get_float32_matmul_precision(),
            deterministic=torch.are_deterministic_algorithms_enabled(),
            offload=self.offload.policy.describe() if self.offload is not None else None,
        )

    # --- the Backend protocol -------------------------------------------------

    def trim_cache(self, keep: int) -> int:
        # Every answer's prompt starts here (engine.backend.prefill): its CPU threads are the cores
        # other programs leave free now (torch's count is per process; changed only when it differs).
        self._lean_checked = False  # a new answer: the lean step's check (if any) belongs to this one
        self._take_threads()
        return super().trim_cache(keep)

    def _take_threads(self) -> None:
        """Set torch's CPU threads for the work about to start: the fixed count, or the free cores now."""
        n = self._fixed_threads or (self._threads_per_answer.now() if self._threads_per_answer is not None else None)
        if n is not None and n != torch.get_num_threads():
            torch.set_num_threads(n)

    def _cut_cache(self, keep: int) -> bool:
        if self._cache is None:
            return False
        try:
            self._cache.crop(keep - len(self._tokens))  # negative: remove that many from the end
        except (RuntimeError, ValueError) as e:
            # A sliding-window layer no longer holds the window before `keep` (GrowingCache keeps
            # SLIDING_REACH tokens more than the window; DynamicCache none): recompute instead.
            log.debug("cache cannot be trimmed (%s); rebuilding", e)
            return False
        return True

    def _clear_cache(self) -> None:
        self._reset()

    # --- capabilities (engine.capabilities) ----------------------------------------------

    def layer_capture(self, token_ids: Sequence[int], positions: Sequence[int], *, top_k: int = 10,
                      attention: bool = False) -> list[LayerCapture]:
        """Each layer's prediction at `positions` and, when asked, attention (LayerLens: torch/lens.py)."""
        from engine.backends.torch.lens import layer_capture

        return layer_capture(self, token_ids, positions, top_k=top_k, attention=attention)

    def batch_runner(self) -> TorchRunner:
        """Many sequences in one transformers forward (BatchRunners)."""
        return TorchRunner(self.model, getattr(self.tokenizer.hf, "pad_token_id", None) or 0,
                           lean=self.lean, lean_tolerance=LEAN_TOLERANCE[self.dtype],
                           # a steered cache is not what the unsteered rows compute: not shared then
                           backend_cache=lambda: (self._tokens, self._cache) if self.steering_key() is None else ((), None))

    def position_runner(self, n_tokens: int) -> TorchRunner:
        """Every position of one sequence (PositionRunners); its KV cache goes where the offload policy
        puts this backend's own, so scoring an offloaded model fits where generating does."""
        del n_tokens  # transformers' caches grow as needed
        # Threads as for an answer (trim_cache): torch's barriers wait on a core another program holds; 1,000
        # positions took 8-17 s on 2 threads beside one busy core, 4.5-4.9 s on 1 (bench/model_diff.py's text).
        self._take_threads()
        if self.offload is None:
            return TorchRunner(self.model)
        from engine.offload import make_kv_cache

        model, policy, device = self.model, self.offload.policy, self.device
        return TorchRunner(model, new_cache=lambda: make_kv_cache(model.config, policy, device))

    def _new_cache(self) -> Any:  # GrowingCache, an offloading cache or transformers' DynamicCache
        if self.offload is not None:
            from engine.offload import make_kv_cache

            return make_kv_cache(self.model.config, self.offload.policy, self.device)
        from engine.backends.torch.cache import GrowingCache, UnsupportedCacheLayout

        try:
            return GrowingCache(self.model.config)
        except UnsupportedCacheLayout as e:
            from transformers import DynamicCache

            log.debug("%s; using transformers' DynamicCache", e)
            return DynamicCache(config=self.model.config)

    def forward(self, token_ids: Sequence[int]) -> np.ndarray:
        return self._forward(token_ids).float().cpu().numpy()  # (V,)

    def forward_on_device(self, token_ids: Sequence[int]) -> torch.Tensor:
        """`forward`'s (V,) float32 row left on the model's device: a copy of its own, which nothing writes to
        later (a compiled step's CUDA graph writes its output buffer again at its next replay, while this row's
        report may still be read)."""
        return self._forward(token_ids).to(torch.float32, copy=True)

    def device_rows(self, settings: SamplerSettings, vocab: Any, constraint: Any = None) -> TorchDeviceRows | None:
        """SamplesOnDevice: the answer's rows on this model's device, sampled there, when that is asked for
        (`sample_on_device`) and the device chain takes `settings` (not banned strings or custom stages)."""
        if not self.sample_on_device or not TorchChain.supports(settings):
            return None
        return TorchDeviceRows(self, TorchChain(settings, vocab, constraint=constraint))

    @torch.inference_mode()
    def _forward(self, token_ids: Sequence[int]) -> torch.Tensor:
        """The forward's last (V,) row, as the model computed it (its dtype, on its device)."""
        foreground_step()  # a compile under way in the background pauses while answers run
        if self._cache is None:
            self._cache = self._new_cache()
        one_token = len(token_ids) == 1 and getattr(self._cache, "supports_static_step", False)
        # The compiled step has no steering in its graph: transformers' forward (hooks) or the lean step instead.
        steered = self.steering_tensor() is not None
        step = self.compiled.step if self.compiled is not None and one_token and not steered else None
        try:
            with self.steered():  # the hooks add the steering to transformers' forward (none when unsteered)
                if step is not None:
                    with self._cache.static_step():
                        logits = step(self.model, self._ids(token_ids), self._cache)
                elif self.lean is not None and one_token:
                    logits = self._lean_step(int(token_ids[0]))
                else:
                    logits = self._transformers_forward(token_ids)
        except BaseException:
            self._reset()  # a half-updated cache no longer matches self._tokens
            raise
        self._tokens.extend(int(t) for t in token_ids)
        return logits[0, -1]

    def forward_during(self, token_ids: Sequence[int], work: Callable[[], T]) -> tuple[np.ndarray, T]:
        """`forward` on a helper thread, `work()` on this one meanwhile (OverlappedForward, overlap.py).

        The row is a fresh numpy copy (`.cpu().numpy()` of a new tensor): nothing writes to it later.
        """
        return self._overlapped(lambda: self.forward(token_ids), work)

    def forward_on_device_during(self, token_ids: Sequence[int], work: Callable[[], T]) -> tuple[torch.Tensor, T]:
        """`forward_on_device` on the helper thread, `work()` on this one meanwhile."""
        return self._overlapped(lambda: self.forward_on_device(token_ids), work)

    def _overlapped(self, forward: Callable[[], R], work: Callable[[], T]) -> tuple[R, T]:
        if self._overlap is None:
            self._overlap = OverlapPool()
        return self._overlap.run(forward, work)

    def _ids(self, token_ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)  # (1, T)

    def _transformers_forward(self, token_ids: Sequence[int]) -> torch.Tensor:
        # logits_to_keep=1: the head projects only the last position, (1, 1, V) not (1, T, V)
        ids = self._ids(token_ids)
        return self.model(input_ids=ids, **with_cache(self.model, self._cache), use_cache=True, logits_to_keep=1).logits

    def _lean_step(self, token: int) -> torch.Tensor:
        """One token through the lean step; its first use per model is checked against transformers' forward."""
        lean = self.lean
        assert lean is not None  # forward() takes this path only with a lean step
        if lean.verified:
            return lean.step(token, self._cache, *self._lean_steer())
        try:
            ours = lean.step(token, self._cache, *self._lean_steer())
        except Exception as e:  # a model the step misjudged costs speed, never the answer; the cache is intact
            self.lean = None  # (layer lengths move only after every layer ran)
            log.warning("the lean decode step failed (%s: %s); decoding uses transformers' forward",
                        type(e).__name__, e)
            return self._transformers_forward([token])
        self._cache.crop(-1)  # the same position again, through transformers
        theirs = self._transformers_forward([token])
        self._lean_checked = True  # this answer's step came from transformers' forward, not the lean step
        err = relative_logit_error(ours, theirs)
        if err <= LEAN_TOLERANCE[self.dtype]:
            lean.verified = True
        else:
            self.lean = None
            log.warning("the lean decode step differs from transformers' forward by %.3g of the largest logit; "
                        "decoding uses the latter", err)
        return theirs

    def _lean_steer(self) -> tuple:
        """The lean step's steering argument: none when unsteered (the step is called as before)."""
        add = self.steering_tensor()
        return () if add is None else (add,)

    def peak_memory_bytes(self) -> int:
        # The preallocated KV cache counts in full from when it is reserved, not only the filled part:
        # on CUDA it is allocated memory; on the CPU its buffers are zero-filled, so their pages are resident.
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return process_peak_rss_bytes()

    def close(self) -> None:
        overlap = getattr(self, "_overlap", None)  # (None also when __init__ failed before making it)
        if overlap is not None:  # its helper thread ends with the backend
            overlap.close()
            self._overlap = None
        if self.compiled is not None:  # a build still under way ends now, not minutes after its model
            self.compiled.close()
        self._reset()
        if self.offload is not None:
            self.offload.close()
        self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _reset(self) -> None:
        self._cache = None
        self._tokens = []
