"""Do two models share a tokenizer? And, where they do not, which stretches of a text can be compared.

Two models can be compared token by token only when a token id means the same
bytes to both: then one tokenization of the text feeds both models and their
next-token distributions are over the same outcomes. `compare_vocabularies`
checks exactly that: the same number of tokens and the same bytes for every
id (special tokens by their text), with a SHA-256 of each vocabulary for the
record. Merges or normalisation may still differ; that does not matter, since
both models read the same ids.

Where the vocabularies differ, each model reads its own tokenization of the
text, and the two are laid side by side on byte offsets (`token_spans`,
`aligned_spans`): a span ends where a token of A *and* a token of B end, so
each span is covered exactly by whole tokens of both, and the sum of a model's
log-probs over its tokens in the span is log p(span's bytes | the text before).
KL per token is not defined there: the two distributions are over different
vocabularies.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.capabilities import ByteVocabulary


@dataclass(frozen=True)
class VocabularyCheck:
    """Whether two tokenizers map every id to the same bytes, and why not when they do not."""

    same: bool
    tokens_a: int
    tokens_b: int
    digest_a: str  # SHA-256 over every token's bytes (length-prefixed); "" when not computed
    digest_b: str
    reason: str  # one line for a person

    def to_dict(self) -> dict[str, Any]:
        return {"same": self.same, "tokens_a": self.tokens_a, "tokens_b": self.tokens_b,
                "digest_a": self.digest_a, "digest_b": self.digest_b, "reason": self.reason}


def _token_count(tok: Any) -> int:
    count = getattr(tok, "token_count", None)
    return int(count()) if callable(count) else 0


_DIGESTS: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()  # tokenizer -> its digest


def vocabulary_digest(tok: ByteVocabulary) -> str:
    """SHA-256 of every token's bytes in id order, each prefixed by its length (so no two lists collide).

    Remembered per tokenizer object (reading 49k tokens one by one costs ~0.5 s, 262k several seconds), so a
    window that compares again, or a script in a loop, pays it once.
    """
    try:
        return _DIGESTS[tok]
    except (KeyError, TypeError):  # TypeError: not weakly referable, so never remembered
        pass
    h = hashlib.sha256()
    for i in range(tok.token_count()):
        b = tok.token_bytes(i)
        h.update(len(b).to_bytes(4, "little"))
        h.update(b)
    digest = h.hexdigest()
    try:
        _DIGESTS[tok] = digest
    except TypeError:
        pass
    return digest


def compare_vocabularies(tok_a: Any, tok_b: Any) -> VocabularyCheck:
    """Same token count and the same bytes for every id? (the first differing id is named)

    A tokenizer that cannot list its tokens as bytes (a server's) is never taken as the same.
    """
    if not isinstance(tok_a, ByteVocabulary) or not isinstance(tok_b, ByteVocabulary):
        which = "A" if not isinstance(tok_a, ByteVocabulary) else "B"
        return VocabularyCheck(False, _token_count(tok_a), _token_count(tok_b), "", "",
                               f"model {which}'s tokenizer cannot list its tokens as bytes, so the vocabularies "
                               "cannot be compared")
    n_a, n_b = tok_a.token_count(), tok_b.token_count()
    if n_a != n_b:  # no need to read 262k tokens to tell these apart
        return VocabularyCheck(False, n_a, n_b, "", "", f"different vocabularies: {n_a:,} tokens against {n_b:,}")
    da, db = vocabulary_digest(tok_a), vocabulary_digest(tok_b)
    if da == db:
        return VocabularyCheck(True, n_a, n_b, da, db, f"the same {n_a:,} tokens, byte for byte")
    differ = [i for i in range(n_a) if tok_a.token_bytes(i) != tok_b.token_bytes(i)]
    i = differ[0]
    return VocabularyCheck(False, n_a, n_b, da, db,
                           f"both have {n_a:,} tokens but {len(differ):,} differ (the first, id {i}: "
                           f"{tok_a.token_bytes(i)!r} against {tok_b.token_bytes(i)!r})")


# --- byte alignment (different tokenizers) -----------------------------------------------------


def token_spans(tok: Any, ids: Sequence[int], text: str, who: str = "the tokenizer") -> list[tuple[int, int]]:
    """[start, end) byte offsets in `text`'s UTF-8 of every token of `ids`; a special token (BOS) is empty.

    Raises ValueError when the tokens do not spell the text byte for byte (a tokenizer that normalises
    the text), since spans of the two models could not be matched then.
    """
    special = tok.special_token_ids() if hasattr(tok, "special_token_ids") else frozenset()
    data = text.encode("utf-8")
    spans, at = [], 0
    for t in ids:
        piece = tok.token_bytes(int(t))
        if t in special and data[at : at + len(piece)] != piece:
            piece = b""  # markup the tokenizer put in (BOS), not text: it covers no bytes
        if data[at : at + len(piece)] != piece:
            raise ValueError(f"{who} does not spell the text byte for byte (at byte {at}: the token "
                             f"{piece!r} against {data[at:at + len(piece)]!r}), so its tokens cannot be matched "
                             "to the other model's")
        spans.append((at, at + len(piece)))
        at += len(piece)
    if at != len(data):
        raise ValueError(f"{who}'s tokens spell {at} of the text's {len(data)} bytes")
    return spans


@dataclass(frozen=True)
class AlignedSpan:
    """Bytes [start, end) of the text, covered exactly by tokens `a` of model A and `b` of model B (indices)."""

    start: int
    end: int
    a: tuple[int, ...]
    b: tuple[int, ...]


def aligned_spans(spans_a: Sequence[tuple[int, int]], spans_b: Sequence[tuple[int, int]], total: int) -> list[AlignedSpan]:
    """The text cut where a token of A and a token of B both end; every byte in exactly one span.

    Empty tokens (special ones) belong to no span. Each non-empty token lies inside one span.
    """
    ends_a = {e for s, e in spans_a if e > s}
    ends_b = {e for s, e in spans_b if e > s}
    cuts = sorted((ends_a & ends_b) | {total})
    out: list[AlignedSpan] = []
    ia = ib = 0
    start = 0
    for cut in cuts:
        if cut <= start:
            continue
        a: list[int] = []
        b: list[int] = []
        while ia < len(spans_a) and spans_a[ia][1] <= cut:
            if spans_a[ia][1] > spans_a[ia][0]:
                a.append(ia)
            ia += 1
        while ib < len(spans_b) and spans_b[ib][1] <= cut:
            if spans_b[ib][1] > spans_b[ib][0]:
                b.append(ib)
            ib += 1
        out.append(AlignedSpan(start, cut, tuple(a), tuple(b)))
        start = cut
    return out
