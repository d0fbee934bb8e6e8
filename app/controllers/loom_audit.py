"""The loom's audit: rerun the batched children of a question one by one and say how far their log-probs moved.

The loom makes N children as rows of one batch; a chat answer is decoded alone. With the same seeds and settings
a row should come out the same either way: on llama.cpp's CPU backend bit for bit (an audit reports 0), on
other backends within float rounding (the audit reports what it finds). Each child is rerun from what it stored
(`Engine.start_audit_rows`, on the model's worker thread), through the same recipe Replay uses.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from engine import LoomAudit, experiments

from app.state.answer_recipe import other_model, recipe_for
from app.controllers.off_thread import to_loop
from app.state.conversation import Conversation, Message
from app.state.loom_tree import answer_group


def loom_children(conv: Conversation, message: Message) -> list[Message]:
    """The answers to `message`'s question that the loom made (their request records the loom's row)."""
    _, answers = answer_group(conv, message)
    return [m for m in answers if isinstance((m.request or {}).get("loom"), dict) and m.finish_reason
            and (m.stats or {}).get("seed") is not None]


def audit_inputs(conv: Conversation, children: list[Message], info: Any) -> list[tuple[Any, list, Any]]:
    """(request, the row's own tokens after its kept prefix, its fingerprint) per child; ValueError in words."""
    rows = []
    for child in children:
        recipe = recipe_for(conv, child)
        why = other_model(recipe.model, info)
        if why is not None:
            raise ValueError(why)
        tokens = conv.tokens(child)[len(recipe.prefix):]
        rows.append((recipe.request(), tokens, experiments.fingerprint_of(child.stats or {})))
    return rows


async def audit_question(host: Any, conv: Conversation, message: Message, *,
                         cancel: threading.Event | None = None,
                         progress: Callable[[int, int], None] | None = None) -> LoomAudit:
    """Rerun every loom child of `message`'s question alone on the loaded model; ValueError when there are none.

    `progress(done, total)` runs on the loop before each row; `cancel` (set from the loop: Stop) ends the rerun
    under way before its next token, and the audit holds the rows done (`LoomAudit.stopped`)."""
    children = loom_children(conv, message)
    if not children:
        raise ValueError("no loom continuations here to audit: make some with Continue ×N first")
    engine = await host.wait_engine()
    rows = audit_inputs(conv, children, engine.info)
    hop = to_loop(progress) if progress is not None else None  # called on the model's thread
    return await asyncio.wrap_future(engine.start_audit_rows(rows, cancel, hop))
