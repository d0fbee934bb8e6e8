"""Scoring in one teacher-forced pass: every position's logits in chunks, on torch, llama.cpp and MLX.

Oracles: transformers' own all-positions forward (torch), llama-cpp-python's
`Llama(logits_all=True)` (llama.cpp), the step-by-step scorer (decode-loop
numbers), and the two backends against each other on the default model.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import engine.backends.chunks as positions
from engine import GenerationRequest, SamplerSettings
from engine.decode.loop import generate_events
from engine.events import TokenEvent
from engine.experiments import score, score_ids, score_step_by_step, text_ids
from engine.backends.chunks import positions_per_chunk
from engine.backends.torch.runner import TorchRunner
from engine.capabilities import PositionRunners

TEXT = (
    "Grüße aus Köln — 東京は晴れ 🙂, said the fox. "
    "The lighthouse keeper climbed the narrow stairs every evening."
)
CHUNK = 16  # positions per forward in these tests, so that a short text takes several chunks


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


@pytest.fixture
def small_chunks(monkeypatch):
    """Make the chunk length `CHUNK` positions at the default model's 49k vocabulary."""
    monkeypatch.setattr(positions, "LOGITS_BUDGET", CHUNK * 49_152)
    assert positions_per_chunk(49_152) == CHUNK


def test_chunk_length_bounds_the_logits_held_at_once():
    assert positions_per_chunk(49_152) == 256  # SmolLM2: 48 MiB of float32 logits per forward
    assert positions_per_chunk(262_144) == 48  # Gemma 3: the same budget, fewer positions
    assert positions_per_chunk(10_000_000) == positions.MIN_CHUNK
    assert list(positions.chunk_spans(40, 16, first=20)) == [(0, 16, 0), (16, 32, 12), (32, 40, 8)]


@pytest.mark.slow
def test_torch_and_llamacpp_scores_agree_in_one_forward_per_chunk(
    small_chunks, fresh_default_torch, fresh_default_llamacpp
):
    ids, context = text_ids(fresh_default_torch.tokenizer, TEXT)
    assert text_ids(fresh_default_llamacpp.tokenizer, TEXT) == (ids, context) and context == 1
    run = len(ids) - 1  # the last token predicts nothing and is not run
    results = {}
    for backend in (fresh_default_torch, fresh_default_llamacpp):
        backend.forward([9690, 28, 905])  # a conversation in the backend's own cache...
        result = score(backend, TEXT)
        assert list(backend.cached_tokens()) == [9690, 28, 905]  # ...is left as it was
        assert len(result.tokens) == run and result.reused_tokens == 0
        assert result.forward_calls == math.ceil(run / CHUNK) == 3  # not one per token
        results[backend.name] = result
    t, lc = results["torch"], results["llamacpp"]
    # torch (float32) against transformers' own all-positions forward, across chunk boundaries.
    import torch

    with torch.inference_mode():
        oracle = _log_softmax(fresh_default_torch.model(input_ids=torch.tensor([ids])).logits[0].double().numpy())
    assert max(abs(s.logprob - oracle[s.index - 1, s.token_id]) for s in t.tokens) < 1e-4
    # llama.cpp runs the Q4_1 file: close to float32 torch, not equal (measured: mean 0.07, max 0.19 nats).
    diff = np.array([a.logprob - b.logprob for a, b in zip(t.tokens, lc.tokens)])
    assert np.abs(diff).mean() < 0.15 and np.abs(diff).max() < 1.0
    assert lc.perplexity == pytest.approx(t.perplexity, rel=0.05)
    assert np.mean([a.top[0].token_id == b.top[0].token_id for a, b in zip(t.tokens, lc.tokens)]) >= 0.8


@pytest.mark.slow
def test_llamacpp_scores_equal_llama_cpp_pythons_own_all_positions_logits(small_chunks, fresh_default_llamacpp):
    llama_cpp = pytest.importorskip("llama_cpp")
    backend = fresh_default_llamacpp
    ids, context = text_ids(backend.tokenizer, TEXT)
    result = score_ids(backend, ids, context=context)
    # flash attention as our contexts get it by default on CPU (llama.cpp's "auto")
    oracle = llama_cpp.Llama(str(backend.path), logits_all=True, n_ctx=256, n_threads=backend.n_threads,
                             flash_attn=True, verbose=False)
    try:
        oracle.eval(ids[:-1])
        lp = _log_softmax(np.array(oracle.scores[: len(ids) - 1]))
    finally:
        oracle.close()
    assert max(abs(s.logprob - lp[s.index - 1, s.token_id]) for s in result.tokens) < 1e-4
    want_ranks = [int((lp[s.index - 1] > lp[s.index - 1, s.token_id]).sum()) for s in result.tokens]
    assert [s.rank for s in result.tokens] == want_ranks
    # Cancelled after the first chunk: that chunk's positions, then nothing more.
    checks = iter(range(100))
    partial = score_ids(backend, ids, context=context, cancelled=lambda: next(checks) >= 1)
    assert len(partial.tokens) == CHUNK and partial.forward_calls == 1
    assert [s.logprob for s in partial.tokens] == [s.logprob for s in result.tokens[:CHUNK]]


def test_scoring_a_generated_answer_on_torch_reproduces_its_recorded_logprobs(fresh_default_torch):
    """The decode loop's incremental numbers, recomputed in one batched pass (float32: equal within 1e-4)."""
    backend = fresh_default_torch
    request = GenerationRequest(prompt="The capital of France is", sampler=SamplerSettings(temperature=0.9, seed=3),
                                max_new_tokens=8, ignore_eos=True, top_n=20)
    events = [e for e in generate_events(backend, request) if isinstance(e, TokenEvent)]
    prompt = backend.tokenizer.encode("The capital of France is")
    result = score_ids(backend, prompt + [e.token_id for e in events], context=len(prompt))
    assert result.forward_calls == 1
    for scored, event in zip(result.tokens, events, strict=True):
        assert scored.logprob == pytest.approx(event.logprob, abs=1e-4)
        assert scored.entropy == pytest.approx(event.entropy, abs=1e-3)
        if scored.rank != event.rank:  # only a near-tie may swap places between batched and incremental float32
            assert abs(event.top_model[scored.rank].logprob - event.logprob) < 1e-4


def test_torch_runner_sequence_logprobs_do_not_depend_on_the_chunk(tiny_torch):
    runner = TorchRunner(tiny_torch.model)
    ids = tiny_torch.tokenizer.encode("a few words to run through the model in several chunks")
    whole = runner.sequence_logprobs(ids)  # (T, V)
    assert whole.shape == (len(ids), tiny_torch.info.vocab_size) and runner.forward_calls == 1
    np.testing.assert_allclose(np.exp(whole).sum(axis=1), 1.0, atol=1e-4)
    chunked = np.concatenate(list(runner.position_logits(ids, first=3, chunk=4)))
    assert runner.forward_calls == 1 + math.ceil(len(ids) / 4)
    np.testing.assert_allclose(_log_softmax(chunked), whole[3:], atol=1e-4)


def test_backends_without_all_positions_logits_score_step_by_step():
    from engine.backends.mock import MockBackend

    backend = MockBackend()
    assert not isinstance(backend, PositionRunners)
    ids = backend.tokenizer.encode(" the old man and the sea")
    result = score_ids(backend, ids)
    assert result.forward_calls == len(ids) - 1  # the fallback: one forward per position
    assert [t.logprob for t in result.tokens] == [t.logprob for t in score_step_by_step(backend, ids).tokens]
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        score_ids(backend, [ids[0], 10**6])


@pytest.mark.mlx
def test_mlx_scores_equal_its_step_by_step_scores_and_torch(tiny_llama_folder, tiny_torch):
    pytest.importorskip("mlx_lm")
    from engine.backends.mlx.backend import MlxBackend

    backend = MlxBackend(tiny_llama_folder, spec=str(tiny_llama_folder), display_name="tiny-llama")
    try:
        ids = backend.tokenizer.encode("a few words to run through the model in several chunks")
        runner = backend.position_runner(len(ids))
        chunked = np.concatenate(list(runner.position_logits(ids, first=2, chunk=4)))
        assert runner.forward_calls == math.ceil(len(ids) / 4)
        torch_lp = TorchRunner(tiny_torch.model).sequence_logprobs(ids)
        np.testing.assert_allclose(_log_softmax(chunked), torch_lp[2:], atol=1e-4)
        batched, stepwise = score_ids(backend, ids), score_step_by_step(backend, ids)
        assert batched.forward_calls == 1
        np.testing.assert_allclose([t.logprob for t in batched.tokens], [t.logprob for t in stepwise.tokens], atol=1e-4)
    finally:
        backend.close()
