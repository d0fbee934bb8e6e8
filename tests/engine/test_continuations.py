"""The loom's engine side on the default model (llama.cpp): N continuations in one batch, and step mode."""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest

from engine.backend import prefill
from engine.decode.loop import generate_events, prompt_ids_for
from engine.events import Done, TokenEvent
from engine.loom import StepGate, continuation_events
from engine.loom.continuations import collect, row_seeds
from engine.request import GenerationRequest
from engine.sampling import SamplerChain, SamplerSettings

MESSAGES = ({"role": "user", "content": "Write one sentence about the sea."},)
SAMPLER = SamplerSettings(temperature=0.9, top_k=40, seed=1234)


def request(**kw) -> GenerationRequest:
    base = dict(messages=MESSAGES, sampler=SAMPLER, max_new_tokens=8, top_n=5, ignore_eos=True)
    return GenerationRequest(**{**base, **kw})


@pytest.fixture
def runners(fresh_default_llamacpp, monkeypatch):
    """The batch runners the continuations make, kept so the test can read their counters."""
    made = []
    original = fresh_default_llamacpp.batch_runner

    def spy():
        runner = original()
        made.append(runner)
        return runner

    monkeypatch.setattr(fresh_default_llamacpp, "batch_runner", spy)
    return made


class OnlyBackend:
    """The default model behind the five Backend methods only: no batch runner, so children go one by one."""

    def __init__(self, backend):
        self._b = backend
        self.tokenizer, self.info = backend.tokenizer, backend.info

    def cached_tokens(self):
        return self._b.cached_tokens()

    def trim_cache(self, n):
        return self._b.trim_cache(n)

    def forward(self, ids):
        return self._b.forward(ids)

    def peak_memory_bytes(self):
        return self._b.peak_memory_bytes()

    def close(self):
        pass


def test_children_run_as_one_batch_one_forward_per_step(fresh_default_llamacpp, runners):
    n, new = 6, 8
    tokens, stats = collect(continuation_events(fresh_default_llamacpp, request(max_new_tokens=new), n), n)
    (runner,) = runners
    assert runner.forward_calls == new  # the prefix once, then one forward per step for all six rows
    prompt_len = stats[0].prompt_tokens
    assert runner.tokens_evaluated == prompt_len + (new - 1) * n  # the prefix was computed once, not six times
    assert all(len(t) == new for t in tokens)
    assert [s.seed for s in stats] == row_seeds(request(), n)
    assert [s.finish_reason for s in stats] == ["length"] * n
    assert len({tuple(s.token_ids) for s in stats}) > 1  # six seeds, not six copies


@pytest.mark.slow
def test_same_seed_same_children(fresh_default_llamacpp):
    first = collect(continuation_events(fresh_default_llamacpp, request(), 4), 4)[1]
    again = collect(continuation_events(fresh_default_llamacpp, request(), 4), 4)[1]
    assert [s.token_ids for s in first] == [s.token_ids for s in again]
    other = collect(continuation_events(fresh_default_llamacpp, request(sampler=SAMPLER.with_(seed=99)), 4), 4)[1]
    assert [s.token_ids for s in other] != [s.token_ids for s in first]


def test_each_childs_first_token_is_its_seeded_chains_pick(fresh_default_llamacpp):
    req = request(max_new_tokens=2)
    tokens, stats = collect(continuation_events(fresh_default_llamacpp, req, 8), 8)
    prompt = prompt_ids_for(fresh_default_llamacpp.tokenizer, req)
    fresh_default_llamacpp.trim_cache(0)
    logits, _ = prefill(fresh_default_llamacpp, prompt)
    for row in range(8):
        chain = SamplerChain(SAMPLER.with_(seed=stats[row].seed))
        assert tokens[row][0].token_id == chain.pick(logits, np.asarray(prompt), top_n=0).token_id
        assert tokens[row][0].index == 0 and tokens[row][1].index == 1
        assert tokens[row][0].top_model  # inspectable like the decode loop's events


def test_top_mode_starts_with_the_likeliest_tokens(fresh_default_llamacpp):
    tokens, _ = collect(continuation_events(fresh_default_llamacpp, request(max_new_tokens=3), 5, mode="top"), 5)
    firsts = [t[0] for t in tokens]
    assert [e.rank for e in firsts] == [0, 1, 2, 3, 4]
    assert [e.token_id for e in firsts] == [p.token_id for p in firsts[0].top_model[:5]]


@pytest.mark.slow
def test_without_a_batch_runner_children_go_one_by_one_with_the_same_draws(fresh_default_llamacpp, runners):
    plain = OnlyBackend(fresh_default_llamacpp)
    events = list(continuation_events(plain, request(), 3))
    assert not runners
    assert [e.row for e in events if isinstance(e.event, Done)] == [0, 1, 2]
    tokens, stats = collect(events, 3)
    for row in range(3):  # each row is exactly the decode loop's answer for its seed
        alone = [e for e in generate_events(plain, request(sampler=SAMPLER.with_(seed=stats[row].seed)))
                 if isinstance(e, TokenEvent)]
        assert [e.token_id for e in alone] == [e.token_id for e in tokens[row]]


def test_stopped_rows_leave_the_batch_and_cancel_ends_every_row(fresh_default_llamacpp, runners):
    cancel = threading.Event()
    seen = []
    for e in continuation_events(fresh_default_llamacpp, request(max_new_tokens=50), 4, cancel=cancel):
        seen.append(e)
        if isinstance(e.event, TokenEvent) and e.event.index == 2:
            cancel.set()
    done = [e for e in seen if isinstance(e.event, Done)]
    assert sorted(d.row for d in done) == [0, 1, 2, 3]
    assert {d.event.stats.finish_reason for d in done} == {"cancelled"}
    # the prefix and two steps, and the third, which was already running while token 2 was shown (its report is
    # built during the next forward); no token after the cancel
    assert runners[0].forward_calls == 4
    assert max(e.event.index for e in seen if isinstance(e.event, TokenEvent)) == 2


def test_children_counts_outside_2_to_16_are_refused(fresh_default_llamacpp):
    for n in (1, 17):
        with pytest.raises(ValueError, match="from 2 to 16"):
            list(continuation_events(fresh_default_llamacpp, request(), n))
    with pytest.raises(ValueError, match="forced"):
        list(continuation_events(fresh_default_llamacpp, request(forced_tokens=(5,)), 2))


def test_step_mode_takes_the_users_pick_and_stop_ends_the_wait(fresh_default_llamacpp):
    waiting: list[TokenEvent] = []

    def show(preview):  # the window: shown the distribution, the user takes the second alternative
        waiting.append(preview)
        gate.pick(preview.top_model[1].token_id)

    gate = StepGate(show, poll_s=0.01)
    gate.set_stepping(True)
    cancel = threading.Event()
    req = request(max_new_tokens=3)
    events = [e for e in generate_events(fresh_default_llamacpp, req, cancel, choose=lambda p: gate.choose(p, cancel))
              if isinstance(e, TokenEvent)]
    assert [e.token_id for e in events] == [p.top_model[1].token_id for p in waiting]
    assert all(e.forced and e.rank == 1 for e in events)

    # Stop while a token waits: the run ends as cancelled without it.
    gate.on_waiting = lambda preview: threading.Timer(0.05, cancel.set).start()  # Stop pressed while it waits
    cancel.clear()
    out = list(generate_events(fresh_default_llamacpp, req, cancel, choose=lambda p: gate.choose(p, cancel)))
    assert len(out) == 1 and out[0].stats.finish_reason == "cancelled"

    # Leaving step mode lets the model go on: the sampler's own picks, as without the hook.
    gate.set_stepping(False)
    cancel.clear()
    free = [e.token_id for e in generate_events(fresh_default_llamacpp, req, cancel,
                                                choose=lambda p: gate.choose(p, cancel)) if isinstance(e, TokenEvent)]
    plain = [e.token_id for e in generate_events(fresh_default_llamacpp, req) if isinstance(e, TokenEvent)]
    assert free == plain


def test_torch_rows_share_the_prefix_too(tiny_torch, monkeypatch):
    """The torch runner's `reorder` copies one prefilled row into N (a tiny random Llama: the shapes, not the words)."""
    made = []
    original = tiny_torch.batch_runner
    monkeypatch.setattr(tiny_torch, "batch_runner", lambda: made.append(original()) or made[-1])
    req = GenerationRequest(prompt_ids=(1, 5, 9, 14), sampler=SAMPLER, max_new_tokens=5, top_n=3, ignore_eos=True)
    tokens, stats = collect(continuation_events(tiny_torch, req, 3), 3)
    assert made[0].forward_calls == 5 and all(len(t) == 5 for t in tokens)
    for row in range(3):  # each row equals the decode loop's answer for its seed (same weights, same draws)
        alone = [e.token_id for e in generate_events(tiny_torch, replace(req, sampler=SAMPLER.with_(seed=stats[row].seed)))
                 if isinstance(e, TokenEvent)]
        assert alone == [e.token_id for e in tokens[row]]


def test_constrained_children_each_follow_the_constraint(fresh_default_llamacpp):
    """The batched rows have no grammar matcher: constrained children go through the decode loop, each held to it."""
    import re

    from engine.constraints import Constraint

    pattern = r"(yes|no|maybe), [a-z]+"
    req = request(constraint=Constraint.regex(pattern), max_new_tokens=12, ignore_eos=False)
    rows, stats = collect(continuation_events(fresh_default_llamacpp, req, 3, mode="sample"), 3)
    texts = ["".join(e.text for e in row) for row in rows]
    assert all(re.fullmatch(pattern, t) or re.fullmatch(r"(yes|no|maybe), [a-z]*", t) for t in texts), texts
    assert all(any(e.constraint is not None for e in row) for row in rows)  # the grammar stage ran on every child
    with pytest.raises(ValueError, match="structured output"):
        list(continuation_events(fresh_default_llamacpp, req, 3, mode="top"))


def test_beam_mode_children_are_transformers_beam_search_results(tiny_torch):
    """Beam mode: the N children are the N sequences `generate(num_beams=N, num_return_sequences=N)` returns,
    best first, each token recorded with the model's probability and marked forced (not drawn)."""
    import torch

    prompt = (5, 17, 99, 1203)
    req = GenerationRequest(prompt_ids=prompt, sampler=SAMPLER, max_new_tokens=6, top_n=3, ignore_eos=False)
    rows, stats = collect(continuation_events(tiny_torch, req, 4, mode="beam"), 4)
    with torch.inference_mode():
        ref = tiny_torch.model.generate(torch.tensor([prompt]), num_beams=4, num_return_sequences=4, max_new_tokens=6,
                                        do_sample=False, output_scores=True, return_dict_in_generate=True)
    pad = tiny_torch.model.generation_config.pad_token_id
    for row, seq, score in zip(rows, ref.sequences.tolist(), ref.sequences_scores.tolist()):
        expected = seq[len(prompt):]
        got = [e.token_id for e in row]
        assert got == expected[: len(got)] and all(t == pad for t in expected[len(got):])
        assert all(e.forced for e in row)  # chosen by the search, not drawn by the sampler
        # transformers' score is the sum of the model's log-probs over the length (length_penalty 1.0)
        assert abs(sum(e.logprob for e in row) / len(row) - score) < 1e-4
    assert [s.finish_reason for s in stats] == ["length" if len(r) == 6 else "eos" for r in rows]


@pytest.mark.slow  # seconds on two cores (junit times, 2026-12-04)
def test_beam_mode_on_the_default_model_ranks_whole_continuations(fresh_default_llamacpp, runners):
    n, new = 4, 6
    rows, stats = collect(continuation_events(fresh_default_llamacpp, request(max_new_tokens=new), n, mode="beam"), n)
    means = [sum(e.logprob for e in row) / len(row) for row in rows]
    assert means == sorted(means, reverse=True)  # best first, as beam search ranks them (length-normalised)
    assert len({tuple(s.token_ids) for s in stats}) == n  # N different continuations
    (runner,) = runners
    assert runner.forward_calls >= 2 * new - 1  # the search, then the rows run with their tokens forced
    greedy = [e for e in generate_events(fresh_default_llamacpp, request(
        max_new_tokens=new, sampler=SamplerSettings(temperature=0.0))) if isinstance(e, TokenEvent)]
    assert means[0] >= sum(e.logprob for e in greedy) / new - 1e-4  # at least as likely as the greedy answer
    for row in rows:  # each child's recorded log-probs are the decode loop's for the same tokens
        alone = [e for e in generate_events(fresh_default_llamacpp, request(
            max_new_tokens=new, forced_tokens=tuple(e.token_id for e in row))) if isinstance(e, TokenEvent)]
        assert [e.logprob for e in alone] == [e.logprob for e in row]


def test_beam_mode_refuses_what_it_cannot_honour(fresh_default_llamacpp):
    with pytest.raises(ValueError, match="banned strings"):
        list(continuation_events(fresh_default_llamacpp, request(sampler=SAMPLER.with_(banned_strings=("sea",))), 3,
                                 mode="beam"))
    with pytest.raises(ValueError, match="whole next-token distribution"):
        list(continuation_events(OnlyBackend(fresh_default_llamacpp), request(), 3, mode="beam"))
    cancel = threading.Event()
    cancel.set()
    _, stats = collect(continuation_events(fresh_default_llamacpp, request(), 3, mode="beam", cancel=cancel), 3)
    assert [s.finish_reason for s in stats] == ["cancelled"] * 3


class ForegroundRunner:
    """A llama.cpp runner seen without its BackgroundStep: every step in the caller's thread."""

    def __init__(self, runner):
        self._r = runner
        self.start, self.step, self.reorder, self.close = runner.start, runner.step, runner.reorder, runner.close

    @property
    def forward_calls(self):
        return self._r.forward_calls


def test_reports_built_during_the_next_step_are_the_same(fresh_default_llamacpp, monkeypatch):
    """The next step runs on the runner's helper thread while the reports are built: same children, same records."""
    from engine.capabilities import BackgroundStep

    req = request(max_new_tokens=10, stop=("sea",), ignore_eos=False)
    overlapped = collect(continuation_events(fresh_default_llamacpp, req, 5), 5)
    original = fresh_default_llamacpp.batch_runner
    probe = original()
    assert isinstance(probe, BackgroundStep) and not isinstance(ForegroundRunner(probe), BackgroundStep)
    probe.close()
    monkeypatch.setattr(fresh_default_llamacpp, "batch_runner", lambda: ForegroundRunner(original()))
    plain = collect(continuation_events(fresh_default_llamacpp, req, 5), 5)
    assert [[e.token_id for e in row] for row in overlapped[0]] == [[e.token_id for e in row] for row in plain[0]]
    assert [[(e.logprob, e.top_model, e.stages) for e in row] for row in overlapped[0]] == \
        [[(e.logprob, e.top_model, e.stages) for e in row] for row in plain[0]]
    assert [s.finish_reason for s in overlapped[1]] == [s.finish_reason for s in plain[1]]


class NoSharedStart(ForegroundRunner):
    """A llama.cpp runner seen without StartsFromBackendCache: the prompt is always computed."""

    def __init__(self, runner):
        super().__init__(runner)
        self.step_in_background = runner.step_in_background

    @property
    def tokens_evaluated(self):
        return self._r.tokens_evaluated


def test_children_start_from_the_chats_cached_prompt(fresh_default_llamacpp, runners, monkeypatch):
    """After an answer the backend's cache holds the prompt: the loom copies it and computes only what is new."""
    from engine.capabilities import BackgroundStep, StartsFromBackendCache

    req = request(max_new_tokens=6)
    prompt = prompt_ids_for(fresh_default_llamacpp.tokenizer, req)
    list(generate_events(fresh_default_llamacpp, replace(req, max_new_tokens=3)))  # the chat's answer: prompt cached
    shared = collect(continuation_events(fresh_default_llamacpp, req, 4), 4)
    (runner,) = runners
    assert isinstance(runner, StartsFromBackendCache)
    assert shared[1][0].reused_tokens == len(prompt) - 1  # all but the last prompt token, which gives the logits
    assert runner.tokens_evaluated == 1 + 5 * 4  # the one prompt token, then five steps of four rows

    monkeypatch.setattr(fresh_default_llamacpp, "batch_runner",
                        lambda: NoSharedStart(runners[0].__class__(fresh_default_llamacpp)))
    probe = fresh_default_llamacpp.batch_runner()
    assert isinstance(probe, BackgroundStep) and not isinstance(probe, StartsFromBackendCache)
    probe.close()
    computed = collect(continuation_events(fresh_default_llamacpp, req, 4), 4)
    assert computed[1][0].reused_tokens == 0
    assert [s.token_ids for s in shared[1]] == [s.token_ids for s in computed[1]]
    for a, b in zip(shared[0], computed[0]):
        np.testing.assert_allclose([e.logprob for e in a], [e.logprob for e in b], atol=1e-4)
