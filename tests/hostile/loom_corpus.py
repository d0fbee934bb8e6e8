"""Hostile loom files, made here: a good export, then each way a file can lie about what it is.

`good_loom()` is a real export (app/state/loom_tree.export_tree) of a small
tree: a question, two answers sharing their first token, token records with
alternatives and a sampler stage. `CORPUS` maps a case name to a function
that returns a hostile variant, as bytes (most are the good document with one
value changed; some are not JSON at all). Every case must be refused by the
import with one line and leave the database as it was.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from typing import Any

from engine import StageSnapshot, TokenEvent, TokenProb

from app.state.conversation_list import Library
from app.state.loom_tree import export_tree
from app.state.database.store import Store

QUESTION = "Name a colour."
IDS = {"Blue": 100, ".": 101, "-green": 102}  # both answers start with "Blue": the tree forks after it


def _event(i: int, token_id: int, text: str, lp: float) -> TokenEvent:
    alts = (TokenProb(token_id, text, lp), TokenProb(token_id + 1, text + "?", lp - 1.5))
    stage = StageSnapshot("top_k", 2, 0.9, 0.7, alts)
    return TokenEvent(index=i, token_id=token_id, text=text, token_text=text, logprob=lp, sampler_logprob=lp / 2,
                      rank=0, entropy=1.25, top_model=alts, top_sampler=alts, stages=(stage,))


def good_loom() -> dict[str, Any]:
    """A real export: the prompt and two answers that share their first token."""
    library = Library(Store(":memory:"))
    conv = library.new(system_prompt="Be brief.")
    user = conv.add_message(None, "user", QUESTION)
    model = {"name": "TinyModel", "spec": "tiny", "architecture": "llama", "parameters": 1000, "dtype": "f32",
             "context_length": 512, "backend": "mock", "device": "cpu", "revision": None}
    for words in (("Blue", ".", ""), ("Blue", "-green", ".")):
        answer = conv.add_message(user, "assistant", request={"sampler": {"temperature": 0.7}, "max_new_tokens": 8},
                                  model=model)
        events = [_event(i, IDS[w], w, -0.1 * (i + 1)) for i, w in enumerate(words) if w]
        conv.set_tokens(answer, events, "".join(e.text for e in events))
        conv.update_message(answer, finish_reason="eos",
                            stats={"seed": 7, "generated_tokens": len(events), "decode_tokens_per_s": 12.5,
                                   "time_to_first_token_s": 0.1, "total_s": 0.3, "prompt_tokens": 5,
                                   "reused_tokens": 0, "peak_memory_bytes": 1, "finish_reason": "eos"})
    conv.flush()
    # Through JSON, as a file holds it.
    return json.loads(json.dumps(export_tree(conv, user), allow_nan=False))


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=True).encode("utf-8")  # allow_nan: some cases hold NaN on purpose


def _variant(change: Callable[[dict[str, Any]], Any]) -> Callable[[], bytes]:
    def make() -> bytes:
        doc = copy.deepcopy(good_loom())
        change(doc)
        return _dumps(doc)

    return make


def _set(path: tuple, value: Any) -> Callable[[], bytes]:
    def change(doc: dict[str, Any]) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return _variant(change)


def _deep_list(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def _deep_text(path: tuple, depth: int) -> Callable[[], bytes]:
    """`path` set to lists nested `depth` deep, written as text (json.dumps itself refuses such depth)."""
    marker = "__deep__"
    inner = _set(path, marker)
    return lambda: inner().replace(f'"{marker}"'.encode(), b"[" * depth + b"]" * depth)


def _raw(text: bytes) -> Callable[[], bytes]:
    return lambda: text


A0 = ("answers", 0)
T0 = ("answers", 0, "tokens", 0)
CORPUS: dict[str, Callable[[], bytes]] = {
    # The six that poisoned the database (issue 36 item 1) and their kin.
    "request is a string": _set((*A0, "request"), "temperature=0.7"),
    "request is a list": _set((*A0, "request"), [1, 2, 3]),
    "model is a string": _set((*A0, "model"), "TinyModel"),
    "model is a list": _set((*A0, "model"), ["TinyModel"]),
    "stats are a string": _set((*A0, "stats"), "fast"),
    "stats hold text for a number": _set((*A0, "stats", "decode_tokens_per_s"), "fast"),
    "stats hold a list for a count": _set((*A0, "stats", "generated_tokens"), [3]),
    "stats hold NaN": _set((*A0, "stats", "total_s"), math.nan),
    "branch index is a string": _set((*A0, "branch_index"), "1"),
    "branch index is a fraction": _set((*A0, "branch_index"), 1.5),
    "branch index is negative": _set((*A0, "branch_index"), -3),
    "branch index is true": _set((*A0, "branch_index"), True),
    "branch index past the tokens": _set((*A0, "branch_index"), 99),
    # What escaped the Import button with no message.
    "entropy is NaN": _set((*T0, "entropy"), math.nan),
    "entropy is Infinity": _set((*T0, "entropy"), math.inf),
    "entropy is a string": _set((*T0, "entropy"), "high"),
    "token id is 2**63": _set((*T0, "token_id"), 2**63),
    "token id is 2**64": _set((*T0, "token_id"), 2**64),
    "token id is 2**31": _set((*T0, "token_id"), 2**31),
    "token id is negative": _set((*T0, "token_id"), -7),
    "token id is a fraction": _set((*T0, "token_id"), 12.5),
    "token id is a string": _set((*T0, "token_id"), "12"),
    "token id is true": _set((*T0, "token_id"), True),
    "deep nesting (parser)": _deep_text(("tree",), 100_000),
    "deep nesting (request)": _set((*A0, "request", "sampler"), {"x": _deep_list(200)}),
    "finish reason is a number": _set((*A0, "finish_reason"), 3),
    "finish reason is unknown": _set((*A0, "finish_reason"), "exploded"),
    # Tokens.
    "logprob is NaN": _set((*T0, "logprob"), math.nan),
    "logprob is positive": _set((*T0, "logprob"), 5.0),
    "logprob is a string": _set((*T0, "logprob"), "-0.1"),
    "rank is negative": _set((*T0, "rank"), -1),
    "forced is a string": _set((*T0, "forced"), "yes"),
    "text is a number": _set((*T0, "text"), 42),
    "token text of 5 MB": _set((*T0, "text"), "x" * 5_000_000),
    "token is a list": _set(T0, [1, 2]),
    "tokens are a mapping": _set((*A0, "tokens"), {"0": {}}),
    "alternatives are a list": _set((*T0, "alternatives"), [[1, "a", -1.0]]),
    "alternative id is 2**40": _set((*T0, "alternatives", "m", 0, 0), 2**40),
    "alternative log-prob is NaN": _set((*T0, "alternatives", "m", 0, 2), math.nan),
    "alternative row is short": _set((*T0, "alternatives", "m", 0), [1]),
    "stage mass is NaN": _set((*T0, "alternatives", "st", 0, 2), math.nan),
    # The answer's other fields.
    "model name is a list": _set((*A0, "model", "name"), ["TinyModel"]),
    "request reasoning is a list": _set((*A0, "request", "reasoning"), ["<think>"]),
    "request stop is a string": _set((*A0, "request", "stop"), "\n"),
    "request holds NaN": _set((*A0, "request", "sampler", "temperature"), math.nan),
    "seed is a string": _set((*A0, "seed"), "seven"),
    "answer is a string": _set(A0, "Blue."),
    # The document.
    "format is missing": _variant(lambda d: d.pop("format")),
    "version is a string": _set(("version",), "1"),
    "version is from the future": _set(("version",), 99),
    "title is a list": _set(("title",), ["a"]),
    "messages are a mapping": _set(("messages",), {"role": "user"}),
    "message content is a number": _set(("messages", -1, "content"), 7),
    "message role is unknown": _set(("messages", -1, "role"), "tool"),
    "prompt ends with an answer": _variant(lambda d: d["messages"].append({"role": "assistant", "content": "x"})),
    "no answers": _set(("answers",), []),
    "answers are a string": _set(("answers",), "none"),
    "too many answers": _variant(lambda d: d.__setitem__("answers", [copy.deepcopy(d["answers"][1])] * 1001)),
    "document is a list": _raw(b"[1, 2, 3]"),
    "not JSON": _raw(b'{"format": "logitlab-loom", "version": 1, '),
    "not UTF-8": _raw(b'{"format": "logitlab-loom", "title": "\xff\xfe"}'),
    "empty file": _raw(b""),
}
