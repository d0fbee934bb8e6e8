"""Export a conversation: Markdown of the visible path, JSON of the whole tree with token records."""

from __future__ import annotations

import time
from typing import Any

from app import __version__
from app.state.conversation import Conversation, Message
from app.state.json_safe import dumps
from app.state.records import token_to_json

JSON_FORMAT = "logitlab.conversation/1"


def to_markdown(conv: Conversation) -> str:
    """The conversation as a person reads it in the window (the active branch only).

    A notebook is its text as it reads, then which parts the model wrote."""
    if conv.mode == "notebook":
        return _notebook_markdown(conv)
    lines = [f"# {conv.title}", ""]
    if conv.system_prompt.strip():
        lines += ["> **System:** " + conv.system_prompt.strip().replace("\n", "\n> "), ""]
    for message in conv.path():
        who = "User" if message.role == "user" else "Assistant"
        meta = ""
        if message.is_assistant and message.model:
            meta = f" <sub>({message.model.get('name', '?')})</sub>"
        lines += [f"## {who}{meta}", "", message.content.strip() or "*(empty)*", ""]
    return "\n".join(lines).rstrip() + "\n"


def _notebook_markdown(conv: Conversation) -> str:
    path = conv.path()
    text = "".join(m.content for m in path)
    lines = [f"# {conv.title}", "", "*Notebook: one text the model continues (no chat template).*", "", text.rstrip("\n"), ""]
    written = [m for m in path if m.is_assistant and m.content]
    if written:
        models = sorted({(m.model or {}).get("name", "?") for m in written})
        lines += ["---", "", f"{len(written)} part(s) of this text were written by {', '.join(models)}:", ""]
        lines += [f"- “{_excerpt(m.content)}”" for m in written]
    return "\n".join(lines).rstrip() + "\n"


def _excerpt(text: str, limit: int = 60) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _message_json(conv: Conversation, message: Message) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": message.id,
        "parent_id": message.parent_id,
        "role": message.role,
        "content": message.content,
        "created": message.created,
        "active_child_id": message.active_child_id,
    }
    if message.is_assistant:
        d.update(
            finish_reason=message.finish_reason,
            branch_index=message.branch_index,
            request=message.request,
            model=message.model,
            stats=message.stats,
            tokens=[token_to_json(ev) for ev in conv.tokens(message)],
        )
    return d


def to_json_dict(conv: Conversation) -> dict[str, Any]:
    """Everything: every branch, the settings and model per answer, every token with its alternatives."""
    conv.flush()
    return {
        "format": JSON_FORMAT,
        "exported_by": f"Logit Lab {__version__}",
        "exported_at": time.time(),
        "id": conv.id,
        "title": conv.title,
        "mode": conv.mode,  # "chat" | "notebook": a notebook's text is its active path's contents, in order
        "system_prompt": conv.system_prompt,
        "created": conv.created,
        "active_root_id": conv.active_root_id,
        "active_path": [m.id for m in conv.path()],
        "messages": [_message_json(conv, m) for m in sorted(conv.messages.values(), key=lambda m: m.id)],
    }


def to_json(conv: Conversation) -> str:
    """Standard JSON: token log-probs of -inf are null, a banned token's bias is `false`, any other
    non-finite number a string such as "-inf" (app/state/json_safe.py)."""
    return dumps(to_json_dict(conv), ensure_ascii=False, indent=1)
