"""The research API and `batch` on a remote model: llama-cpp-python's server on the default model (127.0.0.1)."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest

pytest.importorskip("llama_cpp.server", reason="needs llama-cpp-python[server] (the test extra)")

from engine.__main__ import main as cli_main  # noqa: E402
from engine.research import LanguageModel  # noqa: E402

GREEDY = {"temperature": 0, "top_k": 0, "top_p": 1, "min_p": 0, "repeat_penalty": 1}


@pytest.fixture(scope="module")
def lm(llama_server_url):
    model = LanguageModel.load(llama_server_url)
    yield model
    model.close()


def _server_greedy(url: str, prompt: str, n: int = 1) -> dict:
    return httpx.post(url + "/completions", json={"prompt": prompt, "max_tokens": n, "logprobs": 5, **GREEDY},
                      timeout=30).json()["choices"][0]


def test_next_token_logprobs_top_token_is_the_servers_greedy_token(lm, llama_server_url):
    prompt = "The capital of France is"
    ids = lm.tokenizer.encode(prompt)
    lp = lm.next_token_logprobs_sync(ids)
    theirs = _server_greedy(llama_server_url, prompt)
    assert lm.tokenizer.decode([int(np.argmax(lp))]) == theirs["text"]
    finite = np.isfinite(lp)
    assert 5 <= finite.sum() <= lm.backend.top_n  # the server's top N, -inf elsewhere
    assert np.exp(lp[finite]).sum() == pytest.approx(1.0, abs=1e-4)  # renormalised over them
    # Differences of log-probs are the server's own (renormalising shifts them all by one constant).
    top = theirs["logprobs"]["top_logprobs"][0]
    second = sorted(top.items(), key=lambda kv: -kv[1])[1]
    second_id = lm.tokenizer.encode(prompt + second[0])[len(ids):]
    assert len(second_id) == 1
    assert lp[second_id[0]] - lp.max() == pytest.approx(second[1] - max(top.values()), abs=1e-3)

    async def both():
        return await lm.batch_next_token_logprobs([ids, lm.tokenizer.encode("One, two,")])

    rows = asyncio.run(both())
    assert rows.shape == (2, lp.shape[0]) and np.array_equal(rows[0], lp)  # the first one is cached


@pytest.mark.slow
def test_batch_cli_on_a_server_matches_the_servers_greedy_text(llama_server_url, tmp_path):
    prompts = ["Once upon a time", "def fib(n):"]
    src, out = tmp_path / "in.txt", tmp_path / "out.jsonl"
    src.write_text("\n".join(prompts) + "\n")
    code = cli_main(["batch", "--model", llama_server_url, "--input", str(src), "--output", str(out),
                     "--max-new-tokens", "2"])
    assert code == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in records] == prompts
    for r in records:
        assert r["text"] == _server_greedy(llama_server_url, r["prompt"], 2)["text"]
        assert len(r["token_ids"]) == 2 and all(lp <= 0 for lp in r["logprobs"])
