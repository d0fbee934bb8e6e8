"""One experiment run at a time in a panel: what the Score and Compare-models windows share.

The panel's Start button starts a run (or hands back the one under way), Stop asks it to stop, and when it
ends, the buttons come back and the summary says why it failed, or the result is drawn. A closed panel stops
listening to its run and ends it (`close`).
"""

from __future__ import annotations

import asyncio
import html
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

from PySide6.QtWidgets import QLabel, QPushButton

from app.controllers.experiment import ExperimentRun

R = TypeVar("R", bound=ExperimentRun)


class OneRun(Generic[R]):
    """The panel's last run (`run`), its Start/Stop buttons and summary line.

    `busy`: the summary while it runs; `failed`: the words before the error; `on_end(run)`: the panel's method
    called when it ends without an error (draw its result); `after`: its method called after every end (a panel
    that decides its Start button's state itself). Both are held weakly: the panel holds this object, and a
    cycle between them would keep a closed panel's wrapper until a garbage collection.
    """

    def __init__(self, start_button: QPushButton, stop_button: QPushButton, summary: QLabel, *, busy: str,
                 failed: str, on_end: Callable[[R], None], after: Callable[[], None] | None = None) -> None:
        self.run: R | None = None
        self._start_button, self._stop_button, self._summary = start_button, stop_button, summary
        self._busy, self._failed = busy, failed
        self._on_end = weakref.WeakMethod(on_end)
        self._after = weakref.WeakMethod(after) if after is not None else None
        stop_button.setEnabled(False)
        stop_button.clicked.connect(self.stop)

    @property
    def running(self) -> bool:
        return self.run is not None and self.run.running

    def start(self, make: Callable[[], R]) -> asyncio.Task | None:
        """Start `make()`'s run; the one under way if there is one; None when `make` refuses (ValueError, said
        in the summary)."""
        if self.run is not None and self.run.running:
            return self.run.task
        try:
            self.run = run = make()
        except ValueError as e:
            self._summary.setText(html.escape(str(e)))
            return None
        run.finished.connect(self._finished)
        self._start_button.setEnabled(False)
        self._stop_button.setEnabled(True)
        self._summary.setText(self._busy)
        return run.task

    def stop(self) -> None:
        if self.run is not None:
            self.run.cancel()

    def close(self, *, abandon: bool = False) -> None:
        """The panel closed: its run ends after it, with nothing to draw into (`abandon`: end the task now even
        where it waits, as for a model still loading)."""
        if self.run is not None:
            self.run.finished.disconnect(self._finished)
            if abandon:
                self.run.abandon()
            else:
                self.run.cancel()

    def _finished(self) -> None:
        run = self.run
        assert run is not None, "finished is connected only to the run kept in self.run, which is never cleared"
        self._start_button.setEnabled(True)
        self._stop_button.setEnabled(False)
        if run.error is not None:
            self._summary.setText(html.escape(f"{self._failed}: {run.error}"))
        elif (on_end := self._on_end()) is not None:
            on_end(run)
        after = self._after() if self._after is not None else None
        if after is not None:
            after()
