"""Every value and path the user gives the CLI is checked before a model loads: one line, rc 2, no traceback.

The loaders are replaced by ones that fail the test, so "before the model
loads" is checked, not assumed; nothing here loads a model.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from engine import cli
from engine.cli.input import check_args
from engine.errors import UsageError
from cli_checks import one_error_line, refuse_model_load


@pytest.fixture
def no_model_load(monkeypatch):
    refuse_model_load(monkeypatch)


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\nworld\n", encoding="utf-8")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n")
    return {"dir": tmp_path, "prompts": prompts, "latin1": latin1, "empty": empty}


CASES = [
    (["generate", "--prompt", "x", "--device", "bogus"], "unknown device 'bogus'"),
    (["generate", "--prompt", "x", "--num-beams", "0"], "--num-beams must be at least 1, got 0"),
    (["generate", "--prompt", "x", "--num-beams", "-5"], "--num-beams must be at least 1, got -5"),
    (["generate", "--prompt", "x", "--num-beams", "2", "--num-return-sequences", "3"], "cannot exceed --num-beams"),
    (["generate", "--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    (["chat", "--max-new-tokens", "-3"], "--max-new-tokens must be at least 1"),  # -1: llama.cpp's "no limit"
    (["generate", "--prompt", "x", "--backend", "torch", "--offload", "foo"], "--offload 'foo'"),
    (["generate", "--prompt", "x", "--temperature", "-1"], "temperature must be >= 0"),
    (["generate", "--prompt", "x", "--top-p", "7"], "top_p must be in (0, 1]"),
    (["chat", "--order", "top_k,nonsense"], "nonsense"),
    (["generate", "--prompt", "x", "--top-n", "-2"], "--top-n must be at least 0"),
    (["generate", "--prompt", "x", "--stop", ""], "--stop needs a non-empty string"),
    (["generate", "--num-beams", "abc", "--prompt", "x"], "invalid int value: 'abc'"),
    (["generate", "--prompt", "x", "--backend", "bogus"], "invalid choice: 'bogus'"),
    (["generate"], "give a prompt"),
    (["generate", "--prompt", "x", "--prompt-file", "{prompts}"], "either --prompt or --prompt-file"),
    (["generate", "--prompt-file", "{dir}/missing.txt"], "missing.txt: no such file"),
    (["generate", "--prompt-file", "{dir}"], "is a folder, not a text file"),
    (["generate", "--prompt-file", "{latin1}"], "not valid UTF-8 (byte 0xe9 on line 1)"),
    (["chat", "--system", "-"], "chat reads its turns from standard input"),
    (["chat", "--system-file", "{dir}/nope.txt"], "--system-prompt-file"),
    (["generate", "--prompt", "x", "--model", "{dir}/no-such-model"], "--model: model not found"),
    (["generate", "--prompt", "x", "--model", "http://127.0.0.1:9/v1", "--device", "cuda"], "runs on remote"),
    (["batch", "--input", "{prompts}", "--output", "{dir}/missing/out.jsonl"], "does not exist; create it first"),
    (["batch", "--input", "{prompts}", "--output", "{dir}"], "is a folder; name a file"),
    (["batch", "--input", "{prompts}", "--output", "{prompts}"], "is the input file"),
    (["batch", "--input", "{dir}/missing.txt", "--output", "{dir}/o.jsonl"], "--input"),
    (["batch", "--input", "{empty}", "--output", "{dir}/o.jsonl"], "has no prompts"),
    (["batch", "--input", "{latin1}", "--output", "{dir}/o.jsonl"], "not valid UTF-8"),
    (["batch", "--input", "{prompts}", "--output", "{dir}/o.jsonl", "--batch-size", "0"], "--batch-size must be"),
    (["batch", "--input", "{prompts}", "--output", "{dir}/o.jsonl", "--top-p", "0"], "top_p must be in (0, 1]"),
    (["generate", "--prompt", "caf\udce9", "--max-new-tokens", "3"], "--prompt is not valid UTF-8 (byte 0xe9"),
]


@pytest.mark.model
@pytest.mark.parametrize("argv, needle", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_input_is_refused_in_one_line_before_the_model_loads(argv, needle, files, no_model_load, capsys):
    argv = [a.format(**files) for a in argv]
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's own checks (types, choices) exit from parse_args
        code = e.code
    assert code == 2
    assert needle in one_error_line(capsys)


@pytest.mark.model
def test_cuda_without_a_usable_gpu_is_refused_before_the_model_loads(monkeypatch, no_model_load, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # what the CUDA build says without a driver
    code = cli.main(["generate", "--prompt", "x", "--backend", "torch", "--device", "cuda"])
    assert code == 2 and "'cuda' is not available" in one_error_line(capsys)


def test_invalid_utf8_in_argv_gets_one_line_from_the_real_command(tmp_path):
    # The bytes a terminal in another encoding sends; Python turns them into lone surrogates.
    argv = [sys.executable, "-m", "engine", "generate", "--prompt", b"caf\xe9", "--max-new-tokens", "3"]
    run = subprocess.run(argv, capture_output=True, timeout=60, cwd=Path(__file__).parents[2])
    err = run.stderr.decode("utf-8", "replace")
    assert run.returncode == 2 and "Traceback" not in err
    assert err.strip().splitlines() == ["error: --prompt is not valid UTF-8 (byte 0xe9 at character 4); "
                                        "check the terminal's encoding"]


@pytest.mark.model
def test_prompt_comes_from_stdin_or_a_file_without_its_final_newline(tmp_path):
    parser = cli.build_parser()
    args = parser.parse_args(["generate", "--prompt", "-", "--backend", "torch"])
    check_args(args, stdin=io.BytesIO("first line\nsecond – line\n".encode()))
    assert args.prompt == "first line\nsecond – line"

    long_file = tmp_path / "long.txt"
    long_file.write_text("word " * 40_000 + "\r\n", encoding="utf-8")  # too long for any argv
    args = parser.parse_args(["generate", "--prompt-file", str(long_file), "--backend", "torch"])
    check_args(args)
    assert args.prompt == "word " * 40_000

    system = tmp_path / "system.txt"
    system.write_text("You are terse.\n", encoding="utf-8")
    args = parser.parse_args(["chat", "--system-file", str(system), "--backend", "torch"])
    check_args(args)
    assert args.system == "You are terse."


def test_invalid_utf8_on_stdin_for_prompt_names_the_byte():
    args = cli.build_parser().parse_args(["generate", "--prompt", "-", "--backend", "torch"])
    with pytest.raises(UsageError, match=r"standard input is not valid UTF-8 \(byte 0xff on line 2\)"):
        check_args(args, stdin=io.BytesIO(b"fine\n\xff\n"))
