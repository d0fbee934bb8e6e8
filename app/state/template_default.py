"""What a chat template says when a chat has no system prompt: the model's default system prompt, if any.

SmolLM2's template puts "You are a helpful AI assistant named SmolLM, trained
by Hugging Face" before every chat without a system message, and the window's
empty system prompt box hid that. The template is asked, not parsed: it is
rendered once with a marker system message and once without, and what the
second has in the marker's place is the default. Qt-free; uses only the
tokenizer's public `chat_text` (any backend).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

_MARKER = "\u2063SYSTEM-MARKER\u2063"  # text no default prompt contains (invisible separators around a word)
_USER = "\u2063USER-MARKER\u2063"


def default_system_prompt(tokenizer: Any) -> str:
    """The system text `tokenizer`'s chat template adds to a chat that has none ("" when it adds none).

    "" too when the template cannot say: it refuses a system message, renders the marker in another
    form, or fails (logged; the box then shows its ordinary placeholder).
    """
    user = {"role": "user", "content": _USER}
    try:
        with_system = tokenizer.chat_text([{"role": "system", "content": _MARKER}, user], add_generation_prompt=True)
        without = tokenizer.chat_text([user], add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 - a template that fails here fails in words where chats are sent
        log.info("the chat template's default system prompt cannot be read: %s", e)
        return ""
    start = with_system.find(_MARKER)
    if start < 0:
        return ""
    before, after = with_system[:start], with_system[start + len(_MARKER):]
    if not without.startswith(before) or not without.endswith(after):
        return ""  # the chat without a system message is laid out differently: no one place to read
    added = without[len(before): len(without) - len(after)]
    return added.strip() if len(before) + len(after) <= len(without) else ""
