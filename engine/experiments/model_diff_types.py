"""What comparing two models on one text gives: per token (same tokenizer) or per byte span (different ones).

`ModelDiff` (same vocabulary): one `PositionDiff` per scored token, each model's
`ScoredToken` (log-prob, rank, entropy, top alternatives: the numbers
`Engine.score` gives) and, from the two full distributions at that position,
KL(A || B) and KL(B || A) in nats and the rank of each model's top token under
the other. The window colours by KL(A || B) (A: the model the text is judged
against, usually the reference; pass the float original as A for "how far is
the quantized model from it").

`SpanModelDiff` (different vocabularies): each model reads its own tokens; the
text is cut where both tokenizations have a token boundary, and per span each
model's summed log-prob of those bytes is given. KL per token is not defined
there (the two distributions are over different vocabularies).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from engine.events import TokenEvent
from engine.experiments.model_diff_vocab import VocabularyCheck
from engine.experiments.score import ScoredToken

NO_TOKEN_KL = ("KL per token is not defined here: the two models' tokenizers differ, so their next-token "
               "distributions are over different vocabularies; spans of text are compared by summed log-prob")


@dataclass(frozen=True, slots=True)
class PositionDiff:
    """One token of the text under both models (same tokenizer)."""

    index: int  # position in ModelDiff.token_ids
    a: ScoredToken
    b: ScoredToken
    kl_ab: float  # KL(A || B), nats, of the two full next-token distributions at this position
    kl_ba: float  # KL(B || A)
    a_top_rank_in_b: int  # rank under B of A's most likely token (0: B agrees on the top token)
    b_top_rank_in_a: int

    @property
    def token_id(self) -> int:
        return self.a.token_id

    @property
    def token_text(self) -> str:
        return self.a.token_text

    @property
    def logprob_delta(self) -> float:
        """log pB(token) - log pA(token): > 0 where B likes the text's token more."""
        return self.b.logprob - self.a.logprob

    def event(self, index: int | None = None, side: str = "a") -> TokenEvent:
        """The position as model `side`'s `TokenEvent` (token views draw those)."""
        return (self.a if side == "a" else self.b).as_event(index)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "token_id": self.token_id, "text": self.token_text,
            "logprob_a": self.a.logprob, "logprob_b": self.b.logprob,
            "rank_a": self.a.rank, "rank_b": self.b.rank,
            "entropy_a": self.a.entropy, "entropy_b": self.b.entropy,
            "kl_ab": self.kl_ab, "kl_ba": self.kl_ba,
            "a_top_rank_in_b": self.a_top_rank_in_b, "b_top_rank_in_a": self.b_top_rank_in_a,
            "top_a": [[t.token_id, t.text, t.logprob] for t in self.a.top],
            "top_b": [[t.token_id, t.text, t.logprob] for t in self.b.top],
        }


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


@dataclass(frozen=True)
class ModelDiff:
    """Two models (same tokenizer) on one token sequence; `positions` are `token_ids[context:]`."""

    model_a: str
    model_b: str
    token_ids: tuple[int, ...]
    context: int
    positions: tuple[PositionDiff, ...]
    vocabulary: VocabularyCheck
    seconds: float = 0.0
    forward_calls: tuple[int, int] = (0, 0)
    same_tokenizer: bool = field(default=True, init=False)

    @property
    def kl_ab(self) -> list[float]:
        return [p.kl_ab for p in self.positions]

    @property
    def kl_ba(self) -> list[float]:
        return [p.kl_ba for p in self.positions]

    def top_divergences(self, n: int = 10, by: str = "kl_ab") -> list[PositionDiff]:
        """The `n` positions where the models disagree most (by KL(A||B), or "kl_ba"), largest first."""
        if by not in ("kl_ab", "kl_ba"):
            raise ValueError(f"by must be 'kl_ab' or 'kl_ba', got {by!r}")
        return sorted(self.positions, key=lambda p: -getattr(p, by))[: max(0, n)]

    def summary_dict(self) -> dict[str, Any]:
        ab, ba = self.kl_ab, self.kl_ba
        n = len(self.positions)
        agree = sum(1 for p in self.positions if p.a_top_rank_in_b == 0)
        total_a = sum(p.a.logprob for p in self.positions)
        total_b = sum(p.b.logprob for p in self.positions)
        return {
            "tokens": n,
            "mean_kl_ab": sum(ab) / n if n else 0.0, "mean_kl_ba": sum(ba) / n if n else 0.0,
            "median_kl_ab": _quantile(ab, 0.5), "p90_kl_ab": _quantile(ab, 0.9), "p99_kl_ab": _quantile(ab, 0.99),
            "max_kl_ab": max(ab) if ab else 0.0, "max_kl_ba": max(ba) if ba else 0.0,
            "top_token_agreement": agree / n if n else 1.0,
            "total_logprob_a": total_a, "total_logprob_b": total_b,
            "perplexity_a": math.exp(-total_a / n) if n else 1.0, "perplexity_b": math.exp(-total_b / n) if n else 1.0,
            "seconds": self.seconds,
        }

    def summary(self) -> str:
        """One line for a person."""
        s = self.summary_dict()
        return (f"{s['tokens']} tokens; KL(A||B) mean {s['mean_kl_ab']:.4f} nats, median {s['median_kl_ab']:.4f}, "
                f"p99 {s['p99_kl_ab']:.4f}, max {s['max_kl_ab']:.4f}; KL(B||A) mean {s['mean_kl_ba']:.4f}; "
                f"same top token at {s['top_token_agreement']:.1%} of positions; "
                f"perplexity A {s['perplexity_a']:.2f}, B {s['perplexity_b']:.2f}")


@dataclass(frozen=True, slots=True)
class SpanDiff:
    """Bytes [start, end) of the text and each model's log-prob of them (different tokenizers).

    A log-prob is None where one of the model's tokens in the span is context only (the text's first
    token, when the model puts no BOS before it: nothing predicts it).
    """

    start: int
    end: int
    text: str
    tokens_a: tuple[str, ...]
    tokens_b: tuple[str, ...]
    logprob_a: float | None
    logprob_b: float | None

    @property
    def delta(self) -> float | None:
        """log pB(span) - log pA(span), None where either is unknown."""
        return None if self.logprob_a is None or self.logprob_b is None else self.logprob_b - self.logprob_a

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "text": self.text, "tokens_a": list(self.tokens_a),
                "tokens_b": list(self.tokens_b), "logprob_a": self.logprob_a, "logprob_b": self.logprob_b}


@dataclass(frozen=True)
class SpanModelDiff:
    """Two models with different tokenizers on one text, compared span by span on byte offsets."""

    model_a: str
    model_b: str
    text: str
    spans: tuple[SpanDiff, ...]
    vocabulary: VocabularyCheck
    tokens_a: int  # how many tokens each model read the text as
    tokens_b: int
    seconds: float = 0.0
    same_tokenizer: bool = field(default=False, init=False)
    note: str = field(default=NO_TOKEN_KL, init=False)

    def top_divergences(self, n: int = 10) -> list[SpanDiff]:
        """The `n` spans whose log-probs differ most (either way), largest first; unknown ones left out."""
        known = [s for s in self.spans if s.delta is not None]
        return sorted(known, key=lambda s: -abs(s.delta or 0.0))[: max(0, n)]

    def summary_dict(self) -> dict[str, Any]:
        known = [s for s in self.spans if s.delta is not None]
        ta = sum(s.logprob_a or 0.0 for s in known)
        tb = sum(s.logprob_b or 0.0 for s in known)
        nbytes = sum(s.end - s.start for s in known)
        return {
            "spans": len(self.spans), "compared_spans": len(known), "bytes_compared": nbytes,
            "tokens_a": self.tokens_a, "tokens_b": self.tokens_b,
            "total_logprob_a": ta, "total_logprob_b": tb,
            "bits_per_byte_a": -ta / nbytes / math.log(2) if nbytes else math.nan,
            "bits_per_byte_b": -tb / nbytes / math.log(2) if nbytes else math.nan,
            "mean_abs_delta": sum(abs(s.delta or 0.0) for s in known) / len(known) if known else 0.0,
            "seconds": self.seconds,
        }

    def summary(self) -> str:
        s = self.summary_dict()
        return (f"{s['spans']} spans ({s['compared_spans']} compared, {s['bytes_compared']} bytes; A read "
                f"{s['tokens_a']} tokens, B {s['tokens_b']}); bits/byte A {s['bits_per_byte_a']:.3f}, "
                f"B {s['bits_per_byte_b']:.3f}; mean |Δ log-prob| per span {s['mean_abs_delta']:.3f} nats. "
                f"{self.note}")
