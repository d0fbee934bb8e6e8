"""Issue 36 items 3 and 15: no grammar crashes the process, and a grammar that cannot go on says why.

Found by experiment (llguidance 1.9, in child processes; see engine/constraints/limits.py): a Lark chain
of ~2,600 rules, or JSON-schema `$ref`s chained ~1,000 deep, overflow an 8 MiB stack (SIGSEGV); a thread
with a 2 MiB stack dies near 700; GBNF conversion is quadratic (1,000 chained rules: 1 s); a choice list
past 2,000 options failed mid-answer; a JSON schema nested 500 deep raised RecursionError. The hostile
grammars are made here; anything that could crash runs in a child process, so a crash fails the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine import Constraint, ConstraintError
from engine.constraints import limits

ROOT = Path(__file__).resolve().parents[2]


def lark_chain(n: int) -> str:
    return "start: r0\n" + "".join(f'r{i}: "a" r{i + 1}\n' for i in range(n)) + f'r{n}: "b"\n'


def gbnf_chain(n: int) -> str:
    return "root ::= r0\n" + "".join(f'r{i} ::= "a" r{i + 1}\n' for i in range(n)) + f'r{n} ::= "b"\n'


def nested_schema(depth: int) -> str:
    # Built as text: json.dumps of a 500-deep dict is itself a RecursionError.
    return '{"type": "object", "properties": {"a": ' * depth + '{"type": "string"}' + "}}" * depth


def ref_chain(n: int) -> str:
    defs = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return json.dumps({"$ref": "#/$defs/d0", "$defs": defs})


def _in_child(body: str, timeout: float = 120) -> subprocess.CompletedProcess:
    script = "from engine import Constraint, ConstraintError\nfrom tests.hostile.test_grammar_limits import *\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


# --- too big: refused in one line, before llguidance sees it --------------------------------------


@pytest.mark.parametrize(("kind", "make", "words"), [
    ("lark", lambda: lark_chain(3000), "the Lark grammar has 3,002 rules; the limit is 1,000"),
    ("gbnf", lambda: gbnf_chain(10_000), "the GBNF grammar has 10,002 rules; the limit is 1,000"),
    ("json_schema", lambda: nested_schema(500), "the JSON schema is nested 1,001 levels deep; the limit is 128"),
    ("json_schema", lambda: ref_chain(1200), "the JSON schema has 1,201 $refs; the limit is 1,000"),
    ("choice", lambda: json.dumps([f"option {i}" for i in range(100_000)]), "characters; the limit is 100,000"),
    ("choice", lambda: json.dumps([f"option {i}" for i in range(9_000)]), "characters; the limit is 100,000"),
    ("choice", lambda: json.dumps(["a"] * 15_000), "the choice list has 15,000 options; the limit is 10,000"),
    ("regex", lambda: "|".join(f"w{i}" for i in range(30_000)), "the regular expression has"),
])
def test_a_grammar_past_a_limit_is_one_error_in_words_at_once(kind, make, words):
    text = make()
    t0 = time.perf_counter()
    with pytest.raises(ConstraintError) as e:
        Constraint(kind, text)
    assert words in str(e.value)
    assert "\n" not in str(e.value)
    assert time.perf_counter() - t0 < 2.0  # refused by counting, not by building


def test_the_issues_grammars_do_not_crash_the_process():
    """Without the limits these killed the process (exit 139) or raised RecursionError."""
    result = _in_child("""
        for kind, text in (("lark", lark_chain(3000)), ("gbnf", gbnf_chain(10_000)), ("json_schema", nested_schema(500)),
                           ("json_schema", ref_chain(1500))):
            try:
                Constraint(kind, text)
                print("BUILT", kind)
            except ConstraintError as e:
                print("REFUSED", kind, "|", e)
    """)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("REFUSED") == 4, result.stdout


# --- just under the limits: built on a deep stack, whatever the caller's ----------------------------


@pytest.mark.slow
def test_grammars_under_the_limits_build_even_on_a_thread_with_a_small_stack():
    """A 1,000-rule Lark chain and a 900-deep $ref chain need several MiB of stack: a caller's thread with
    1 MiB (below a Linux thread's 2 MiB when `ulimit -s` is unlimited) died here before they were built on
    a thread of their own."""
    result = _in_child("""
        import threading
        out = []
        def build():
            for kind, text in (("lark", lark_chain(limits.MAX_RULES - 2)), ("json_schema", ref_chain(900))):
                c = Constraint(kind, text)
                out.append(f"BUILT {kind} {len(c.grammar) > 0}")
        threading.stack_size(1 << 20)
        t = threading.Thread(target=build)
        t.start()
        t.join()
        print("\\n".join(out))
    """, timeout=300)
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-2000:]}"
    assert "BUILT lark True" in result.stdout and "BUILT json_schema True" in result.stdout


def test_a_long_choice_list_is_one_expression_that_matches_each_option_exactly():
    options = [f"option {i}." for i in range(5000)] + ["a|b", "x*y (z)", "back\\slash", "c/d"]
    c = Constraint.choice(options)
    assert c.grammar and c.choices() == options


def test_on_deep_stack_returns_the_result_and_raises_the_error():
    assert limits.on_deep_stack(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ZeroDivisionError):
        limits.on_deep_stack(lambda: 1 / 0)


def test_json_depth_reads_any_depth_and_skips_strings():
    assert limits.json_depth("[" * 100_000 + "]" * 100_000) == 100_000
    assert limits.json_depth('{"a": "[[[[{{{{\\"]]]"}') == 1


# --- grammars that cannot go on: said as what happened (the real model) -----------------------------


# default_llamacpp / fresh_default_llamacpp: the session's, from tests/conftest.py.


def _answer(backend, constraint: Constraint, max_new_tokens: int = 20, fast_forward: bool = True):
    from engine import Done, GenerationRequest, SamplerSettings, TokenEvent
    from engine.decode.loop import generate_events

    c = Constraint(constraint.kind, constraint.text, fast_forward=fast_forward)
    req = GenerationRequest(messages=({"role": "user", "content": "Say something."},), constraint=c,
                            sampler=SamplerSettings(temperature=0), max_new_tokens=max_new_tokens)
    events = list(generate_events(backend, req))
    assert isinstance(events[-1], Done)
    return [e for e in events if isinstance(e, TokenEvent)], events[-1].stats


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize("fast_forward", [True, False])
@pytest.mark.parametrize("grammar", ['root ::= "ab" root', 'root ::= "a"{100000}'])
def test_a_grammar_that_never_ends_says_so_not_dead_end_in_step_mode(fresh_default_llamacpp, grammar, fast_forward):
    tokens, stats = _answer(fresh_default_llamacpp, Constraint.gbnf(grammar), fast_forward=fast_forward)
    said = (stats.error or "") + " " + stats.constraint_status
    assert "branch or in step mode" not in said
    assert "forces a text longer than the grammar engine can look ahead" in said or \
        "stopped at the length limit inside the grammar" in said, said
    assert stats.finish_reason in ("error", "length")


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize(("kind", "text"), [("regex", r"[^\s\S]"), ("regex", r"a[^\s\S]"), ("lark", r"start: /[^\s\S]/")])
def test_a_grammar_that_allows_nothing_is_not_an_end_of_text(fresh_default_llamacpp, kind, text):
    tokens, stats = _answer(fresh_default_llamacpp, Constraint(kind, text))
    assert stats.finish_reason == "error" and not tokens
    assert "allows no answer at all" in stats.error
    assert "ended (eos)" not in stats.constraint_status


@pytest.mark.slow
@pytest.mark.model
def test_a_5000_option_choice_list_answers_one_option(fresh_default_llamacpp):
    options = [f"item {i}" for i in range(5000)]  # past llguidance's 2,000 alternatives at one place
    tokens, stats = _answer(fresh_default_llamacpp, Constraint.choice(options), max_new_tokens=12)
    assert stats.error is None and stats.constraint_status == "complete", (stats.error, stats.constraint_status)
    assert stats.text in options
