"""A model's chat template is code: it renders in a sandbox with a time and a size limit, and any
failure is one `ChatTemplateError` in words (the CLI prints it as one line, no traceback)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.templates.render import ChatTemplateError, render_chat_template
from engine.errors import EngineError

MESSAGES = [{"role": "user", "content": "hi"}]
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}" + CHATML

# Each builds a value far larger than memory in a few steps, unless stopped before it is made.
BOMBS = {
    "doubling with +": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
    "doubling with ~": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "repeat with *": "{{ ('x' * 100000) * 100000 }}",
    "power": "{{ 7 ** 1000000000 }}",
    "squaring": "{% set ns = namespace(n=3) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}{% endfor %}{{ 1 }}",
    "centre filter": "{{ 'x'|center(10000000000) }}",
    "replace squares": "{% set ns = namespace(s='abcd') %}{% for i in range(8) %}{% set ns.s = ns.s|replace('', ns.s) %}{% endfor %}",
    "replace method": "{% set ns = namespace(s='abcd') %}{% for i in range(8) %}{% set ns.s = ns.s.replace('', ns.s) %}{% endfor %}",
    "a list that holds itself": "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}",
    "join of a generator": "{{ range(100000)|map('string')|map('center', 100000)|join }}",
    "format width": "{{ '%*d' % (10000000000, 1) }}",
    "format width written out": "{{ '%0100000000d' % 1 }}",
    "format filter width": "{{ '%*d'|format(10000000000, 1) }}",
    "str.format width": "{{ '{:>100000000}'.format(1) }}",
    "ljust": "{{ 'x'.ljust(100000000) }}",
    "output": "{% for i in range(100000) %}{% for j in range(100) %}{{ 'xxxxxxxxxxxxxxxxxxxx' }}{% endfor %}{% endfor %}",
}


def test_an_honest_template_renders_as_jinja_renders_it():
    text = render_chat_template(CHATML, {"messages": MESSAGES, "add_generation_prompt": True})
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_big_numbers_that_are_not_widths_are_fine():
    template = "{{ '%d' % 20240101 }} {{ x|default(99999999999) }} {{ {'a': 1}.get('b', 12345678901) }} {{ 'v%s'|format(20240101) }}"
    assert render_chat_template(template, {}, max_chars=1_000_000) == "20240101 99999999999 12345678901 v20240101"


def test_a_template_that_loops_for_hours_is_stopped_at_the_time_limit():
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError, match="did not finish within 0.5 s"):
        render_chat_template(NESTED_LOOPS, {"messages": MESSAGES, "add_generation_prompt": True}, time_limit_s=0.5)
    assert time.monotonic() - t0 < 5
    # The tracing ends with the render: the thread runs on untraced.
    assert sys.gettrace() is None or "deadline" not in getattr(sys.gettrace(), "__qualname__", "")


@pytest.mark.parametrize("name", list(BOMBS))
def test_a_template_that_builds_a_huge_value_is_stopped_before_it_is_made(name):
    with pytest.raises(ChatTemplateError, match="more than 1,000,000 characters"):
        render_chat_template(BOMBS[name], {"messages": MESSAGES}, max_chars=1_000_000, time_limit_s=30)


@pytest.mark.parametrize(
    ("template", "words"),
    [
        ("{% for m in messages %}{{ m.content }", "not valid Jinja"),
        ("{{ raise_exception('Conversation roles must alternate user/assistant') }}", "roles must alternate"),
        ("{{ messages.__class__.__mro__ }}", "sandbox forbids"),
        ("{{ ''.__class__.__subclasses__() }}", "sandbox forbids"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "calls itself"),
        ("{{ messages|nosuchfilter }}", "not valid Jinja"),
    ],
)
def test_a_broken_or_refusing_template_is_one_error_in_words(template, words):
    with pytest.raises(ChatTemplateError, match=words) as info:
        render_chat_template(template, {"messages": MESSAGES})
    assert isinstance(info.value, EngineError)
    assert info.value.__cause__ is None and "Traceback" not in str(info.value)


def test_limits_hold_on_any_thread():
    errors: list[BaseException] = []

    def render() -> None:
        try:
            render_chat_template(NESTED_LOOPS, {"messages": MESSAGES}, time_limit_s=0.3)
        except BaseException as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    worker = threading.Thread(target=render)
    worker.start()
    worker.join(10)
    assert not worker.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ChatTemplateError)


@pytest.fixture
def hostile_gguf(tmp_path) -> callable:
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from tiny_gguf import write_tiny_llama_gguf

    def write(template: str) -> Path:
        return write_tiny_llama_gguf(tmp_path / f"hostile-{abs(hash(template))}.gguf", chat_template=template)

    return write


def _llama_backend(path: Path):
    pytest.importorskip("llama_cpp")
    from engine.backends.llamacpp.backend import LlamaCppBackend

    return LlamaCppBackend(path, spec=str(path), display_name="hostile")


def test_a_gguf_template_is_rendered_with_the_limits(hostile_gguf, monkeypatch):
    import engine.templates.render as chat_template

    monkeypatch.setattr(chat_template, "TIME_LIMIT_S", 0.5)
    backend = _llama_backend(hostile_gguf(NESTED_LOOPS))
    try:
        t0 = time.monotonic()
        with pytest.raises(ChatTemplateError, match="did not finish"):
            backend.tokenizer.chat_ids(MESSAGES)
        assert time.monotonic() - t0 < 5
    finally:
        backend.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("template", "words"),
    [
        ("{% for m in messages %}{{ m.content }", "not valid Jinja"),
        ("{{ raise_exception('Conversation roles must alternate') }}", "roles must alternate"),
        ("{{ messages.__class__.__mro__ }}", "sandbox forbids"),
    ],
)
def test_the_cli_says_what_is_wrong_with_a_template_in_one_line(hostile_gguf, template, words):
    pytest.importorskip("llama_cpp")
    path = hostile_gguf(template)
    run = subprocess.run(
        [sys.executable, "-m", "engine", "generate", "--model", str(path), "--chat", "--prompt", "hi", "--max-new-tokens", "2"],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2],
    )
    assert run.returncode != 0
    assert "Traceback" not in run.stderr and "jinja2" not in run.stderr, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "chat template" in errors[0] and words in errors[0], run.stderr


CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And <b>3+3</b>? {{ no }}"}],
]


@pytest.mark.model
@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_the_limited_render_equals_transformers_own(default_model_folder, conversation, generation_prompt):
    from transformers import AutoTokenizer

    from engine.tokenizer import Tokenizer

    ours = Tokenizer.from_folder(default_model_folder)
    hf = AutoTokenizer.from_pretrained(str(default_model_folder))
    want = hf.apply_chat_template(conversation, add_generation_prompt=generation_prompt, tokenize=False)
    assert ours.chat_text(conversation, add_generation_prompt=generation_prompt) == want


def test_a_folder_template_is_rendered_with_the_limits(default_model_folder, tmp_path, monkeypatch):
    """A Hugging Face folder whose template loops for hours: stopped at the limit, one error."""
    import json
    import shutil

    import engine.templates.render as chat_template
    from engine.tokenizer import Tokenizer

    folder = tmp_path / "hostile"
    shutil.copytree(default_model_folder, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.gguf"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = NESTED_LOOPS
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    monkeypatch.setattr(chat_template, "TIME_LIMIT_S", 0.5)
    tok = Tokenizer.from_folder(folder)
    assert "range(100000)" in tok.hf.get_chat_template()
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError, match="did not finish"):
        tok.chat_ids(MESSAGES)
    assert time.monotonic() - t0 < 5
