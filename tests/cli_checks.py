"""What the CLI tests share: run `logitlab-cli` in-process, read its one error line, refuse any model load."""

from __future__ import annotations

from engine import cli


def run_cli(argv: list[str]) -> int:
    """`logitlab-cli ARGV`'s exit status (argparse's own refusals exit through SystemExit)."""
    try:
        return cli.main(argv)
    except SystemExit as e:
        return int(e.code)


def one_error_line(capsys) -> str:
    """The one `error: ...` line the CLI printed on stderr, with no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    return lines[0]


def refuse_model_load(monkeypatch, message: str = "a model was loaded before the command line was checked") -> None:
    """Make any model load fail the test: what is checked here must be checked before a model loads."""

    def refuse(*_a, **_k):
        raise AssertionError(message)

    monkeypatch.setattr("engine.engine.load_model", refuse)
    monkeypatch.setattr("engine.open_model.load_model", refuse)
