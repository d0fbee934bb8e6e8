"""The steering work that takes time, off the UI thread (Qt-free): reading a vector file, training, and what
steering did to a token or to a whole answer.

Everything that touches the model runs on the engine's worker (between
answers, like the layer view: app/controllers/lens_jobs.py); reading a file runs on the
host's blocking pool. Training reports progress and can be cancelled between
batches of prompts. When the model changes, the state learns what a vector
must fit (`Engine.residual_shape`, None for a model that cannot steer).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import ModelInfo, steering as steer

from app.controllers.engine_host import EngineHost
from app.controllers.lens_jobs import answer_parts, check_model
from app.controllers.off_thread import to_loop
from app.state.conversation import Conversation, Message
from app.state.observable import Signal
from app.controllers.steering_shadows import SteeringShadows
from app.state.steering_state import SteeringState

log = logging.getLogger(__name__)

TOP_K = 8  # risers, fallers and top tokens shown per side
CANNOT_STEER = "{name} cannot be steered: steering adds to the model's own layers, which it does not expose (a server, for one)"


@dataclass(frozen=True)
class EffectView:
    """What steering did to one answer token, with the texts the view needs."""

    message_id: int
    index: int
    effect: steer.SteeringEffect
    texts: dict[int, str]  # token id -> text, for every id the effect names


class SteeringJobs:
    """Off-thread steering work for the window; one training at a time."""

    def __init__(self, host: EngineHost, state: SteeringState):
        self.host = host
        self.state = state
        self.training_progress = Signal()  # (done, total) prompts read
        self.training_changed = Signal()  # (bool) a training started / ended
        self._cancel: threading.Event | None = None
        self.shadows = SteeringShadows(self)  # the token view's "Steering effect" colouring
        host.model_changed.connect(self._on_model_changed)
        if host.engine is not None:
            self._on_model_changed(host.info)

    @property
    def training(self) -> bool:
        return self._cancel is not None

    # -- the model -------------------------------------------------------------------------

    def _on_model_changed(self, info: ModelInfo | None) -> None:
        self.shadows.model_changed()  # what failed may work on this model; a job under way was the last one's
        try:
            asyncio.get_running_loop().create_task(self.refresh_model())
        except RuntimeError:  # no loop (building the window in a script): the next change tells
            pass

    async def refresh_model(self) -> None:
        """Tell the state what vectors the loaded model takes (or that it cannot be steered)."""
        engine = self.host.engine
        if engine is None:
            self.state.set_model(None, "", False)
            return
        name = engine.info.name
        try:
            shape = await asyncio.wrap_future(engine.start_residual_shape())
        except Exception as e:  # noqa: BLE001 - the panel says it cannot steer; the chat goes on
            log.warning("could not read the steering shape of %s: %s", name, e)
            shape = None
        if self.host.engine is engine:
            self.state.set_model(shape, name, shape is not None)

    def cannot_steer_text(self) -> str:
        return CANNOT_STEER.format(name=self.state.model_name or "this model")

    # -- vectors ---------------------------------------------------------------------------

    async def load_file(self, path: str | Path) -> steer.SteeringVector:
        """Read a control-vector GGUF and add it; SteeringError in words (a corrupt file, another model's)."""
        vector = await self.host.off_ui_thread(steer.load_vector, str(path))
        return self.state.add(vector)

    async def save_file(self, vector: steer.SteeringVector, path: str | Path) -> Path:
        return await self.host.off_ui_thread(steer.save_vector, vector, str(path))

    async def read_pairs(self, paths: list[str]) -> steer.PairSet:
        return await self.host.off_ui_thread(steer.read_pair_set, paths)

    async def train(self, pairs: steer.PairSet, *, method: str = "pca", name: str | None = None) -> steer.SteeringVector:
        """Train a vector on the loaded model from `pairs` and add it; GenerationCancelled after `cancel_training`."""
        if self._cancel is not None:
            raise RuntimeError("a steering vector is already being trained; wait for it or cancel it")
        engine = await self.host.wait_engine()
        if self.state.can_steer is False:
            raise steer.SteeringError(self.cannot_steer_text())
        cancel = self._cancel = threading.Event()
        progress = to_loop(self.training_progress.emit)  # called on the model's worker thread, emitted on the loop

        self.training_changed.emit(True)
        try:
            vector = await asyncio.wrap_future(engine.start_train_steering_vector(
                pairs, method=method, name=name, cancel=cancel, progress=progress))
        finally:
            self._cancel = None
            self.training_changed.emit(False)
        return self.state.add(vector)

    def cancel_training(self) -> bool:
        if self._cancel is None:
            return False
        self._cancel.set()
        return True

    # -- what steering did -----------------------------------------------------------------

    def answer_steering(self, message: Message) -> steer.Steering | None:
        """The steering `message` was written under (its record), None when none; SteeringError when a vector
        it names is not available any more."""
        return self.state.steering_of((message.request or {}).get("steering"))

    async def effect(self, conv: Conversation, message: Message, index: int) -> EffectView:
        """The distribution at answer token `index` with and without the answer's steering (engine.steering)."""
        engine = await self.host.wait_engine()
        check_model(engine, message, "what steering did to it")  # first: nothing is read with the wrong model
        steering = self.answer_steering(message)
        if steering is None:
            raise ValueError("this answer was not steered")
        history, answer = answer_parts(conv, message)
        if not 0 <= index < len(answer):
            raise ValueError(f"the answer has no token {index + 1}")

        prompt = await self.host.off_ui_thread(history.token_ids, engine.tokenizer)  # the template renders
        effect = await asyncio.wrap_future(
            engine.start_steering_effect(prompt + answer, len(prompt) + index, steering, top_k=TOP_K))
        ids = {effect.token_id} | {t for t, _ in effect.steered_top + effect.unsteered_top} | {
            s.token_id for s in effect.risers + effect.fallers}
        texts = await self.host.off_ui_thread(_texts_of, engine.tokenizer, ids)
        return EffectView(message.id, index, effect, texts)

    async def shadow(self, conv: Conversation, message: Message, *, cancel: threading.Event | None = None,
                     progress: Callable[[int, int], None] | None = None) -> steer.SteeringShadow:
        """Every token of a steered answer scored without its steering (KL per token: the colour mode).

        `progress(done, total)` answer tokens, on the loop; setting `cancel` stops the engine's work before its
        next chunk (GenerationCancelled)."""
        engine = await self.host.wait_engine()
        check_model(engine, message, "what steering did to it")  # first: nothing is read with the wrong model
        steering = self.answer_steering(message)
        if steering is None:
            raise ValueError("this answer was not steered")
        history, answer = answer_parts(conv, message)
        if not answer:
            raise ValueError("the answer has no tokens yet")

        prompt = await self.host.off_ui_thread(history.token_ids, engine.tokenizer)  # the template renders
        hop = to_loop(progress) if progress is not None else None  # called on the model's worker thread
        return await asyncio.wrap_future(engine.start_unsteered_shadow(prompt + answer, len(prompt), steering,
                                                                       cancel=cancel, progress=hop))


def _texts_of(tokenizer: Any, ids: set[int]) -> dict[int, str]:
    """id -> text for each of `ids` (off the UI thread)."""
    return {t: tokenizer.decode([t]) for t in ids}

