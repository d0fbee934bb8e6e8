"""Export a conversation: Markdown of the visible path, JSON of the whole tree with token records."""

from __future__ import annotations

import time
from typing import Any

from app import __version__
from app.state.conversation import Conversation, Message
from app.state.folders import export_fields
from app.state.json_safe import dumps
from app.state.database.records import token_to_json

JSON_FORMAT = "logitlab.conversation/1"


def to_markdown(conv: Conversation) -> str:
    """The conversation as a person reads it in the window (the active branch only).

    A notebook is its text as it reads, then which parts the model wrote."""
    if conv.mode == "notebook":
        return _notebook_markdown(conv)
    lines = [f"# {conv.title}", ""]
    filed = export_fields(conv._store, conv.id)
    if filed["folder"] or filed["tags"]:
        lines += [" · ".join(([f"*Folder: {_md_name(filed['folder'])}*"] if filed["folder"] else [])
                             + ([f"*Tags: {', '.join(_md_name(t) for t in filed['tags'])}*"] if filed["tags"] else [])), ""]
    if conv.system_prompt.strip():
        lines += ["> **System:** " + conv.system_prompt.strip().replace("\n", "\n> "), ""]
    for message in conv.path():
        who = "User" if message.role == "user" else "Assistant"
        meta = ""
        if message.is_assistant and message.model:
            meta = f" <sub>({message.model.get('name', '?')})</sub>"
        lines += [f"## {who}{meta}", "", message.content.strip() or "*(empty)*", ""]
        if message.attachments:  # named, not inlined: the JSON export carries their text
            lines += ["*Attached: " + ", ".join(f"{_md_name(a.name)} ({a.size_text()})" for a in message.attachments)
                      + "*", ""]
        note = ending_note(conv, message) if message.is_assistant else ""
        if note:
            lines += [note, ""]
    return "\n".join(lines).rstrip() + "\n"


def ending_note(conv: Conversation, message: Message) -> str:
    """How an answer that did not end on its own ended, as a Markdown line; "" for one that did.

    The message records it: `finish_reason` "cancelled" is the user's Stop; None on an answer no longer
    streaming is one cut off by a quit (`stats.interrupted_by` names the signal or "quit") or a crash;
    "length" the limit; "error" the failure (`stats.error`). A reader of the Markdown would otherwise take
    a cut-off answer for the model's whole reply."""
    stats = message.stats or {}
    n = _token_count(conv, message, stats)
    after = f" after {n:,} token{'s' * (n != 1)}" if n else ""
    reason = message.finish_reason
    if message.generating:
        return f"*(still being written: {n:,} tokens so far)*"
    if reason == "cancelled":
        return f"*(interrupted: stopped by the user{after})*"
    if reason is None:
        by = stats.get("interrupted_by")
        if not by:  # a crash, or a kill: nothing was told
            return f"*(interrupted: the app ended before the answer was finished{',' * bool(after)}{after})*"
        why = f"the app quit ({' '.join(str(by).split())})" if by != "quit" else "the app quit"
        return f"*(interrupted: {why}{after})*"
    if reason == "length":
        return f"*(cut off at the length limit{after})*"
    if reason == "error":
        error = stats.get("error")
        return f"*(interrupted by an error{after}" + (f": {' '.join(str(error).split())}" if error else "") + ")*"
    return ""  # eos, a stop string, an answer a client sent: it ended as it should


def _token_count(conv: Conversation, message: Message, stats: dict[str, Any]) -> int:
    """The answer's tokens: its records (a loom child's include the prefix it kept), else the last run's count."""
    recorded = len(conv.tokens(message))
    if recorded:
        return recorded
    generated = stats.get("generated_tokens")
    return generated if isinstance(generated, int) and not isinstance(generated, bool) and generated > 0 else 0


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


def _md_name(name: str) -> str:
    # A file's name in the Markdown: one line, its Markdown marks escaped so a name cannot format the export.
    return "`" + " ".join(name.split()).replace("`", "'") + "`"


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
    if message.attachments:  # by their bytes' SHA-256, into the export's "documents" (each text once)
        d["attachments"] = [{"sha256": a.sha256, "name": a.name} for a in message.attachments]
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
        **export_fields(conv._store, conv.id),  # "folder": its name or null, "tags": a list (app/state/folders.py)
        "created": conv.created,
        "active_root_id": conv.active_root_id,
        "active_path": [m.id for m in conv.path()],
        "messages": [_message_json(conv, m) for m in sorted(conv.messages.values(), key=lambda m: m.id)],
        # The attached files' documents, keyed by SHA-256 as in the database: a file on several branches is
        # here once. Each as engine.documents.Attachment.to_dict() less its name (the message's link has it).
        "documents": _documents(conv),
    }


def _documents(conv: Conversation) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for message in sorted(conv.messages.values(), key=lambda m: m.id):
        for a in message.attachments:
            out.setdefault(a.sha256, {k: v for k, v in a.to_dict().items() if k not in ("name", "sha256")})
    return out


def to_json(conv: Conversation) -> str:
    """Standard JSON: token log-probs of -inf are null, a banned token's bias is `false`, any other
    non-finite number a string such as "-inf" (app/state/json_safe.py)."""
    return dumps(to_json_dict(conv), ensure_ascii=False, indent=1)
