"""Model ▸ Runtime settings…: the loaded model's context length, threads, GPU layers and batch size.

Each setting is either "automatic" (the engine chooses, as it does for a model
opened for the first time) or a number the user sets. What the model runs with
now is shown beside each, and the KV cache a context length would take below
it. A setting the model cannot take is disabled with the reason the engine
gives (`ModelInfo.runtime.why_not`): the window never guesses from a backend's
name. OK reloads the model with the settings; the caller remembers them.
"""

from __future__ import annotations

from engine import ModelInfo, RuntimeSettings
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QGridLayout,
    QLabel,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.widgets.fmt import human_bytes

AUTOMATIC = "automatic"
# What each setting does, as a tip. Its range is RuntimeSettings.range(name): one table for the window and the
# CLI (engine/runtime_settings.py), so the dialog never offers a value the engine refuses, nor refuses one it takes.
# The value just below the lowest is shown as "automatic".
TIPS: dict[str, str] = {
    "n_ctx": "Tokens of context to allocate; automatic: the model's own, capped so its KV cache fits a memory budget",
    "n_threads": "CPU threads while generating; automatic: for each answer, the cores other programs leave free",
    "n_threads_batch": "CPU threads while reading a prompt; automatic: as many as for generating",
    "n_gpu_layers": "Layers on the GPU, -1 for all; automatic: all on a GPU build",
    "n_batch": "Prompt tokens per model call; automatic: 512",
}


def spin_range(name: str) -> tuple[int, int]:
    """The spin box's (minimum, maximum) for a setting: the engine's range, one below it meaning automatic."""
    low, high = RuntimeSettings.range(name)
    return low - 1, high


class RuntimeDialog(QDialog):
    """`open()`, then on accepted read `settings()`."""

    def __init__(self, info: ModelInfo, chosen: RuntimeSettings, parent: QWidget | None = None):
        """`chosen`: the settings remembered for this model (None fields: automatic)."""
        super().__init__(parent)
        self.setObjectName("runtime_dialog")
        self.setWindowTitle("Runtime settings")
        self.setAccessibleName("Runtime settings")
        self._facts = facts = info.runtime
        in_use = facts.in_use
        self.spins: dict[str, QSpinBox] = {}
        self.reasons: dict[str, QLabel] = {}  # why a setting is disabled, shown under it

        intro = QLabel(
            f"How {info.name} runs on this machine. The model reloads with these settings (the conversation "
            "stays) and they are used whenever it opens again."
        )
        intro.setWordWrap(True)
        grid = QGridLayout()
        grid.setColumnStretch(1, 1)
        row = 0
        for name in RuntimeSettings.names():
            lowest, high = spin_range(name)
            tip = TIPS.get(name, RuntimeSettings.label(name).capitalize())
            if name == "n_ctx" and facts.trained_context > 0:
                high = min(high, facts.trained_context)  # never longer than the model's own
            spin = QSpinBox()
            spin.setObjectName(name)
            spin.setAccessibleName(RuntimeSettings.label(name))
            spin.setRange(lowest, high)
            spin.setSpecialValueText(AUTOMATIC)  # shown at the minimum, the value below the lowest
            spin.setGroupSeparatorShown(True)
            spin.setToolTip(tip)
            value = getattr(chosen, name)
            spin.setValue(value if value is not None else spin.minimum())
            now = getattr(in_use, name)
            now_label = QLabel(f"now {now:,}" if now is not None else "")
            now_label.setObjectName(f"{name}_now")
            grid.addWidget(QLabel(RuntimeSettings.label(name).capitalize()), row, 0)
            grid.addWidget(spin, row, 1)
            grid.addWidget(now_label, row, 2)
            row += 1
            why = facts.why_not(name)
            if why is not None:
                spin.setValue(spin.minimum())
                spin.setEnabled(False)
                spin.setToolTip(f"Not for this model: {why}")
                reason = QLabel(f"Not for this model: {why}")
                reason.setWordWrap(True)
                reason.setEnabled(False)  # greyed, like the control it explains
                reason.setObjectName(f"{name}_reason")
                self.reasons[name] = reason
                grid.addWidget(reason, row, 1, 1, 2)
                row += 1
            if name == "n_ctx":
                self.cache_label = QLabel()
                self.cache_label.setObjectName("kv_cache")
                self.cache_label.setWordWrap(True)
                self.cache_label.setAccessibleName("KV cache at this context length")
                grid.addWidget(self.cache_label, row, 1, 1, 2)
                row += 1
                spin.valueChanged.connect(self._update_cache)
            self.spins[name] = spin

        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.reload_button = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.reload_button.setText("Reload with these settings")
        self.reload_button.setEnabled(bool(facts.takes))
        self.defaults_button = self.buttons.addButton("All automatic", QDialogButtonBox.ButtonRole.ResetRole)
        self.defaults_button.setObjectName("all_automatic")
        self.defaults_button.clicked.connect(self.reset)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addWidget(intro)
        lay.addLayout(grid)
        lay.addWidget(self.buttons)
        self._update_cache()

    def settings(self) -> RuntimeSettings:
        """What the dialog says: None for every setting left automatic (or not for this model)."""
        values = {name: (None if spin.value() == spin.minimum() else spin.value()) for name, spin in self.spins.items()}
        return RuntimeSettings(**values)

    def reset(self) -> None:
        """Every setting back to automatic (the engine's choices)."""
        for spin in self.spins.values():
            spin.setValue(spin.minimum())

    def _update_cache(self) -> None:
        """The KV cache the chosen context takes (from what the loaded one costs a token)."""
        facts, spin = self._facts, self.spins["n_ctx"]
        per_token = facts.kv_cache_bytes // facts.in_use.n_ctx if facts.kv_cache_bytes and facts.in_use.n_ctx else 0
        if not per_token:
            self.cache_label.setText("")
            self.cache_label.setVisible(False)
            return
        self.cache_label.setVisible(True)
        if spin.value() == spin.minimum():
            text = f"KV cache now: {human_bytes(facts.kv_cache_bytes)} for {facts.in_use.n_ctx:,} tokens"
            if facts.context_note:
                text += f". Automatic: {facts.context_note}"
            self.cache_label.setText(text)
            return
        model = f" (the model's own is {facts.trained_context:,})" if facts.trained_context else ""
        self.cache_label.setText(f"KV cache at {spin.value():,} tokens: {human_bytes(spin.value() * per_token)}{model}")
