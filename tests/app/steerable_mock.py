"""A steerable mock model for window tests of the steering views (UI only: its "steering" moves a few logits).

`MockBackend` with the `Steerable` capability: four layers of width 8, steered logits that differ from the
plain ones by a fixed shift per strength, and a delay per `steered_logits` call so a job over an answer
takes long enough to watch and stop. It never ends an answer early (no end of sequence), so answers have
exactly the length asked for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np

from engine import Engine
from engine.backends.mock import EOS_ID, MockBackend
from engine.steering import ResidualShape, Steering

SHAPE = ResidualShape(n_layer=4, n_embd=8, model_hint="mock")


class SteerableMock(MockBackend):
    def __init__(self, delay_s: float = 0.0, steer_delay_s: float = 0.2):
        super().__init__(delay_s=delay_s)
        self.steer_delay_s = steer_delay_s
        self._steering: Steering | None = None
        self.steered_calls = 0  # steered_logits calls: read by the tests from their thread
        self.lock = threading.Lock()

    @staticmethod
    def logits_after(tokens: Sequence[int]) -> np.ndarray:
        logits = MockBackend.logits_after(tokens)
        logits[EOS_ID] = -1e4  # answers run to their length limit
        return logits

    def residual_shape(self) -> ResidualShape:
        return SHAPE

    def set_steering(self, steering: Steering | None) -> None:
        self._steering = steering

    def current_steering(self) -> Steering | None:
        return self._steering

    def steered_logits(self, token_ids: Sequence[int], positions: Sequence[int],
                       steering: Steering | None) -> np.ndarray:
        with self.lock:
            self.steered_calls += 1
        time.sleep(self.steer_delay_s)
        rows = np.stack([self.logits_after(list(token_ids[:p])) for p in positions]).astype(np.float32)
        if steering is not None and steering.active:
            rows[:, 5:40] += np.float32(sum(e.strength for e in steering.entries))
        return rows


def steerable_factory(backend: SteerableMock):
    def factory(spec, _backend, progress):
        progress("loading the mock model", 1.0)
        return Engine.from_backend(backend)

    return factory
