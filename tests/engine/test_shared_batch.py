"""engine.decode.shared_batch: several requests' answers as rows of one batch are each request's own answers.

Different prompts (so different prompt lengths), different sampler settings, lengths and stops, and one request
with n = 2, decoded together on the default model (llama.cpp: a sequence per row, no padding). Each row must be
what the single-answer loop makes for that request with that row's seed: every token's record bit for bit, the
same end. A request whose client goes away ends alone; the others go on to the same answers.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from engine.backend import shared_prefix_length
from engine.backends.llamacpp.runner import MIN_SHARED_PREFIX
from engine.decode.loop import generate_events, prompt_ids_for
from engine.events import Done, TokenEvent
from engine.decode.shared_batch import BatchJob, shared_batch_events
from engine.request import GenerationRequest
from engine.sampling import SamplerSettings

FIELDS = ("finish_reason", "prompt_tokens", "generated_tokens", "seed", "text", "token_ids", "error")


def ask(text: str, **kw) -> GenerationRequest:
    return GenerationRequest(messages=({"role": "user", "content": text},), top_n=5, record_stages=True, **kw)


JOBS = [
    ask("Name a sea animal, in a word or two.", sampler=SamplerSettings(temperature=1.1, top_k=40, seed=11),
        max_new_tokens=24, stop=(",",)),
    ask("Write one long sentence about the history of bread, with many details.",
        sampler=SamplerSettings(temperature=0.0, seed=3), max_new_tokens=18),
    ask("Hi!", sampler=SamplerSettings(temperature=0.8, top_p=0.9, min_p=0.05, seed=40), max_new_tokens=12),
]


def alone(backend, request: GenerationRequest, seed: int):
    events = list(generate_events(backend, replace(request, sampler=request.sampler.with_(seed=seed))))
    assert isinstance(events[-1], Done)
    return [e for e in events if isinstance(e, TokenEvent)], events[-1].stats


def check_own_answers(backend, jobs, tokens, stats) -> None:
    """Every row (job j, row r) is what the single-answer loop makes for job j's request with the row's seed."""
    for (j, r), st in stats.items():
        mine, mine_stats = alone(backend, jobs[j].request, st.seed)
        assert [e.token_id for e in tokens.get((j, r), [])] == [e.token_id for e in mine], f"job {j} row {r}"
        for a, b in zip(mine, tokens[j, r]):
            assert a == b, f"job {j} row {r}, token {a.index}"  # every field of the record, floats bit for bit
        for field in FIELDS:
            assert getattr(mine_stats, field) == getattr(st, field), f"job {j} row {r}: {field}"


def run(backend, jobs):
    tokens: dict[tuple[int, int], list[TokenEvent]] = {}
    stats = {}
    for j, ev in shared_batch_events(backend, jobs):
        if isinstance(ev.event, Done):
            stats[j, ev.row] = ev.event.stats
        else:
            tokens.setdefault((j, ev.row), []).append(ev.event)
    return tokens, stats


@pytest.mark.slow
def test_each_row_is_its_requests_own_answer(fresh_default_llamacpp, monkeypatch):
    backend = fresh_default_llamacpp
    runners = []
    original = backend.batch_runner
    monkeypatch.setattr(backend, "batch_runner", lambda: runners.append(original()) or runners[-1])
    jobs = [BatchJob(JOBS[0], n=2), BatchJob(JOBS[1]), BatchJob(JOBS[2])]
    tokens, stats = run(backend, jobs)
    assert len(runners) == 1 and sorted(stats) == [(0, 0), (0, 1), (1, 0), (2, 0)]
    # One forward per step for every live row (plus each prompt's prefill), not one per row and step.
    longest = max(s.generated_tokens for s in stats.values())
    assert runners[0].forward_calls <= len(jobs) + longest
    assert stats[0, 1].seed == stats[0, 0].seed + 1  # a request's n rows are seeded seed + row, as the loom's
    check_own_answers(backend, jobs, tokens, stats)
    for st in stats.values():
        assert st.fingerprint is not None and st.fingerprint.extras["batch_rows"] == 4
    assert stats[1, 0].finish_reason == "length" and stats[0, 0].prompt_tokens != stats[1, 0].prompt_tokens
    # What each answer says it reused: the chat template's common beginning (its system prompt) was computed
    # once, by the first job's row, from an empty cache; the other jobs' rows copied it; the first job's
    # second row copied that row's whole prompt.
    prompts = [prompt_ids_for(backend.tokenizer, job.request) for job in jobs]
    common = shared_prefix_length(prompts, MIN_SHARED_PREFIX)
    assert common >= MIN_SHARED_PREFIX
    assert runners[0].reused_prompt_tokens == (0, common, common)
    assert [stats[k].reused_tokens for k in [(0, 0), (0, 1), (1, 0), (2, 0)]] == [0, len(prompts[0]), common, common]


@pytest.mark.slow
def test_a_request_stopped_midway_ends_alone(fresh_default_llamacpp):
    backend = fresh_default_llamacpp
    gone = threading.Event()
    jobs = [BatchJob(JOBS[1], cancel=gone), BatchJob(replace(JOBS[2], max_new_tokens=16))]
    tokens: dict[int, list[TokenEvent]] = {0: [], 1: []}
    stats = {}
    for j, ev in shared_batch_events(backend, jobs):
        if isinstance(ev.event, Done):
            stats[j] = ev.event.stats
        else:
            tokens[j].append(ev.event)
            if j == 0 and len(tokens[0]) == 3:
                gone.set()  # the first client goes away after its third token
    assert stats[0].finish_reason == "cancelled" and len(tokens[0]) == 3
    mine, mine_stats = alone(backend, jobs[1].request, stats[1].seed)
    assert [e.token_id for e in tokens[1]] == [e.token_id for e in mine] and stats[1].text == mine_stats.text


def test_requests_that_need_the_decode_loop_are_refused_in_words(fresh_default_llamacpp):
    banned = ask("Hi!", sampler=SamplerSettings(banned_strings=("hello",)))
    with pytest.raises(ValueError, match="banned strings"):
        list(shared_batch_events(fresh_default_llamacpp, [BatchJob(JOBS[2]), BatchJob(banned)]))


def left_padded_rows_are_their_own_answers(backend) -> None:
    """Greedy tokens equal; log-probs to float tolerance (padded rows may sum in another order)."""
    jobs = [BatchJob(ask("Hi!", sampler=SamplerSettings(temperature=0.0), max_new_tokens=8)),
            BatchJob(ask("Tell me about the long history of bread and ovens.",
                         sampler=SamplerSettings(temperature=0.0), max_new_tokens=6))]
    tokens, stats = run(backend, jobs)
    for j, job in enumerate(jobs):
        mine, mine_stats = alone(backend, job.request, stats[j, 0].seed)
        assert [e.token_id for e in tokens[j, 0]] == [e.token_id for e in mine]
        for a, b in zip(mine, tokens[j, 0]):
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert stats[j, 0].generated_tokens == mine_stats.generated_tokens


def test_rows_of_different_prompt_lengths_on_torch_are_their_own_answers(tiny_torch):
    """torch's runner left-pads the shorter prompt: each row still decodes as its request alone."""
    left_padded_rows_are_their_own_answers(tiny_torch)


def test_rows_of_different_prompt_lengths_on_mlx_are_their_own_answers(tiny_llama_folder):
    """MLX's runner left-pads too (mlx-lm's caches, shifted per row)."""
    pytest.importorskip("mlx_lm")
    from engine.backends.mlx.backend import MlxBackend

    backend = MlxBackend(tiny_llama_folder, spec=str(tiny_llama_folder), display_name="tiny-llama")
    try:
        left_padded_rows_are_their_own_answers(backend)
    finally:
        backend.close()
