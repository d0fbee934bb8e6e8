"""Issue 36 item 5: no chat template outlives its time limit, and the process that asked stays responsive.

Two templates beat the in-process limit: one long C call that holds the GIL
(`sum` of 100,000 one-item lists, with `start=[]`) froze every thread for 22 s,
and a loop inside the `striptags` filter (which the trace function never
sees) never ended at all. Rendered in the renderer process, each ends with a
`ChatTemplateError` about a second after its limit, this process keeps
running its other threads meanwhile, and the next honest template renders at
once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.templates import process as template_process
from engine.templates.render import ChatTemplateError, render_chat_template, render_in_this_process

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "user", "content": "hi"}]
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# The two templates, as reported (under a 1 s limit the first is still building its list of lists,
# where the trace function stops it; under the 5 s default it reached its `sum`).
GIL_HOG = "{{ (range(100000)|batch(1)|list)|sum(start=[])|length }}"
FILTER_LOOP = "{{ ('<>'*3000000)|striptags }}"
# The same `sum` reached at once: one C call of ~30 s in-process, where no trace function runs.
ONE_C_CALL = "{{ ([[0]] * 100000)|sum(start=[])|length }}"
# With markupsafe 3.0.4 the filter loop's `striptags` ends after ~1 s here (it never ended with the one the issue
# met), a coin flip against a 1 s limit (3.13's CI pass once finished it in time); the text cannot grow, templates
# may build at most 8,000,000 characters. So the limit is a quarter of a second: each template is 4x past it.
LIMIT_S = 0.25
# The limit, the grace before the kill, and room for a loaded two-core machine.
ENDS_WITHIN_S = LIMIT_S + template_process.GRACE_S + 1.5


class _Ticker:
    """A thread that ticks every 10 ms; the largest gap between ticks is how long this process was frozen."""

    def __init__(self) -> None:
        self.largest_gap = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.01):
            now = time.monotonic()
            self.largest_gap = max(self.largest_gap, now - last)
            last = now

    def __enter__(self) -> "_Ticker":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _render_with_deadline(template: str, limit_s: float, wait_s: float) -> tuple[BaseException | None, float]:
    """Render in a thread, so that a render that never ends fails the test instead of hanging it."""
    outcome: list = []

    def run() -> None:
        t0 = time.monotonic()
        try:
            render_chat_template(template, {"messages": MESSAGES, "add_generation_prompt": True}, time_limit_s=limit_s)
            outcome.append((None, time.monotonic() - t0))
        except BaseException as e:  # noqa: BLE001 - collected for the assertion
            outcome.append((e, time.monotonic() - t0))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(wait_s)
    assert not thread.is_alive(), f"the render was still running {wait_s:g} s later"
    return outcome[0]


@pytest.fixture
def warm_renderer():
    """A started renderer (its start-up is not the template's time), and a clean memo of overtime templates."""
    import engine.templates.render as chat_template

    chat_template._overtime.clear()
    assert render_chat_template(CHATML, {"messages": MESSAGES, "add_generation_prompt": True})
    yield template_process.renderer()
    chat_template._overtime.clear()


@pytest.mark.slow
@pytest.mark.parametrize("template", [GIL_HOG, ONE_C_CALL, FILTER_LOOP],
                         ids=["issue-sum-of-batches", "one-long-c-call", "loop-inside-a-filter"])
def test_a_template_the_trace_cannot_stop_ends_after_its_limit_and_this_process_stays_responsive(warm_renderer, template):
    with _Ticker() as ticker:
        error, took = _render_with_deadline(template, LIMIT_S, wait_s=30)
    assert isinstance(error, ChatTemplateError), error
    assert f"did not finish within {LIMIT_S:g} s" in str(error) and "\n" not in str(error)
    assert took < ENDS_WITHIN_S, f"took {took:.2f} s"
    # In-process, the C call held the GIL for the whole render: here no thread of ours waited more than a moment.
    assert ticker.largest_gap < 0.5, f"this process was frozen for {ticker.largest_gap:.2f} s"
    # The next honest template renders at once (in a new renderer process if the old one was killed).
    t0 = time.monotonic()
    text = render_chat_template(CHATML, {"messages": MESSAGES, "add_generation_prompt": True})
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert time.monotonic() - t0 < 10


@pytest.mark.slow
def test_a_template_that_ran_out_of_time_is_refused_at_once_the_next_time(warm_renderer):
    first, _ = _render_with_deadline(FILTER_LOOP, LIMIT_S, wait_s=30)
    assert isinstance(first, ChatTemplateError) and "did not finish" in str(first)  # it did run out of time
    t0 = time.monotonic()
    error, _ = _render_with_deadline(FILTER_LOOP, LIMIT_S, wait_s=30)
    assert isinstance(error, ChatTemplateError) and "did not finish" in str(error)
    assert time.monotonic() - t0 < 0.5


def test_an_honest_template_renders_exactly_as_in_this_process(warm_renderer):
    variables = {"messages": [{"role": "system", "content": "Be brief ✓"}, *MESSAGES, {"role": "assistant", "content": "a\tb"}],
                 "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>", "tools": None}
    template = "{{ bos_token }}" + CHATML + "{{ messages|tojson }}{{ strftime_now('%Y') }}"
    assert render_chat_template(template, variables) == render_in_this_process(
        template, variables, time_limit_s=5, max_chars=1_000_000)


def test_the_template_renders_in_another_process(warm_renderer):
    assert warm_renderer.pid is not None and warm_renderer.pid != os.getpid()
    assert render_chat_template("{{ 1 + 1 }}", {}) == "2"


def test_variables_that_cannot_be_copied_are_refused_in_words(warm_renderer):
    with pytest.raises(ChatTemplateError, match="cannot be passed to the template renderer"):
        render_chat_template(CHATML, {"messages": MESSAGES, "lock": threading.Lock()})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/limits is Linux's")
def test_the_renderer_is_held_to_a_memory_limit(warm_renderer):
    limits = Path(f"/proc/{warm_renderer.pid}/limits").read_text().splitlines()
    address_space = next(line for line in limits if line.startswith("Max address space")).split()
    assert address_space[3] != "unlimited"
    assert int(address_space[3]) < 8 << 30  # what it had at start, plus MEMORY_LIMIT_BYTES


def test_a_closed_renderer_ends_the_render_waiting_on_it_at_once(warm_renderer):
    threading.Timer(0.5, template_process.shutdown).start()
    error, took = _render_with_deadline(FILTER_LOOP + "{{ 'x' }}", 30, wait_s=10)
    assert isinstance(error, ChatTemplateError) and "closing" in str(error)
    assert took < 3
    assert render_chat_template("{{ 'again' }}", {}) == "again"  # the next render starts a new renderer


def test_without_a_renderer_process_templates_render_in_this_process(monkeypatch):
    broken = template_process.TemplateRenderer()
    monkeypatch.setattr(template_process, "_renderer", broken)
    monkeypatch.setattr(template_process, "_command", lambda: [str(ROOT / "no-such-python")])
    assert render_chat_template(CHATML, {"messages": MESSAGES, "add_generation_prompt": True}).endswith("assistant\n")
    with pytest.raises(ChatTemplateError, match="sandbox forbids"):
        render_chat_template("{{ ''.__class__.__mro__ }}", {})


@pytest.mark.slow
@pytest.mark.parametrize("how", ["exit", "os._exit", "SIGKILL mid-render"])
def test_the_renderer_does_not_outlive_the_process_that_started_it(tmp_path, how):
    code = (
        "import os, signal, sys, threading\n"
        "from engine.templates.render import render_chat_template\n"
        "from engine.templates import process as template_process\n"
        "render_chat_template('{{ 1 }}', {})\n"
        "print(template_process.renderer().pid, flush=True)\n"
        f"how = {how!r}\n"
        "if how == 'os._exit':\n"
        "    os._exit(0)\n"
        "if how.startswith('SIGKILL'):\n"
        f"    threading.Thread(target=render_chat_template, args=({FILTER_LOOP!r}, {{}}), kwargs={{'time_limit_s': 1}}).start()\n"
        "    import time; time.sleep(0.5)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    child = int(proc.stdout.split()[0])
    # Mid-render, its own alarm ends it: the render's limit, the grace and the slack after it.
    deadline = time.monotonic() + (1 + template_process.GRACE_S + template_process._ORPHAN_SLACK_S + 3 if how.startswith("SIGKILL") else 3)
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), f"the renderer {child} outlived its parent ({how})"
    assert "Traceback" not in proc.stderr


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


@pytest.mark.model
@pytest.mark.slow  # seconds on two cores (junit times, 2026-12-04)
def test_the_default_models_and_gemmas_templates_render_as_they_did_in_this_process(warm_renderer):
    """SmolLM2's own template (from its GGUF) and the built-in Gemma one: the renderer process changes no byte."""
    from gguf import GGUFReader

    from engine.templates.choice import BUILTIN_TEMPLATES
    from engine.sources import resolve_spec

    field = GGUFReader(resolve_spec(None).path).fields["tokenizer.chat_template"]
    templates = {"SmolLM2": bytes(field.parts[field.data[0]]).decode(), "Gemma": BUILTIN_TEMPLATES["gemma"].text}
    chats = [
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
         {"role": "assistant", "content": "Four."}, {"role": "user", "content": "And 3+3?\nIn words ✓ <b>"}],
    ]
    for name, template in templates.items():
        for chat in chats:
            for generation_prompt in (True, False):
                variables = {"messages": chat, "add_generation_prompt": generation_prompt, "bos_token": "<s>",
                             "eos_token": "</s>", "tools": None, "documents": None}
                expected = render_in_this_process(template, variables, time_limit_s=5, max_chars=1_000_000)
                assert render_chat_template(template, variables) == expected, name
