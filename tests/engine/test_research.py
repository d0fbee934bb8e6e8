"""Research APIs checked against transformers on the same weights (tiny random Llama), on torch and MLX."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from engine.research import LanguageModel

RAGGED = [[5, 17, 99, 1203, 7, 8], [400, 401], [9, 10, 11, 12], [31000]]


def hf_greedy(model, row, n):
    with torch.inference_mode():
        out = model.generate(torch.tensor([row]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(row):].tolist()


def hf_logprobs(model, ids):
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].double()
    return torch.log_softmax(logits, -1).numpy()


@pytest.fixture
def lm(tiny_torch):
    model = LanguageModel(tiny_torch)
    yield model
    model._executor.shutdown()


@pytest.mark.slow
def test_batch_greedy_equals_rows_and_transformers(lm, tiny_torch):
    out = lm.generate(RAGGED, max_new_tokens=10)
    width = max(map(len, RAGGED))
    assert out.shape == (4, width + 10)
    for i, row in enumerate(RAGGED):
        assert out[i, width - len(row):width].tolist() == row  # left-padded prompt
        alone = lm.generate([row], max_new_tokens=10)[0, len(row):].tolist()
        assert out[i, width:].tolist() == alone == hf_greedy(tiny_torch.model, row, 10)


def test_stop_pads_a_row_and_all_stopped_ends_early(lm):
    first = lm.generate([RAGGED[0]], max_new_tokens=6)[0, len(RAGGED[0]):]
    stop = int(first[2])
    out = lm.generate([RAGGED[0]], max_new_tokens=6, stop=stop)[0, len(RAGGED[0]):]
    assert out[:3].tolist() == first[:3].tolist() and (out[3:] == -1).all()  # -1: no token (a pad id is one)
    calls = lm.forward_calls
    lm.generate([RAGGED[0]], max_new_tokens=6, stop=stop)
    assert lm.forward_calls - calls == 3  # prefill + 2 steps; the rest was skipped


def test_seeded_batch_sampling_is_reproducible_and_row_independent(lm):
    a = lm.generate(RAGGED, max_new_tokens=8, do_sample=True, temperature=1.0, seed=5)
    b = lm.generate(RAGGED, max_new_tokens=8, do_sample=True, temperature=1.0, seed=5)
    assert (a == b).all()


def test_trie_cached_logprobs_equal_uncached_including_after_eviction(tiny_torch):
    base = list(range(1000, 1040))
    seqs = [base[:10], base[:25], base, base[:25] + [7, 8, 9], base + [1, 2]]
    for budget in (1 << 30, 1):  # roomy, and so small that every KV state is evicted at once
        lm = LanguageModel(tiny_torch, kv_budget_bytes=budget)
        for s in seqs:
            got = lm.next_token_logprobs_sync(s)
            np.testing.assert_allclose(got, hf_logprobs(tiny_torch.model, s), atol=1e-5)
        if budget == 1:
            assert lm.trie.kv_bytes == 0
        # Cached answers are returned as is.
        calls = lm.forward_calls
        assert np.array_equal(lm.next_token_logprobs_sync(seqs[2]), lm.trie.cached_logprobs(tuple(seqs[2])))
        assert lm.forward_calls == calls


def test_lru_eviction_keeps_the_budget(tiny_torch):
    lm = LanguageModel(tiny_torch)
    lm.next_token_logprobs_sync(list(range(100, 120)))
    one = lm.trie.kv_bytes
    lm = LanguageModel(tiny_torch, kv_budget_bytes=int(one * 2.5))
    for k in range(5):
        lm.next_token_logprobs_sync(list(range(100 + k, 120 + k)))
        assert lm.trie.kv_bytes <= lm.trie.kv_budget_bytes
    assert 0 < lm.trie.kv_bytes


def test_extension_runs_only_new_tokens(tiny_torch, monkeypatch):
    lm = LanguageModel(tiny_torch)
    prefix = list(range(200, 260))
    lm.next_token_logprobs_sync(prefix)
    seen = []
    real = lm.runner.forward_rows
    monkeypatch.setattr(lm.runner, "forward_rows", lambda rows, **kw: (seen.append([len(t) for _, t in rows]), real(rows, **kw))[1])
    lm.next_token_logprobs_sync(prefix + [5, 6])
    assert seen == [[2]]


def test_async_requests_are_batched_and_deduplicated(lm):
    prefix = list(range(300, 340))

    async def run():
        reqs = [prefix + [i] for i in range(7)] + [prefix + [0]]  # 8 requests, one duplicate
        return await asyncio.gather(*(lm.next_token_logprobs(r) for r in reqs))

    calls = lm.forward_calls
    results = asyncio.run(run())
    assert lm.forward_calls - calls == 2  # their shared 40-token prefix once, then all 7 distinct rows in one batch
    assert np.array_equal(results[0], results[7])
    np.testing.assert_allclose(results[3], hf_logprobs(lm.backend.model, prefix + [3]), atol=1e-5)


def test_empty_token_ids_raise(lm):
    with pytest.raises(ValueError, match="empty"):
        lm.next_token_logprobs_sync([])
    with pytest.raises(ValueError):
        asyncio.run(lm.next_token_logprobs([]))


def test_sample_and_batch_sample(lm):
    ids, total = lm.sample([5, 6, 7], max_tokens=5, seed=1)
    assert len(ids) == 5 and total < 0
    assert lm.sample([5, 6, 7], max_tokens=5, seed=1) == (ids, total)
    batch = lm.batch_sample([[5, 6, 7], [8, 9]], max_tokens=4, seed=1)
    assert batch[0] == lm.sample([5, 6, 7], max_tokens=4, seed=1)


@pytest.mark.parametrize("length_penalty, early_stopping", [(1.0, False), (0.5, True), (2.0, "never")])
def test_beam_search_equals_transformers(lm, tiny_torch, length_penalty, early_stopping):
    prompt = [5, 17, 99, 1203]
    ours = lm.beam_search(prompt, num_beams=4, max_new_tokens=8, length_penalty=length_penalty,
                          early_stopping=early_stopping, num_return_sequences=2)
    with torch.inference_mode():
        ref = tiny_torch.model.generate(
            torch.tensor([prompt]), num_beams=4, max_new_tokens=8, do_sample=False, length_penalty=length_penalty,
            early_stopping=early_stopping, num_return_sequences=2, output_scores=True, return_dict_in_generate=True,
        )
    for i, r in enumerate(ours):
        expected = ref.sequences[i].tolist()
        n = len(r.token_ids)
        assert list(r.token_ids) == expected[:n]
        assert all(t == tiny_torch.model.generation_config.pad_token_id for t in expected[n:])  # only padding after
        assert abs(r.score - float(ref.sequences_scores[i])) < 1e-4


def test_agenerate_does_not_block_the_loop(lm):
    async def run():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        t = asyncio.create_task(ticker())
        out = await lm.agenerate(RAGGED, max_new_tokens=16)
        t.cancel()
        return out, ticks

    out, ticks = asyncio.run(run())
    assert out.shape[0] == 4 and ticks > 3


mlx_lm = pytest.importorskip("mlx_lm")


@pytest.fixture(scope="module")
def tiny_mlx_lm(tiny_llama_folder):
    from engine.backends.mlx.backend import MlxBackend

    backend = MlxBackend(tiny_llama_folder, spec="tiny", display_name="tiny")
    lm = LanguageModel(backend)
    yield lm
    lm.close()


@pytest.mark.mlx
def test_mlx_batch_greedy_equals_torch(tiny_mlx_lm, lm):
    assert (tiny_mlx_lm.generate(RAGGED, max_new_tokens=10) == lm.generate(RAGGED, max_new_tokens=10)).all()


@pytest.mark.mlx
def test_mlx_trie_logprobs_equal_uncached(tiny_mlx_lm, tiny_torch):
    base = list(range(1000, 1030))
    for s in (base[:12], base, base + [4, 5], base[:12] + [9]):
        np.testing.assert_allclose(tiny_mlx_lm.next_token_logprobs_sync(s), hf_logprobs(tiny_torch.model, s), atol=1e-4)


@pytest.mark.mlx
def test_mlx_beam_search_equals_torch(tiny_mlx_lm, lm):
    a = tiny_mlx_lm.beam_search([5, 17, 99], num_beams=4, max_new_tokens=6)
    b = lm.beam_search([5, 17, 99], num_beams=4, max_new_tokens=6)
    assert a[0].token_ids == b[0].token_ids and abs(a[0].score - b[0].score) < 1e-3


def test_shared_prefix_of_a_batch_runs_once(tiny_torch, monkeypatch):
    lm = LanguageModel(tiny_torch)
    prefix = list(range(500, 600))
    seen = []
    real = lm.runner.forward_rows
    monkeypatch.setattr(lm.runner, "forward_rows", lambda rows, **kw: (seen.append([len(t) for _, t in rows]), real(rows, **kw))[1])
    got = lm.batch_next_token_logprobs_sync([prefix + [i, i + 1] for i in range(6)])
    assert seen == [[100], [2] * 6]  # the prefix once, then only each row's own tokens
    np.testing.assert_allclose(got[4], hf_logprobs(tiny_torch.model, prefix + [4, 5]), atol=1e-5)
