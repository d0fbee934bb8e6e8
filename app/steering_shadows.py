"""The token view's "Steering effect" colouring: each steered answer's unsteered shadow, computed on demand (Qt-free).

When the token view shows a steered answer in that mode, `kl` starts one
job (engine.steering.unsteered_shadow on the model's worker: the answer
scored with and without its steering, one batched pass each) and answers
None until it is done; `ready` then names the message so its view draws
again. Results are kept per answer and token count, so scrolling back or
switching modes costs nothing; an answer still being written is not scored.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import numpy as np

from app.engine_host import describe_error
from app.state.conversation import Conversation, Message
from app.state.observable import Signal

log = logging.getLogger(__name__)


class ShadowSource(Protocol):
    """Where shadows are computed (app/steering_jobs.py `SteeringJobs`, which owns this cache)."""

    async def shadow(self, conv: Conversation, message: Message) -> Any: ...


class SteeringShadows:
    """KL(steered ‖ unsteered) per token of steered answers, computed when first asked for."""

    def __init__(self, jobs: ShadowSource):
        self._jobs = jobs
        self._kl: dict[int, tuple[int, np.ndarray]] = {}  # message id -> (token count, KL per token)
        self._pending: set[int] = set()
        self.errors: dict[int, str] = {}  # message id -> why its shadow could not be computed
        self.ready = Signal()  # (message id) its KL is known now (or failed: see errors)

    def kl(self, conv: Conversation, message: Message) -> np.ndarray | None:
        """The answer's KL per token when known; else None, and the job starts (for a finished steered answer)."""
        if not (message.request or {}).get("steering") or message.generating:
            return None
        n = len(conv.tokens(message))
        known = self._kl.get(message.id)
        if known is not None and known[0] == n:
            return known[1]
        if message.id not in self._pending and message.id not in self.errors and n:
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # no event loop (a script drawing the window): nothing can run
                return None
            self._pending.add(message.id)
            asyncio.ensure_future(self._compute(conv, message, n))
        return None

    async def _compute(self, conv: Conversation, message: Message, n: int) -> None:
        try:
            shadow = await self._jobs.shadow(conv, message)
            self._kl[message.id] = (n, np.asarray(shadow.kl, dtype=np.float32))
        except Exception as e:  # noqa: BLE001 - the tokens stay uncoloured; the reason is kept for the tooltip
            log.info("no steering shadow for answer %s: %s", message.id, e)
            self.errors[message.id] = describe_error(e)
        finally:
            self._pending.discard(message.id)
        self.ready.emit(message.id)
