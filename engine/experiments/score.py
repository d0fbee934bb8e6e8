"""Teacher-forced scoring: how surprising is a given text to the model, token by token.

The text is read in one teacher-forced pass: the backend's position runner
(engine.capabilities.PositionRunners) runs it in chunks of positions (256 at a 49k
vocabulary, fewer for larger ones, so the logits held at once stay bounded)
on a KV cache carried from chunk to chunk, keeping every position's logits.
A text of n tokens costs ceil(n / chunk) forwards, the Backend protocol is
not widened (a position runner is a capability each backend's package implements), and the
backend's own KV cache, holding the conversation, is left as it was.

Backends without such a runner (remote, mock) fall back to
`score_step_by_step`: the context is prefilled with prefix reuse, then every
scored position costs one single-token forward through the 5-method protocol.
docs/experiments.md has the measured difference (`python bench/score.py`).

Per position the numbers come from the same `SamplerChain` code that reports
them for generated tokens (greedy, with the text's token forced), so scoring a
generated answer reproduces its recorded log-probs, ranks and entropies: exactly
on the step-by-step path, within float32 rounding (~1e-5) on the batched one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.backend import PREFILL_CHUNK, Backend, prefill
from engine.backends.chunks import positions_per_chunk
from engine.capabilities import PositionRunner, PositionRunners
from engine.errors import ContextLengthError
from engine.events import TokenEvent, TokenProb
from engine.sampling import SamplerChain, SamplerSettings
from engine.tokenizer import TokenizerLike

LN2 = math.log(2)


@dataclass(frozen=True, slots=True)
class ScoredToken:
    """One position of a scored text: the token that is there and what the model expected.

    Attributes:
        index: position in `ScoreResult.token_ids`.
        token_id: the token at that position.
        token_text: its surface text.
        logprob: log p(token | everything before it), natural log.
        rank: 0 = the model's most likely token at this position.
        entropy: entropy (nats) of the model's distribution here.
        top: the model's top alternatives here, most likely first.
    """

    index: int
    token_id: int
    token_text: str
    logprob: float
    rank: int
    entropy: float
    top: tuple[TokenProb, ...]

    @property
    def surprisal_bits(self) -> float:
        return -self.logprob / LN2

    def as_event(self, index: int | None = None) -> TokenEvent:
        """The position as a `TokenEvent` (the views draw and inspect those); no sampler was involved."""
        return TokenEvent(
            index=self.index if index is None else index,
            token_id=self.token_id,
            text=self.token_text,
            token_text=self.token_text,
            logprob=self.logprob,
            sampler_logprob=self.logprob,
            rank=self.rank,
            entropy=self.entropy,
            top_model=self.top,
            top_sampler=(),
        )


@dataclass(frozen=True)
class ScoreResult:
    """A scored token sequence.

    `token_ids[:context]` were given as context only (at least the first
    token: nothing predicts it); `tokens` are the positions after them.
    """

    token_ids: tuple[int, ...]
    context: int
    tokens: tuple[ScoredToken, ...]
    reused_tokens: int  # context tokens whose KV cache was reused (step by step only; else 0)
    forward_calls: int  # model calls: one per chunk of positions, or one per position step by step

    @property
    def total_logprob(self) -> float:
        return float(sum(t.logprob for t in self.tokens))

    @property
    def mean_surprisal_bits(self) -> float:
        return -self.total_logprob / len(self.tokens) / LN2 if self.tokens else 0.0

    @property
    def perplexity(self) -> float:
        """exp(mean negative log-likelihood per scored token); 1.0 when nothing was scored."""
        return math.exp(-self.total_logprob / len(self.tokens)) if self.tokens else 1.0

    @property
    def unknown_tokens(self) -> int:
        """Scored tokens without a log-prob: a server reports only its top N, and a token outside them reads -inf."""
        return sum(1 for t in self.tokens if t.logprob == -math.inf)

    def known_perplexity(self) -> float:
        """The perplexity over the tokens whose log-prob is known (all of them on a local model)."""
        known = [t.logprob for t in self.tokens if t.logprob != -math.inf]
        return math.exp(-sum(known) / len(known)) if known else math.nan

    def summary(self, reports_top_n: int = 0) -> str:
        """One line for a person: tokens, perplexity and surprisal, and, when it is infinite, why.

        `reports_top_n`: the model reports only its top N log-probs per step (`ModelInfo.reports_top_n`).
        """
        n = len(self.tokens)
        unknown = self.unknown_tokens
        if not unknown:
            return (f"{n} tokens scored; perplexity {self.perplexity:.2f}; "
                    f"mean surprisal {self.mean_surprisal_bits:.2f} bits/token")
        where = (f"outside the server's top {reports_top_n} log-probs" if reports_top_n
                 else "outside what the model reports")
        rest = f"; over the other {n - unknown}: perplexity {self.known_perplexity():.2f}" if unknown < n else ""
        return (f"{n} tokens scored; perplexity inf: {unknown} of them fell {where}, so their probability "
                f"is unknown (counted as 0){rest}")

    def events(self) -> list[TokenEvent]:
        """The scored positions as `TokenEvent`s numbered from 0 (for token views)."""
        return [t.as_event(i) for i, t in enumerate(self.tokens)]


def text_ids(tokenizer: TokenizerLike, text: str) -> tuple[list[int], int]:
    """Token ids for scoring `text` and how many leading ids are context.

    The tokenizer's own convention decides: when it puts a BOS token before a
    text (Llama, Gemma), the text follows it and its first token is scored
    too; when it adds nothing (SmolLM2, GPT-2), the first token is context
    only, since nothing predicts it. No other token is invented as a start:
    a chat model's `<|im_start|>` would make the model expect a role name.
    """
    if not text:
        raise ValueError("the text to score is empty")
    plain = tokenizer.encode(text, add_special_tokens=False)
    full = tokenizer.encode(text, add_special_tokens=True)
    extra = len(full) - len(plain)
    if extra > 0 and full[extra:] == plain:  # special tokens were put in front only
        return list(full), extra
    return list(plain), 1


def score_ids(
    backend: Backend,
    token_ids: Sequence[int],
    *,
    context: int = 1,
    top_n: int = 10,
    cancelled: Callable[[], bool] = lambda: False,
) -> ScoreResult:
    """Score `token_ids[context:]` given everything before each position.

    A backend with a position runner (engine.capabilities.PositionRunners:
    torch, MLX, llama.cpp) runs the sequence teacher-forced, every position's
    logits at once, in chunks (engine.backends.chunks); the backend's own KV
    cache is left as it was. Others (a server, the mock) go step by step
    (`score_step_by_step`).
    Call it on the backend's worker thread (`Engine.score` / `Engine.call`).

    Args:
        backend: the model.
        token_ids: the whole sequence, context first.
        context: how many leading ids are context only (>= 1).
        top_n: alternatives reported per position.
        cancelled: checked before every forward; a cancelled run returns the
            positions scored so far.

    Raises:
        ValueError: fewer than two ids, a context outside [1, len), or an id outside the vocabulary.
        ContextLengthError: the sequence is longer than the model's context.
    """
    ids = _checked_ids(backend, token_ids, context)
    if not isinstance(backend, PositionRunners):
        return score_step_by_step(backend, ids, context=context, top_n=top_n, cancelled=cancelled)
    runner = backend.position_runner(len(ids))
    try:
        return _score_all_positions(backend, runner, ids, context, top_n, cancelled)
    finally:
        runner.close()  # llama.cpp: its scoring context


def check_token_count(n_tokens: int, limit: int, *, at_least: str = "") -> None:
    """The one length check of a text to score, before and after the model loads (engine.cli.experiments):
    ValueError under two tokens, ContextLengthError past `limit` (the model's context; 0: unknown).

    `at_least`: `n_tokens` is a lower bound counted from the text's start, described so (a huge text is not
    tokenized whole just to be refused: engine.cli.token_count)."""
    if n_tokens < 2:
        raise ValueError(f"scoring needs at least two tokens (one to predict from), got {n_tokens}")
    if limit and n_tokens > limit:
        has, excess = ((at_least, f"at least {n_tokens - limit:,}") if at_least
                       else (f"{n_tokens} tokens", f"{n_tokens - limit:,}"))
        raise ContextLengthError(f"the text has {has} but the model's context length is {limit} "
                                 f"({excess} too many)")


def _checked_ids(backend: Backend, token_ids: Sequence[int], context: int) -> list[int]:
    ids = [int(t) for t in token_ids]
    check_token_count(len(ids), backend.info.context_length)
    if not 1 <= context < len(ids):
        raise ValueError(f"context must be in [1, {len(ids)}), got {context}")
    vocab = backend.info.vocab_size
    bad = [t for t in ids if t < 0 or (vocab and t >= vocab)]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the model's vocabulary (0..{vocab - 1})")
    return ids


class _Scorer:
    """Turns the logits at position pos - 1 into the `ScoredToken` for position pos."""

    def __init__(self, tokenizer: TokenizerLike, ids: list[int], top_n: int):
        self.tok = tokenizer
        self.ids = ids
        self.top_n = top_n
        # Greedy with the text's token forced: the model-side numbers, computed as for generated tokens.
        self.chain = SamplerChain(SamplerSettings(temperature=0.0, seed=0), tokenizer)  # names the alternatives
        self.history = np.asarray(ids, dtype=np.int64)

    def __call__(self, pos: int, logits: np.ndarray) -> ScoredToken:
        tok, token_id = self.tok, self.ids[pos]
        pick = self.chain.pick(logits, self.history[:pos], top_n=self.top_n, force_token=token_id)
        return ScoredToken(
            index=pos,
            token_id=token_id,
            token_text=tok.token_text(token_id),
            logprob=pick.logprob,
            rank=pick.rank,
            entropy=pick.entropy,
            top=pick.top_model,
        )


def _score_all_positions(
    backend: Backend, runner: PositionRunner, ids: list[int], context: int, top_n: int, cancelled: Callable[[], bool]
) -> ScoreResult:
    """One teacher-forced pass: the runner yields the logits of positions context-1 .. T-2 chunk by chunk."""
    scorer = _Scorer(backend.tokenizer, ids, top_n)
    chunk = positions_per_chunk(backend.info.vocab_size)
    # The last token predicts nothing, so it is not run; row j of the first chunk predicts ids[context + j].
    chunks = runner.position_logits(ids[:-1], first=context - 1, chunk=chunk)
    scored: list[ScoredToken] = []
    try:
        while not cancelled():
            block = next(chunks, None)  # (n, V): one forward
            if block is None:
                break
            for row in block:
                scored.append(scorer(context + len(scored), row))
    finally:
        chunks.close()
    return ScoreResult(tuple(ids), context, tuple(scored), 0, runner.forward_calls)


def score_step_by_step(
    backend: Backend,
    token_ids: Sequence[int],
    *,
    context: int = 1,
    top_n: int = 10,
    cancelled: Callable[[], bool] = lambda: False,
) -> ScoreResult:
    """`score_ids` through the 5-method protocol alone: one single-token forward per position.

    The fallback for backends without an all-positions runner (remote, mock).
    The context is prefilled with prefix reuse and the backend's KV cache is
    left holding the ids.
    """
    ids = _checked_ids(backend, token_ids, context)
    scorer = _Scorer(backend.tokenizer, ids, top_n)
    logits, reused = prefill(backend, ids[:context], cancelled=cancelled)
    forwards = math.ceil((context - reused) / PREFILL_CHUNK) if logits is not None else 0
    scored: list[ScoredToken] = []
    for pos in range(context, len(ids)):
        if logits is None:
            break
        scored.append(scorer(pos, logits))
        if pos + 1 < len(ids):
            if cancelled():
                break
            logits = backend.forward([ids[pos]])
            forwards += 1
    return ScoreResult(tuple(ids), context, tuple(scored), reused, forwards)


def score(
    backend: Backend,
    text_or_ids: str | Sequence[int],
    *,
    context: int | None = None,
    top_n: int = 10,
    cancelled: Callable[[], bool] = lambda: False,
) -> ScoreResult:
    """Score a text (tokenized, after BOS when the model has one) or a list of token ids."""
    if isinstance(text_or_ids, str):
        ids, ctx = text_ids(backend.tokenizer, text_or_ids)
    else:
        ids, ctx = list(text_or_ids), 1
    return score_ids(backend, ids, context=ctx if context is None else context, top_n=top_n, cancelled=cancelled)
