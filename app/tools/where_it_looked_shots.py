"""`python -m app.tools.where_it_looked_shots WIDTHxHEIGHT OUT.png`: where an answer looked in an attached file,
as the window shows it on a screen of that size (docs/documents.md's pictures of the highlight).

As app/tools/attachment_shots.py (its report PDF and question, the default model, greedy): the answer's token
that names the capital selected, the Inspector's Layers tab open with the passage panel's highlight for that
token, and the whole answer's bar asked for (Whole answer); the sidebar's Folders (the chat kept in one) and tags:

    python -m app.tools.where_it_looked_shots 1440x900 docs/where-it-looked-1440x900.png
    python -m app.tools.where_it_looked_shots 1024x700 docs/where-it-looked-1024x700.png
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from app.state.conversation import Conversation, Message

from app.tools.attachment_shots import PAGES, QUESTION, sample_pdf
from app.tools.screen_size_shots import _settle, run_at_size, save_window

WAIT_S = 180  # each step's wait at most: a capture over the whole prompt on two busy cores


async def _until(ready: Callable[[], bool], what: str) -> None:
    for _ in range(WAIT_S * 10):
        if ready():
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"gave up waiting for {what}")


def _token_naming(conv: Conversation, answer: Message, word: str) -> int:
    """The index of the answer's first token that is part of `word` (else its first token)."""
    tokens = conv.tokens(answer)
    return next((i for i, t in enumerate(tokens) if t.token_text.strip() and t.token_text.strip() in word), 0)


async def _shoot(out: Path) -> None:
    from app.lifecycle import close_session, open_session

    folder = Path(tempfile.mkdtemp(prefix="logitlab-where-"))
    report = folder / "zorbia-report.pdf"
    report.write_bytes(sample_pdf(PAGES))
    session = open_session("light")
    window = session.window
    try:
        window.start(None, None)
        await window.host.wait_engine()
        window.settings.apply_preset("Greedy")
        window.settings.set_max_new_tokens(24)
        conv = window.library.new()
        composer = window.chat.composer
        if not composer.attach_file(str(report)):
            raise RuntimeError(composer.attach_error.text())
        composer.edit.setPlainText(QUESTION)
        composer.submit()
        await _until(lambda: len(conv.path()) == 2 and not conv.path()[-1].generating
                     and not window.controller.busy, "the answer")
        answer = conv.path()[-1]
        # Chats kept in folders (the sidebar's Folders): this one in "Reports", tagged, beside an empty folder.
        window.library.create_folder("Recipes")
        window.library.folders.add_tag(conv.id, "zorbia")
        window.sidebar.move_chat(conv.id, window.library.create_folder("Reports"))  # (the sidebar reloads)
        window.inspector_dock.show()
        window.inspector.tabs.setCurrentWidget(window.inspector.layer_view)
        panel = window.inspector.layer_view.passages
        window.selection.set(answer.id, _token_naming(conv, answer, "Quellton"))
        await _until(panel.whole_button.isEnabled, "the token's passages")
        panel.whole_button.click()
        await _until(lambda: bool(panel.answer_shares()), "the whole answer's bar")
        window.status.clearMessage()
        await _settle(1.0)
        save_window(window, out)
    finally:
        await close_session(session)


def main(argv: list[str]) -> int:
    return run_at_size(argv, _shoot)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
