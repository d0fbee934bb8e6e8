"""Where the answer looked: the attention an answer token paid to each passage of the attached documents.

A passage is a paragraph of an attachment's text as `compose_message` laid it out: the blocks between blank
lines, a block of more than `MAX_PASSAGE_LINES` lines (a table, a listing without blank lines) cut into runs of
that many lines. `passages_in_prompt` finds their token ranges in the prompt the model read; `attention_map`
reads the attention of answer tokens through the layer view's own capture (`engine.lens.capture`, the
`LayerLens` capability: torch's eager weights, llama.cpp's `cb_eval`, MLX's recomputed softmax) — there is no
second capture path — and sums it over heads and the chosen layers, normalised per token: a token's masses over
all earlier positions add up to 1, so `mass` is the share of the token's whole attention (the chat template,
the question and the answer so far take the rest), and `share` the share among passages only.

Attention is where the model looked, not proof of what it used (said to the user wherever it is shown).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from engine.documents.attachment import Attachment
from engine.documents.compose import Composed
from engine.lens import capture
from engine.tokenizer import TokenizerLike

if TYPE_CHECKING:
    from engine.backend import Backend

CAVEAT = "attention is where the model looked, not proof of what it used"
# A block with more lines than this is cut: a 300-row CSV as one passage would say nothing about which rows.
MAX_PASSAGE_LINES = 12
_BLANK = re.compile(r"\n[ \t]*\n\s*")


@dataclass(frozen=True)
class Passage:
    """One paragraph of an attachment: where it lies in the composed message and in the prompt's tokens."""

    sha256: str  # the attachment's
    name: str  # the attachment's name
    index: int  # 0-based, per attachment
    start: int  # character offsets in the composed message, end exclusive
    end: int
    text: str
    first_token: int = 0  # token range in the prompt, end exclusive (empty: not found in the prompt)
    end_token: int = 0

    @property
    def label(self) -> str:
        """'notes.md §2': what a bar or a highlight is called (1-based, as a reader counts)."""
        return f"{self.name} §{self.index + 1}"

    @property
    def n_tokens(self) -> int:
        return self.end_token - self.first_token


@dataclass(frozen=True)
class TokenAttention:
    """One answer token's attention on the passages: `mass[i]` of passage i (share of all its attention)."""

    position: int  # the token's index in the ids (the residual stream that predicts it is read at position - 1)
    token_id: int
    mass: tuple[float, ...]

    @property
    def share(self) -> tuple[float, ...]:
        """Each passage's part of the attention that fell on passages (sums to 1 when any did)."""
        total = sum(self.mass)
        return tuple(m / total if total > 0 else 0.0 for m in self.mass)


@dataclass(frozen=True)
class AttentionMap:
    """Where the chosen answer tokens looked: per token, and over them all (the per-passage bar)."""

    passages: tuple[Passage, ...]
    tokens: tuple[TokenAttention, ...]
    layers: tuple[int, ...]  # the layers summed

    @property
    def mass(self) -> tuple[float, ...]:
        """Each passage's mass averaged over the tokens."""
        if not self.tokens:
            return tuple(0.0 for _ in self.passages)
        return tuple(float(v) for v in np.mean([t.mass for t in self.tokens], axis=0))

    @property
    def share(self) -> tuple[float, ...]:
        """Each passage's part of the tokens' attention on passages ("this answer read mostly §2")."""
        mass = self.mass
        total = sum(mass)
        return tuple(m / total if total > 0 else 0.0 for m in mass)

    def top(self, n: int = 3) -> list[tuple[Passage, float]]:
        """The `n` passages with the largest share, largest first."""
        order = sorted(range(len(self.passages)), key=lambda i: -self.share[i])[:n]
        return [(self.passages[i], self.share[i]) for i in order]


def _blocks(text: str) -> list[tuple[int, int]]:
    """(start, end) character ranges of the paragraphs of `text`, surrounding whitespace left out."""
    out: list[tuple[int, int]] = []
    at = 0
    for gap in [*_BLANK.finditer(text), None]:
        stop = gap.start() if gap is not None else len(text)
        chunk = text[at:stop]
        lead = len(chunk) - len(chunk.lstrip())
        body = chunk.strip()
        if body:
            out.extend(_cut_lines(text, at + lead, at + lead + len(body)))
        at = gap.end() if gap is not None else len(text)
    return out


def _cut_lines(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """A block cut into runs of at most MAX_PASSAGE_LINES lines."""
    lines = text[start:end].split("\n")
    if len(lines) <= MAX_PASSAGE_LINES:
        return [(start, end)]
    out, at = [], start
    for i in range(0, len(lines), MAX_PASSAGE_LINES):
        run = "\n".join(lines[i:i + MAX_PASSAGE_LINES])
        out.append((at, at + len(run)))
        at += len(run) + 1
    return out


def passages_of(composed: Composed, attachments: Sequence[Attachment]) -> list[Passage]:
    """Every attachment's paragraphs, in message order, with their character ranges in `composed.text`."""
    by_sha = {a.sha256: a for a in attachments}
    out: list[Passage] = []
    for span in composed.spans:
        attachment = by_sha.get(span.sha256)
        name = attachment.name if attachment is not None else span.sha256[:12]
        text = composed.text[span.start:span.end]
        for i, (a, b) in enumerate(_blocks(text)):
            out.append(Passage(span.sha256, name, i, span.start + a, span.start + b, text[a:b]))
    return out


def token_byte_ends(tokenizer: TokenizerLike, ids: Sequence[int]) -> tuple[bytes, np.ndarray]:
    """(the tokens' bytes joined, (n,) each token's end offset in them)."""
    pieces = [tokenizer.token_bytes(int(t)) for t in ids]
    return b"".join(pieces), np.cumsum([len(p) for p in pieces], dtype=np.int64)


def passages_in_prompt(tokenizer: TokenizerLike, ids: Sequence[int], composed: Composed,
                       attachments: Sequence[Attachment]) -> list[Passage]:
    """The passages with their token ranges in `ids` (the prompt that holds the composed message, e.g. its
    chat template around it). The message is found in the tokens' bytes (its last occurrence: a system prompt
    quoting it comes first); a token is a passage's when it starts inside it, or is its first and straddles
    its start. ValueError when the message is not in the prompt."""
    data, ends = token_byte_ends(tokenizer, ids)
    message = composed.text.encode("utf-8")
    base = data.rfind(message)
    if base < 0:
        raise ValueError("the composed message is not in these prompt tokens (was it sent with other attachments?)")
    starts = ends - np.array([len(tokenizer.token_bytes(int(t))) for t in ids], dtype=np.int64)
    out = []
    previous_end = 0
    for p in passages_of(composed, attachments):
        lo = base + len(composed.text[:p.start].encode("utf-8"))
        hi = base + len(composed.text[:p.end].encode("utf-8"))
        first = max(int(np.searchsorted(ends, lo, side="right")), previous_end)  # first token ending past lo
        end = max(int(np.searchsorted(starts, hi, side="left")), first)  # first token starting at or past hi
        previous_end = end
        out.append(Passage(p.sha256, p.name, p.index, p.start, p.end, p.text, first, end))
    return out


def late_layers(n_layers: int) -> tuple[int, ...]:
    """The second half of the layers. On SmolLM2-135M the first third attends by position (the start of the
    prompt, whatever it holds) and the later layers by content: a fact's paragraph leads in layers 12-23 and
    is buried under the first paragraph when every layer is summed (docs/documents.md)."""
    return tuple(range(n_layers // 2, n_layers))


def passage_mass(attention: np.ndarray, passages: Sequence[Passage], layers: Sequence[int] | None = None
                 ) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """(each passage's mass, the layers used) from one capture's (L, H, position) attention: summed over heads
    and the chosen layers (None: all), divided by heads x layers so that the token's mass over every earlier
    position is 1."""
    n_layers = attention.shape[0]
    chosen = tuple(range(n_layers)) if layers is None else tuple(sorted({int(i) for i in layers}))
    if not chosen or any(not 0 <= i < n_layers for i in chosen):
        raise ValueError(f"layers must be among 0..{n_layers - 1}, got {list(layers or [])}")
    per_position = attention[list(chosen)].astype(np.float64).sum(axis=(0, 1))  # (position,)
    per_position /= len(chosen) * attention.shape[1]
    width = per_position.shape[0]
    mass = tuple(float(per_position[min(p.first_token, width):min(p.end_token, width)].sum()) for p in passages)
    return mass, chosen


def attention_map(backend: Backend, ids: Sequence[int], positions: Sequence[int], passages: Sequence[Passage],
                  layers: Sequence[int] | None = None) -> AttentionMap:
    """Where the tokens at `positions` of `ids` (prompt then answer; a position is a predicted token's index)
    looked, over `passages` (from `passages_in_prompt`). Runs the layer view's capture on the backend (call it
    on the model's worker thread, e.g. `Engine.call`); MissingCapabilityError in words on a model without it."""
    captures = capture(backend, ids, positions, top_k=1, attention=True)
    tokens = []
    used: tuple[int, ...] = ()
    for c in captures:
        if c.attention is None:
            raise RuntimeError("the layer view returned no attention for this model")
        mass, used = passage_mass(c.attention, passages, layers)
        tokens.append(TokenAttention(c.position, c.target_id, mass))
    return AttentionMap(tuple(passages), tuple(tokens), used)
