"""Files attached to a chat message: read and checked (`read_attachment`), then written into the message the
model reads (`compose_message`); and where an answer looked in them (`attention_map`, attention.py).
Qt-free; the CLI's --attach and the window's paperclip both go through here.
The format and the limits are documented in docs/documents.md.
"""

from engine.documents.attention import (CAVEAT, AttentionMap, Passage, TokenAttention, attention_map, late_layers,
                                        passage_mass, passages_in_prompt, passages_of)
from engine.documents.whole_answer import AnswerAttention, answer_attention
from engine.documents.attachment import MAX_BYTES, MAX_CHARS, Attachment, DocumentError
from engine.documents.compose import AttachmentSpan, Composed, attachment_block, compose_message, fence_for
from engine.documents.first_part import block_tokens, first_part
from engine.documents.read import attachment_from_bytes, read_attachment

__all__ = ["AnswerAttention", "answer_attention", "CAVEAT", "AttentionMap", "Passage", "TokenAttention", "attention_map", "late_layers", "passage_mass",
           "passages_in_prompt", "passages_of",
           "MAX_BYTES", "MAX_CHARS", "Attachment", "AttachmentSpan", "Composed", "DocumentError",
           "attachment_block", "attachment_from_bytes", "block_tokens", "first_part", "compose_message", "fence_for", "read_attachment"]
