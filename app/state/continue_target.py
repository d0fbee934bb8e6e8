"""Which answer Chat ▸ Continue answer acts on, and how its menu item names it (Qt-free).

The menu item acts on one answer only: the last answer of the branch on
screen, and only when that answer was cut off. An earlier cut-off answer is
never picked behind the user's back (it once was: the last one with a More
button, whatever came after it); its own More button continues it, as a new
version (app/controllers/chat.py), so the later turns keep the text they
answered.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.state.conversation import Conversation, Message

CUT_BY = {"length": "by the length limit", "cancelled": "by Stop", None: "by a crash or by quitting"}
PLAIN_TEXT = "&Continue answer"


@dataclass(frozen=True)
class ContinueTarget:
    """The answer Continue acts on (None: nothing to continue), the menu item's text and its tip."""

    message: Message | None
    text: str
    tip: str


def continue_target(conv: Conversation | None) -> ContinueTarget:
    """The last answer of `conv`'s visible branch when it can be continued; else why nothing can."""
    path = conv.path() if conv is not None else []
    last = path[-1] if path else None
    if conv is None or last is None:
        return ContinueTarget(None, PLAIN_TEXT, "There is no answer to continue yet.")
    if not last.is_assistant:
        return ContinueTarget(None, PLAIN_TEXT, "The last message is yours: Send answers it.")
    if last.generating:
        return ContinueTarget(None, PLAIN_TEXT, "The last answer is still being written.")
    n = len(conv.tokens(last))
    if not last.can_continue or not (n or last.content):
        how = "with an error" if last.finish_reason == "error" else "by itself"
        return ContinueTarget(None, PLAIN_TEXT, (
            f"The last answer ended {how}; only a cut-off answer can be continued. An earlier cut-off answer "
            "has its own More button, which continues it as a new version (the turns after it are kept)."))
    tokens = f"{n} token{'s' if n != 1 else ''}"
    return ContinueTarget(last, f"&Continue the last answer ({tokens})",
                          f"Generate more of the last answer, cut off {CUT_BY.get(last.finish_reason, '')} "
                          f"after {tokens}.")
