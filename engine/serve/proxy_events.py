"""What an upstream server answered, as our `TokenEvent`s and `GenerationStats` (proxy mode's record).

The upstream's log-probs are read by the remote backend's readers (`engine.backends.remote.step`: both
OpenAI's completions shape and the chat/llama.cpp `content` shape, ids where the server gives them, every
value checked). Its alternatives are its top N as reported, with one "rest" entry for the probability it did
not report (as the remote backend shows a server's steps); the sampler's view is unknown (the upstream
sampled), so `top_sampler` is empty and `sampler_logprob` repeats the model's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from engine.backends.remote.step import chosen_tokens, parse_alternatives, position_entries
from engine.decode.stats import generation_stats
from engine.events import FinishReason, GenerationStats, TokenEvent, TokenProb, rest_entry
from engine.serve.proxy_echo import EchoCut


def upstream_tokens(logprobs: Any) -> list[tuple[int, str, float, list[tuple[int, str, float]]]]:
    """(id or -1, token text, logprob, alternatives) per token of one `logprobs` object (checked; [] when none)."""
    if not logprobs:
        return []
    chosen = chosen_tokens(logprobs)
    entries = position_entries(logprobs)
    out = []
    for i, (tid, text, lp) in enumerate(chosen):
        alts = parse_alternatives(entries[i], None) if i < len(entries) and entries[i] else []
        out.append((-1 if tid is None else tid, text, lp, alts))
    return out


def upstream_event(index: int, tid: int, text: str, token_text: str, lp: float,
                   alts: list[tuple[int, str, float]]) -> TokenEvent:
    top = tuple(TokenProb(i, t, l) for i, t, l in alts)
    probs = [math.exp(l) for _, _, l in alts]
    rest = rest_entry(sum(probs)) if alts else None
    entropy = -sum(p * math.log(p) for p in probs if p > 0) + (-rest.prob * rest.logprob if rest else 0.0)
    rank = next((r for r, (i, t, _) in enumerate(alts) if (tid >= 0 and i == tid) or t == token_text), len(alts))
    return TokenEvent(index=index, token_id=tid, text=text, token_text=token_text, logprob=lp, sampler_logprob=lp,
                      rank=rank, entropy=max(entropy, 0.0), top_model=top + ((rest,) if rest else ()),
                      top_sampler=())


@dataclass
class UpstreamChoice:
    """One choice of an upstream answer, read as it arrives."""

    events: list[TokenEvent] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    finish: str | None = None  # the upstream's finish_reason
    t_first: float | None = None
    t_last: float | None = None
    echo: EchoCut | None = None  # completions with echo: the prompt's part, cut off (engine.serve.proxy_echo)

    def feed(self, choice: dict[str, Any], whole: bool = False) -> list[TokenEvent]:
        """The events of one streamed chunk's choice (or, `whole`, of a whole answer's)."""
        if whole:
            message = choice.get("message")
            piece = message.get("content") if isinstance(message, dict) else choice.get("text")
        else:
            delta = choice.get("delta")
            piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        piece = piece if isinstance(piece, str) else ""
        logprobs = choice.get("logprobs")
        if self.echo is not None:
            piece, logprobs = self.echo.cut(piece, logprobs)
        if piece:  # an endless stream of empty deltas must not grow the record
            self.texts.append(piece)
        tokens = upstream_tokens(logprobs)
        if not tokens and piece and not whole:
            tokens = [(-1, piece, math.nan, [])]  # an upstream that sent no log-probs: the text alone
        new = []
        for k, (tid, token_text, lp, alts) in enumerate(tokens):
            # Streamed: the chunk's text goes with its last token; whole: each token carries its own text.
            text = token_text if whole else (piece if k == len(tokens) - 1 else "")
            new.append(upstream_event(len(self.events), tid, text, token_text, lp, alts))
            self.events.append(new[-1])
        if new:
            self.t_last = time.perf_counter()
            if self.t_first is None:
                self.t_first = self.t_last
        if isinstance(choice.get("finish_reason"), str):
            self.finish = choice["finish_reason"]
        return new

    def stats(self, t0: float, prompt_tokens: int, seed: int | None, ended: FinishReason | None = None,
              error: str | None = None) -> GenerationStats:
        if self.echo is not None and self.echo.cut_tokens:
            prompt_tokens = self.echo.cut_tokens  # this choice's own prompt (usage sums a list of prompts')
        finish: FinishReason = ended or ("length" if self.finish == "length" else
                                         "cancelled" if self.finish is None else "eos")
        return generation_stats(finish=finish, prompt_tokens=prompt_tokens, seed=seed if seed is not None else -1,
                                token_ids=tuple(e.token_id for e in self.events), text="".join(self.texts),
                                t0=t0, t_first=self.t_first, t_last=self.t_last, error=error)


def recorded_top(events: Any) -> int | None:
    """The most alternatives a recorded token has (the upstream's top-N); None when no token has a log-prob
    (an upstream that gave none, or an API that has none: Anthropic's; the record is then its text pieces)."""
    top: int | None = None
    for e in events:
        if not math.isnan(e.logprob):
            top = max(top or 0, sum(1 for p in e.top_model if not p.is_rest))
    return top
