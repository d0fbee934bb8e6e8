"""The MLX backend: mlx-lm models on Apple Silicon (and on Linux CPU through `mlx[cpu]`).

mlx-lm supplies the architectures and the prompt cache; sampling stays ours
(`engine.sampling`), so a token chosen here is the token torch would choose
from the same logits. Everything runs on the engine's worker thread, on a
stream made by that thread, and the streams are cleared when it closes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import mlx.core as mx
import numpy as np

from engine.backend import CachedTokens
from engine.backends.mlx.runner import MlxRunner
from engine.backends.mlx.steering import MlxSteering
from engine.errors import ModelLoadError
from engine.model_info import ModelInfo
from engine.fingerprints.record import NumericSetup
from engine.layer_capture import LayerCapture
from engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)
T = TypeVar("T")


class MlxBackend(CachedTokens, MlxSteering):  # steering: its layers wrapped while a forward is built (steering.py)
    name = "mlx"

    def __init__(self, folder: Path, *, spec: str, display_name: str, trust_remote_code: bool = False):
        from mlx_lm.models.cache import make_prompt_cache
        from mlx_lm.utils import load_model

        self._make_cache = make_prompt_cache
        self.stream = mx.new_stream(mx.default_device())
        self.tokenizer = Tokenizer.from_folder(folder, trust_remote_code)
        try:
            self.model, config = load_model(Path(folder), trust_remote_code=trust_remote_code)
        except Exception as e:
            raise ModelLoadError(f"mlx-lm could not load the model in {folder}: {type(e).__name__}: {e}") from e
        self._cache: list[Any] | None = None  # mlx-lm's prompt cache, one entry per layer (made on first use)
        self._tokens: list[int] = []
        mx.reset_peak_memory()
        self.info = self._describe(folder, spec, display_name, config)

    def _describe(self, folder: Path, spec: str, display_name: str, config: dict) -> ModelInfo:
        from mlx.utils import tree_flatten

        params = cast(list[tuple[str, Any]], tree_flatten(self.model.parameters()))  # (name, array) pairs
        text_cfg = config.get("text_config", config)
        dtypes = {str(v.dtype).removeprefix("mlx.core.") for _, v in params}
        return ModelInfo(
            name=display_name,
            spec=spec,
            path=str(folder),
            architecture=(config.get("architectures") or [config.get("model_type", "?")])[0],
            parameters=sum(v.size for _, v in params),
            dtype="/".join(sorted(dtypes)),
            context_length=int(text_cfg.get("max_position_embeddings", 0) or 0),
            vocab_size=int(text_cfg.get("vocab_size", 0)),
            bytes=sum(v.nbytes for _, v in params),
            backend=self.name,
            device=f"{mx.default_device().type.name} (mlx {mx.__version__})",  # type: ignore[attr-defined]  # not in mlx's stubs
        )

    def numeric_facts(self) -> NumericSetup:
        """What changes the numbers here (NumericFacts): mlx and mlx-lm's versions, the device, the dtypes."""
        return NumericSetup.of(("mlx", "mlx-lm"), device=mx.default_device().type.name, dtype=self.info.dtype)

    # --- the Backend protocol -------------------------------------------------

    def _cut_cache(self, keep: int) -> bool:
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        if self._cache is None or not can_trim_prompt_cache(self._cache):
            return False  # e.g. a rotating (sliding-window) cache that wrapped: rebuild
        drop = len(self._tokens) - keep
        return trim_prompt_cache(self._cache, drop) == drop

    def _clear_cache(self) -> None:
        self._reset()

    def forward(self, token_ids: Sequence[int]) -> np.ndarray:
        return self._finish(token_ids, self._start(token_ids))

    def forward_during(self, token_ids: Sequence[int], work: Callable[[], T]) -> tuple[np.ndarray, T]:
        """`forward`, with `work()` run on this thread while MLX computes (OverlappedForward).

        The graph is built and handed to `mx.async_eval`, as mlx-lm's `generate_step` does with its next
        token; `work` (the decode loop's report of the previous token) runs meanwhile.
        """
        logits = self._start(token_ids)
        try:
            result = work()
        finally:
            row = self._finish(token_ids, logits)  # also when `work` failed: the cache must match _tokens
        return row, result

    def _start(self, token_ids: Sequence[int]) -> mx.array:
        """The last position's (V,) float32 logits of `token_ids`, being computed (`mx.async_eval`)."""
        if self._cache is None:
            self._cache = self._make_cache(self.model)
        try:
            with mx.stream(self.stream), self.steered():
                inputs = mx.array(list(token_ids), dtype=mx.int32)[None]  # (1, T)
                if inputs.shape[1] > 1:
                    # mlx-lm models have no `logits_to_keep`: run all but the last token for
                    # their cache only, so the (T, V) head projection is never computed.
                    self.model(inputs[:, :-1], cache=self._cache)
                    mx.eval([c.state for c in self._cache])
                    inputs = inputs[:, -1:]
                logits = self.model(inputs, cache=self._cache)[0, -1].astype(mx.float32)  # (V,)
                mx.async_eval(logits)
        except BaseException:
            self._reset()  # a half-updated cache no longer matches self._tokens
            raise
        return logits

    def _finish(self, token_ids: Sequence[int], logits: mx.array) -> np.ndarray:
        try:
            mx.eval(logits)
        except BaseException:
            self._reset()
            raise
        self._tokens.extend(int(t) for t in token_ids)
        # One (V,) float32 row to the host for our sampler: ~0.2 MB at 49k, 1 MB at 262k;
        # on unified memory this is a memcpy, not a transfer.
        return np.array(logits)

    def peak_memory_bytes(self) -> int:
        return int(mx.get_peak_memory())

    def close(self) -> None:
        self._reset()
        self.model = None
        mx.clear_cache()
        # The engine's worker thread ends after close(): free its thread-local streams. On the
        # main thread (scripts, tests) they must stay: the default stream lives there too.
        if threading.current_thread() is not threading.main_thread():
            mx.clear_streams()

    # --- capabilities (engine.capabilities) ----------------------------------------------

    def layer_capture(self, token_ids: Sequence[int], positions: Sequence[int], *, top_k: int = 10,
                      attention: bool = False) -> list[LayerCapture]:
        """Each layer's prediction at `positions` and, when asked, attention (LayerLens: mlx/lens.py)."""
        from engine.backends.mlx.lens import layer_capture

        return layer_capture(self, token_ids, positions, top_k=top_k, attention=attention)

    def batch_runner(self) -> MlxRunner:
        """Many sequences in one forward on mlx-lm's BatchKVCache (BatchRunners)."""
        return MlxRunner(self.model, getattr(self.tokenizer.hf, "pad_token_id", None) or 0)

    def position_runner(self, n_tokens: int) -> MlxRunner:
        """Every position of one sequence on mlx-lm's own prompt cache (PositionRunners)."""
        del n_tokens  # the prompt cache grows as needed
        return MlxRunner(self.model)

    def _reset(self) -> None:
        self._cache = None
        self._tokens = []
