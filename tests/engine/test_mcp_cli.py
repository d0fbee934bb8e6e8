"""`logitlab-cli chat/generate --mcp-config` through the real CLI entry, the default model and the real MCP
server over stdio: calls printed with their confidence, run only on "y"/"a" read from standard input, results
printed escaped; wrong configs refused in one line before any model loads."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from engine import cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mcp_server_fixture import HERE  # noqa: E402

# 48 new tokens: a call here is ~25. Its arguments' JSON has no free whitespace (engine/tools/constraint.py);
# when it allowed llama.cpp's bound, the default model at temperature 0 spaced `{}` out on some machines and
# ended inside `</tool_call>` at 36.
FAST = ["--temperature", "0", "-n", "48", "--max-tool-steps", "2"]


@pytest.fixture
def mcp_json(tmp_path) -> str:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"fixture": {"command": sys.executable, "args": [str(HERE), "stdio"]}}}))
    return str(path)


def _run(monkeypatch, capsys, argv, stdin):
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.slow
def test_generate_runs_an_approved_call_and_prints_its_confidence_and_result(monkeypatch, capsys, mcp_json):
    code, out, err = _run(monkeypatch, capsys, ["generate", "--mcp-config", mcp_json, "--tool-choice", "get_weather",
                                                "-p", "What is the weather in Paris?", *FAST], "y\n")
    assert code == 0, err
    assert "[mcp server 'fixture' (stdio): 9 tools: add, get_weather" in err
    assert "note: tool 'bad_schema' of server 'fixture' cannot be offered" in err
    assert 'call get_weather({"city": "Paris"})' in out and "call vs text: p(call)=" in out and "argument city" in out
    assert "run get_weather {\"city\": \"Paris\"} (server 'fixture')? [y] once, [n] no, [a] always for this tool: y" in out
    assert "[get_weather: result in " in out and "\n18 C and sunny\n" in out
    assert out.count("assistant> ") == 2  # the call, then the answer with its result


@pytest.mark.slow
def test_chat_denies_on_n_runs_on_a_without_asking_again_and_shows_results_escaped(monkeypatch, capsys, mcp_json):
    script = "Show me the text.\nn\nAgain please.\na\nOnce more.\n/quit\n"
    code, out, err = _run(monkeypatch, capsys, ["chat", "--mcp-config", mcp_json, "--tool-choice", "escape", *FAST], script)
    assert code == 0, err
    assert "[denied: escape did not run; the model is told so]" in out
    assert out.count("for this tool: ") == 2  # asked in the first two turns; "always" in the second covers the third
    assert out.count("[escape: result in ") == 2 and out.count(", always]") == 2
    assert "bell\\x07 esc\\x1b[31mred\\x1b[0m nul\\x00 end" in out
    assert "\x1b" not in out and "\x07" not in out and "\x00" not in out  # nothing acts on the terminal


@pytest.mark.slow
def test_the_end_of_input_at_a_question_denies_the_call(monkeypatch, capsys, mcp_json):
    code, out, err = _run(monkeypatch, capsys, ["generate", "--mcp-config", mcp_json, "--tool-choice", "get_weather",
                                                "-p", "What is the weather in Paris?", *FAST], "")
    assert code == 0, err
    assert "(no answer: the end of input; denied)" in out and "[denied: get_weather did not run" in out
    assert "[get_weather: result" not in out


@pytest.mark.parametrize("config, extra, needle", [
    ("{oops", [], "error: --mcp-config {path}: not valid JSON"),
    ({"mcpServers": {"a": {"command": "x", "url": "http://h/mcp"}}}, [], 'mcpServers.a has both "command" and "url"'),
    ({"mcpServers": {"a": {"command": "x"}}}, ["--tools", "{path}"], "give --tools FILE or --mcp-config FILE, not both"),
    ({"mcpServers": {"a": {"command": "x"}}}, ["--tool-timeout", "0"], "--tool-timeout must be a number of seconds above 0"),
    ({"mcpServers": {"a": {"command": "/nonexistent/mcp-xyz"}}}, [],
     "error: server 'a' (/nonexistent/mcp-xyz) could not start: no such program '/nonexistent/mcp-xyz'; its tools are not offered"),
])
def test_a_wrong_config_is_one_line_and_no_model_loads(monkeypatch, capsys, tmp_path, config, extra, needle):
    path = tmp_path / "mcp.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    argv = ["chat", "--mcp-config", str(path), *[e.replace("{path}", str(path)) for e in extra]]
    code, out, err = _run(monkeypatch, capsys, argv, "hello\n")
    assert code == 2 and needle.replace("{path}", str(path)) in err, err
    assert "Traceback" not in err and "loading" not in err
