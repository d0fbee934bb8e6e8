"""How big a constraint may be, checked before llguidance sees it, and a deep stack to build it on.

llguidance parses grammars recursively in native code: a Lark chain of about
2,600 rules, or a JSON schema whose `$ref`s chain some 1,000 deep, overflows
an 8 MiB stack and kills the process (SIGSEGV, nothing to catch); a thread
with a 2 MiB stack dies at about 700. Converting GBNF to Lark takes time
quadratic in a chain's length (1,000 rules: 1 s; 3,000: 12 s), a 100 KB
sequence makes every step's mask slow, and a choice list past 2,000 options
fails at generation time ("row has N items; max is 2000").

So: the size of the text, the number of rules, `$ref`s and choices, and the
nesting of JSON are checked first, each against a limit well below where it
breaks, and said in words ("the grammar has 3,000 rules; the limit is
1,000"). What is built is built on a thread of its own with a 128 MiB stack
(`on_deep_stack`), so the limits keep a wide margin whatever stack the
caller has (measured on llguidance 1.9; tests/hostile/test_grammar_limits.py).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from engine.json_depth import json_depth

MAX_CHARS = 100_000  # any kind's text (a 200 KB sequence takes a second per token to mask)
MAX_RULES = 1_000  # GBNF / Lark rule definitions (a 2,600-rule chain overflows an 8 MiB stack)
MAX_JSON_DEPTH = 128  # nested {...} / [...] in a JSON schema (llguidance itself gives up near 100, in words)
MAX_JSON_REFS = 1_000  # "$ref"s in a JSON schema (a chain of 1,000 overflows an 8 MiB stack)
MAX_CHOICES = 10_000  # options in a choice list (built as one regular expression: 10,000 in 0.2 s)
DEEP_STACK_BYTES = 128 << 20  # address space only: a thread's stack pages are used as it grows

_GBNF_RULE = re.compile(r"::=")
_LARK_RULE = re.compile(r"(?m)^[ \t]*[?!]?[A-Za-z_][\w.]*[ \t]*(?:\{[^}\n]*\})?[ \t]*(?:\.[ \t]*-?\d+)?[ \t]*:(?!:)")
_REF = re.compile(r'"\$ref"\s*:')

T = TypeVar("T")


class ConstraintTooBig(ValueError):
    """A constraint past one of the limits; the message says which, and the limit."""


def check_size(kind: str, text: str, label: str) -> None:
    """Refuse `text` of `kind` (its `label` in words) when it is past a limit, before llguidance sees it.

    Raises:
        ConstraintTooBig: naming what is too big, how big it is, and the limit.
    """
    if kind == "json":  # any JSON: the text is not read
        return
    too_long = ConstraintTooBig(f"the {label} has {len(text):,} characters; the limit is {MAX_CHARS:,}")
    if len(text) > 10 * MAX_CHARS:  # not even worth counting what it holds
        raise too_long
    if kind in ("gbnf", "lark"):
        rules = len(_GBNF_RULE.findall(text)) + len(_LARK_RULE.findall(text))
        if rules > MAX_RULES:
            raise ConstraintTooBig(f"the {label} has {rules:,} rules; the limit is {MAX_RULES:,}")
    elif kind in ("json_schema", "choice"):
        depth = json_depth(text)
        if depth > MAX_JSON_DEPTH:
            raise ConstraintTooBig(f"the {label} is nested {depth:,} levels deep; the limit is {MAX_JSON_DEPTH}")
        refs = len(_REF.findall(text)) if kind == "json_schema" else 0
        if refs > MAX_JSON_REFS:
            raise ConstraintTooBig(f"the {label} has {refs:,} $refs; the limit is {MAX_JSON_REFS:,}")
    if len(text) > MAX_CHARS:
        raise too_long


def check_choice_count(n: int) -> None:
    if n > MAX_CHOICES:
        raise ConstraintTooBig(f"the choice list has {n:,} options; the limit is {MAX_CHOICES:,}")




_stack_lock = threading.Lock()


def on_deep_stack(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on a new thread with a `DEEP_STACK_BYTES` stack; its result, or its exception re-raised.

    llguidance's recursive descent needs far more stack than the limits above need at 8 MiB, but the
    caller may be a worker thread with 2 MiB (or the window's). A fresh thread costs ~0.1 ms.
    """
    out: list[Any] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn(*args))
        except BaseException as e:  # re-raised on the caller's thread
            err.append(e)

    with _stack_lock:  # the size applies to threads started while it is set: only this one
        previous = threading.stack_size()
        try:
            threading.stack_size(DEEP_STACK_BYTES)
        except (ValueError, RuntimeError):  # a platform that cannot: the caller's stack it is
            return fn(*args)
        try:
            thread = threading.Thread(target=run, name="logitlab-grammar", daemon=True)
            thread.start()
        finally:
            threading.stack_size(previous)
    thread.join()
    if err:
        raise err[0]
    return out[0]
