"""Batch scoring on llama.cpp with a CPU free: the next text's forward runs on a helper thread while this text's
per-position report is made (engine/experiments/batch_score.py `_one_ahead`), with the very same numbers."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("llama_cpp")

from engine.backends.llamacpp import LlamaCppBackend  # noqa: E402
from engine.experiments.batch_score import item_ids, score_on_runner  # noqa: E402
from engine.research.lm import LanguageModel  # noqa: E402

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Grüße aus Köln — 東京は晴れ 🙂",
    "ab",
    "Numbers: 3.14159, 2.71828 and 1.41421 are famous.",
    "The quick brown fox jumps over the lazy cat.",
]


@pytest.fixture(scope="module")
def lm(tiny_gguf):
    model = LanguageModel(LlamaCppBackend(tiny_gguf, spec="tiny", display_name="tiny"))
    yield model
    model.close()


def forwards_seen_on(lm, monkeypatch, spare: bool) -> tuple[list, set[str]]:
    """`lm.score(TEXTS)` with the runner saying a CPU is free (or not); the results and the threads whose
    `position_logits` ran the forwards."""
    runner = lm.runner
    threads: set[str] = set()
    original = type(runner).position_logits

    def recording(self, *a, **k):
        for block in original(self, *a, **k):
            threads.add(threading.current_thread().name)
            yield block

    monkeypatch.setattr(runner, "leaves_a_core_free", lambda: spare)
    monkeypatch.setattr(runner, "position_logits", recording.__get__(runner))
    return lm.score(TEXTS, top_n=5), threads


def test_with_a_core_free_the_forwards_run_ahead_on_a_helper_thread_with_the_same_numbers(lm, monkeypatch):
    plain, plain_threads = forwards_seen_on(lm, monkeypatch, spare=False)
    ahead, ahead_threads = forwards_seen_on(lm, monkeypatch, spare=True)
    assert plain_threads == {threading.current_thread().name}
    assert ahead_threads and threading.current_thread().name not in ahead_threads
    assert [r.token_ids for r in ahead] == [r.token_ids for r in plain]
    assert [r.tokens for r in ahead] == [r.tokens for r in plain]  # bit for bit: the same forwards, reordered
    assert [r.forward_calls for r in ahead] == [r.forward_calls for r in plain]


def test_a_cancelled_run_ahead_keeps_what_it_reached_and_leaves_the_runner_usable(lm, monkeypatch):
    monkeypatch.setattr(lm.runner, "leaves_a_core_free", lambda: True)
    ids = [item_ids(lm.tokenizer, item) for item in map(_text_item, TEXTS)]
    calls = {"n": 0}

    def after_two_blocks() -> bool:  # checked before each item and after each block
        calls["n"] += 1
        return calls["n"] > 3

    partial = score_on_runner(lm.backend, lm.runner, ids, top_n=5, cancelled=after_two_blocks)
    assert 1 <= len(partial) < len(TEXTS)
    full = lm.score(TEXTS, top_n=5)  # the runner's cache was cleared: the next batch is unaffected
    assert [r.tokens for r in partial] == [r.tokens for r in full[: len(partial)]]


def _text_item(text):
    from engine.experiments.batch_score import ScoreItem

    return ScoreItem(text=text)
