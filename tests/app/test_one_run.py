"""app/widgets/experiment_windows/one_run.py: a panel's one run at a time: its buttons while it runs and after, its failure in words,
Stop, and a closed panel that no longer hears its run."""

from __future__ import annotations

import asyncio

from PySide6.QtWidgets import QLabel, QPushButton, QWidget

from app.controllers.experiment import ExperimentRun
from app.widgets.experiment_windows.one_run import OneRun
from qt_helpers import run_task


class _Run(ExperimentRun):
    """Waits until stopped or released; then ends with `outcome` (an exception ends it failed)."""

    def __init__(self, outcome: object = "done") -> None:
        super().__init__()
        self.outcome = outcome
        self.release = asyncio.Event()
        self.result: object = None

    def cancel(self) -> None:
        super().cancel()
        self.release.set()

    async def _run(self, host) -> None:
        await self.release.wait()
        if isinstance(self.outcome, Exception):
            raise self.outcome
        self.result = self.outcome


class _Panel(QWidget):
    def __init__(self) -> None:
        super().__init__()
        self.start_button, self.stop_button, self.summary = QPushButton("Go"), QPushButton("Stop"), QLabel()
        self.shown: list[object] = []
        self.afters = 0
        self.runs: OneRun[_Run] = OneRun(self.start_button, self.stop_button, self.summary, busy="Working…",
                                         failed="It failed", on_end=self.show_run, after=self.count_after)

    def show_run(self, run: _Run) -> None:
        self.shown.append(run.result)

    def count_after(self) -> None:
        self.afters += 1


def _started(panel: _Panel, run: _Run) -> asyncio.Task:
    def make() -> _Run:
        run.start(None)  # type: ignore[arg-type]  # this run never asks for a model
        return run
    task = panel.runs.start(make)
    assert task is not None
    return task


def test_buttons_follow_the_run_and_its_result_is_shown(qtbot, qloop):
    panel = _Panel()
    qtbot.addWidget(panel)
    run = _Run("tokens")
    task = _started(panel, run)
    assert not panel.start_button.isEnabled() and panel.stop_button.isEnabled()
    assert panel.summary.text() == "Working…" and panel.runs.running
    assert _started(panel, _Run()) is task  # a second start hands back the run under way
    run.release.set()
    run_task(qtbot, task)
    assert panel.start_button.isEnabled() and not panel.stop_button.isEnabled()
    assert panel.shown == ["tokens"] and panel.afters == 1 and not panel.runs.running


def test_a_failure_is_said_in_words_and_stop_ends_the_run(qtbot, qloop):
    panel = _Panel()
    qtbot.addWidget(panel)
    failing = _Run(ValueError("the text is empty <b>"))
    task = _started(panel, failing)
    failing.release.set()
    run_task(qtbot, task)
    assert panel.summary.text() == "It failed: the text is empty &lt;b&gt;"  # escaped: the summary is rich text
    assert panel.shown == [] and panel.afters == 1 and panel.start_button.isEnabled()

    stopped = _Run("partial")
    task = _started(panel, stopped)
    panel.stop_button.click()
    run_task(qtbot, task)
    assert stopped._cancelled and panel.shown == ["partial"] and panel.afters == 2
    # A refused start (ValueError from the maker) is said in the summary; nothing starts.
    assert panel.runs.start(lambda: (_ for _ in ()).throw(ValueError("nothing to run"))) is None
    assert panel.summary.text() == "nothing to run" and panel.start_button.isEnabled()


def test_a_closed_panel_no_longer_hears_its_run(qtbot, qloop):
    panel = _Panel()
    qtbot.addWidget(panel)
    run = _Run("late")
    task = _started(panel, run)
    panel.runs.close()  # the window closed: its run is stopped and ends after it
    run_task(qtbot, task)
    assert run._cancelled and panel.shown == [] and panel.afters == 0
