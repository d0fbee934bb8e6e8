"""`logitlab-cli generate/chat --attach FILE`: the file read before the model loads, put into the user message,
its tokens said on stderr; a file that cannot be attached is one line and exit status 2, before any load."""

from __future__ import annotations

import io
import re

import pytest

from cli_checks import one_error_line, refuse_model_load, run_cli
from documents_files import encrypted_pdf, make_pdf

FACT = "Zorbia is a small country. The capital of Zorbia is Quellton, a city on the river Vell.\n"
QUESTION = "What is the capital of Zorbia?"
GREEDY = ["--temperature", "0", "-n", "12"]


def _prompt_tokens(err: str) -> int:
    return int(re.search(r"; prompt (\d+) \(", err).group(1))


@pytest.mark.slow
@pytest.mark.model
def test_generate_reads_the_attached_pdf_and_answers_from_it(tmp_path, capsys):
    pdf = tmp_path / "zorbia.pdf"
    pdf.write_bytes(make_pdf([FACT.strip()]))
    assert run_cli(["generate", "--chat", "-p", QUESTION, *GREEDY]) == 0
    without = _prompt_tokens(capsys.readouterr().err)
    assert run_cli(["generate", "--chat", "--attach", str(pdf), "-p", QUESTION, *GREEDY]) == 0
    out, err = capsys.readouterr()
    assert "Quellton" in out  # a name the model cannot know but from the file
    tokens = int(re.search(r"\[attached zorbia\.pdf: \d+ B, (\d+) tokens\]", err).group(1))
    # The prompt grew by the attachment's block and the blank line after it: its count is what it costs.
    assert 0 <= _prompt_tokens(err) - without - tokens <= 2


@pytest.mark.slow
@pytest.mark.model
def test_chat_puts_the_attachments_into_the_first_message_only(tmp_path, capsys, monkeypatch):
    fact = tmp_path / "fact.txt"
    fact.write_text(FACT)
    other = tmp_path / "colour.md"
    other.write_text("# Flag\n\nThe flag of Zorbia is green.\n")
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{QUESTION}\nThanks.\n/quit\n"))
    assert run_cli(["chat", "--attach", str(fact), "--attach", str(other), *GREEDY]) == 0
    out, err = capsys.readouterr()
    assert "Quellton" in out.split("assistant> ")[1]
    assert re.search(r"\[attached fact\.txt: 88 B, \d+ tokens\]", err)
    assert re.search(r"\[attached colour\.md: \d+ B, \d+ tokens\]", err)
    first, second = (_prompt_tokens(line) for line in err.splitlines() if "; prompt " in line)
    assert second > first  # the second turn holds the first (with its files), not a second copy of them


def _bad_files(tmp_path):
    (tmp_path / "pic.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (tmp_path / "latin.txt").write_bytes("caf".encode() + "é".encode("latin-1"))
    (tmp_path / "locked.pdf").write_bytes(encrypted_pdf(["secret"]))
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4\nnothing more")
    (tmp_path / "scan.pdf").write_bytes(make_pdf([""], with_text=False))
    with (tmp_path / "huge.log").open("wb") as f:
        f.truncate(500 * 1024 * 1024)
    return {
        "pic.txt": "--attach pic.txt: is a PNG image, not text",
        "latin.txt": "--attach latin.txt: is not UTF-8 text (byte 0xe9 on line 1",
        "locked.pdf": "--attach locked.pdf: is an encrypted PDF with a password",
        "broken.pdf": "--attach broken.pdf: is not a readable PDF (",
        "scan.pdf": "--attach scan.pdf: has no text layer",
        "huge.log": "--attach huge.log: is 500.0 MB; attachments are limited to 20.0 MB",
        "missing.txt": "--attach missing.txt: no such file",
    }


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_a_file_that_cannot_be_attached_is_one_line_before_the_model_loads(tmp_path, capsys, monkeypatch, command):
    refuse_model_load(monkeypatch)
    good = tmp_path / "good.txt"
    good.write_text("fine")
    for name, words in _bad_files(tmp_path).items():
        argv = [command, "--attach", str(good), "--attach", str(tmp_path / name)] + (["-p", "q"] if command == "generate" else [])
        assert run_cli(argv) == 2, name
        line = one_error_line(capsys)
        assert line.startswith("error: " + words), line
