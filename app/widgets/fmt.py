"""Small text helpers shared by the views: visible token text, percentages, token tooltips."""

from __future__ import annotations

import html
import math

from engine import TokenEvent

_VISIBLE = str.maketrans({" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"})


def visible(token_text: str) -> str:
    """A token's text with whitespace made visible ('␣Paris', '↵'), for lists and headers."""
    return token_text.translate(_VISIBLE) if token_text else "∅"


def pct(p: float) -> str:
    if not math.isfinite(p) or p <= 0:
        return "0%"
    if p < 0.001:
        return "<0.1%"
    if p >= 0.9995:
        return "100%"
    return f"{p * 100:.1f}%"


def bits(logprob: float) -> str:
    return "∞ bits" if not math.isfinite(logprob) else f"{-logprob / math.log(2):.2f} bits"


def token_tooltip(ev: TokenEvent, alternatives: int = 5) -> str:
    """Rich-text tooltip: the token, its probability, rank, entropy, and top alternatives."""
    rows = []
    for alt in ev.top_model[:alternatives]:
        mark = "▶ " if alt.token_id == ev.token_id else ""
        rows.append(
            f"<tr><td>{mark}<code>{html.escape(visible(alt.text))}</code></td>"
            f"<td align='right'>&nbsp;{pct(alt.prob)}</td></tr>"
        )
    badges = " · forced" if ev.forced else ""
    badges += " · end of sequence" if ev.special else ""
    return (
        f"<b><code>{html.escape(visible(ev.token_text))}</code></b>{badges}<br>"
        f"p {pct(ev.prob)} · sampler {pct(ev.sampler_prob)} · rank {ev.rank + 1}<br>"
        f"entropy {ev.entropy:.2f} nats · {bits(ev.logprob)}"
        f"<table style='margin-top:4px'>{''.join(rows)}</table>"
    )


def human_bytes(n: int | float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
