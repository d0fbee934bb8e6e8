"""Which generated tokens are the model's markup (special tokens such as Gemma's `<start_of_image>`), not text.

The decode loop gives such a token's text as the token spells it, so a
notebook showed `<start_of_image>` inline as if the model had written those
letters. Which ids are special is the tokenizer's to say
(`special_token_ids`, engine's ByteVocabulary capability), but reading it
walks the whole vocabulary (seconds for Gemma's 262k): it is read once per
loaded model, off the UI thread, and only when a token spelt like markup
(`<…>`) is on screen.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from engine import TokenEvent
from PySide6.QtCore import QObject, Signal

log = logging.getLogger(__name__)

MARKUP_SHAPE = re.compile(r"<[^<>\s]{1,64}>")  # <start_of_image>, <|im_end|>, <eos>: what to look up at all


class MarkupTokens(QObject):
    """The loaded model's special token ids, read when first needed; `ready` when they are known."""

    ready = Signal()

    def __init__(self, host: Any, parent: QObject | None = None):
        super().__init__(parent)
        self._host = host
        self._tokenizer: Any = None  # whose ids are (being) read
        self._ids: frozenset[int] | None = None

    def is_markup(self, ev: TokenEvent) -> bool:
        """Whether `ev` is a special token of the loaded model (an end of sequence always is). False while the
        model's list is being read (`ready` follows)."""
        if ev.special:
            return True
        if not MARKUP_SHAPE.fullmatch(ev.token_text):
            return False
        ids = self._special_ids()
        return ids is not None and ev.token_id in ids

    def _special_ids(self) -> frozenset[int] | None:
        engine = self._host.engine
        tokenizer = engine.tokenizer if engine is not None and engine.is_loaded else None
        read = getattr(tokenizer, "special_token_ids", None)  # only tokenizers that can list their vocabulary
        if tokenizer is None or not callable(read):
            return frozenset()
        if tokenizer is not self._tokenizer:  # another model: read its list (once)
            self._tokenizer, self._ids = tokenizer, None
            self._host.run_off_ui_thread(read, lambda ids, error, t=tokenizer: self._on_read(t, ids, error))
        return self._ids

    def _on_read(self, tokenizer: Any, ids: frozenset[int] | None, error: BaseException | None) -> None:
        if tokenizer is not self._tokenizer:
            return  # a model loaded since
        if error is not None:
            log.info("the model's special tokens could not be read: %s", error)
        self._ids = frozenset(ids or ())
        self.ready.emit()
