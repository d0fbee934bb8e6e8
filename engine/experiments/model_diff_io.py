"""A two-model comparison as JSON lines and as a table for a terminal (`logitlab-cli compare-models`).

JSON lines, format "logitlab.model_diff/1": a header (both models, the vocabulary check, which KL is which),
one line per token (same tokenizer: "type": "token", `PositionDiff.to_dict()`) or per byte span (different
tokenizers: "type": "span", `SpanDiff.to_dict()`), and an end line with the summary and the top divergences.
Numbers JSON cannot hold (an infinite KL, a NaN quantile of nothing) are written as null.
"""

from __future__ import annotations

import math
from typing import Any

from engine.experiments.model_diff_types import ModelDiff, SpanModelDiff

FORMAT = "logitlab.model_diff/1"
KL_WORDS = "kl_ab = KL(A || B), kl_ba = KL(B || A), in nats, of the two models' full next-token distributions"


def _finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (recursively), so the line is standard JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def diff_lines(diff: ModelDiff | SpanModelDiff, *, top: int = 10, text: str | None = None) -> list[dict[str, Any]]:
    """The comparison as JSON-ready dicts: header, one per token or span, end."""
    header: dict[str, Any] = {
        "type": "header", "format": FORMAT, "model_a": diff.model_a, "model_b": diff.model_b,
        "same_tokenizer": diff.same_tokenizer, "vocabulary": diff.vocabulary.to_dict(),
    }
    if isinstance(diff, ModelDiff):
        header.update(kl=KL_WORDS, context=diff.context, token_ids=list(diff.token_ids))
        if text is not None:
            header["text"] = text
        rows = [{"type": "token", **p.to_dict()} for p in diff.positions]
        end = {"type": "end", "summary": diff.summary_dict(),
               "top_divergences": [p.index for p in diff.top_divergences(top)], "forward_calls": list(diff.forward_calls)}
    else:
        header.update(note=diff.note, text=diff.text)
        rows = [{"type": "span", **s.to_dict()} for s in diff.spans]
        end = {"type": "end", "summary": diff.summary_dict(),
               "top_divergences": [[s.start, s.end] for s in diff.top_divergences(top)]}
    return [_finite(line) for line in (header, *rows, end)]


def _cell(text: str, width: int) -> str:
    shown = repr(text)[1:-1]
    return shown if len(shown) <= width else shown[: width - 1] + "…"


def diff_table(diff: ModelDiff | SpanModelDiff, *, top: int = 10) -> list[str]:
    """Lines for a terminal: every token (or span), then the top divergences and the summary."""
    out = [f"A: {diff.model_a}", f"B: {diff.model_b}", f"vocabulary: {diff.vocabulary.reason}"]
    if isinstance(diff, ModelDiff):
        out.append(f"{'pos':>5} {'token':<16} {'logp A':>8} {'logp B':>8} {'KL(A||B)':>9} {'KL(B||A)':>9} "
                   f"{'rank A':>6} {'rank B':>6} {'A top in B':>10}")
        row = "{:>5} {:<16} {:>8.3f} {:>8.3f} {:>9.5f} {:>9.5f} {:>6} {:>6} {:>10}"
        for p in diff.positions:
            out.append(row.format(p.index, _cell(p.token_text, 16), p.a.logprob, p.b.logprob, p.kl_ab, p.kl_ba,
                                  p.a.rank + 1, p.b.rank + 1, p.a_top_rank_in_b + 1))
        out.append(f"top {top} divergences by KL(A||B) (ranks count from 1, the model's top token):")
        for p in diff.top_divergences(top):
            alts_a = ", ".join(f"{_cell(t.text, 12)} {t.prob:.3f}" for t in p.a.top[:3])
            alts_b = ", ".join(f"{_cell(t.text, 12)} {t.prob:.3f}" for t in p.b.top[:3])
            out.append(f"  pos {p.index} {_cell(p.token_text, 16)!s}: KL {p.kl_ab:.4f}; A: {alts_a} | B: {alts_b}")
        out.append(f"[{diff.summary()}; {diff.seconds:.2f} s]")
        return out
    out.append(diff.note)
    out.append(f"{'bytes':>11} {'span':<20} {'logp A':>8} {'logp B':>8} {'Δ (B-A)':>8}")
    for s in diff.spans:
        a = f"{s.logprob_a:8.3f}" if s.logprob_a is not None else f"{'context':>8}"
        b = f"{s.logprob_b:8.3f}" if s.logprob_b is not None else f"{'context':>8}"
        d = f"{s.delta:8.3f}" if s.delta is not None else f"{'':>8}"
        out.append(f"{s.start:>5}-{s.end:<5} {_cell(s.text, 20):<20} {a} {b} {d}")
    out.append(f"top {top} spans by |Δ log-prob|:")
    for s in diff.top_divergences(top):
        out.append(f"  bytes {s.start}-{s.end} {_cell(s.text, 20)}: A {s.logprob_a:.3f} ({'|'.join(s.tokens_a)}), "
                   f"B {s.logprob_b:.3f} ({'|'.join(s.tokens_b)})")
    out.append(f"[{diff.summary()}; {diff.seconds:.2f} s]")
    return out
