"""`logitlab-cli replay TRACE` (issue 35 item 4): a traced answer run again, the verdict and the fingerprint fields
that differ; a trace that cannot be replayed is refused in one line before any model loads."""

from __future__ import annotations

import json

import pytest
from cli_checks import one_error_line, refuse_model_load, run_cli

from engine.experiments.trace import read_trace


@pytest.fixture(scope="module")
def compare_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("replay") / "cmp.jsonl"
    assert run_cli(["compare", "-p", "Once upon a time", "--settings", '{"temperature": 0.8}',
                    "--settings", '{"temperature": 0.9, "top_k": 40}', "-s", "5", "-n", "10",
                    "--output", str(path), "--backend", "llamacpp"]) == 0
    return path


@pytest.mark.slow
@pytest.mark.model
def test_replay_of_a_trace_is_identical_and_names_changed_threads(compare_trace, capsys, default_model_folder):
    runs = read_trace(compare_trace)
    assert all(len(r.end["fingerprint"]["model_sha256"]) == 64 for r in runs)  # traces carry the fingerprint
    capsys.readouterr()
    assert run_cli(["replay", str(compare_trace), "--backend", "llamacpp"]) == 0
    out = capsys.readouterr().out
    assert "run 0: identical (10 tokens traced, 10 replayed)" in out and "run 1: identical" in out
    threads = runs[1].end["fingerprint"]["numerics"][0][1]
    other = 2 if threads == 1 else 1
    assert run_cli(["replay", str(compare_trace), "--run", "1", "-t", str(other), "--backend", "llamacpp"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("run 1: identical") and f"n_threads {threads} -> {other}" in out


@pytest.mark.slow
@pytest.mark.model
def test_replay_of_an_edited_trace_says_where_it_diverged(compare_trace, tmp_path, capsys, default_model_folder):
    lines = [json.loads(x) for x in compare_trace.read_text().splitlines()]
    tokens = [i for i, d in enumerate(lines) if d["type"] == "token"]
    third = lines[tokens[2]]
    third["token_id"], third["token_text"] = third["token_id"] + 1, "edited"
    lines[tokens[0]]["logprob"] -= 0.5
    path = tmp_path / "edited.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in lines))
    capsys.readouterr()
    assert run_cli(["replay", str(path), "--run", "0", "--backend", "llamacpp"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("run 0: diverged at token 3 ('edited' vs ")


BAD = {
    "missing.jsonl": None,
    "not-json.jsonl": "this is not json\n",
    "no-prompt.jsonl": json.dumps({"type": "header", "format": "logitlab.trace/1", "kind": "generation",
                                   "settings": {}, "seed": 1, "prompt_ids": None}) + "\n",
    "no-seed.jsonl": json.dumps({"type": "header", "format": "logitlab.trace/1", "kind": "generation",
                                 "settings": {}, "seed": "x", "prompt_ids": [1, 2]}) + "\n",
    "bad-settings.jsonl": json.dumps({"type": "header", "format": "logitlab.trace/1", "kind": "generation",
                                      "settings": {"temperature": "hot"}, "seed": 1, "prompt_ids": [1, 2]}) + "\n",
    "negative-id.jsonl": json.dumps({"type": "header", "format": "logitlab.trace/1", "kind": "generation",
                                     "settings": {}, "seed": 1, "prompt_ids": [1, -2]}) + "\n",
    "score-only.jsonl": json.dumps({"type": "header", "format": "logitlab.trace/1", "kind": "score",
                                    "prompt_ids": [1, 2]}) + "\n",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_trace_that_cannot_be_replayed_is_refused_before_the_model_loads(name, tmp_path, capsys, monkeypatch):
    refuse_model_load(monkeypatch)
    path = tmp_path / name
    if BAD[name] is not None:
        path.write_text(BAD[name])
    assert run_cli(["replay", str(path)]) == 2
    line = one_error_line(capsys)
    assert len(line) < 300, line


@pytest.mark.slow
@pytest.mark.model
def test_cli_audit_on_llamacpp_reports_exactly_zero(capsys, default_model_folder):
    assert run_cli(["audit", "-p", "Once upon a time", "--rows", "3", "-n", "8", "--temp", "0.9", "-s", "7",
                    "--backend", "llamacpp"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [f"row {r} (seed {7 + r}): identical; largest |Δ log-prob| 0" for r in range(3)] + [
        "3 rows; largest |Δ log-prob| 0; every row identical"]


@pytest.mark.parametrize("rows", ["1", "17"])
def test_cli_audit_refuses_a_row_count_before_the_model_loads(rows, capsys, monkeypatch):
    refuse_model_load(monkeypatch)
    assert run_cli(["audit", "-p", "x", "--rows", rows]) == 2
    assert "from 2 to 16" in one_error_line(capsys)


@pytest.mark.slow
@pytest.mark.model
def test_replay_of_a_json_schema_answer_keeps_its_schema(tmp_path, capsys, default_model_folder):
    """A served answer's trace records its constraint only in the fingerprint (the server's header has none):
    the replay ran it unconstrained and diverged at token 1 ('{' vs 'I')."""
    from engine import Constraint, Engine, GenerationRequest, SamplerSettings
    from engine.events import Done
    from engine.experiments.trace import generation_run, write_lines

    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    request = GenerationRequest(messages=({"role": "user", "content": "Invent a character."},), max_new_tokens=12,
                                sampler=SamplerSettings(temperature=1.0, seed=9),
                                constraint=Constraint.json_schema(schema))
    with Engine.load(None, backend="llamacpp") as engine:
        events = list(engine.generate(request))
        ids = engine.tokenizer.chat_ids(request.messages, add_generation_prompt=True)
        info = engine.info
    done = events.pop()
    assert isinstance(done, Done) and events[0].token_text.startswith("{")
    assert done.stats.fingerprint.extras["constraint"]["kind"] == "json_schema"
    path = tmp_path / "served.jsonl"
    with path.open("w") as out:
        write_lines(out, generation_run(model=info, prompt_ids=ids, settings=request.sampler, seed=done.stats.seed,
                                        events=events, stats=done.stats))
    capsys.readouterr()
    assert run_cli(["replay", str(path), "--backend", "llamacpp"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("run 0: identical"), out
