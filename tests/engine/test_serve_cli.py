"""`logitlab-cli serve`: what it refuses before any model loads (one error line, exit 2)."""

from __future__ import annotations

import pytest

from cli_checks import one_error_line, refuse_model_load, run_cli


@pytest.mark.parametrize("argv, words", [
    (["serve", "--host", "0.0.0.0"], "reachable from other machines: give --api-key"),
    (["serve", "--port", "70000"], "--port must be from 0 to 65535"),
    (["serve", "--upstream", "ftp://example"], "--upstream must be an http:// or https:// URL"),
    (["serve", "--record-top-n", "500"], "--record-top-n must be from 0 to 100"),
])
def test_serve_refuses_before_loading(argv, words, capsys, monkeypatch):
    refuse_model_load(monkeypatch)
    assert run_cli(argv) == 2
    assert words in one_error_line(capsys)
