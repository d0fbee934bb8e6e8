"""How attachments go into the user message the model reads: one documented way (docs/documents.md).

Each attachment becomes a block, in the order attached, before the user's own text:

    Attached file: notes.md
    ```markdown
    ...the file's text...
    ```

then a blank line and the message. This is what LM Studio and Open WebUI do for a whole document put into the
context (the name on a line of its own, the text fenced), so a model's answer can refer to the file by name.
The fence is longer than any run of backticks in the text (a Markdown file with its own ``` blocks cannot close
it early), and its info string is the file's language where its kind says one. Pure functions: the same
message and attachments give the same text, byte for byte, in the CLI, the window and a replay.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from engine.documents.attachment import Attachment

LANGUAGES = {".py": "python", ".js": "javascript", ".ts": "typescript", ".rs": "rust", ".go": "go", ".c": "c",
             ".h": "c", ".cpp": "cpp", ".cc": "cpp", ".java": "java", ".rb": "ruby", ".sh": "bash", ".sql": "sql",
             ".html": "html", ".css": "css", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".xml": "xml"}
KIND_LANGUAGES = {"markdown": "markdown", "csv": "csv", "json": "json"}


def fence_for(text: str) -> str:
    """Backticks, at least three and one more than the longest run of them in `text`."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _language(attachment: Attachment) -> str:
    return KIND_LANGUAGES.get(attachment.media_kind) or LANGUAGES.get(Path(attachment.name).suffix.lower(), "")


def _header(attachment: Attachment) -> str:
    # A newline in a name would let a file's name write lines of the prompt: it is shown as a space.
    name = " ".join(attachment.name.split())
    return f"Attached file: {name}\n{fence_for(attachment.text)}{_language(attachment)}\n"


def attachment_block(attachment: Attachment) -> str:
    """One attachment as the model reads it: its name line, the fenced text, the closing fence."""
    text = attachment.text if attachment.text.endswith("\n") else attachment.text + "\n"
    return _header(attachment) + text + fence_for(attachment.text)


@dataclass(frozen=True)
class AttachmentSpan:
    """Where an attachment's own text lies in the composed message (character offsets, end exclusive)."""

    sha256: str
    start: int
    end: int


@dataclass(frozen=True)
class Composed:
    text: str
    spans: tuple[AttachmentSpan, ...]


def compose_message(text: str, attachments: tuple[Attachment, ...] | list[Attachment]) -> Composed:
    """The user message the model reads: each attachment's block, then `text`; and where each file's text is.

    With no attachments the message is `text` unchanged."""
    if not attachments:
        return Composed(text, ())
    parts: list[str] = []
    spans: list[AttachmentSpan] = []
    at = 0
    for attachment in attachments:
        start = at + len(_header(attachment))
        spans.append(AttachmentSpan(attachment.sha256, start, start + len(attachment.text)))
        block = attachment_block(attachment) + "\n\n"
        parts.append(block)
        at += len(block)
    body = "".join(parts) + text if text else "".join(parts).rstrip("\n")
    return Composed(body, tuple(spans))
