"""Where a branch's later messages went: "3 later messages are on version 1".

After a regenerate, an edit or a branch from a token, the window shows the
new version of a message and the path below it; the turns that followed the
other version are still in the tree, one click away. `elsewhere` finds the
other version with the most of them, so the view can say so.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.state.conversation import Conversation, Message


@dataclass(frozen=True)
class Elsewhere:
    """Later messages that live on another version of a message.

    Attributes:
        version: that version's number as the "2 / 3" arrows count it (1-based).
        offset: how many places away it is from the version shown (for `Conversation.select_sibling`).
        later: how many messages follow it on its own path.
    """

    version: int
    offset: int
    later: int

    @property
    def text(self) -> str:
        if self.later == 1:
            return f"1 later message is on version {self.version}"
        return f"{self.later} later messages are on version {self.version}"


def later_count(conv: Conversation, message: Message) -> int:
    """How many messages follow `message` on its own path (its active child, that one's, and so on)."""
    n, node = 0, conv.active_child(message.id)
    while node is not None:
        n += 1
        node = conv.active_child(node.id)
    return n


def elsewhere(conv: Conversation, message: Message) -> Elsewhere | None:
    """The other version of `message` with the most later messages (the nearest on a tie), or None when
    no other version has any (a regenerated last answer: nothing went anywhere)."""
    siblings = conv.siblings(message)
    if len(siblings) < 2 or message not in siblings:
        return None
    here = siblings.index(message)
    best: Elsewhere | None = None
    for i, other in enumerate(siblings):
        if other is message:
            continue
        later = later_count(conv, other)
        if later and (best is None or later > best.later or (later == best.later and abs(i - here) < abs(best.offset))):
            best = Elsewhere(version=i + 1, offset=i - here, later=later)
    return best
