"""Choose a model: a local folder, a .gguf file, a hub id, or a recent one; and the backend."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from engine import BACKENDS as ENGINE_BACKENDS, custom_code_files

from app.state.store import Store

RECENT_KEY = "recent_models"
MAX_RECENT = 10
DEFAULT_SPEC = "default"
BACKENDS = tuple(b for b in ENGINE_BACKENDS if b != "mock")  # mock is for tests


def recent_models(store: Store) -> list[dict[str, str]]:
    """Most recent first: [{"spec": ..., "backend": ...}]."""
    rows = store.get_setting(RECENT_KEY, [])
    return [r for r in rows if isinstance(r, dict) and "spec" in r]


def remember_model(store: Store, spec: str | None, backend: str) -> None:
    spec = spec or DEFAULT_SPEC
    rows = [r for r in recent_models(store) if r["spec"] != spec]
    store.put_setting(RECENT_KEY, [{"spec": spec, "backend": backend}] + rows[: MAX_RECENT - 1])


def folder_code_files(spec: str | None) -> tuple[str, ...]:
    """The Python files a local model folder asks to run (its `auto_map`); () for anything else."""
    if not spec:
        return ()
    folder = Path(spec).expanduser()
    return custom_code_files(folder) if folder.is_dir() else ()


def remote_code_confirmation(parent: QWidget | None, model: str, files: tuple[str, ...]) -> QMessageBox:
    """Ask before running a model's own code, naming the files; the caller connects the "allow" button."""
    box = QMessageBox(
        QMessageBox.Icon.Warning,
        "Run this model's own code?",
        f"{model} ships its own Python code, which would run with your rights:\n\n"
        + "\n".join(f"  • {f}" for f in files)
        + "\n\nRead these files first. Allow them to run only if you trust where the model comes from.",
        parent=parent,
    )
    box.setObjectName("remote_code_confirmation")
    box.setAccessibleName("Confirm running the model's code")
    allow = box.addButton("Allow and load", QMessageBox.ButtonRole.AcceptRole)
    allow.setObjectName("allow_remote_code")
    box.addButton(QMessageBox.StandardButton.Cancel)
    box.allow_button = allow
    return box


class ModelPicker(QDialog):
    """`exec()` then read `spec` and `backend`."""

    def __init__(self, store: Store, current_spec: str | None, current_backend: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Open model")
        self.setMinimumWidth(560)
        self.spec_box = QComboBox()
        self.spec_box.setEditable(True)
        self.spec_box.setAccessibleName("Model")
        self.spec_box.lineEdit().setPlaceholderText("a folder, a .gguf file, or a hub id like org/name")
        specs = [r["spec"] for r in recent_models(store)]
        for spec in [current_spec or DEFAULT_SPEC, DEFAULT_SPEC, *specs]:
            if self.spec_box.findText(spec) < 0:
                self.spec_box.addItem(spec)
        self.spec_box.setCurrentText(current_spec or DEFAULT_SPEC)
        folder = QPushButton("Folder…")
        folder.setAccessibleName("Choose a model folder")
        gguf = QPushButton(".gguf file…")
        gguf.setAccessibleName("Choose a GGUF file")
        folder.clicked.connect(self._choose_folder)
        gguf.clicked.connect(self._choose_gguf)
        self.backend_box = QComboBox()
        self.backend_box.setAccessibleName("Backend")
        self.backend_box.addItems(BACKENDS)
        self.backend_box.setCurrentText(current_backend if current_backend in BACKENDS else "auto")
        self.backend_box.setToolTip(
            "auto: a .gguf file on llama.cpp when installed, a server URL on remote; "
            "otherwise MLX on Apple Silicon, torch elsewhere (CUDA when present)"
        )

        pick = QHBoxLayout()
        pick.addWidget(self.spec_box, 1)
        pick.addWidget(folder)
        pick.addWidget(gguf)
        form = QFormLayout()
        form.addRow("Model", pick)
        form.addRow("Backend", self.backend_box)
        hint = QLabel(
            "“default” is SmolLM2-135M-Instruct. A .gguf file runs quantized on llama.cpp (other backends "
            "convert it once into the cache folder); "
            "a hub id is downloaded into the Hugging Face cache. The current model stays loaded until "
            "the new one is ready, and stays if loading fails."
        )
        hint.setWordWrap(True)
        hint.setForegroundRole(hint.foregroundRole().PlaceholderText)
        # A folder with its own code: name the files and ask, here, before anything is loaded.
        self.trust_box = QCheckBox()
        self.trust_box.setObjectName("trust_remote_code")
        self.trust_box.setAccessibleName("Allow the model's own code to run")
        self.trust_box.setVisible(False)
        self.spec_box.currentTextChanged.connect(self._update_trust_box)
        self._update_trust_box(self.spec_box.currentText())
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Open | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(hint)
        lay.addWidget(self.trust_box)
        lay.addWidget(buttons)

    @property
    def spec(self) -> str | None:
        text = self.spec_box.currentText().strip()
        return None if text in ("", DEFAULT_SPEC) else text

    @property
    def backend(self) -> str:
        return self.backend_box.currentText()

    @property
    def trust_remote_code(self) -> bool:
        """True only when the chosen folder ships code and the user ticked the box naming its files."""
        return not self.trust_box.isHidden() and self.trust_box.isChecked()  # isVisible is False once exec() ends

    def _update_trust_box(self, text: str) -> None:
        files = folder_code_files(text.strip())
        self.trust_box.setChecked(False)  # a new folder is never pre-approved
        self.trust_box.setText(f"Allow this model's own code to run: {', '.join(files)}" if files else "")
        self.trust_box.setVisible(bool(files))

    def _choose_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Model folder (with config.json)")
        if path:
            self.spec_box.setCurrentText(path)

    def _choose_gguf(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "GGUF model file", "", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.spec_box.setCurrentText(path)
