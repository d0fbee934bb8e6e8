"""Values no run could use are refused in one line with exit status 2 before a model loads (issue 36 items 4
and 14, issue 37 item 19): numbers out of range (--n-batch 2147483648 segfaulted llama.cpp), deep JSON, a huge
token id, a missing chat template file, a lens position past the prompt, an answer longer than the context.
The loaders fail the test if called, so "before the model loads" is checked, not assumed.
"""

from __future__ import annotations

import json

import pytest

from engine.cli.input import check_args
from engine.cli.main import build_parser
from engine.runtime_settings import RuntimeSettings
from cli_checks import one_error_line, refuse_model_load, run_cli as run


@pytest.fixture(autouse=True)
def no_model_load(monkeypatch):
    monkeypatch.setattr("engine.cli.input.planned_backend", lambda args: "llamacpp")

    refuse_model_load(monkeypatch)


def deep_json(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


OUT_OF_RANGE = [
    (["generate", "-p", "x", "--n-batch", "2147483648"], "batch size (n_batch) must be from 1 to 65,536"),
    (["generate", "-p", "x", "-b", "100000"], "batch size (n_batch) must be from 1 to 65,536"),
    (["generate", "-p", "x", "-c", "4294967296"], "context length (n_ctx) must be from 1 to 2,147,483,647"),
    (["generate", "-p", "x", "-t", "100000"], "threads (n_threads) must be from 1 to 512"),
    (["generate", "-p", "x", "-tb", "0"], "prompt threads (n_threads_batch) must be from 1 to 512"),
    (["generate", "-p", "x", "-ngl", "1000000"], "GPU layers (n_gpu_layers) must be from -1 to 9,999"),
    (["generate", "-p", "x", "-n", "9999999999"], "--max-new-tokens must be at most 2,147,483,647"),
    (["generate", "-p", "x", "-n", "-3"], "--max-new-tokens must be at least 1"),
    (["generate", "-p", "x", "--top-n", "5000"], "--top-n must be at most 1,000"),
    (["generate", "-p", "x", "--num-beams", "2", "-n", "-1"], "with --num-beams give a number of tokens"),
    (["generate", "-p", "x", "--num-beams", "1000000"], "--num-beams must be at most 256"),
    (["info", "--n-batch", "2147483648"], "n_batch"),
    (["compare", "-p", "x", "--settings", "{}", "--settings", "{}", "-s", "-5"], "seed must be in [0, 2**63)"),
    (["lens", "--prompt", "x", "--top-k", "100000"], "--top-k must be at most 1,000"),
    (["score", "--text", "ab", "--top-n", "100000"], "--top-n must be at most 1,000"),
    (["compare", "-p", "x", "--settings", "{}", "--settings", "{}", "--max-new-tokens", "0"],
     "--max-new-tokens must be at least 1"),
]


@pytest.mark.parametrize("argv, needle", OUT_OF_RANGE, ids=[" ".join(a)[:50] for a, _ in OUT_OF_RANGE])
def test_numbers_out_of_range_are_one_line_before_loading(argv, needle, capsys):
    assert run(argv) == 2
    assert needle in one_error_line(capsys)


def test_the_runtime_ranges_are_one_table_shared_with_the_window():
    assert RuntimeSettings.range("n_batch") == (1, 65536)
    RuntimeSettings(n_batch=65536, n_ctx=2**31 - 1, n_gpu_layers=-1, n_threads=512)  # the largest are fine
    with pytest.raises(ValueError, match="n_batch"):
        RuntimeSettings(n_batch=2**31)


def test_hostile_values_are_one_line(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text(deep_json(100_000))
    assert run(["generate", "-p", "x", "--settings-json", str(deep)]) == 2
    assert "nested more than 64 levels" in one_error_line(capsys)
    assert run(["compare", "-p", "x", "--settings", deep_json(100_000), "--settings", "{}"]) == 2
    assert "nested too deeply" in one_error_line(capsys)
    assert run(["generate", "-p", "x", "--logit-bias", "99999999999999999999999999=1"]) == 2
    assert "is not a token id of any model" in one_error_line(capsys)
    assert run(["generate", "-p", "x", "-l", "99999999999999999999999999+1"]) == 2
    assert "is not a token id of any model" in one_error_line(capsys)
    assert run(["generate", "-p", "x", "-l", "5=1e999"]) == 2
    assert "finite number" in one_error_line(capsys)
    assert run(["generate", "-p", "x", "-j", deep_json(100_000)]) == 2
    one_error_line(capsys)
    assert run(["generate", "-p", "x", "--samplers", "top_k;bogus"]) == 2
    assert "'bogus'" in one_error_line(capsys)


def test_chat_template_files_are_read_before_loading(tmp_path, capsys):
    assert run(["chat", "--chat-template", str(tmp_path / "missing.jinja")]) == 2
    assert "missing.jinja: no such file" in one_error_line(capsys)
    assert run(["chat", "--chat-template-file", str(tmp_path / "nope.jinja")]) == 2
    assert "--chat-template-file" in one_error_line(capsys)
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content }", encoding="utf-8")
    assert run(["chat", "--chat-template-file", str(broken)]) == 2
    one_error_line(capsys)
    good = tmp_path / "good.jinja"
    good.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}", encoding="utf-8")
    args = build_parser().parse_args(["chat", "--chat-template-file", str(good)])
    check_args(args)
    assert args.chat_template == good.read_text()
    args = build_parser().parse_args(["chat", "--chat-template", "chatml"])
    check_args(args)
    assert args.chat_template == "chatml"  # a built-in stays its name


def test_lens_position_past_the_prompt_and_length_past_the_context(capsys):
    assert run(["lens", "--prompt", "Hi", "--position", "500"]) == 2
    assert "--position 500 is past the prompt's last token" in one_error_line(capsys)
    assert run(["generate", "-p", "x", "-c", "128", "-n", "200"]) == 2
    assert "does not fit a context of 128 tokens" in one_error_line(capsys)


def test_score_file_drops_its_final_newline_as_prompt_file_does(tmp_path, capsys):
    f = tmp_path / "t.txt"
    f.write_text("The cat sat.\n", encoding="utf-8")
    args = build_parser().parse_args(["score", "--file", str(f)])
    check_args(args)
    assert args.text == "The cat sat."
    args = build_parser().parse_args(["generate", "-f", str(f)])
    check_args(args)
    assert args.prompt == "The cat sat."
    empty = tmp_path / "e.txt"
    empty.write_text("\n")
    assert run(["score", "--file", str(empty)]) == 2
    assert "the text to score is empty" in one_error_line(capsys)
    assert run(["score", "--file", str(tmp_path / "none.txt")]) == 2
    assert "no such file" in one_error_line(capsys)


def test_settings_json_with_n_predict_over_the_context_is_refused(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"n_predict": 4000}))
    assert run(["generate", "-p", "x", "-c", "256", "--settings-json", str(path)]) == 2
    assert "4,000 does not fit a context of 256" in one_error_line(capsys)
