"""Big conversations for the window's responsiveness tests, and a meter of the event loop's longest stall.

The conversations are written through the state layer (`Library`, `Conversation`) into the test's
database, as a long chat, a loom run or an old import would have left them; the window then opens them.
`TickGaps` is the measure: a QTimer asks for a tick every 10 ms and the longest time between two ticks
is how long the window could not answer the user.
"""

from __future__ import annotations

import math
import time

from engine import TokenEvent
from PySide6.QtCore import QTimer

from app.state.conversation import Conversation
from app.state.conversation_list import Library
from app.state.database.store import Store


def token(index: int, token_id: int, text: str, logprob: float = -0.5, special: bool = False) -> TokenEvent:
    return TokenEvent(index=index, token_id=token_id, text="" if special else text, token_text=text, logprob=logprob,
                      sampler_logprob=logprob, rank=0, entropy=1.0, top_model=(), top_sampler=(), special=special)


def _answer(conv: Conversation, question, tokens: list[TokenEvent], finish: str = "length"):
    answer = conv.add_message(question, "assistant")
    conv.set_tokens(answer, tokens, "".join(t.text for t in tokens))
    conv.update_message(answer, finish_reason=finish)
    return answer


def _chat(store: Store, title: str) -> tuple[Conversation, object]:
    conv = Library(store).new()  # a second library on the window's database: the window does not follow it
    question = conv.add_message(None, "user", "Write something.")
    conv.set_title(title)
    return conv, question


def one_long_token(store: Store, chars: int) -> int:
    """An answer of one token `chars` long without a space (a hostile server or file)."""
    conv, question = _chat(store, "one long token")
    _answer(conv, question, [token(0, 7, "x" * chars)])
    conv.flush()
    return conv.id


def long_unbroken_answer(store: Store, chars: int, piece: int = 1000) -> int:
    """An answer of `chars` characters with nowhere to break a line, in tokens of `piece` characters."""
    conv, question = _chat(store, "unbroken answer")
    _answer(conv, question, [token(i, 100 + i % 50, "y" * piece) for i in range(chars // piece)])
    conv.flush()
    return conv.id


def many_answers(store: Store, n: int, length: int = 30) -> int:
    """One question with `n` answers of `length` tokens (loom runs repeated, or an old import)."""
    conv, question = _chat(store, "many answers")
    for a in range(n):
        tail = [token(i, 5 + i % 7, " and") for i in range(1, length)]
        _answer(conv, question, [token(0, 1000 + a, f" w{a}", -0.1 - a / n), *tail])
    conv.flush()
    return conv.id


def deep_tree(store: Store, depth: int) -> int:
    """`depth` answers where answer k follows answer k-1 for k tokens, then parts: a tree `depth` forks deep."""
    conv, question = _chat(store, "deep tree")
    for k in range(depth):
        shared = [token(i, 10, " a", -0.01) for i in range(k)]
        _answer(conv, question, [*shared, token(k, 20, " b", math.log(0.3)), token(k + 1, 21, " c")])
    conv.flush()
    return conv.id


def long_transcript(store: Store, turns: int) -> int:
    """A chat of `turns` questions and answers on one path."""
    conv, parent = _chat(store, "long transcript")
    for t in range(turns):
        parent = _answer(conv, parent, [token(0, 30, f"Answer {t}"), token(1, 31, " here.")], finish="eos")
        parent = conv.add_message(parent, "user", f"Question {t + 1}?")
    conv.flush()
    return conv.id


class TickGaps:
    """The longest time the event loop went without running a 10 ms timer (how long the window froze)."""

    def __init__(self, interval_ms: int = 10):
        self.longest = 0.0
        self._last = time.perf_counter()
        self._timer = QTimer()
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self._tick)

    def _tick(self) -> None:
        now = time.perf_counter()
        self.longest = max(self.longest, now - self._last)
        self._last = now

    def restart(self) -> float:
        """Start measuring afresh (what came before is someone else's work); returns the stall so far."""
        now = time.perf_counter()
        before, self.longest, self._last = max(self.longest, now - self._last), 0.0, now
        return before

    def __enter__(self) -> "TickGaps":
        self._last = time.perf_counter()
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._tick()
        self._timer.stop()


def loom_file_doc(answers: int, length: int, turns: int) -> dict:
    """A loom file (the export's format) with `turns` earlier exchanges and `answers` answers of `length` tokens."""
    def tok(i: int, token_id: int, text: str) -> dict:
        return {"index": i, "token_id": token_id, "text": text, "token_text": text, "logprob": -0.5,
                "sampler_logprob": -0.5, "rank": 0, "entropy": 1.0, "forced": False, "special": False,
                "alternatives": {"m": [], "s": []}}

    messages = []
    for t in range(turns):
        messages += [{"role": "user", "content": f"Question {t}?"}, {"role": "assistant", "content": f"Answer {t}."}]
    messages.append({"role": "user", "content": "And now?"})
    return {
        "format": "logitlab-loom", "version": 1, "title": "big loom", "messages": messages,
        "answers": [{"branch_index": None, "finish_reason": "length", "request": None, "model": None, "stats": None,
                     "tokens": [tok(0, 1000 + a, f" w{a}")] + [tok(i, 5 + i % 7, " and") for i in range(1, length)]}
                    for a in range(answers)],
    }
