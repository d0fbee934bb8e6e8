"""lm-evaluation-harness itself against the server on 127.0.0.1 (issue 46 item 1): its `local-completions`
model, a multiple-choice loglikelihood task and a generate_until task, both defined here over local JSONL
files, tokenizing through the server (`tokenizer_backend=remote`: `/tokenizer_info` and `/tokenize`, no hub).

Its log-likelihoods must be `logitlab-cli score`'s on the same texts (|d| <= 1e-4), its choices those the
scores pick, and its generations the server's own greedy answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

lm_eval = pytest.importorskip("lm_eval", reason="needs lm-eval (the test extra)")

from engine.experiments.trace import read_trace  # noqa: E402
from serve_helpers import served_default_model  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow]

QUESTIONS = [
    {"query": "The capital of France is", "choices": [" Paris", " Berlin", " a small dog"], "gold": 0},
    {"query": "Two plus two equals", "choices": [" four", " green", " seven hundred"], "gold": 0},
    {"query": "The sun rises in the", "choices": [" east", " west", " kitchen"], "gold": 0},
    {"query": "Water freezes at zero degrees", "choices": [" Celsius", " Fahrenheit"], "gold": 0},
]
PROMPTS = [{"question": "The first three letters of the alphabet are", "answer": " A, B"},
           {"question": "Once upon a time", "answer": " there"}]

MC_TASK = """\
task: logitlab_mc
dataset_path: json
dataset_kwargs:
  data_files: {data}
test_split: train
output_type: multiple_choice
doc_to_text: "{{{{query}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: gold
target_delimiter: ""
metric_list:
  - metric: acc
"""
GEN_TASK = """\
task: logitlab_gen
dataset_path: json
dataset_kwargs:
  data_files: {data}
test_split: train
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: ""
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 8
metric_list:
  - metric: exact_match
"""


@pytest.fixture(scope="module")
def served():
    with served_default_model() as triple:
        yield triple


def _tasks(tmp: Path) -> Path:
    tasks = tmp / "tasks"
    tasks.mkdir()
    for name, rows, spec in (("mc", QUESTIONS, MC_TASK), ("gen", PROMPTS, GEN_TASK)):
        data = tmp / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        (tasks / f"{name}.yaml").write_text(spec.format(data=data), encoding="utf-8")
    return tasks


@pytest.fixture(scope="module")
def lm_eval_samples(served, tmp_path_factory):
    """lm-eval's own CLI (as a user runs it) against the server, both tasks, every sample logged; run once."""
    tmp = tmp_path_factory.mktemp("lm_eval")
    return _lm_eval(served[1], tmp, batch_size=4), tmp


def _lm_eval(server, tmp: Path, batch_size: int) -> dict:
    out = tmp / "out"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_CACHE=str(tmp / "datasets"), OPENAI_API_KEY="unused")
    args = [sys.executable, "-m", "lm_eval", "--model", "local-completions",
            "--model_args", f"base_url={server.url}/completions,model=SmolLM2-135M-Instruct,tokenizer_backend=remote,"
                            "tokenized_requests=True,max_retries=1,timeout=300", "--batch_size", str(batch_size),
            "--tasks", "logitlab_mc,logitlab_gen", "--include_path", str(_tasks(tmp)),
            "--log_samples", "--output_path", str(out), "--seed", "1234"]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    samples = {}
    for path in out.rglob("samples_*.jsonl"):
        task = path.name.split("_", 1)[1].rsplit("_", 1)[0]
        samples[task] = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return samples


def test_lm_eval_loglikelihoods_equal_logitlab_score(served, lm_eval_samples, tmp_path):
    engine, server, _ = served
    samples, _ = lm_eval_samples
    mc = sorted(samples["logitlab_mc"], key=lambda s: s["doc_id"])
    assert len(mc) == len(QUESTIONS)
    # The same (context, continuation) pairs scored by `logitlab-cli score --file`: each part tokenized on its
    # own. lm-eval splits the whole text's tokens at the context's length; on these texts the two agree (checked).
    tok = engine.tokenizer
    pairs = [(q["query"], c) for q in QUESTIONS for c in q["choices"]]
    for context, continuation in pairs:
        whole = tok.encode(context + continuation, add_special_tokens=False)
        assert whole == tok.encode(context, add_special_tokens=False) + tok.encode(continuation, add_special_tokens=False)
    items = tmp_path / "pairs.jsonl"
    items.write_text("".join(json.dumps({"context": a, "continuation": b}) + "\n" for a, b in pairs), encoding="utf-8")
    trace = tmp_path / "scores.jsonl"
    done = subprocess.run([sys.executable, "-m", "engine", "score", "--file", str(items), "--output", str(trace)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    cli = [sum(t.logprob for t in run.scored_tokens()) for run in read_trace(trace)]
    assert len(cli) == len(pairs)
    k = 0
    for sample, question in zip(mc, QUESTIONS):
        got = [float(r[0][0]) for r in sample["resps"]]
        want = cli[k:k + len(question["choices"])]
        k += len(question["choices"])
        assert got == pytest.approx(want, abs=1e-4), (question, got, want)
        assert sample["acc"] == float(max(range(len(want)), key=want.__getitem__) == question["gold"])


def test_lm_eval_generate_until_is_the_servers_greedy_answer(served, lm_eval_samples):
    engine, server, _ = served
    samples, _ = lm_eval_samples
    gen = sorted(samples["logitlab_gen"], key=lambda s: s["doc_id"])
    assert len(gen) == len(PROMPTS)
    for sample, row in zip(gen, PROMPTS):
        got = sample["resps"][0][0]
        own = httpx.post(f"{server.url}/completions", timeout=120, json={
            "prompt": row["question"], "max_tokens": 8, "temperature": 0, "stop": ["\n", ".", "<|endoftext|>"]}).json()
        assert got == own["choices"][0]["text"], (got, own)
        assert got  # the model said something
