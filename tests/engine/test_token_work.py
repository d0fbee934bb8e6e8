"""The per-token work done once (issue 47): the row's head shared by top-k, the model's top N and the rank, and
the stage records' removed tokens found at once, give exactly what the report gave before.

The reference below is the report as it was (engine/sampling/pick.py before issue 47: its own look at the whole
row for the top N and the rank, a top-k mask, `Dist.score` per watched token), run on a chain that does not share
the head; the new report must equal it field for field, float for float, over whole answers of the real models
on llama.cpp, every stage, on both vocabularies (SmolLM2's 49k, Gemma 3's 262k).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import engine.sampling.chain as chain_module
from engine.backend import prefill
from engine.sampling import SamplerChain, SamplerSettings
from engine.sampling.distribution import Dist, mass_kept, top_local
from engine.sampling.head import RowHead
from engine.sampling.pick import Choice, Pick, StageStats

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a message in a bottle."}]
# The window's default (top-k first: the head's fast path), one with full-row stages before any cut (penalties,
# XTC) and min-p the only filter, and greedy.
SETTINGS = {
    "balanced": SamplerSettings(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=7),
    "creative": SamplerSettings(temperature=1.2, min_p=0.05, repetition_penalty=1.05, xtc_probability=0.5,
                                xtc_threshold=0.1, seed=7),
    "topk_after_penalty": SamplerSettings(temperature=0.7, top_k=20, repetition_penalty=1.1, seed=7),
    "greedy": SamplerSettings(temperature=0, top_k=40, seed=7),
}
TOKENS = 24


def reference_report(choice: Choice, top_n: int) -> Pick:
    """`Choice.report` as it was before issue 47 (the whole row looked at for each summary)."""
    scores, token, names = choice._scores, choice.token_id, choice._names
    model = Dist(scores)
    model_top = _top_without_head(model, top_n)
    recorded: list[StageStats] | None = None
    if choice._steps is not None:
        recorded = []
        dist = model
        watched = dict.fromkeys([t for t, _ in model_top] + [token])
        for name, ids, vals in choice._steps:
            if vals is None:
                recorded.append(StageStats(name, dist.count, 1.0, dist.entropy, names(dist.top(top_n))))
                continue
            after = Dist(vals, ids)
            top = after.top(top_n)
            removed = tuple(t for t in watched if dist.score(t) != -math.inf and after.score(t) == -math.inf)
            recorded.append(StageStats(name, after.count, mass_kept(dist, after), after.entropy, names(top), removed))
            watched.update(dict.fromkeys(t for t, _ in top))
            dist = after
    if choice._final is None:
        best = choice._best
        sampler_logprob = 0.0 if token == best else -math.inf
        top_sampler = ((best, 0.0),) if top_n > 0 else ()
    else:
        sampler_logprob = choice._final.logprob(token)
        top_sampler = choice._final.top(top_n)
    return Pick(token_id=token, logprob=model.logprob(token), sampler_logprob=sampler_logprob,
                rank=int(np.count_nonzero(scores > scores[token])), entropy=model.entropy,
                top_model=names(model_top), top_sampler=names(top_sampler),
                stages=tuple(recorded) if recorded is not None else None, forced=choice.forced)


def _top_without_head(model: Dist, n: int) -> tuple[tuple[int, float], ...]:
    n = min(n, model.count)
    if n <= 0:
        return ()
    local = top_local(model.vals, n)
    ids = local if model.ids is None else model.ids[local]
    vals = model.vals[local]
    order = np.lexsort((ids, -vals))
    return tuple((int(ids[i]), float(vals[i]) - model.lse) for i in order)


def _answer(backend, settings: SamplerSettings, monkeypatch) -> int:
    """Decode TOKENS tokens; at each, the report of a head-sharing chain must equal the reference report of a
    chain without the head (the old top-k mask and looks at the whole row). Returns the stages compared."""
    backend.trim_cache(0)
    prompt = backend.tokenizer.chat_ids(PROMPT)
    logits, _ = prefill(backend, prompt)
    new = SamplerChain(settings, vocab=backend.tokenizer)
    old = SamplerChain(settings, vocab=backend.tokenizer)
    history = list(prompt)
    compared = 0
    for _ in range(TOKENS):
        hist = np.asarray(history, dtype=np.int64)
        fresh = new.choose(logits, hist, record_stages=True)
        with monkeypatch.context() as m:
            m.setattr(chain_module, "RowHead", lambda row, top: None)  # the chain as it was: no shared head
            before = old.choose(logits, hist, record_stages=True)
        assert before._head is None and fresh._head is not None
        pick = fresh.report(20)
        assert pick == reference_report(before, 20)
        assert fresh.report(0) == reference_report(before, 0)
        compared += len(pick.stages or ())
        history.append(fresh.token_id)
        logits = backend.forward([fresh.token_id])
    return compared


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_reports_equal_the_old_ones_over_whole_answers(default_llamacpp, monkeypatch, name: str) -> None:
    assert _answer(default_llamacpp, SETTINGS[name], monkeypatch) >= TOKENS


@pytest.mark.slow
@pytest.mark.parametrize("name", ["balanced", "creative"])
def test_reports_equal_the_old_ones_on_a_262k_vocabulary(gemma_llamacpp, monkeypatch, name: str) -> None:
    assert gemma_llamacpp.n_vocab == 262144
    assert _answer(gemma_llamacpp, SETTINGS[name], monkeypatch) >= TOKENS


def _rows() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    peaked = (rng.standard_normal(50_000) * 3).astype(np.float32)
    peaked[[7, 900, 40_000]] = 25.0  # ties at the top
    flat = np.zeros(4096, dtype=np.float32)  # every entry tied: the head is the whole row
    ties_at_cut = np.round(rng.standard_normal(30_000) * 2).astype(np.float32)  # many ties at any cut
    with_inf = peaked.copy()
    with_inf[::3] = -np.inf
    far = peaked.copy()
    far[100] = 200.0  # one entry far above the rest: the head widens to find k
    return [peaked, flat, ties_at_cut, with_inf, far]


@pytest.mark.parametrize("row", _rows(), ids=["peaked", "flat", "ties_at_cut", "with_inf", "far_top"])
def test_the_head_answers_as_the_whole_row_does(row: np.ndarray) -> None:
    finite = int(np.count_nonzero(np.isfinite(row)))
    for k in (1, 2, 20, 40, 300, finite - 1):
        head = RowHead(row)
        assert head.kth_largest(k) == np.partition(row, row.size - k)[row.size - k]
        kept = head.at_least(head.kth_largest(k))
        if kept is not None:
            np.testing.assert_array_equal(kept, np.flatnonzero(row >= head.kth_largest(k)))
        np.testing.assert_array_equal(RowHead(row).top_local(k), top_local(row, k))
    head = RowHead(row)
    head.kth_largest(40)
    for token in (0, 7, 100, 900, int(np.argmin(np.where(np.isfinite(row), row, np.inf)))):
        assert head.rank(token) == int(np.count_nonzero(row > row[token]))


def _small_rows() -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    rows = []
    for n in (1, 2, 7, 8, 9, 16, 17, 40, 41, 100, 255, 256, 257, 1000, 1024):
        row = (rng.standard_normal(n + 3) * 4).astype(np.float32)[3:]  # an offset view, as survivors are gathered
        rows.append(row)
        tied = np.round(row)
        if n > 2:
            tied[::2] = -np.inf
            tied[1] = 5.0
        rows.append(tied)
    return rows


def test_short_rows_sum_as_the_chunked_loop_does(monkeypatch) -> None:
    """The survivors' sums without the chunk buffers are the chunked loop's, bit for bit."""
    import engine.sampling.stages as stages

    for row in _small_rows():
        m = row.max()
        finite = bool(np.all(np.isfinite(row)))
        for entropy in (False, True):
            fast = stages.exp_sums(row, m, entropy=entropy, all_finite=finite)
            with monkeypatch.context() as patch:
                patch.setattr(stages, "_SMALL", 0)
                chunked = stages.exp_sums(row, m, entropy=entropy, all_finite=finite)
            assert fast == chunked


def test_short_rows_list_their_top_as_the_partition_does(monkeypatch) -> None:
    import engine.sampling.distribution as distribution

    for row in _small_rows():
        finite = np.isfinite(row)
        ids = np.flatnonzero(finite) * 3 + 1  # ascending ids of survivors
        for dist_of in (lambda: Dist(row), lambda: Dist(row[finite], ids)):
            for n in (1, 2, 5, 20, 40, 300):
                fast = dist_of().top(n)
                with monkeypatch.context() as patch:
                    patch.setattr(distribution, "_SORT_ALL", 0)
                    assert dist_of().top(n) == fast
