"""Issue 36 item 13: the research API's cache (log-prob rows, KV states, the trie) stays within one byte budget.

Rows were never evicted: +2.2 GB per 1,000 prefixes on Gemma 3 (1 MiB a row). Now rows and KV states
share `cache_budget_bytes`, the least recently used goes first, and the trie's emptied nodes go with them.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.research.trie import NODE_OVERHEAD_BYTES, TokenTrie

V = 4096  # a row of 16 KiB


def _row(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(V).astype(np.float32)


def test_rows_alone_stay_within_the_budget_over_many_prefixes():
    budget = 50 * V * 4  # room for about 50 rows
    trie = TokenTrie(budget, lambda state: 0)
    for k in range(1000):  # 1,000 distinct prefixes of 40 tokens: 16 MiB of rows unbounded
        trie.store(tuple(range(k, k + 40)), _row(k))
        assert trie.nbytes <= budget
    assert 30 <= len(trie) <= 50
    # The tree holds only what the cached rows need: evicted prefixes took their nodes with them.
    assert trie.nodes <= len(trie) * 40
    assert trie.nbytes == trie.row_bytes + trie.nodes * NODE_OVERHEAD_BYTES


def test_the_least_recently_used_goes_first():
    trie = TokenTrie(3 * (V * 4 + 2 * NODE_OVERHEAD_BYTES), lambda state: 0)
    a, b, c, d = (1, 2), (3, 4), (5, 6), (7, 8)
    for key in (a, b, c):
        trie.store(key, _row(key[0]))
    assert trie.cached_logprobs(a) is not None  # a is used again: b is now the oldest
    trie.store(d, _row(7))
    assert trie.cached_logprobs(b) is None
    assert all(trie.cached_logprobs(k) is not None for k in (a, c, d))


def test_rows_and_kv_states_share_the_budget_and_kv_has_its_own_cap():
    state_bytes = 3 * V * 4
    budget = 10 * V * 4
    trie = TokenTrie(budget, lambda state: state_bytes, kv_budget_bytes=2 * state_bytes)
    for k in range(40):
        trie.store((k, k + 1, k + 2), _row(k), state=object())
        assert trie.nbytes <= budget
        assert trie.kv_bytes <= 2 * state_bytes
    assert trie.kv_bytes > 0 and trie.row_bytes > 0
    depth, state = trie.deepest_state((39, 40, 41, 99))
    assert depth == 3 and state is not None  # the newest state is kept


def test_a_row_bigger_than_the_whole_budget_is_not_cached():
    trie = TokenTrie(1000, lambda state: 0)
    trie.store((1, 2, 3), _row(0))
    assert len(trie) == 0 and trie.nbytes == 0 and trie.nodes == 0


@pytest.mark.slow
def test_language_model_memory_stays_bounded(tiny_torch):
    from engine.research.lm import LanguageModel

    lm = LanguageModel(tiny_torch)
    row = lm.next_token_logprobs_sync([5, 6, 7]).nbytes
    budget = 8 * row
    lm = LanguageModel(tiny_torch, cache_budget_bytes=budget)
    for k in range(60):
        lm.next_token_logprobs_sync([100 + k, 200 + k, 300 + k, 7])
        assert lm.trie.nbytes <= budget
    assert 0 < len(lm.trie) <= 16
    # Still right after eviction: a prefix asked again is computed again, equal to the first answer.
    again = lm.next_token_logprobs_sync([100, 200, 300, 7])
    lm2 = LanguageModel(tiny_torch)
    np.testing.assert_allclose(again, lm2.next_token_logprobs_sync([100, 200, 300, 7]), atol=1e-5)
