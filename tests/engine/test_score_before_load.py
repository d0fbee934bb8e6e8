"""`logitlab-cli score` refuses a one-token text before the model loads (issue 37 item 19).

For a .gguf on llama.cpp the text is tokenized by the file's vocabulary alone (`vocab_only`: no weights, no
context), with the tokenizer the model will use; the refusal is word for word the loaded model's, exit status 2.
"""

from __future__ import annotations

import time

import pytest

import importlib

cli = importlib.import_module("engine.cli.main")  # the module (engine.cli exports its main function as `main`)

pytest.importorskip("llama_cpp")
pytestmark = pytest.mark.model

ONE_TOKEN = "Hello"  # one token for SmolLM2 (no BOS)


class Loaded(Exception):
    """The model's load was reached."""


@pytest.fixture
def no_load(monkeypatch):
    def refuse(_args):
        raise Loaded()

    monkeypatch.setattr(cli, "_load", refuse)


def test_a_one_token_text_is_refused_before_the_model_loads(no_load, capsys):
    started = time.perf_counter()
    assert cli.main(["score", "--text", ONE_TOKEN]) == 2
    took = time.perf_counter() - started
    err = capsys.readouterr().err
    assert err.strip() == "error: scoring needs at least two tokens (one to predict from), got 1"
    print(f"refused in {took * 1000:.0f} ms, the model never loaded")


def test_a_two_token_text_goes_on_to_the_load(no_load):
    with pytest.raises(Loaded):
        cli.main(["score", "--text", "Hello world"])


def test_other_backends_leave_the_check_to_the_loaded_model(no_load):
    with pytest.raises(Loaded):  # a server: no cheap tokenizer (a connection is the load)
        cli.main(["score", "--text", ONE_TOKEN, "--model", "http://127.0.0.1:9/v1"])


@pytest.mark.slow
def test_the_refusal_is_the_loaded_models_word_for_word(capsys):
    from engine import Engine

    assert cli.main(["score", "--text", ONE_TOKEN]) == 2
    before_load = capsys.readouterr().err.strip()
    with Engine.load("default") as engine, pytest.raises(ValueError) as after_load:
        engine.score(ONE_TOKEN)
    assert before_load == f"error: {after_load.value}"
