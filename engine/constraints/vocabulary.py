"""The llguidance tokenizer of a model, built from the model's own vocabulary.

Every backend's tokenizer that can list its vocabulary as bytes
(`engine.capabilities.ByteVocabulary`: the Hugging Face tokenizer of torch and
MLX models, llama.cpp's vocabulary of a GGUF file) gives the same thing: each
token's bytes, which ones are markup, and how text is tokenized. From those
one builder makes llguidance's `LLTokenizer` (its `TokenizerWrapper`), so the
ids a grammar mask speaks of are exactly the sampler's. Special tokens carry
llguidance's marker byte 0xFF in front, so a grammar never spells text with
`<|im_start|>`; the end-of-generation tokens are the grammar's end.

Building one walks the whole vocabulary (0.3 s at 49k tokens), so it is kept
per tokenizer object (a weak map: it goes when the model does).

A server's tokenizer cannot list its vocabulary; `byte_tokenizer` is the
stand-in there: one token per byte, so a candidate token's text can be
checked byte by byte (`engine.constraints.matcher.CandidateMask`).
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from engine.capabilities import ByteVocabulary

log = logging.getLogger(__name__)

SPECIAL_MARKER = b"\xff"  # llguidance's prefix for a special token's bytes (never valid UTF-8)
_cache: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class _VocabularyView:
    """What llguidance's `TokenizerWrapper` reads: tokens as bytes, EOS, and a tokenize call."""

    def __init__(self, tok: ByteVocabulary, n_vocab: int | None) -> None:
        count = tok.token_count()
        special = tok.special_token_ids()
        tokens = [(SPECIAL_MARKER if i in special else b"") + tok.token_bytes(i) for i in range(count)]
        if n_vocab is not None and n_vocab > count:  # the model's head is wider than its vocabulary
            tokens += [SPECIAL_MARKER + f"<unused {i}>".encode() for i in range(count, n_vocab)]
        self.tokens = tokens
        self.special_token_ids = sorted(special)
        eos = sorted(tok.eos_token_ids)
        self.eos_token_id = eos[0] if eos else None
        self.bos_token_id = None
        self._tok = tok

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return list(self._tok.encode(text, add_special_tokens=False))


def ll_tokenizer(tok: ByteVocabulary, n_vocab: int | None = None) -> Any:
    """llguidance's `LLTokenizer` for `tok` (cached per tokenizer object and width).

    Args:
        tok: the model's tokenizer (a `ByteVocabulary`).
        n_vocab: the width of the model's logits, when wider than the vocabulary
            (padded heads): the extra ids are never allowed.
    """
    from llguidance import LLTokenizer, TokenizerWrapper

    with _lock:
        per_tok = _cache.get(tok)
        if per_tok is None:
            per_tok = _cache[tok] = {}
        found = per_tok.get(n_vocab)
        if found is None:
            view = _VocabularyView(tok, n_vocab)
            eos = sorted(tok.eos_token_ids)
            found = LLTokenizer(TokenizerWrapper(view), n_vocab=len(view.tokens), eos_token=eos or None)
            per_tok[n_vocab] = found
            log.debug("llguidance tokenizer built: %d tokens, eos %s", len(view.tokens), eos)
        return found


class _Bytes:
    """One token per byte (ids 0..255) and one end token (256): text checked byte by byte."""

    END = 256

    def __init__(self) -> None:
        # Byte 0xFF is llguidance's special marker; it never occurs in UTF-8 text, so its token is markup.
        self.tokens = [bytes([b]) for b in range(255)] + [SPECIAL_MARKER + b"<byte 255>", SPECIAL_MARKER + b"<end>"]
        self.special_token_ids = [255, self.END]
        self.eos_token_id = self.END
        self.bos_token_id = None

    def __call__(self, text: str | bytes) -> list[int]:
        raw = text.encode("utf-8") if isinstance(text, str) else text
        return list(raw)


_byte_tok: list[Any] = []


def byte_tokenizer() -> Any:
    """An `LLTokenizer` with one token per byte (for vocabularies that cannot be listed)."""
    from llguidance import LLTokenizer, TokenizerWrapper

    with _lock:
        if not _byte_tok:
            _byte_tok.append(LLTokenizer(TokenizerWrapper(_Bytes()), n_vocab=257, eos_token=_Bytes.END))
        return _byte_tok[0]
