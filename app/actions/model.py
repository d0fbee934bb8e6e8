"""Model ▸ Open model…, Connect to server…, Recent, Runtime settings…, and the first start's default model: loads
and their dialogs.

Each load is a `LoadRequest` that travels with its task: what failed is
answered from the request itself (the files to allow and the backend to retry
with), never from state left on a long-lived object. Every failure reaches the
user as one dialog; a load that is cancelled reports nothing.

Dialogs are opened with `open()`, never `exec()`: a nested event loop inside
an asyncio task lets other tasks and deferred deletions run under a dialog's
feet (the reported segfault). One picker or connect dialog at a time: asking
again raises the one that is open. Each is deleted once it has closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QDialog, QMenu, QMessageBox, QProgressDialog

from engine import (
    DefaultModelMissingError,
    EngineError,
    RemoteCodeRefusedError,
    RuntimeSettings,
    download_default_model,
    split_server_spec,
)

from app.actions.context import ActionContext
from app.controllers.engine_host import LoadState, describe_error
from app.controllers.off_thread import run_off_thread
from app.state.models import model_defaults
from app.state.models.runtime_choices import remember_runtime, saved_runtime
from app.state.models.servers import ApiKeys, prepare_connection, remember_server
from app.widgets.dialogs.connect_dialog import ConnectChoice, ConnectDialog
from app.widgets.dialogs.runtime_dialog import RuntimeDialog
from app.widgets.dialogs.model_picker import DEFAULT_SPEC, ModelPicker, recent_models, remember_model, remote_code_confirmation

log = logging.getLogger(__name__)

CONNECTING_SHOWN_AFTER_MS = 400  # a server that answers at once never flashes the "Connecting…" dialog


@dataclass(frozen=True)
class LoadRequest:
    """One load as the user asked for it."""

    spec: str | None  # None: the default model
    backend: str = "auto"
    trust_remote_code: bool = False  # only after the user confirmed the model's code files by name
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)  # as remembered for this model

    @property
    def label(self) -> str:
        return self.spec or "the default model"


def server_base(spec: str | None) -> str | None:
    """The base URL when `spec` names a server (`http://host:port/v1#model`), else None."""
    if not spec:
        return None
    try:
        return split_server_spec(spec)[0]
    except ValueError:
        return None


class ModelActions:
    """Loads models for the window and tells the user, in a dialog, whatever went wrong."""

    def __init__(self, ctx: ActionContext, keys: ApiKeys, controls: Sequence[QAction]):
        """`controls` (Open model, Connect to server) are enabled only while nothing loads or downloads."""
        self._ctx = ctx
        self._keys = keys
        self._controls = tuple(controls)
        self._downloading = False
        self.dialog: QDialog | None = None  # the open picker or connect dialog
        self.error_box: QMessageBox | None = None  # the open load error (or remote-code question)
        ctx.host.state_changed.connect(self._on_load_state)
        self._update_controls()

    def detach(self) -> None:
        """The window closes; the host lives on (tests open another window on it)."""
        self._ctx.host.state_changed.disconnect(self._on_load_state)

    # -- loading ---------------------------------------------------------------------------------

    def start(self, spec: str | None = None, backend: str | None = None) -> asyncio.Future:
        """Load the model given on the command line, else the last one used, else the default."""
        if spec is None and backend is None:
            recent = recent_models(self._ctx.store)
            if recent:
                spec = None if recent[0]["spec"] == DEFAULT_SPEC else recent[0]["spec"]
                backend = recent[0].get("backend", "auto")
        return self.load(spec, backend or "auto")

    def load(self, spec: str | None, backend: str = "auto", trust_remote_code: bool = False) -> asyncio.Future:
        """Start loading (the host counts as loading at once); the future gives True on success.

        Never raises: whatever stops the load from starting is a dialog too, and the future gives False.
        """
        request = LoadRequest(spec, backend, trust_remote_code)
        host = self._ctx.host
        try:
            if spec is not None and server_base(spec) is not None:
                # Its key, URL credentials and timeout, never in the store: the spec loaded, shown and
                # remembered is the URL without credentials (they are kept with the key).
                spec = prepare_connection(self._ctx.store, self._keys, spec)
                request = LoadRequest(spec, backend, trust_remote_code)
            else:  # the context, threads, GPU layers and batch size chosen for this model, if any
                request = replace(request, runtime=saved_runtime(self._ctx.store, spec, backend))
                if request.runtime.n_ctx is None:  # else the context length its saved defaults ask for
                    n_ctx = model_defaults.context_for(self._ctx.store, spec, backend, self._ctx.settings.preset_names())
                    request = replace(request, runtime=replace(request.runtime, n_ctx=n_ctx))
            loading = host.load(spec, backend, trust_remote_code=trust_remote_code, runtime=request.runtime)
        except Exception as e:  # noqa: BLE001 - a load that cannot start is reported like one that failed
            if host.loading:  # another load is under way: not this request's failure
                self._ctx.notify(str(e), 6000)
            else:
                self._show_failure(request, e)
            done = asyncio.get_running_loop().create_future()
            done.set_result(False)
            return done
        return self._ctx.spawn(self._finish(request, loading))

    async def _finish(self, request: LoadRequest, loading: asyncio.Task) -> bool:
        connecting = self._connecting_dialog(request) if server_base(request.spec) else None
        try:
            ok = await loading
        except asyncio.CancelledError:
            if loading.cancelled() and not _current_task_cancelling():
                return False  # the user cancelled the load: nothing to report
            raise
        finally:
            if connecting is not None:
                connecting.canceled.disconnect()
                connecting.reset()
                connecting.deleteLater()
        if ok:
            remember_model(self._ctx.store, request.spec, request.backend)
            said = model_defaults.on_loaded(self._ctx.library, self._ctx.settings, self._ctx.host)
            if said:  # "SmolLM2-135M-Instruct: its saved defaults applied (preset Balanced, context 4096)"
                self._ctx.notify(said, 10000)
        elif self._ctx.host.last_error is not None:
            self._show_failure(request, self._ctx.host.last_error)
        return ok

    def _connecting_dialog(self, request: LoadRequest) -> QProgressDialog:
        """"Connecting to host…" with a Cancel: a server that accepts and never answers holds no one up."""
        base = server_base(request.spec) or request.label
        dialog = QProgressDialog(f"Connecting to {base}…", "Cancel", 0, 0, self._ctx.parent)
        dialog.setObjectName("connecting")
        dialog.setWindowTitle("Connect to server")
        dialog.setWindowModality(Qt.WindowModality.NonModal)  # the model in use still answers meanwhile
        dialog.setMinimumDuration(CONNECTING_SHOWN_AFTER_MS)
        dialog.setAutoClose(False)
        dialog.setAutoReset(False)
        dialog.canceled.connect(self._ctx.host.cancel_load)
        dialog.setValue(0)  # starts the timer that shows it after the minimum duration
        return dialog

    def _show_failure(self, request: LoadRequest, error: BaseException) -> None:
        host = self._ctx.host
        if request.spec is None and host.info is None and isinstance(error, DefaultModelMissingError):
            self._offer_default_model(describe_error(error))
            return
        if isinstance(error, RemoteCodeRefusedError):
            self._confirm_remote_code(request, error.files)
            return
        if host.info is not None:
            keep = f"The previous model, {host.info.name}, is still loaded and in use."
        else:
            keep = "No model is loaded: open one from Model ▸ Open model…"
        box = QMessageBox(QMessageBox.Icon.Warning, "Could not load the model", f"{describe_error(error)}\n\n{keep}",
                          parent=self._ctx.parent)
        box.setAccessibleName("Model load error")
        if request.runtime.load_kwargs():  # the user's own settings may be why: offer the engine's
            box.setInformativeText(f"It was loaded with your runtime settings: {request.runtime.describe()}.")
            retry = box.addButton("Load with the default settings", QMessageBox.ButtonRole.ActionRole)
            retry.setObjectName("load_with_defaults")
            retry.clicked.connect(lambda: self.reload_with(RuntimeSettings(), request.spec, request.backend))
            box.addButton(QMessageBox.StandardButton.Close)
        self._show_box(box)

    def _confirm_remote_code(self, request: LoadRequest, files: tuple[str, ...]) -> None:
        """The model needs its own code (a hub id, or a folder opened without the picker): name the files, ask."""
        box = remote_code_confirmation(self._ctx.parent, request.spec or "the model", files)
        allowed = replace(request, trust_remote_code=True)
        box.allow_button.clicked.connect(lambda: self.load(allowed.spec, allowed.backend, allowed.trust_remote_code))
        self._show_box(box, name=box.objectName())

    def _offer_default_model(self, message: str) -> None:
        """The default model is nowhere (a packaged app's first start): download it, or choose another."""
        box = QMessageBox(QMessageBox.Icon.Information, "Get the default model", message, parent=self._ctx.parent)
        box.setAccessibleName("Default model missing")
        download = box.addButton("Download (98 MB)", QMessageBox.ButtonRole.AcceptRole)
        choose = box.addButton("Choose a model…", QMessageBox.ButtonRole.ActionRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        download.setObjectName("download_default")
        choose.setObjectName("choose_model")
        download.clicked.connect(lambda: self.download_default_model())
        choose.clicked.connect(lambda: self.open_model_dialog())
        self._show_box(box)

    def _show_box(self, box: QMessageBox, name: str = "load_error") -> None:
        """One load dialog at a time: a new one replaces the last; each is deleted once closed."""
        if self.error_box is not None:
            self.error_box.done(0)
        box.setObjectName(name)
        box.finished.connect(lambda _result, b=box: self._forget_box(b))
        box.open()  # not exec(): the window stays responsive and no nested event loop runs
        self.error_box = box

    def _forget_box(self, box: QMessageBox) -> None:
        if self.error_box is box:
            self.error_box = None
        box.deleteLater()

    def download_default_model(self) -> asyncio.Task:
        """Download the default model into the user models folder, then load it; the task gives False if that failed."""
        return self._ctx.spawn(self._download_default_model())

    async def _download_default_model(self) -> bool:
        def progress(message: str, fraction: float | None) -> None:  # on the loop, for each report of the download
            self._ctx.notify(message if fraction is None else f"{message}: {fraction:.0%}", 0)

        self._downloading = True
        self._update_controls()
        self._ctx.notify("Downloading the default model…", 0)
        try:
            # A plain thread, not the loop's default executor (qasync's QThreads outlive a closed window).
            with ThreadPoolExecutor(1, thread_name_prefix="logitlab-download") as pool:
                await run_off_thread(lambda state: download_default_model(state.report), on_progress=progress,
                                     executor=pool)
        except EngineError as e:
            self._ctx.notify("", 0)
            box = QMessageBox(
                QMessageBox.Icon.Warning,
                "Could not download the default model",
                f"{e}\n\nYou can open a model file or folder instead: Model ▸ Open model…",
                parent=self._ctx.parent,
            )
            self._show_box(box)
            return False
        finally:
            self._downloading = False
            self._update_controls()
        return await self.load(None, "auto")

    # -- dialogs ---------------------------------------------------------------------------------

    def open_model_dialog(self) -> ModelPicker:
        """Model ▸ Open model…: the picker (the one already open, raised, if there is one)."""
        host = self._ctx.host
        if isinstance(self.dialog, ModelPicker):
            self._raise(self.dialog)
            return self.dialog
        picker = ModelPicker(self._ctx.store, host.spec, host.backend, self._ctx.parent)
        picker.accepted.connect(lambda: self._load_unless_busy(picker.spec, picker.backend, picker.trust_remote_code))
        self._show_dialog(picker)
        return picker

    def open_connect_dialog(self) -> ConnectDialog:
        """Model ▸ Connect to server…: the connect dialog (the one already open, raised, if there is one)."""
        if isinstance(self.dialog, ConnectDialog):
            self._raise(self.dialog)
            return self.dialog
        ctx = self._ctx
        dialog = ConnectDialog(ctx.store, self._keys, ctx.settings.options.server_sampling, ctx.parent)
        dialog.accepted.connect(lambda: self._connect_unless_busy(dialog))
        self._show_dialog(dialog)
        return dialog

    def connect_server(self, choice: ConnectChoice) -> asyncio.Future:
        """Keep the key (keyring or session) and the server (recent list, without the key); load its model."""
        self._keys.set(choice.url, choice.api_key, remember=choice.remember_key)
        if choice.credentials:
            self._keys.set_credentials(choice.url, choice.credentials, remember=choice.remember_key)
        remember_server(self._ctx.store, choice.url, choice.model, choice.timeout_s)
        self._ctx.settings.set_server_sampling(choice.server_sampling)
        return self.load(choice.spec, "remote")

    def open_runtime_dialog(self) -> RuntimeDialog | None:
        """Model ▸ Runtime settings…: the loaded model's context, threads, GPU layers and batch size; OK reloads it."""
        host = self._ctx.host
        if host.info is None:
            self._ctx.notify("Load a model first: runtime settings belong to a model.", 6000)
            return None
        if isinstance(self.dialog, RuntimeDialog):
            self._raise(self.dialog)
            return self.dialog
        spec, backend = host.spec, host.backend
        dialog = RuntimeDialog(host.info, saved_runtime(self._ctx.store, spec, backend), self._ctx.parent)
        dialog.accepted.connect(lambda: self.reload_with(dialog.settings(), spec, backend))
        self._show_dialog(dialog)
        return dialog

    def reload_with(self, settings: RuntimeSettings, spec: str | None, backend: str) -> None:
        """Remember `settings` for the model and load it again with them (the chat goes on with the reloaded model)."""
        remember_runtime(self._ctx.store, spec, backend, settings)
        self._load_unless_busy(spec, backend)

    def fill_recent(self, menu: QMenu) -> None:
        """Model ▸ Recent: the models opened last, each with the backend it was opened with."""
        menu.clear()
        for row in recent_models(self._ctx.store):
            spec, backend = row["spec"], row.get("backend", "auto")
            action = menu.addAction(f"{spec}  ({backend})")
            action.triggered.connect(
                lambda _c=False, s=spec, b=backend: self._load_unless_busy(None if s == DEFAULT_SPEC else s, b)
            )
        menu.setEnabled(not menu.isEmpty())

    def _show_dialog(self, dialog: QDialog) -> None:
        if self.dialog is not None:  # the other kind is open: one dialog at a time
            self.dialog.reject()
        self.dialog = dialog
        dialog.finished.connect(lambda _result: self._forget_dialog(dialog))
        dialog.open()

    def _forget_dialog(self, dialog: QDialog) -> None:
        if self.dialog is dialog:
            self.dialog = None
        dialog.deleteLater()  # after the accepted handlers have read its fields

    @staticmethod
    def _raise(dialog: QDialog) -> None:
        dialog.raise_()
        dialog.activateWindow()

    def _load_unless_busy(self, spec: str | None, backend: str, trust_remote_code: bool = False) -> None:
        if self._ctx.host.loading or self._downloading:
            self._ctx.notify("A model is already loading; wait for it to finish.", 6000)
            return
        self.load(spec, backend, trust_remote_code)

    def _connect_unless_busy(self, dialog: ConnectDialog) -> None:
        if self._ctx.host.loading or self._downloading:
            self._ctx.notify("A model is already loading; wait for it to finish.", 6000)
            return
        self.connect_server(dialog.choice())

    # -- reactions -------------------------------------------------------------------------------

    def _on_load_state(self, _state: LoadState) -> None:
        self._update_controls()

    def _update_controls(self) -> None:
        free = not self._ctx.host.loading and not self._downloading
        for action in self._controls:
            action.setEnabled(free)


def _current_task_cancelling() -> bool:
    """Whether the task running this code was itself asked to stop (the window closing), not just its await."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
