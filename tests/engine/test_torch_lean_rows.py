"""The lean step for rows (engine/backends/torch/lean_rows.py): the loom's and beam search's batch steps on torch,
against transformers' forward over the same cache, and the children they make."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from engine.backends.torch.lean_rows import step_rows
from engine.loom import continuation_events
from engine.loom.continuations import collect
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings

# An argument transformers has announced it will remove (`past_key_values` -> `cache`, ...) is an error here, so a
# rename inside the admitted transformers range fails these tests rather than a user's model a release later.
pytestmark = pytest.mark.filterwarnings("error:.*(is deprecated|will be removed).*:FutureWarning")


def _runner_after(backend, prompt: list[int], rows: int, lean):
    runner = backend.batch_runner()
    runner.lean = lean
    runner.start([prompt])
    runner.reorder([0] * rows)
    return runner


def test_rows_step_equals_transformers_forward_step_by_step(tiny_torch):
    backend = tiny_torch
    assert backend.lean is not None
    prompt = backend.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    runner = _runner_after(backend, prompt, 5, None)  # transformers' forward only: the reference cache and logits
    tokens = [int(t) for t in np.random.default_rng(3).integers(10, 1000, 5)]
    with torch.inference_mode():
        for step in range(12):
            position = len(prompt) + step
            ids = torch.tensor(tokens)
            ours = step_rows(backend.lean, ids, position, runner._cache)  # appends to the cache ...
            runner._cache.crop(-1)  # ... which is cropped back, and the same step runs through transformers
            theirs = runner.step(tokens)
            np.testing.assert_allclose(ours.float().numpy(), theirs, atol=1e-4 * max(1.0, np.abs(theirs).max()))
            tokens = [int(t) for t in theirs.argmax(-1)]
            tokens[0] = (tokens[0] + step) % 1000  # rows that differ, so a mixed-up row would show


def test_loom_children_on_torch_go_through_the_rows_step_with_transformers_tokens(tiny_torch, monkeypatch):
    backend = tiny_torch
    req = GenerationRequest(prompt_ids=(1, 5, 9, 14, 33), sampler=SamplerSettings(temperature=0.9, seed=4),
                            max_new_tokens=10, top_n=3, ignore_eos=True)
    monkeypatch.setattr(backend, "lean", None)  # transformers' forward for every step: the reference
    reference = collect(continuation_events(backend, req, 4), 4)[1]
    monkeypatch.undo()
    calls = []
    import engine.backends.torch.lean_rows as lean_rows

    real = lean_rows.step_rows
    monkeypatch.setattr(lean_rows, "step_rows", lambda *a: calls.append(a[2]) or real(*a))
    backend.lean.rows_verified = False
    ours = collect(continuation_events(backend, req, 4), 4)[1]
    assert backend.lean.rows_verified and len(calls) == 9  # every step after the prefix's
    assert [s.token_ids for s in ours] == [s.token_ids for s in reference]


def test_a_rows_step_that_disagrees_is_dropped_on_first_use(tiny_torch, monkeypatch, caplog):
    backend = tiny_torch
    req = GenerationRequest(prompt_ids=(1, 5, 9, 14, 33), sampler=SamplerSettings(temperature=0.9, seed=4),
                            max_new_tokens=6, top_n=3, ignore_eos=True)
    monkeypatch.setattr(backend, "lean", None)
    reference = collect(continuation_events(backend, req, 3), 3)[1]
    monkeypatch.undo()
    import engine.backends.torch.lean_rows as lean_rows

    real = lean_rows.step_rows
    monkeypatch.setattr(lean_rows, "step_rows", lambda *a: real(*a) + 1.0)
    backend.lean.rows_verified = False
    with caplog.at_level(logging.WARNING, logger="engine.backends.torch.runner"):
        ours = collect(continuation_events(backend, req, 3), 3)[1]
    assert [s.token_ids for s in ours] == [s.token_ids for s in reference]
    assert "lean step for rows differs" in caplog.text and not backend.lean.rows_verified


def test_padded_rows_keep_transformers_forward(tiny_torch, monkeypatch):
    """Prompts of different lengths are left-padded: the rows step (no mask) must not run on them."""
    import engine.backends.torch.lean_rows as lean_rows

    monkeypatch.setattr(lean_rows, "step_rows", lambda *a: pytest.fail("the rows step ran on padded rows"))
    runner = tiny_torch.batch_runner()
    runner.start([[1, 5, 9], [1, 5, 9, 14, 33]])
    assert runner.step([7, 8]).shape[0] == 2


def test_kernels_for_rows_are_timed_once_per_bucket_and_follow_a_fixed_choice(tiny_torch, monkeypatch):
    from engine.backends.torch import linear as cpu_linear

    lean = tiny_torch.lean
    before = lean.choose_kernels("torch")
    try:
        assert lean.linears_for_rows(8) is lean._linears  # a fixed choice holds for rows too
        lean.choose_kernels("auto")
        timed = []
        real = cpu_linear.fastest
        monkeypatch.setattr(cpu_linear, "fastest", lambda w, b, names=None, rows=1: timed.append(rows) or real(w, b, names, rows))
        eight = lean.linears_for_rows(8)
        assert set(timed) == {8} and len(timed) == 5  # each of the five roles, timed with 8 rows
        assert set(eight) == {"qkv", "o", "gate_up", "down", "head"}
        assert all(k in cpu_linear.KERNELS.values() for k in eight.values())
        assert lean.linears_for_rows(5) is eight and len(timed) == 5  # 5 rows: the same bucket, not timed again
        lean.linears_for_rows(40)
        assert timed[-1] == 32  # at most 32 rows are timed
        assert lean.linears_for_rows(1) is lean._linears
    finally:
        lean.choose_kernels(before)


def test_loom_children_on_torch_start_from_the_chats_cached_prompt(tiny_torch, monkeypatch):
    """After an answer the backend's cache holds the prompt: the rows copy its keys and values, compute only the
    last prompt token, and make the children they make when the whole prompt is computed."""
    from engine.decode.loop import generate_events

    backend = tiny_torch
    prompt = tuple(range(40, 80))
    req = GenerationRequest(prompt_ids=prompt, sampler=SamplerSettings(temperature=0.9, seed=5),
                            max_new_tokens=6, top_n=3, ignore_eos=True)
    backend.trim_cache(0)
    list(generate_events(backend, req))  # the chat's answer: the prompt is cached
    made = []
    real = backend.batch_runner
    monkeypatch.setattr(backend, "batch_runner", lambda: made.append(real()) or made[-1])
    shared = collect(continuation_events(backend, req, 3), 3)
    assert shared[1][0].reused_tokens == len(prompt) - 1
    assert len(backend.cached_tokens()) >= len(prompt)  # the backend's cache was only read
    # the same runner without the backend's cache: the prompt computed whole
    monkeypatch.setattr(backend, "batch_runner", lambda: setattr(r := real(), "_backend_cache", None) or r)
    computed = collect(continuation_events(backend, req, 3), 3)
    assert computed[1][0].reused_tokens == 0
    assert [s.token_ids for s in shared[1]] == [s.token_ids for s in computed[1]]
    for a, b in zip(shared[0], computed[0]):
        np.testing.assert_allclose([e.logprob for e in a], [e.logprob for e in b], atol=1e-4)
