"""Model ▸ Library: open the library dialog over the window; a model opened from it loads the way
Model ▸ Open model… loads one (`ModelActions.load`: the same load errors, the same question before
running a model's own code, the same Recent list)."""

from __future__ import annotations

from app.actions.context import ActionContext
from app.actions.model import ModelActions
from app.state.models.model_library import DEFAULT_SPEC, ModelLibraryState
from app.widgets.dialogs.library_dialog import LibraryDialog
from app.widgets.dialogs.model_picker import recent_models


def open_library(ctx: ActionContext, models: ModelActions) -> LibraryDialog:
    """The library dialog (the one already open, raised, if there is one), scanning as it opens."""
    for existing in ctx.parent.findChildren(LibraryDialog):
        if existing.isVisible():
            existing.raise_()
            existing.activateWindow()
            return existing
    dialog = LibraryDialog(ModelLibraryState(ctx.store), ctx.store, lambda: recent_models(ctx.store), ctx.parent)
    dialog.open_requested.connect(lambda spec, backend: _load(ctx, models, spec, backend))
    dialog.finished.connect(lambda _result: dialog.deleteLater())
    dialog.show()  # not modal: the chat stays usable while a download runs
    dialog.rescan()
    return dialog


def _load(ctx: ActionContext, models: ModelActions, spec: str, backend: str) -> None:
    if ctx.host.loading:
        ctx.notify("A model is already loading; wait for it to finish.", 6000)
        return
    models.load(None if spec == DEFAULT_SPEC else spec, backend)
