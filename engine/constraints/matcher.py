"""One answer's constraint state: an llguidance matcher over the model's tokens.

A `ConstraintRun` is made per decode run (never kept on settings or on a
model): it holds the matcher, which advances with every accepted token, and
what the constraint cost so far (the log of the probability mass it kept at
each step). `state()` / `restore()` let the decode loop step back (banned
strings, step mode) by rolling the matcher back.

Two ways to know what is allowed:

- `VocabularyMask` (a local model): llguidance computes the mask over the
  whole vocabulary, one bit per token, into a reused buffer.
- `CandidateMask` (a server that reports only its top N): only those N are
  known, so each is checked on its own by walking its bytes through a
  byte-level matcher and rolling back. What lies outside the N is unknown.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import Any

import numpy as np

from engine.constraints.limits import on_deep_stack
from engine.constraints.spec import Constraint, ConstraintError
from engine.constraints.vocabulary import byte_tokenizer, ll_tokenizer


class ConstraintRun:
    """The constraint's state for one answer.

    Attributes:
        constraint: what the answer must match.
        note: what the stage should say about how the mask was made ("" for a full mask).
        failure: why the constraint cannot go on (a dead end, a token it does not allow), or None.
    """

    def __init__(self, constraint: Constraint, mask: "VocabularyMask | CandidateMask") -> None:
        self.constraint = constraint
        self._mask = mask
        self.note = mask.note
        self.failure: str | None = None
        # One per accepted token: the log mass kept, or what computes it when read (the grammar stage builds its
        # record after the token is chosen: engine.sampling.grammar.GrammarStage)
        self._log_kept: list[float | Callable[[], float]] = []
        self._pending: float | Callable[[], float] = 0.0  # this step's, until the token is accepted

    # --- the mask ---------------------------------------------------------------------

    def allowed(self, scores: np.ndarray) -> np.ndarray:
        """(V,) bool: which tokens the constraint allows next (`scores` tells the candidates' ids).

        None at all when the grammar engine has given up (then `failure` says why): llguidance's mask
        allows only the end of text then, which would end the answer as if it were complete.
        """
        allowed = self._mask.allowed(scores)
        self._check_engine()
        if self.failure is not None:
            allowed[:] = False
        return allowed

    def fast_forward(self) -> int | None:
        """The next token the grammar forces (llguidance's fast-forward), or None (ask the mask)."""
        if not self.constraint.fast_forward:
            return None
        forced = self._mask.forced()
        self._check_engine()
        return None if self.failure else forced

    def _check_engine(self, limits_only: bool = False) -> None:
        """The grammar engine gave up: say so in words, once. `limits_only`: only when one of its own limits
        stopped it (a token it refuses puts it in an error state too; that is a dead end, said by `accept`)."""
        if self.failure is None:
            why = self._mask.engine_error()
            if why and (not limits_only or is_engine_limit(why)):
                self.failure = engine_failure(why, len(self._log_kept), self.constraint.label)

    def record(self, log_kept: float | Callable[[], float]) -> None:
        """The log mass the mask kept at the step being picked, or a function that gives it (committed by
        `accept`)."""
        self._pending = log_kept

    def accept(self, token: int) -> None:
        """Advance past `token`; a token the constraint does not allow ends it with `failure` set."""
        if self.failure is not None:
            return
        why = self._mask.consume(int(token))
        if why:
            self._check_engine(limits_only=True)
            if self.failure is None:
                self.failure = (f"dead end: {why} (it was given as a branch or in step mode, or the stages after "
                                "the grammar removed every token it allows)")
            return
        self._log_kept.append(self._pending)
        self._pending = 0.0

    def fail(self, why: str) -> None:
        self.failure = why

    # --- stepping back ----------------------------------------------------------------

    def state(self) -> tuple[int, int]:
        return (self._mask.consumed(), len(self._log_kept))

    def restore(self, state: tuple[int, int]) -> None:
        consumed, steps = state
        self._mask.rollback(self._mask.consumed() - consumed)
        del self._log_kept[steps:]
        self.failure = None

    # --- the answer -------------------------------------------------------------------

    @property
    def log_mass_kept(self) -> float:
        """Sum over the answer's steps of log(mass kept): how far it is from what the model would have said."""
        return float(math.fsum(v() if callable(v) else v for v in self._log_kept))

    def is_accepting(self) -> bool:
        return self._mask.is_accepting()

    def finish_note(self, finish_reason: str) -> str:
        """What to tell the user about the constraint at the end of an answer."""
        if self.failure is not None:
            return self.failure
        if self.is_accepting():
            return "complete"
        if finish_reason == "length":
            return ("stopped at the length limit inside the grammar: the answer is not complete yet "
                    "(the grammar wants more text than the answer's length allows)")
        if finish_reason == "cancelled":
            return "cancelled inside the grammar: the answer is not complete"
        return f"ended ({finish_reason}) inside the grammar: the answer is not complete"


class VocabularyMask:
    """The mask over a local model's whole vocabulary (llguidance computes it)."""

    note = ""

    def __init__(self, matcher: Any, n_tokens: int) -> None:
        self._m = matcher
        self._n = n_tokens
        self._bits = np.full((1, (n_tokens + 31) // 32), -1, dtype=np.int32)  # reused every step
        self._consumed = 0

    def allowed(self, scores: np.ndarray) -> np.ndarray:
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(self._m, self._bits)
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")  # (32 * words,) 0/1
        v = scores.size
        if v <= self._n:
            return bits[:v].view(np.bool_)
        out = np.zeros(v, dtype=np.bool_)  # ids past the vocabulary (a padded head) are never allowed
        out[: self._n] = bits[: self._n].view(np.bool_)
        return out

    def forced(self) -> int | None:
        ff = self._m.compute_ff_tokens()
        return int(ff[0]) if ff else None

    def engine_error(self) -> str:
        return str(self._m.get_error()) if self._m.is_error() else ""

    def consume(self, token: int) -> str:
        if token < 0 or token >= self._n or not self._m.consume_token(token):
            return f"the constraint does not allow token {token} here"
        self._consumed += 1
        return ""

    def consumed(self) -> int:
        return self._consumed

    def rollback(self, n: int) -> None:
        if n > 0:
            self._m.rollback(n)
            self._consumed -= n

    def is_accepting(self) -> bool:
        return bool(self._m.is_accepting())


class CandidateMask:
    """The mask over a server's top N: each candidate's bytes walked through a byte-level matcher."""

    def __init__(self, matcher: Any, tok: Any, top_n: int) -> None:
        self._m = matcher
        self._tok = tok
        self._eos: Collection[int] = tok.eos_token_ids
        self._steps: list[int] = []  # bytes consumed per accepted token
        self.note = f"mask applied to the server's top {top_n} only: tokens outside them are unknown"

    def _bytes(self, token: int) -> bytes:
        return self._tok.token_bytes(token)

    def allowed(self, scores: np.ndarray) -> np.ndarray:
        out = np.zeros(scores.size, dtype=np.bool_)
        accepting = self._m.is_accepting()
        for found in np.flatnonzero(scores > -np.inf):
            t = int(found)
            if t in self._eos:
                out[t] = accepting
                continue
            raw = list(self._bytes(t))
            if not raw:
                continue
            n = self._m.try_consume_tokens(raw)
            if n:
                self._m.rollback(n)
            out[t] = n == len(raw)
        return out

    def forced(self) -> int | None:
        return None  # only the server's N tokens are known: no token can be spliced without them

    def engine_error(self) -> str:
        return str(self._m.get_error()) if self._m.is_error() else ""

    def consume(self, token: int) -> str:
        if token in self._eos:
            if not self._m.is_accepting():
                return "the end of the answer is not allowed here by the constraint"
            self._steps.append(0)
            return ""
        raw = list(self._bytes(token))
        n = self._m.try_consume_tokens(raw) if raw else 0
        if n != len(raw) or not raw:
            if n:
                self._m.rollback(n)
            return f"the constraint does not allow token {token} here"
        self._steps.append(n)
        return ""

    def consumed(self) -> int:
        return len(self._steps)

    def rollback(self, n: int) -> None:
        if n <= 0:
            return
        undo = sum(self._steps[-n:])
        del self._steps[-n:]
        if undo:
            self._m.rollback(undo)

    def is_accepting(self) -> bool:
        return bool(self._m.is_accepting())


def start_run(constraint: Constraint, tok: Any, n_vocab: int | None, reports_top_n: int = 0) -> ConstraintRun:
    """A fresh run of `constraint` for a model with tokenizer `tok` and `n_vocab` logits.

    Args:
        reports_top_n: the model reports only its top N per step (a server): check those N.

    Raises:
        ConstraintError: the grammar cannot work with this vocabulary, or the tokenizer
            cannot list its vocabulary (said in words).
    """
    from llguidance import LLMatcher

    from engine.capabilities import ByteVocabulary

    if reports_top_n:
        matcher = on_deep_stack(lambda: LLMatcher(byte_tokenizer(), constraint.grammar, log_level=0))
        mask: VocabularyMask | CandidateMask = CandidateMask(matcher, tok, reports_top_n)
    else:
        if not isinstance(tok, ByteVocabulary):
            raise ConstraintError("a constraint needs the model's vocabulary as bytes, and this model's tokenizer cannot list it")
        ll = ll_tokenizer(tok, n_vocab)
        # Built on a deep stack: llguidance parses the grammar again here, recursively (engine.constraints.limits).
        matcher = on_deep_stack(lambda: LLMatcher(ll, constraint.grammar, log_level=0))
        mask = VocabularyMask(matcher, ll.vocab_size)
    if matcher.is_error():
        raise ConstraintError(f"the {constraint.label} cannot be used with this model: "
                              f"{_first_line(matcher.get_error())}")
    return ConstraintRun(constraint, mask)


def _first_line(message: str) -> str:
    """llguidance's message without its parser dump (`<state>` ...) or backtrace."""
    head = str(message).split("<state>")[0].split("<backtrace>")[0].strip()
    return head.splitlines()[0].strip() if head else "no reason given"


_LIMITS = ("Too many items", "items; max is", "symbols.len()", "NoExtension")


def is_engine_limit(message: str) -> bool:
    """Whether llguidance stopped at a limit of its own (not at a token the grammar refuses)."""
    return _first_line(message).startswith(_LIMITS[3]) or any(k in _first_line(message) for k in _LIMITS[:3])


def engine_failure(message: str, tokens: int, label: str = "grammar") -> str:
    """Why the grammar engine gave up after `tokens` tokens of the answer, in words a user can act on."""
    first = _first_line(message)
    at = f"after {tokens} token{'s' if tokens != 1 else ''}"
    if first.startswith("NoExtension"):  # llguidance's stop reason: no byte can extend the text
        if tokens == 0:
            return (f"the {label} allows no answer at all: no text matches it (check that every rule can end "
                    "and that its character classes are not empty)")
        return f"dead end: the {label} allows nothing after this text ({at}): it cannot go on and cannot end here"
    if "Too many items" in first:
        return (f"the grammar forces a text longer than the grammar engine can look ahead ({at}): a rule that only "
                "calls itself, with no way to end (root ::= \"ab\" root), or a repeat of thousands (\"a\"{100000}) "
                f"does this; give it a way to end or make the forced part shorter (llguidance: {first})")
    if "items; max is" in first:
        return (f"the grammar has too many alternatives at one place for the grammar engine ({at}); write a long "
                f"list of alternatives as a choice list or a regular expression (llguidance: {first})")
    if "symbols.len()" in first:
        return f"the grammar is too big for the grammar engine ({at}); make it smaller (llguidance: {first})"
    return f"the grammar engine stopped ({at}): {first}"
