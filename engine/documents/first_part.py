"""The first part of an attachment that fits a number of tokens: what "send the first part" sends.

Cut at a line break where one is near (a paragraph or a row of a table is not split mid-line), found from the
text's characters per token and checked by counting the cut block's tokens (a few counts, never a search over
every length: a long file costs a second per count).
"""

from __future__ import annotations

import hashlib

from engine.documents.attachment import Attachment
from engine.documents.compose import attachment_block
from engine.tokenizer import TokenizerLike

MAX_TRIES = 8


def block_tokens(tokenizer: TokenizerLike, attachment: Attachment) -> int:
    """What the attachment costs in the context: its block's tokens (name line and fences included)."""
    return len(tokenizer.encode(attachment_block(attachment), add_special_tokens=False))


def first_part(tokenizer: TokenizerLike, attachment: Attachment, max_tokens: int,
               tokens: int | None = None) -> Attachment | None:
    """`attachment` cut to its first part whose block holds at most `max_tokens` tokens, named
    "NAME (first part)" and addressed by its own text's SHA-256; the attachment itself if it fits; None if not
    even a line of it does. `tokens`: its block's tokens where already counted."""
    whole = tokens if tokens is not None else block_tokens(tokenizer, attachment)
    if whole <= max_tokens:
        return attachment
    overhead = block_tokens(tokenizer, _with_text(attachment, ""))
    if max_tokens <= overhead:
        return None
    text = attachment.text
    chars = int(len(text) * (max_tokens - overhead) / max(1, whole - overhead))
    for _ in range(MAX_TRIES):
        cut = text.rfind("\n", 0, chars + 1)
        end = cut + 1 if cut > chars // 2 else chars  # a line break in the last half: end the part there
        part = _with_text(attachment, text[:end])
        if end > 0 and block_tokens(tokenizer, part) <= max_tokens:
            return part
        chars = int(chars * 0.85)
        if chars <= 0:
            break
    return None


def _with_text(attachment: Attachment, text: str) -> Attachment:
    data = text.encode("utf-8")
    return Attachment(name=f"{attachment.name} (first part)", size=len(data), media_kind=attachment.media_kind,
                      text=text, sha256=hashlib.sha256(data).hexdigest(), encoding=attachment.encoding)
