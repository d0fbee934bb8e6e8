"""`logitlab-cli compare-models` (engine/cli/model_diff.py): the default model on llama.cpp against its float32
torch twin, as a table and as JSON lines; bad input refused in one line before either model loads."""

from __future__ import annotations

import json

import pytest
from cli_checks import one_error_line, refuse_model_load, run_cli

TEXT = "The capital of France is Paris. The capital of Germany is Berlin."


@pytest.mark.parametrize("argv, words", [
    (["--text", "a b c"], "the following arguments are required: --model-b"),
    (["--model-b", "/no/such/model", "--text", "a b c"], "--model-b: model not found"),
    (["--model-b", "default", "--text", "   "], "the text to score is empty"),
    (["--model-b", "default", "--text", "a b", "--output", "/no/such/folder/x.jsonl"], "does not exist"),
    (["--model-b", "default", "--text", "a b", "--top", "-1"], "--top must be between 0 and 10,000"),
    (["--model-b", "default", "--backend-b", "nope", "--text", "a b"], "invalid choice"),
])
def test_bad_input_is_one_line_before_any_model_loads(monkeypatch, capsys, argv, words):
    refuse_model_load(monkeypatch)
    assert run_cli(["compare-models", *argv]) == 2
    assert words in one_error_line(capsys)


@pytest.mark.slow
@pytest.mark.model
def test_the_twin_as_json_lines(tmp_path, capsys, default_model_folder):
    out = tmp_path / "diff.jsonl"
    assert run_cli(["compare-models", "--model-b", "default", "--backend-b", "torch", "--text", TEXT,
                    "--top", "3", "--output", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    header, tokens, end = lines[0], lines[1:-1], lines[-1]
    assert header["format"] == "logitlab.model_diff/1" and header["same_tokenizer"] is True
    assert "llamacpp" in header["model_a"] and "torch" in header["model_b"]
    assert header["vocabulary"]["same"] and header["text"] == TEXT
    assert len(tokens) == len(header["token_ids"]) - header["context"] > 5
    assert all(t["type"] == "token" and t["kl_ab"] >= 0 and t["kl_ba"] >= 0 for t in tokens)
    assert "".join(t["text"] for t in tokens) == TEXT[len(TEXT.split()[0]):]  # the first token is context
    by_kl = sorted(tokens, key=lambda t: -t["kl_ab"])
    assert end["type"] == "end" and end["top_divergences"] == [t["index"] for t in by_kl[:3]]
    assert end["summary"]["tokens"] == len(tokens) and 0 < end["summary"]["mean_kl_ab"] < 0.1
    assert "KL(A||B) mean" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.model
def test_the_twin_as_a_table(capsys, default_model_folder):
    assert run_cli(["compare-models", "--model-b", "default", "--backend-b", "torch", "--text", TEXT, "--top", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "vocabulary: the same 49,152 tokens, byte for byte"
    assert "KL(A||B)" in out[3] and "A top in B" in out[3]
    rows = [ln for ln in out[4:] if ln[:5].strip().isdigit()]
    assert len(rows) >= 10 and any(" Paris" in r for r in rows)
    assert any(ln.startswith("top 2 divergences") for ln in out)
    assert out[-1].startswith("[") and "perplexity A" in out[-1]
