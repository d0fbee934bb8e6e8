"""The token view's "Steering effect" colouring: each steered answer's unsteered shadow, computed on demand (Qt-free).

When the token view shows a steered answer in that mode, `kl` starts one
job (engine.steering.unsteered_shadow on the model's worker: the answer
scored with and without its steering, a chunk of positions at a time) and
answers None until it is done; `ready` then names the message so its view
draws again. Results are kept per answer and token count, so scrolling back or
switching modes costs nothing; an answer still being written is not scored.

A long answer takes minutes on a CPU: the job reports how far it is
(`progressed`, `state`), and `stop` cancels the engine's work before its next
chunk. An answer left uncoloured always has a reason in words (`state`): no
steering on it, being computed, stopped, or why it failed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from engine import GenerationCancelled

from app.controllers.engine_host import describe_error
from app.state.conversation import Conversation, Message
from app.state.observable import Signal

log = logging.getLogger(__name__)

NOT_STEERED = "no steering on this answer (it was written without a vector): nothing to colour"


class ShadowSource(Protocol):
    """Where shadows are computed (app/controllers/steering_jobs.py `SteeringJobs`, which owns this cache)."""

    async def shadow(self, conv: Conversation, message: Message, *, cancel: threading.Event | None = None,
                     progress: Callable[[int, int], None] | None = None) -> Any: ...


@dataclass(frozen=True)
class ShadowState:
    """Where an answer's colouring stands: "done", "computing" (done of total tokens), "stopped", "failed" (why),
    "not steered", "writing" (the answer is still being written), "no tokens" (text only: nothing to colour)."""

    kind: str
    done: int = 0
    total: int = 0
    why: str = ""

    @property
    def text(self) -> str:
        if self.kind == "computing":
            return f"Steering effect: computing… {self.done}/{self.total} tokens"
        if self.kind == "stopped":
            return f"Steering effect: stopped at {self.done}/{self.total} tokens"
        if self.kind == "failed":
            return f"Steering effect not computed: {self.why}"
        if self.kind == "not steered":
            return f"Steering effect: {NOT_STEERED}"
        if self.kind == "no tokens":
            return "Steering effect: this answer has no token records to colour"
        if self.kind == "writing":
            return "Steering effect: coloured once the answer is finished"
        return ""


class SteeringShadows:
    """KL(steered ‖ unsteered) per token of steered answers, computed when first asked for."""

    def __init__(self, jobs: ShadowSource):
        self._jobs = jobs
        self._kl: dict[int, tuple[int, np.ndarray]] = {}  # message id -> (token count, KL per token)
        self._pending: dict[int, threading.Event] = {}  # message id -> its job's cancel flag
        self._progress: dict[int, tuple[int, int]] = {}  # message id -> (done, total) answer tokens
        self._stopped: set[int] = set()  # stopped by the user: not started again until asked (`restart`)
        self.errors: dict[int, str] = {}  # message id -> why its shadow could not be computed
        self.ready = Signal()  # (message id) its KL is known now (or failed or stopped: see `state`)
        self.progressed = Signal()  # (message id) its job got further (`state` says how far)

    def kl(self, conv: Conversation, message: Message) -> np.ndarray | None:
        """The answer's KL per token when known; else None, and the job starts (for a finished steered answer)."""
        if not (message.request or {}).get("steering") or message.generating:
            return None
        n = len(conv.tokens(message))
        known = self._kl.get(message.id)
        if known is not None and known[0] == n:
            return known[1]
        if message.id not in self._pending and message.id not in self.errors and message.id not in self._stopped and n:
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # no event loop (a script drawing the window): nothing can run
                return None
            cancel = self._pending[message.id] = threading.Event()
            self._progress[message.id] = (0, n)
            self.progressed.emit(message.id)
            asyncio.ensure_future(self._compute(conv, message, n, cancel))
        return None

    def state(self, conv: Conversation, message: Message) -> ShadowState:
        """Why `message` is coloured or not, for the view to say (without starting anything)."""
        if not (message.request or {}).get("steering"):
            return ShadowState("not steered")
        if message.generating:
            return ShadowState("writing")
        if message.id in self._pending:
            done, total = self._progress.get(message.id, (0, 0))
            return ShadowState("computing", done, total)
        if message.id in self._stopped:
            done, total = self._progress.get(message.id, (0, 0))
            return ShadowState("stopped", done, total)
        if message.id in self.errors:
            return ShadowState("failed", why=self.errors[message.id])
        n = len(conv.tokens(message))
        if not n:
            return ShadowState("no tokens")
        known = self._kl.get(message.id)
        if known is not None and known[0] == n:
            return ShadowState("done")
        return ShadowState("computing", 0, n)  # about to start (the view asks for it as it draws)

    def stop(self, message_id: int) -> bool:
        """Cancel the answer's job (the engine stops before its next chunk); True when one was running."""
        cancel = self._pending.get(message_id)
        if cancel is None:
            return False
        cancel.set()
        self._stopped.add(message_id)
        return True

    def restart(self, message_id: int) -> None:
        """Forget a stop or a failure, so the next `kl` computes the answer again."""
        self._stopped.discard(message_id)
        self.errors.pop(message_id, None)

    def model_changed(self) -> None:
        """Another model: what failed (another model's answer, a model that cannot steer) may work now, and a
        running job is this model's no more (the engine it ran on is gone)."""
        self.errors.clear()
        for cancel in self._pending.values():
            cancel.set()

    def _on_progress(self, message_id: int, done: int, total: int) -> None:
        if message_id in self._pending:
            self._progress[message_id] = (done, total)
            self.progressed.emit(message_id)

    async def _compute(self, conv: Conversation, message: Message, n: int, cancel: threading.Event) -> None:
        try:
            shadow = await self._jobs.shadow(
                conv, message, cancel=cancel, progress=lambda done, total: self._on_progress(message.id, done, total))
            self._kl[message.id] = (n, np.asarray(shadow.kl, dtype=np.float32))
        except GenerationCancelled:
            log.info("the steering effect of answer %s was stopped", message.id)
        except Exception as e:  # noqa: BLE001 - the tokens stay uncoloured; the reason is kept for the view
            log.info("no steering shadow for answer %s: %s", message.id, e)
            if not cancel.is_set():  # stopped, or its model closed under it (`model_changed`): no failure
                self.errors[message.id] = describe_error(e)
        finally:
            if self._pending.get(message.id) is cancel:
                del self._pending[message.id]
        self.ready.emit(message.id)
