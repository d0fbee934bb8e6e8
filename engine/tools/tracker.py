"""Where each streamed token stands in a call, and when the call is complete: `CallTracker`.

Fed the answer's text as it is decoded (one token's text at a time), it says for the token: `None` (text
outside a call), "opener" (the call's opening: `<tool_call>`, `{"name": `), "name" (the tool's name),
"arguments" (the arguments' own braces and commas), the JSON path of the argument the token belongs to
(`arguments.city`, `arguments.stops[1].lat`) or "closer" (`}</tool_call>`). An argument's key counts to the
object holding it, its colon and value to the argument. A token's position is that of its first character
that is not white space. `complete` turns True when a whole call has been read (the decode loop ends the
answer there). A small character-level JSON scanner, no second pass over the vocabulary.

Per character (`places`) it also says which part of the call the character is (`Part`): the server's stream
cuts a call's name and its arguments' exact text from these, since one token can straddle the name, the
call's own punctuation and the arguments; `name` is the tool's name once its string has closed. A branch
inside a call follows the kept text first (`follow`), so the tokens after it continue the same call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from engine.tools.formats import ARGUMENTS_KEY

Path = tuple[str | int, ...]
# Which part of a call a character is: "text" (outside any call), "opener" (the opener and the call's punctuation
# before the name), "name" (the name member's colon and value), "call" (the call's punctuation after the name, the
# arguments' key and colon), "arguments" (the arguments value's own text), "closer".
Part = str
Place = tuple[str | None, Part]  # (the character's position label, its part)
_OPENERS = {"builtin": "<tool_call>", "hermes": "<tool_call>", "llama3": "<|python_tag|>", "mistral": "[TOOL_CALLS]"}
_CLOSERS = {"builtin": "</tool_call>", "hermes": "</tool_call>"}


@dataclass(slots=True)
class _Frame:
    kind: str  # "obj" or "arr"
    path: Path
    key: str | int | None = None  # the member being read (an array's index)
    state: str = "key"  # obj: key / colon / value / after; arr: value / after


@dataclass(slots=True)
class _Json:
    """A JSON value read one character at a time; each character's path."""

    stack: list[_Frame] = field(default_factory=list)
    in_string: bool = False
    is_key: bool = False
    escape: bool = False
    key_buf: list[str] = field(default_factory=list)
    done: bool = False
    broken: bool = False

    def _member(self) -> Path:
        f = self.stack[-1]
        return f.path + (f.key,) if f.key is not None and f.state in ("colon", "value", "after") else f.path

    def feed(self, ch: str) -> Path:
        if not self.stack:  # the first character (after white space) opens the value
            if ch in " \t\r\n":
                return ()
            if ch in "{[":
                self.stack.append(_Frame("obj" if ch == "{" else "arr", (), 0 if ch == "[" else None,
                                         "key" if ch == "{" else "value"))
            else:
                self.broken = True
            return ()
        f = self.stack[-1]
        if self.in_string:
            if self.escape:
                self.escape = False
            elif ch == "\\":
                self.escape = True
            elif ch == '"':
                self.in_string = False
                if self.is_key:
                    f.key, f.state = "".join(self.key_buf), "colon"
                    return f.path
                f.state = "after"
                return f.path + (f.key,) if f.key is not None else f.path
            if self.is_key:
                self.key_buf.append(ch)
                return f.path
            return self._member()
        if ch in " \t\r\n":
            return self._member()
        if ch == '"':
            self.in_string = True
            self.is_key = f.kind == "obj" and f.state == "key"
            self.key_buf.clear()
            if self.is_key:
                return f.path
            f.state = "value"
            return self._member()
        if ch == ":":
            f.state = "value"
            return self._member()
        if ch == ",":
            if f.kind == "obj":
                f.key, f.state = None, "key"
            else:
                f.key, f.state = int(f.key or 0) + 1, "value"
            return f.path
        if ch in "}]":
            self.stack.pop()
            if self.stack:
                self.stack[-1].state = "after"
            else:
                self.done = True
            return f.path
        if ch in "{[":
            path = self._member()
            f.state = "after"
            self.stack.append(_Frame("obj" if ch == "{" else "arr", path, 0 if ch == "[" else None,
                                     "key" if ch == "{" else "value"))
            return path
        f.state = "value"  # a number, true, false, null
        return self._member()


class CallTracker:
    """The position of each token of an answer in `fmt`'s call, and whether a call has completed."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self.args_key = ARGUMENTS_KEY[fmt]
        self.opener = _OPENERS[fmt]
        self.closer = _CLOSERS.get(fmt, "")
        self.state = "before"  # before / opener / json / closer / done
        self.matched = 0  # characters of the opener or closer matched so far
        self.json = _Json()
        self.named = False  # the tool's name has been read (the call's punctuation after it is "arguments")
        self.name: str | None = None  # the tool's name, once its string has closed
        self._name_raw: list[str] = []  # the name's JSON string as written, quotes included
        self.call_depth = 2 if fmt == "mistral" else 1  # the call object's depth in the JSON (Mistral's is in a list)
        self.complete = False
        self.seen_text = False  # something other than white space came before any call

    def feed(self, text: str) -> str | None:
        """Take one token's text; its position (None: not in a call; the current one for empty text)."""
        labels = [label for label, _ in self.places(text)]
        significant = [lab for ch, lab in zip(text, labels) if not ch.isspace()]
        if significant:
            return significant[0]
        return labels[0] if labels else self.position()

    def places(self, text: str) -> list[Place]:
        """Take `text`; each character's position label and part."""
        return [self._char(ch) for ch in text]

    def follow(self, text: str) -> None:
        """Take text already written (an answer's kept part before a branch): no positions wanted."""
        for ch in text:
            self._char(ch)

    def position(self) -> str | None:
        """Where the next character would stand (for a token whose text is still held back)."""
        return {"before": None, "opener": "opener", "closer": "closer", "done": None}.get(self.state, "arguments")

    def _char(self, ch: str) -> Place:
        if self.state == "done":
            return None, "text"
        if self.state in ("before", "opener"):
            return self._before(ch)
        if self.state == "json":
            depth, strung = len(self.json.stack), self.json.in_string
            path = self.json.feed(ch)
            inside = (max(depth, len(self.json.stack)) > self.call_depth or strung or self.json.in_string
                      or not (ch.isspace() or ch == ":"))  # in a member's value, not the white space or colon before it
            place = self._label(path, ch, inside)
            if self.json.broken:
                self._reset()
            elif self.json.done:
                if self.closer:
                    self.state, self.matched = "closer", 0
                else:
                    self.state, self.complete = "done", True
            return place
        # the closer
        if ch.isspace() and self.matched == 0:
            return "closer", "closer"
        if ch == self.closer[self.matched]:
            self.matched += 1
            if self.matched == len(self.closer):
                self.state, self.complete = "done", True
            return "closer", "closer"
        self._reset()
        return None, "text"

    def _before(self, ch: str) -> Place:
        if self.opener and ch == self.opener[self.matched]:
            self.matched += 1
            self.state = "opener"
            if self.matched == len(self.opener):
                self._start_json()
            return "opener", "opener"
        if self.fmt == "llama3" and ch == "{" and not self.seen_text:
            self._start_json()  # Llama's call is a bare JSON object at the start of the answer
            return self._char(ch)
        self.matched, self.state = 0, "before"
        if not ch.isspace():
            self.seen_text = True
        return None, "text"

    def _start_json(self) -> None:
        self.state, self.matched, self.json, self.named = "json", 0, _Json(), False
        self.name, self._name_raw = None, []

    def _reset(self) -> None:
        """What looked like a call was not one: text again, looking for the next opener."""
        self.state, self.matched, self.seen_text = "before", 0, True

    def _label(self, path: Path, ch: str, inside: bool) -> Place:
        """The character's label and part from its JSON path; `inside`: it belongs to a member's value."""
        if self.fmt == "mistral":  # the calls are a list: its brackets open and close, each call is one item
            if not path:
                return ("opener", "opener") if ch == "[" and not self.json.done else ("closer", "closer")
            path = path[1:]
        if not path:  # the call object's own braces, keys and commas
            depth = len(self.json.stack) - (1 if self.fmt == "mistral" else 0)
            if ch == "}" and depth == 0:
                return "closer", "closer"
            return ("arguments", "call") if self.named else ("opener", "opener")
        head = path[0]
        if head == "name":
            self.named = True
            if inside and self.name is None:
                self._name_char(ch)
            return "name", "name"
        if head in (self.args_key, "arguments", "parameters"):
            label = "arguments" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path[1:])
            return label, "arguments" if inside else "call"
        return str(head), "call"

    def _name_char(self, ch: str) -> None:
        """One character of the name's value; the name is known when its string closes."""
        self._name_raw.append(ch)
        if len(self._name_raw) > 1 and not self.json.in_string:
            try:
                name = json.loads("".join(self._name_raw))
            except ValueError:
                name = None
            self.name = name if isinstance(name, str) else None
