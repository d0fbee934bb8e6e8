"""The window's side of attaching files (docs/documents.md): the paperclip's file dialog, each chip's tokens
counted off the UI thread by the loaded model's tokenizer, the attachments' cost shown in the context label
before sending, and a message that would not fit said by how much, with the offer to send the first part.

Reading and checking a file, the block the model reads and the cut to a first part are the engine's
(engine/documents); the composer holds the chips (app/widgets/chat/composer.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtWidgets import QFileDialog, QWidget

from engine import documents

from app.controllers.engine_host import EngineHost
from app.state.database.store import Store
from app.widgets.chat.composer import Composer
from app.widgets.dialogs.file_dialogs import remember_folder, start_folder
from app.widgets.status_bar import StatusBar

PURPOSE = "attachments"  # the file dialog's remembered folder
FILTER = ("Documents (*.txt *.md *.markdown *.rst *.csv *.tsv *.json *.jsonl *.pdf *.py *.js *.ts *.rs *.go *.c "
          "*.h *.cpp *.java *.html *.css *.xml *.yaml *.yml *.toml *.sql *.sh *.log);;All files (*)")
# Room left for the chat template around the message, the typed question and the start of an answer when the
# first part is cut: a part that filled the context to its last token would leave the model no room to answer.
ANSWER_ROOM = 256


class AttachmentActions:
    def __init__(self, parent: QWidget, composer: Composer, host: EngineHost, store: Store, status: StatusBar,
                 on_send_first_part: Callable[[], Any]):
        self._parent, self._composer, self._host, self._store, self._status = parent, composer, host, store, status
        self._on_send_first_part = on_send_first_part
        composer.token_counter = self.count
        composer.off_thread = host.run_off_ui_thread  # files read off the UI thread (a long PDF takes a second)
        composer.attach_requested.connect(self.open_dialog)
        composer.attachments_changed.connect(self.update_fit)
        composer.send_first_part_requested.connect(self.send_first_part)
        host.model_changed.connect(self._on_model_changed)

    def detach(self) -> None:
        self._host.model_changed.disconnect(self._on_model_changed)

    def open_dialog(self) -> list[str]:
        """Ask for files and attach them; the paths chosen (none when cancelled)."""
        chosen, _ = QFileDialog.getOpenFileNames(self._parent, "Attach files", str(start_folder(self._store, PURPOSE)),
                                                 FILTER)
        if chosen:
            remember_folder(self._store, PURPOSE, Path(chosen[0]).parent)
            self._composer.attach_files(chosen)
        return chosen

    def _tokenizer(self) -> Any | None:
        engine, info = self._host.engine, self._host.info
        # A remote model's tokenizer is HTTP: not for a chip's count (the context label leaves it out as well).
        if engine is None or (info is not None and not info.runs_locally):
            return None
        return engine.tokenizer

    def count(self, attachment: documents.Attachment, done: Callable[[int | None], None]) -> None:
        tokenizer = self._tokenizer()
        if tokenizer is None:
            done(None)
            return

        def finished(result: Any, error: BaseException | None) -> None:
            done(None if error is not None or result is None else int(result))

        if not self._host.run_off_ui_thread(lambda: documents.block_tokens(tokenizer, attachment), finished):
            done(documents.block_tokens(tokenizer, attachment))  # no event loop to come back to (scripts): count here

    def _on_model_changed(self, _info: Any) -> None:
        self._composer.recount()

    def over_by(self) -> tuple[int, int, int] | None:
        """(tokens over, the context, the chat's tokens) when the attachments do not fit; None when they do or
        it cannot be told yet."""
        info = self._host.info
        attached = self._composer.attachment_tokens()
        if not self._composer.attachments or attached is None or info is None or not info.context_length:
            return None
        used = self._status.context_used() or 0
        over = used + attached - info.context_length
        return (over, info.context_length, used) if over > 0 else None

    def update_fit(self) -> None:
        self._status.set_attached_tokens(self._composer.attachment_tokens() if self._composer.attachments else 0)
        over = self.over_by()
        if over is None:
            self._composer.set_fit_problem(None)
            return
        by, context, used = over
        chat = f" with this chat's {used:,}" if used else ""
        attached = self._composer.attachment_tokens() or 0
        self._composer.set_fit_problem(
            f"Does not fit: the attachments take {attached:,} tokens;{chat} that is {by:,} more than the model's "
            f"context of {context:,}. Remove one, or send the first part.", can_send_first_part=self._cut() is not None)

    def _cut(self) -> documents.Attachment | None:
        """The last attachment cut to what fits (None: nothing of it does, or no tokenizer)."""
        tokenizer = self._tokenizer()
        over = self.over_by()
        if tokenizer is None or over is None:
            return None
        last = self._composer.attachments[-1]
        tokens = self._composer.tokens.get(last.sha256)
        if tokens is None:
            return None
        room = tokens - over[0] - ANSWER_ROOM
        return documents.first_part(tokenizer, last, room, tokens=tokens) if room > 0 else None

    def send_first_part(self) -> bool:
        """Replace the last attachment by its first part that fits, and send; False if none fits."""
        part = self._cut()
        if part is None:
            return False
        self._composer.remove_attachment(self._composer.attachments[-1].sha256)
        self._composer.add_attachment(part)
        self._on_send_first_part()
        return True
