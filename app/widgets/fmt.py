"""Small text helpers shared by the views: visible token text, percentages, token tooltips."""

from __future__ import annotations

import codecs
import html
import math
from collections.abc import Sequence

from engine import TokenEvent

_VISIBLE = str.maketrans({" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"})


def byte_label(raw: bytes) -> str:
    """Bytes as text, each byte that is not part of a whole UTF-8 character written `<F0>`."""
    text = raw.decode("utf-8", errors="surrogateescape")  # stray bytes become U+DC80..U+DCFF
    return "".join(f"<{ord(c) - 0xDC00:02X}>" if 0xDC80 <= ord(c) <= 0xDCFF else c for c in text)


def token_label(token_text: str, token_bytes: bytes | None = None) -> str:
    """A token's own text, or its bytes (`<F0><9F>`) when it holds only part of a character."""
    return byte_label(token_bytes) if token_bytes is not None else token_text


VISIBLE_CHARS = 200  # a token from a file or a server can be megabytes: labels and tooltips show its start


def visible(token_text: str, token_bytes: bytes | None = None) -> str:
    """A token's text with whitespace made visible ('␣Paris', '↵'), for lists and headers (cut to
    `VISIBLE_CHARS`, saying how long it is: a label laid out a 5 MB token for minutes)."""
    text = token_label(token_text, token_bytes)
    if len(text) > VISIBLE_CHARS:
        return f"{text[:VISIBLE_CHARS].translate(_VISIBLE)}… ({len(text):,} characters)"
    return text.translate(_VISIBLE) if text else "∅"


def finished_characters(run: bytes) -> str | None:
    """The multi-byte characters in `run` if it ends on a character boundary, else None (wait for more bytes)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(run, final=False)
    if decoder.getstate()[0]:
        return None
    return "".join(c for c in text if ord(c) > 0x7F and c != "\ufffd")


def _raw(ev: TokenEvent) -> bytes:
    return ev.token_bytes if ev.token_bytes is not None else ev.token_text.encode("utf-8")


def completed_character(tokens: Sequence[TokenEvent], index: int) -> str | None:
    """The character(s) a partial-byte token belongs to, put together from its neighbours' bytes.

    None when the token is whole text, or when the bytes around it never form a character (an
    answer cut inside one).
    """
    if not 0 <= index < len(tokens) or tokens[index].token_bytes is None:
        return None
    lo = hi = index
    while lo > 0 and tokens[lo - 1].token_bytes is not None:
        lo -= 1
    while hi + 1 < len(tokens) and tokens[hi + 1].token_bytes is not None:
        hi += 1
    # The run may end in a whole token that finishes the character ("\x80!" is partial, "!" is not).
    data = b"".join(_raw(t) for t in tokens[lo : hi + 1])
    start = sum(len(_raw(t)) for t in tokens[lo:index])
    end = start + len(_raw(tokens[index]))
    found, p = [], 0
    while p < len(data):
        lead = data[p]
        n = 1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        try:
            ch = data[p : p + n].decode("utf-8")
        except UnicodeDecodeError:
            ch, n = None, 1
        if ch is not None and n > 1 and p < end and p + n > start:
            found.append(ch)
        p += n
    return "".join(found) or None


def pct(p: float) -> str:
    """A probability as a percentage. "<0.1%" starts like a tag: rich text must get it through html.escape."""
    if not math.isfinite(p) or p <= 0:
        return "0%"
    if p < 0.001:
        return "<0.1%"
    if p >= 0.9995:
        return "100%"
    return f"{p * 100:.1f}%"


def bits(logprob: float) -> str:
    return "∞ bits" if not math.isfinite(logprob) else f"{-logprob / math.log(2):.2f} bits"


def token_tooltip(ev: TokenEvent, alternatives: int = 5, character: str | None = None) -> str:
    """Rich-text tooltip: the token, its probability, rank, entropy, and top alternatives.

    `character`: what a partial-byte token completes (see `completed_character`).
    """
    rows = []
    for alt in ev.top_model[:alternatives]:
        mark = "▶ " if alt.token_id == ev.token_id else ""
        rows.append(
            f"<tr><td>{mark}<code>{html.escape(visible(alt.text, alt.token_bytes))}</code></td>"
            f"<td align='right'>&nbsp;{html.escape(pct(alt.prob))}</td></tr>"
        )
    badges = " · forced" if ev.forced else ""
    if ev.rewind is not None:
        badges += (f" · stepped back here: the answer would have said “{html.escape(ev.rewind.phrase)}” "
                   f"({ev.rewind.withdrawn} token{'s' * (ev.rewind.withdrawn != 1)} taken back)")
    badges += " · end of sequence" if ev.special else ""
    if ev.token_bytes is not None:
        badges += f" · bytes of “{html.escape(character)}”" if character else " · part of a character"
    return (
        f"<b><code>{html.escape(visible(ev.token_text, ev.token_bytes))}</code></b>{badges}<br>"
        f"p {html.escape(pct(ev.prob))} · sampler {html.escape(pct(ev.sampler_prob))} · rank {ev.rank + 1}<br>"
        f"entropy {ev.entropy:.2f} nats · {html.escape(bits(ev.logprob))}"
        f"<table style='margin-top:4px'>{''.join(rows)}</table>"
    )


def human_bytes(n: int | float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
