"""Is a text clearly longer than the model's context? Answered from its first pieces, before the model loads.

llama.cpp tokenizes about 0.6 MB a second here (a 10 MB prompt: 17 s), so a
check that tokenized a huge text whole before refusing it would keep the
user waiting for a "no". Instead a large text is tokenized piece by piece,
cut where a word starts (before a space: the byte-level BPE pre-tokenizers
split there too, so the pieces' tokens are the text's, up to a token or two
at each cut where a SentencePiece vocabulary adds its word-start mark),
and counting stops as soon as the pieces hold clearly more tokens than the
context, with room for those cuts. A text that is not clearly over is left
to the exact count (the caller's), so nothing that fits is ever refused here.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.tokenizer import TokenizerLike

SMALL_BYTES = 256 << 10  # below this the exact count is quick (well under a second)
PIECE_CHARS = 64 << 10
PER_CUT = 2  # tokens one cut can add or take away (a word-start mark, a BOS)


@dataclass(frozen=True)
class OverCount:
    """A lower bound on a text's tokens that is past the limit, and what it suggests for the whole."""

    tokens: int  # at least this many (counted over `read_bytes` of the text)
    read_bytes: int
    total_bytes: int

    @property
    def estimate(self) -> int:
        return self.tokens * self.total_bytes // max(1, self.read_bytes)

    def describe(self) -> str:
        """"more than 9,000 tokens (about 10,000,000 in its 10,000,000 bytes)": what a message says the text has."""
        return f"more than {self.tokens:,} tokens (about {self.estimate:,} in its {self.total_bytes:,} bytes)"


def _pieces(text: str) -> list[str]:
    out, start = [], 0
    while start < len(text):
        end = min(len(text), start + PIECE_CHARS)
        if end < len(text):
            cut = text.rfind(" ", start + 1, end)  # the piece ends before a space: the next word starts the next
            end = cut if cut > start else end
        out.append(text[start:end])
        start = end
    return out


def clearly_over(tokenizer: TokenizerLike, text: str, limit: int) -> OverCount | None:
    """An `OverCount` when `text` holds clearly more than `limit` tokens, found from its first pieces; None when
    it is small, or not clearly over (then count it exactly)."""
    total = len(text.encode("utf-8", errors="surrogatepass"))
    if not limit or total <= SMALL_BYTES:
        return None
    tokens = read = cuts = 0
    for piece in _pieces(text):
        tokens += len(tokenizer.encode(piece, add_special_tokens=False))
        read += len(piece.encode("utf-8", errors="surrogatepass"))
        cuts += 1  # the cut after this piece (and its BOS) may be worth PER_CUT tokens less in the whole text
        if tokens - PER_CUT * cuts > limit:
            return OverCount(tokens - PER_CUT * cuts, read, total)
    return None
