"""`LanguageModel` on llama.cpp: trie logprobs, batched rows, generate, sample and beams, against the backend."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from engine.backends.llamacpp import LlamaCppBackend  # noqa: E402
from engine.research.lm import LanguageModel  # noqa: E402


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max()
    return x - np.log(np.exp(x).sum())


@pytest.fixture(scope="module")
def lm(tiny_gguf):
    model = LanguageModel(LlamaCppBackend(tiny_gguf, spec="tiny", display_name="tiny"))
    yield model
    model.close()


def backend_logprobs(lm: LanguageModel, ids) -> np.ndarray:
    lm.backend.trim_cache(0)
    return log_softmax(lm.backend.forward(list(ids)))


def backend_greedy(lm: LanguageModel, ids, n: int) -> list[int]:
    lm.backend.trim_cache(0)
    logits, out = lm.backend.forward(list(ids)), []
    for _ in range(n):
        out.append(int(logits.argmax()))
        logits = lm.backend.forward([out[-1]])
    return out


def test_next_token_logprobs_batch_in_one_call_and_equal_the_backends(lm):
    lm.clear_cache()
    prefix = lm.tokenizer.encode("a shared prefix of a dozen tokens or so, ")
    rows = [prefix + lm.tokenizer.encode(s, add_special_tokens=False) for s in ("cat", "dog", "🐉")]
    calls, evaluated = lm.forward_calls, lm.runner.tokens_evaluated
    got = lm.batch_next_token_logprobs_sync(rows)
    # the shared prefix once, then the rows: one-token rows share a llama_batch, a row of several tokens has its
    # own (mixing them computes wrongly, llama.cpp #24962: see the runner)
    assert lm.forward_calls - calls <= 1 + len(rows)
    assert lm.runner.tokens_evaluated - evaluated == len(prefix) + sum(len(r) - len(prefix) for r in rows)
    for row, lp in zip(rows, got):
        np.testing.assert_allclose(lp, backend_logprobs(lm, row), atol=1e-4)
    calls = lm.forward_calls
    again = lm.next_token_logprobs_sync(rows[1])  # cached in the trie
    assert lm.forward_calls == calls and np.array_equal(again, got[1])
    longer = rows[1] + [104, 105]  # extends a cached prefix state: restored, only 2 tokens run
    evaluated = lm.runner.tokens_evaluated
    np.testing.assert_allclose(lm.next_token_logprobs_sync(longer), backend_logprobs(lm, longer), atol=1e-4)
    assert lm.runner.tokens_evaluated - evaluated == 2


def test_batch_generate_rows_equal_each_prompt_alone(lm):
    prompts = [lm.tokenizer.encode(s) for s in ("Once upon", "The capital of France is", "x")]
    out = lm.generate(prompts, max_new_tokens=12)
    width = max(len(p) for p in prompts)
    for row, prompt in zip(out, prompts):
        assert row[width - len(prompt) : width].tolist() == prompt
        assert row[width:].tolist() == backend_greedy(lm, prompt, 12)


def test_seeded_sampling_is_reproducible_and_scores_its_tokens(lm):
    prompt = lm.tokenizer.encode("Once upon a time")
    first = lm.sample(prompt, 10, seed=7)
    assert lm.sample(prompt, 10, seed=7) == first
    tokens, total = first
    expected = sum(backend_logprobs(lm, prompt + tokens[:i])[t] for i, t in enumerate(tokens))
    assert total == pytest.approx(expected, abs=1e-3)


def test_beam_search_finds_a_sequence_at_least_as_likely_as_greedy(lm):
    prompt = lm.tokenizer.encode("The capital of France is")
    n = 6
    [best] = lm.beam_search(prompt, num_beams=4, max_new_tokens=n, length_penalty=0.0)
    greedy = backend_greedy(lm, prompt, n)

    def score(gen):
        return sum(backend_logprobs(lm, prompt + list(gen[:i]))[t] for i, t in enumerate(gen))

    assert len(best.generated) == n
    assert best.score == pytest.approx(score(best.generated), abs=1e-3)
    assert best.score >= score(greedy) - 1e-4
    [one] = lm.beam_search(prompt, num_beams=1, max_new_tokens=n, length_penalty=0.0)
    assert list(one.generated) == greedy


@pytest.mark.model
def test_the_default_model_loads_for_research_on_llamacpp():
    model = LanguageModel.load(None)
    try:
        assert model.backend.name == "llamacpp"
        out = model.generate([model.tokenizer.encode("The capital of France is")], max_new_tokens=3)
        assert "Paris" in model.tokenizer.decode(out[0].tolist())
    finally:
        model.close()


@pytest.mark.slow  # seconds on two cores (junit times, 2026-12-04)
def test_rows_decoded_together_equal_each_row_decoded_alone(fresh_default_llamacpp):
    """llama.cpp computes a batch that mixes sequences wrongly once it holds enough tokens (llama.cpp #24962):
    here two 32-token prompts in one batch, or 64 one-token steps, were up to 1.6 off in the logits. The runner
    keeps such batches apart; every row must equal its sequence decoded alone, bit for bit."""
    from engine.backends.llamacpp.runner import LlamaCppRunner

    # Not smaller: 64 rows of 32 tokens are the batch size at which llama.cpp's mixing went wrong (see above).
    tok = fresh_default_llamacpp.tokenizer
    words = "the sea is wide and deep and the ships sail on it under a grey sky while gulls cry".split()
    prompts = [tok.encode(" ".join(2 * (words[i:] + words[:i])), add_special_tokens=False)[:32] for i in range(4)]
    assert all(len(p) == 32 for p in prompts)

    def alone(prompt: list[int], then: int) -> tuple[np.ndarray, np.ndarray]:
        runner = LlamaCppRunner(fresh_default_llamacpp, max_seqs=4)
        try:
            return runner.start([prompt])[0], runner.step([then])[0]
        finally:
            runner.close()

    expected = [alone(p, 11) for p in prompts]
    runner = LlamaCppRunner(fresh_default_llamacpp, max_seqs=128)
    try:
        rows = [prompts[i % 4] for i in range(64)]
        first = runner.start(rows)  # 64 prompts of 32 tokens
        after = runner.step([11] * 64)  # then 64 one-token steps
    finally:
        runner.close()
    for i in range(64):
        assert np.array_equal(first[i], expected[i % 4][0]), i
        assert np.array_equal(after[i], expected[i % 4][1]), i


@pytest.mark.slow  # seconds on two cores (junit times, 2026-12-04)
def test_beams_past_a_full_cache_free_the_cells_dropped_rows_left(fresh_default_llamacpp, caplog):
    """`reorder` keeps the cells of rows that left (exact numbers, tests/engine/test_decode_core.py); a long
    beam-style run fills a small cache with them, and the runner then frees them and goes on."""
    from engine.backends.llamacpp.runner import LlamaCppRunner

    caplog.set_level("INFO", logger="engine.backends.llamacpp.runner")
    runner = LlamaCppRunner(fresh_default_llamacpp, max_seqs=6, n_ctx=256)
    try:
        prompt = fresh_default_llamacpp.tokenizer.encode("Once upon a time", add_special_tokens=False)
        runner.start([prompt])
        runner.reorder([0, 0, 0])
        for step in range(120):  # 3 new cells a step, 2 of them left behind: 244 dropped + 124 live > 256
            logits = runner.step([11 + step % 7, 12, 13])
            runner.reorder([0, 0, 0])  # the first row's beam wins: the other two rows' new cells are dropped
        assert np.isfinite(logits).all() and logits.shape[0] == 3
        assert runner._lens == [len(prompt) + 120] * 3
        assert "freeing the cells dropped rows left behind" in caplog.text  # the cache did fill
    finally:
        runner.close()


@pytest.mark.slow  # seconds on two cores (junit times, 2026-12-04)
def test_prompts_that_begin_alike_compute_their_beginning_once_and_equal_each_alone(fresh_default_llamacpp):
    """A shared beginning (a chat template's system prompt) is computed once, or taken from the backend's own
    cache, and its cells shared by every row; each row's logits are still its prompt's alone, bit for bit."""
    from engine.backends.llamacpp.runner import LlamaCppRunner

    backend = fresh_default_llamacpp
    tok = backend.tokenizer
    head = tok.encode("You are a careful assistant who answers in one short sentence, always politely, and never "
                      "in more than twenty words.", add_special_tokens=False)
    assert len(head) >= 16  # long enough to be taken from the backend's cache (kv_share.MIN_REUSE)
    tails = [tok.encode(t, add_special_tokens=False) for t in (" Why is the sky blue?", " Hi", " Name a fish.")]
    prompts = [head + t for t in tails]

    def alone(prompt: list[int]) -> np.ndarray:
        runner = LlamaCppRunner(backend, max_seqs=2)
        try:
            return runner.start([prompt])[0]
        finally:
            runner.close()

    expected = [alone(p) for p in prompts]
    for cached in (False, True):
        if cached:
            backend.forward(head)  # the backend's own context now holds the beginning
        runner = LlamaCppRunner(backend, max_seqs=8)
        try:
            logits = runner.start(prompts)
            evaluated = runner.tokens_evaluated
        finally:
            runner.close()
        for i in range(len(prompts)):
            assert np.array_equal(logits[i], expected[i]), (cached, i)
        computed_head = 0 if cached else len(head)
        assert evaluated == computed_head + sum(len(t) for t in tails), cached
