"""Choose a model: a local folder, a .gguf file, a hub id, or a recent one; and the backend."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from engine import backend_help, custom_code_files, user_backends

from app.state.database.store import Store
from app.widgets.dialogs.file_dialogs import open_file, open_folder

MODELS_FOLDER = "models"  # the file dialogs' memory of where models were last chosen from

RECENT_KEY = "recent_models"
MAX_RECENT = 10
DEFAULT_SPEC = "default"
BACKENDS = user_backends()  # the engine's backend table: "auto" and each backend users see (not the mock)


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


class RemoteCodeConfirmation(QMessageBox):
    """The question `remote_code_confirmation` asks; `allow_button` is the one that allows the code."""

    allow_button: QPushButton


def remote_code_confirmation(parent: QWidget | None, model: str, files: tuple[str, ...]) -> RemoteCodeConfirmation:
    """Ask before running a model's own code, naming the files; the caller connects the "allow" button."""
    box = RemoteCodeConfirmation(
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
    """`open()` it, then read `spec`, `backend` and `trust_remote_code` once it is accepted.

    The backend follows what is typed: the one a model was last opened with (the current one, a
    recent one), else "auto", which picks by what the text names (a server URL, a .gguf file, a
    folder or hub id). A backend the user chose in this dialog is kept whatever is typed after.
    """

    def __init__(self, store: Store, current_spec: str | None, current_backend: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Open model")
        self.setMinimumWidth(560)
        self._store = store
        recent = recent_models(store)
        self._known_backends = {r["spec"]: r.get("backend", "auto") for r in reversed(recent)}
        self._known_backends[current_spec or DEFAULT_SPEC] = current_backend
        self._backend_chosen = False  # by the user, in this dialog
        self._following = False  # the backend box is being set to follow the text
        self.spec_box = QComboBox()
        self.spec_box.setEditable(True)
        self.spec_box.setAccessibleName("Model")
        spec_edit = self.spec_box.lineEdit()
        if spec_edit is not None:  # it has one: made editable just above
            spec_edit.setPlaceholderText("a folder, a .gguf file, or a hub id like org/name")
        specs = [r["spec"] for r in recent]
        for spec in [current_spec or DEFAULT_SPEC, DEFAULT_SPEC, *specs]:
            if self.spec_box.findText(spec) < 0:
                self.spec_box.addItem(spec)
        self.spec_box.setCurrentText(current_spec or DEFAULT_SPEC)
        self.folder_button = QPushButton("Folder…")
        self.folder_button.setAccessibleName("Choose a model folder")
        self.gguf_button = QPushButton(".gguf file…")
        self.gguf_button.setAccessibleName("Choose a GGUF file")
        self.folder_button.clicked.connect(self._choose_folder)
        self.gguf_button.clicked.connect(self._choose_gguf)
        self.backend_box = QComboBox()
        self.backend_box.setAccessibleName("Backend")
        self.backend_box.addItems(BACKENDS)
        self._follow_text(self.spec_box.currentText())
        self.backend_box.currentTextChanged.connect(self._on_backend_changed)
        self.spec_box.currentTextChanged.connect(self._follow_text)
        self.backend_box.setToolTip(backend_help("\n"))

        pick = QHBoxLayout()
        pick.addWidget(self.spec_box, 1)
        pick.addWidget(self.folder_button)
        pick.addWidget(self.gguf_button)
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

    def _follow_text(self, text: str) -> None:
        """Set the backend a model of this name was opened with, else auto, unless the user chose one here."""
        if self._backend_chosen:
            return
        backend = self._known_backends.get(text.strip() or DEFAULT_SPEC, "auto")
        self._following = True
        try:
            self.backend_box.setCurrentText(backend if backend in BACKENDS else "auto")
        finally:
            self._following = False

    def _on_backend_changed(self, _text: str) -> None:
        if not self._following:
            self._backend_chosen = True

    def _choose_folder(self) -> None:
        path = open_folder(self, self._store, MODELS_FOLDER, "Model folder (with config.json)")
        if path is not None:
            self.spec_box.setCurrentText(str(path))

    def _choose_gguf(self) -> None:
        path = open_file(self, self._store, MODELS_FOLDER, "GGUF model file", "GGUF models (*.gguf);;All files (*)")
        if path is not None:
            self.spec_box.setCurrentText(str(path))
