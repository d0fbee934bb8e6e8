"""The Steering panel: the user's control vectors, a strength each (slider −2…+2 and an exact spin box), the
layer range, and loading, training and saving vectors. What it sets applies from the next answer.

It draws `SteeringState` and changes it only through its methods; the slow
work (reading a file, training) runs in `SteeringJobs`, off the UI thread,
and every failure is one line in the panel's note, in the engine's words
(a vector for another model, a corrupt file, an empty pair file), with
nothing changed.
"""

from __future__ import annotations

import asyncio
import html
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox, QDoubleSpinBox, QFileDialog, QFrame, QGroupBox, QHBoxLayout, QLabel, QLineEdit, QProgressBar,
    QPushButton, QSizePolicy, QSlider, QSpinBox, QToolButton, QVBoxLayout, QWidget,
)

from engine import steering as steer

from app.controllers.engine_host import describe_error
from app.state.database.store import Store
from app.controllers.steering_jobs import SteeringJobs
from app.state.steering_state import SLIDER_LIMIT, SPIN_LIMIT, SteeringState
from app.widgets.dialogs.file_dialogs import remember_folder, start_folder, save_file
from app.widgets.subscriptions import follow

log = logging.getLogger(__name__)

SLIDER_STEPS = 100  # slider units per 1.0 of strength
FROM_FILE = "__file__"  # the pair-set box's "your own file" entry
FOLDER_PURPOSE = "steering"
APPLIES_NOTE = "Strengths apply from the next answer. Positive steers toward the first side of a pair set."
NO_MODEL_NOTE = "Load a model to steer it."
EMPTY_NOTE = "No vectors yet: load a control-vector .gguf (llama.cpp's format) or train one from pairs below."
Spawn = Callable[[Coroutine[Any, Any, Any]], Any]


class VectorRow(QFrame):
    """One vector: its name, Save and Remove, a slider and a spin box for its strength, why it cannot apply."""

    def __init__(self, panel: "SteeringPanel", vector: steer.SteeringVector):
        super().__init__()
        self.vector = vector
        self._panel = panel
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAccessibleName(f"Steering vector {vector.name}")
        self.name_label = QLabel(f"<b>{_escape(vector.name)}</b>")
        self.name_label.setToolTip(f"{vector.name}: {vector.shape.describe()}, sha256 {vector.digest}"
                                   + (f"\n{vector.source}" if vector.source else ""))
        self.name_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.save_button = QToolButton()
        self.save_button.setText("Save…")
        self.save_button.setAccessibleName(f"Save {vector.name} as a .gguf file")
        self.save_button.setToolTip("Save this vector as llama.cpp's control-vector GGUF (--control-vector reads it)")
        self.remove_button = QToolButton()
        self.remove_button.setText("✕")
        self.remove_button.setAccessibleName(f"Remove {vector.name}")
        self.remove_button.setToolTip("Remove from the panel (answers it steered can still be replayed)")
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setRange(int(-SLIDER_LIMIT * SLIDER_STEPS), int(SLIDER_LIMIT * SLIDER_STEPS))
        self.slider.setPageStep(25)
        self.slider.setAccessibleName(f"Strength of {vector.name}")
        self.slider.setToolTip("−2 … +2; 0 is off. The box beside takes exact values")
        self.spin = QDoubleSpinBox()
        self.spin.setRange(-SPIN_LIMIT, SPIN_LIMIT)
        self.spin.setDecimals(2)
        self.spin.setSingleStep(0.05)
        self.spin.setAccessibleName(f"Exact strength of {vector.name}")
        self.spin.setKeyboardTracking(False)  # typing "1.5" is one change, not "1" then "1.5"
        self.unfit_label = QLabel()
        self.unfit_label.setWordWrap(True)
        self.unfit_label.setStyleSheet("color: #c0392b")
        self.unfit_label.setAccessibleName(f"Why {vector.name} cannot steer this model")

        head = QHBoxLayout()
        head.setContentsMargins(0, 0, 0, 0)
        head.addWidget(self.name_label, 1)
        head.addWidget(self.save_button)
        head.addWidget(self.remove_button)
        knob = QHBoxLayout()
        knob.setContentsMargins(0, 0, 0, 0)
        knob.addWidget(self.slider, 1)
        knob.addWidget(self.spin)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 4, 6, 4)
        lay.setSpacing(2)
        lay.addLayout(head)
        lay.addLayout(knob)
        lay.addWidget(self.unfit_label)

        self.slider.valueChanged.connect(lambda v: panel.set_strength(self.vector, v / SLIDER_STEPS))
        self.spin.valueChanged.connect(lambda v: panel.set_strength(self.vector, v))
        self.save_button.clicked.connect(lambda: panel.ask_save(self.vector))
        self.remove_button.clicked.connect(lambda: panel.state.remove(self.vector))

    def show_state(self, strength: float, unfit: str, can_steer: bool) -> None:
        for w in (self.slider, self.spin):
            w.blockSignals(True)
        self.slider.setValue(round(strength * SLIDER_STEPS))
        self.spin.setValue(strength)
        for w in (self.slider, self.spin):
            w.blockSignals(False)
        self.unfit_label.setText(unfit)
        self.unfit_label.setVisible(bool(unfit))
        for w in (self.slider, self.spin):
            w.setEnabled(can_steer and not unfit)


class SteeringPanel(QWidget):
    """The dock's contents. `state` is what the next answer runs under; `jobs` does the slow work."""

    def __init__(self, state: SteeringState, jobs: SteeringJobs, store: Store | None = None,
                 spawn: Spawn | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.jobs = jobs
        self._store = store
        self._spawn: Spawn = spawn or asyncio.ensure_future
        self._rows: dict[str, VectorRow] = {}  # digest -> row
        self.message = ""  # the last failure or result, as shown (tests read it)
        self.setAccessibleName("Steering")

        self.note = QLabel()
        self.note.setWordWrap(True)
        self.note.setAccessibleName("Steering note")
        self.message_label = QLabel()
        self.message_label.setWordWrap(True)
        self.message_label.setAccessibleName("Steering message")
        self.message_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.load_button = QPushButton("Load .gguf…")
        self.load_button.setAccessibleName("Load a control vector")
        self.load_button.setToolTip("A control-vector GGUF as llama-cvector-generator writes it (or Save… here)")
        self.load_button.clicked.connect(self.ask_load)
        self.off_button = QPushButton("All to 0")
        self.off_button.setAccessibleName("Set every strength to 0")
        self.off_button.setToolTip("Turn all steering off (the vectors stay)")
        self.off_button.clicked.connect(self.all_off)
        buttons = QHBoxLayout()
        buttons.addWidget(self.load_button)
        buttons.addWidget(self.off_button)
        buttons.addStretch(1)

        self.rows_box = QVBoxLayout()
        self.rows_box.setContentsMargins(0, 0, 0, 0)
        self.rows_box.setSpacing(4)
        self.empty_label = QLabel(EMPTY_NOTE)
        self.empty_label.setWordWrap(True)
        self.rows_box.addWidget(self.empty_label)

        # The layer range: llama.cpp's --control-vector-layer-range START END; 0 shows as "auto" (its defaults).
        self.layer_start = QSpinBox()
        self.layer_end = QSpinBox()
        for box, label in ((self.layer_start, "First steered layer"), (self.layer_end, "Last steered layer")):
            box.setRange(0, 4096)
            box.setSpecialValueText("auto")
            box.setAccessibleName(label)
            box.setKeyboardTracking(False)
            box.valueChanged.connect(lambda _v: self._on_layers_edited())
        self.layer_start.setToolTip("The first layer steered (auto: layer 1)")
        self.layer_end.setToolTip("The last layer steered (auto: the model's last)")
        layers = QHBoxLayout()
        layers.addWidget(QLabel("Layers"))
        layers.addWidget(self.layer_start)
        layers.addWidget(QLabel("to"))
        layers.addWidget(self.layer_end)
        layers.addStretch(1)

        self.train_box = self._training_group()

        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        lay.addWidget(self.note)
        lay.addLayout(buttons)
        lay.addLayout(self.rows_box)
        lay.addLayout(layers)
        lay.addWidget(self.train_box)
        lay.addWidget(self.message_label)
        lay.addStretch(1)

        # The state and the jobs outlive this panel (a model's refresh can end after its window closed), and its
        # wrapper can outlive its widgets: listen only while Qt has not deleted it.
        follow(self, ((state.changed, self._on_state_changed),
                      (jobs.training_progress, self._on_training_progress),
                      (jobs.training_changed, self._on_training_changed)))
        self._on_state_changed()
        self._on_training_changed(jobs.training)

    def _training_group(self) -> QGroupBox:
        box = QGroupBox("Train from pairs")
        self.pairs_box = QComboBox()
        self.pairs_box.setAccessibleName("Pair set")
        for name, pairs in steer.builtin_pair_sets().items():
            self.pairs_box.addItem(f"{name} ({len(pairs)} pairs)", name)
        self.pairs_box.addItem("Your pair file(s)…", FROM_FILE)
        self.pairs_box.setToolTip("Built-in persona pairs, or your own: one JSONL of {\"positive\", \"negative\"} "
                                  "lines, or two text files (positive, negative) with one prompt a line")
        self.pairs_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.pairs_box.setMinimumContentsLength(10)
        self.method_box = QComboBox()
        self.method_box.setAccessibleName("Training method")
        for method in steer.METHODS:
            self.method_box.addItem({"pca": "PCA", "mean": "Mean diff."}.get(method, method), method)
        self.method_box.setToolTip("PCA: repeng's first principal component of the differences; "
                                   "Mean diff.: their mean")
        self.count_box = QSpinBox()
        self.count_box.setRange(1, 10_000)
        self.count_box.setValue(32)
        self.count_box.setAccessibleName("Pairs to train on")
        self.count_box.setToolTip("Train on the first this many pairs of the set")
        self.name_edit = QLineEdit()
        self.name_edit.setPlaceholderText("name (the pair set's)")
        self.name_edit.setAccessibleName("Name of the trained vector")
        self.train_button = QPushButton("Train")
        self.train_button.setAccessibleName("Train a steering vector")
        self.train_button.clicked.connect(self.start_training)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setAccessibleName("Cancel training")
        self.cancel_button.clicked.connect(self.jobs.cancel_training)
        self.progress = QProgressBar()
        self.progress.setAccessibleName("Training progress")
        self.progress.setTextVisible(True)
        row1 = QHBoxLayout()
        row1.addWidget(self.pairs_box, 1)
        row2 = QHBoxLayout()
        row2.addWidget(self.method_box)
        row2.addWidget(QLabel("pairs"))
        row2.addWidget(self.count_box)
        row3 = QHBoxLayout()
        row3.addWidget(self.name_edit, 1)
        row3.addWidget(self.train_button)
        row3.addWidget(self.cancel_button)
        lay = QVBoxLayout(box)
        lay.addLayout(row1)
        lay.addLayout(row2)
        lay.addLayout(row3)
        lay.addWidget(self.progress)
        return box

    # -- drawing the state -----------------------------------------------------------------

    def _on_state_changed(self) -> None:
        st = self.state
        rows = st.rows()
        wanted = [r.vector.digest for r in rows]
        for digest in list(self._rows):
            if digest not in wanted:
                row = self._rows.pop(digest)
                self.rows_box.removeWidget(row)
                row.deleteLater()
        can = st.can_steer is not False
        for i, r in enumerate(rows):
            shown = self._rows.get(r.vector.digest)
            if shown is None:
                shown = self._rows[r.vector.digest] = VectorRow(self, r.vector)
                self.rows_box.insertWidget(i + 1, shown)  # after the "no vectors yet" line
            shown.show_state(r.strength, r.unfit, can)
        self.empty_label.setVisible(not rows)
        if st.can_steer is False:
            self.note.setText(f"<b>{_escape(self.jobs.cannot_steer_text())}.</b> The vectors stay for a model that can.")
        elif st.can_steer is None:
            self.note.setText(NO_MODEL_NOTE)
        else:
            active = st.steering()
            now = f"Next answer: <b>{_escape(active.describe())}</b>." if active else "Next answer: not steered."
            self.note.setText(f"{now} {APPLIES_NOTE}")
        for box, value in ((self.layer_start, st.layer_start), (self.layer_end, st.layer_end)):
            box.blockSignals(True)
            box.setValue(value or 0)
            box.blockSignals(False)
        if st.shape is not None:
            for box in (self.layer_start, self.layer_end):
                box.setMaximum(st.shape.n_layer - 1)
        self.off_button.setEnabled(any(r.strength != 0 for r in rows))
        self._on_training_changed(self.jobs.training)

    def _on_training_changed(self, training: bool) -> None:
        self.train_button.setEnabled(not training and self.state.can_steer is not False)
        self.cancel_button.setEnabled(training)
        self.progress.setVisible(training)
        if training:
            self.progress.setRange(0, 0)  # busy until the first batch reports

    def _on_training_progress(self, done: int, total: int) -> None:
        self.progress.setRange(0, total)
        self.progress.setValue(done)
        self.progress.setFormat(f"{done} of {total} prompts")

    def say(self, text: str) -> None:
        self.message = text
        self.message_label.setText(_escape(text))

    # -- changing the state ----------------------------------------------------------------

    def set_strength(self, vector: steer.SteeringVector, value: float) -> None:
        try:
            self.state.set_strength(vector, value)
        except (ValueError, steer.SteeringError) as e:
            self.say(describe_error(e))
            self._on_state_changed()  # the controls go back to what applies

    def all_off(self) -> None:
        for vector in self.state.vectors:
            self.state.set_strength(vector, 0.0)

    def _on_layers_edited(self) -> None:
        start = self.layer_start.value() or None
        end = self.layer_end.value() or None
        try:
            self.state.set_layers(start, end)
            self.say("")
        except (ValueError, steer.SteeringError) as e:
            self.say(describe_error(e))
            self._on_state_changed()

    # -- loading, saving, training ---------------------------------------------------------

    def ask_load(self) -> None:
        folder = start_folder(self._store, FOLDER_PURPOSE) if self._store else Path.home()
        chosen, _ = QFileDialog.getOpenFileName(self, "Load a control vector", str(folder),
                                                "Control vectors (*.gguf);;All files (*)")
        if chosen:
            if self._store:
                remember_folder(self._store, FOLDER_PURPOSE, Path(chosen).parent)
            self.load_path(chosen)

    def load_path(self, path: str | Path) -> Any:
        """Load a vector file in the background; a failure is said in the panel and nothing changes."""
        return self._spawn(self._load(Path(path)))

    async def _load(self, path: Path) -> None:
        self.load_button.setEnabled(False)
        try:
            vector = await self.jobs.load_file(path)
            self.say(f"Loaded {vector.name} ({vector.shape.describe()}).")
        except Exception as e:  # noqa: BLE001 - said in words; nothing was added
            self.say(f"Not loaded: {describe_error(e)}")
        finally:
            self.load_button.setEnabled(True)

    def ask_save(self, vector: steer.SteeringVector) -> None:
        if self._store is not None:
            path = save_file(self, self._store, FOLDER_PURPOSE, f"Save {vector.name}", f"{vector.name}.gguf",
                             "Control vectors (*.gguf)")
        else:
            chosen, _ = QFileDialog.getSaveFileName(self, f"Save {vector.name}", f"{vector.name}.gguf")
            path = Path(chosen) if chosen else None
        if path is not None:
            self.save_path(vector, path)

    def save_path(self, vector: steer.SteeringVector, path: str | Path) -> Any:
        return self._spawn(self._save(vector, Path(path)))

    async def _save(self, vector: steer.SteeringVector, path: Path) -> None:
        try:
            written = await self.jobs.save_file(vector, path)
            self.say(f"Saved {vector.name} to {written}.")
        except Exception as e:  # noqa: BLE001 - said in words
            self.say(f"Not saved: {describe_error(e)}")

    def start_training(self) -> Any:
        """Train from the chosen pair set (asking for files for "your own"); runs in the background."""
        key = self.pairs_box.currentData()
        if key == FROM_FILE:
            folder = start_folder(self._store, FOLDER_PURPOSE) if self._store else Path.home()
            chosen, _ = QFileDialog.getOpenFileNames(
                self, "Pairs: one JSONL file, or a positive and a negative text file", str(folder),
                "Pair files (*.jsonl *.txt);;All files (*)")
            if not chosen:
                return None
            if self._store:
                remember_folder(self._store, FOLDER_PURPOSE, Path(chosen[0]).parent)
            return self.train_from_files(chosen)
        return self._spawn(self._train(steer.builtin_pair_sets()[key]))

    def train_from_files(self, paths: list[str] | list[Path]) -> Any:
        return self._spawn(self._train_files([str(p) for p in paths]))

    async def _train_files(self, paths: list[str]) -> None:
        try:
            pairs = await self.jobs.read_pairs(paths)
        except Exception as e:  # noqa: BLE001 - an empty or malformed pair file: said, nothing trained
            self.say(f"Not trained: {describe_error(e)}")
            return
        await self._train(pairs)

    async def _train(self, pairs: steer.PairSet) -> None:
        pairs = pairs.limited(self.count_box.value())
        name = self.name_edit.text().strip() or None
        self.say(f"Training on {len(pairs)} pairs of {pairs.name}…")
        try:
            vector = await self.jobs.train(pairs, method=self.method_box.currentData(), name=name)
            self.say(f"Trained {vector.name} from {len(pairs)} pairs: set its strength above.")
        except Exception as e:  # noqa: BLE001 - cancelled, a server, an empty prompt: said in words
            cancelled = type(e).__name__ == "GenerationCancelled"
            self.say("Training cancelled." if cancelled else f"Not trained: {describe_error(e)}")


def _escape(text: str) -> str:
    return html.escape(text, quote=False)
