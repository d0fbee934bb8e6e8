"""The torch backend's rows sampled on their device (SamplesOnDevice), against the numpy chain on host rows.

On a GPU a torch backend keeps each answer's rows on the device and runs engine.sampling.torch_chain there
(issue 49 item 1). A CPU tensor is a device too: `sample_on_device=True` takes that path here, and every
answer must be the numpy chain's — the same tokens, the same ranks and alternatives, the same probabilities
within float32 — with the default model's real logits. Stage records are
made from the rows the device's stages left, by the numpy chain's code. Answers the device chain cannot take
(banned strings) go to the numpy chain, which these tests also check.
"""

from __future__ import annotations

import pytest

from engine.backends.torch.backend import TorchBackend
from engine.capabilities import SamplesOnDevice
from engine.constraints.spec import Constraint
from engine.decode.loop import generate_events
from engine.events import Done, TokenEvent
from engine.request import GenerationRequest
from engine.sampling import torch_chain
from engine.sampling.settings import SamplerSettings

# Whole answers of the default model on both chains: ~96 s together on two cores (junit times, 2026-12-04).
pytestmark = [pytest.mark.model, pytest.mark.slow]

MESSAGES = ({"role": "user", "content": "Name three fruits and say why people like them."},)
SAMPLED = SamplerSettings(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1234)
GREEDY = SamplerSettings(temperature=0.0)
# The window's "Creative" preset (app/state/settings.py): a light repetition penalty and XTC.
CREATIVE = SamplerSettings(temperature=1.2, min_p=0.05, repetition_penalty=1.05, xtc_probability=0.5,
                           xtc_threshold=0.1, seed=5)
# And its "Mirostat 2" preset: mu learns from every pick.
MIROSTAT_2 = SamplerSettings(temperature=0.8, mirostat=2, mirostat_tau=5.0, mirostat_eta=0.1, seed=6)


@pytest.fixture(scope="module")
def on_device(default_model_folder):
    # A fixed thread count: every answer's forwards sum in the same order, so the device chain's run and the
    # numpy chain's (the same backend, `sample_on_device` off: `_run_on_host`) see the same logits bit for bit.
    # (With the threads chosen per answer by the machine's load, a near-tie deep in the tail moved a rank.)
    backend = TorchBackend(default_model_folder, spec="default", display_name="SmolLM2-135M-Instruct",
                           compile_step=False, sample_on_device=True, n_threads=2)
    yield backend
    backend.close()


@pytest.fixture
def device_picks(monkeypatch):
    """How many tokens the device chain chose (it is the path under test, not the numpy chain's)."""
    counted = {"n": 0}
    choose = torch_chain.TorchChain.choose

    def counting(self, *args, **kwargs):
        counted["n"] += 1
        return choose(self, *args, **kwargs)

    monkeypatch.setattr(torch_chain.TorchChain, "choose", counting)
    return counted


def _run_on_host(backend, request, **kw) -> tuple[list[TokenEvent], Done]:
    """The same answer with the numpy chain on host rows: `backend` with `sample_on_device` off."""
    backend.sample_on_device = False
    try:
        return _run(backend, request, **kw)
    finally:
        backend.sample_on_device = True


def _run(backend, request, **kw) -> tuple[list[TokenEvent], Done]:
    # From an empty cache each time: the same computation, so the same logits bit for bit (a prompt partly
    # reused from an earlier answer's cache rounds differently, and a near-tie's rank can move by one).
    backend.trim_cache(0)
    events = list(generate_events(backend, request, **kw))
    done = events[-1]
    assert isinstance(done, Done)
    return [e for e in events if isinstance(e, TokenEvent)], done


def _same_answer(device: list[TokenEvent], host: list[TokenEvent]) -> None:
    assert [e.token_id for e in device] == [e.token_id for e in host]
    for a, b in zip(device, host, strict=True):
        assert a.text == b.text and a.forced == b.forced and a.rank == b.rank
        assert a.logprob == pytest.approx(b.logprob, abs=2e-4)
        assert a.entropy == pytest.approx(b.entropy, abs=2e-4)
        if b.sampler_logprob == float("-inf"):
            assert a.sampler_logprob == b.sampler_logprob
        else:
            assert a.sampler_logprob == pytest.approx(b.sampler_logprob, abs=2e-4)
        for mine, theirs in ((a.top_model, b.top_model), (a.top_sampler, b.top_sampler)):
            assert len(mine) == len(theirs)
            for x, y in zip(mine, theirs):  # near-ties may swap places; their probabilities may not differ
                assert x.logprob == pytest.approx(y.logprob, abs=2e-4)
            assert {t.token_id for t in mine[:-1]} <= {t.token_id for t in theirs}


def test_the_torch_backend_says_where_it_samples(on_device, default_torch):
    assert isinstance(on_device, SamplesOnDevice)
    assert on_device.device_rows(SAMPLED, on_device.tokenizer) is not None
    assert default_torch.sample_on_device is False  # the CPU's default: its rows are host memory already
    assert default_torch.device_rows(SAMPLED, default_torch.tokenizer) is None
    banned = SAMPLED.with_(banned_strings=("banana",))
    assert on_device.device_rows(banned, on_device.tokenizer) is None  # what the device chain does not take


@pytest.mark.parametrize("sampler", [SAMPLED, GREEDY, CREATIVE, MIROSTAT_2],
                         ids=["seeded sampling", "greedy", "creative", "mirostat 2"])
def test_an_answer_sampled_on_the_device_is_the_numpy_chains(on_device, device_picks, sampler):
    request = GenerationRequest(messages=MESSAGES, sampler=sampler, max_new_tokens=32, top_n=10)
    device, device_done = _run(on_device, request)
    assert device_picks["n"] == len(device) > 10  # every token chosen on the device
    host, host_done = _run_on_host(on_device, request)
    _same_answer(device, host)
    assert device_done.stats.text == host_done.stats.text
    if sampler.seed is not None:  # (greedy draws no number: each run records a fresh seed)
        assert device_done.stats.seed == host_done.stats.seed == sampler.seed


@pytest.mark.parametrize("sampler", [SAMPLED, SamplerSettings(temperature=0.9, mirostat=1, mirostat_tau=3.0, seed=3)],
                         ids=["seeded sampling", "mirostat 1"])  # (step mode puts mu back before the person's token)
def test_forced_tokens_and_step_mode_choose_on_the_device_too(on_device, device_picks, sampler):
    request = GenerationRequest(messages=MESSAGES, sampler=sampler, max_new_tokens=12, top_n=5,
                                forced_tokens=(504, 3843))
    shown: list[TokenEvent] = []

    def second_choice(event: TokenEvent) -> int | None:  # step mode: the person takes the runner-up at step 4
        shown.append(event)
        return event.top_model[1].token_id if event.index == 4 else None

    device, _ = _run(on_device, request, choose=second_choice)
    assert device_picks["n"] >= len(device)
    device_shown, shown[:] = list(shown), []
    host, _ = _run_on_host(on_device, request, choose=second_choice)
    _same_answer(device, host)
    assert [e.forced for e in device[:3]] == [True, True, False]
    assert device[4].token_id == device_shown[2].top_model[1].token_id  # (steps 0 and 1 were forced: not shown)
    assert [e.token_id for e in device_shown] == [e.token_id for e in shown]


@pytest.mark.parametrize("request_kw", [
    {"sampler": SAMPLED.with_(banned_strings=("banana",))},
], ids=["banned strings"])
def test_what_the_device_chain_lacks_runs_on_the_numpy_chain(on_device, device_picks, request_kw):
    kw = {"messages": MESSAGES, "sampler": SAMPLED, "max_new_tokens": 12, "top_n": 5, **request_kw}
    request = GenerationRequest(**kw)
    device, _ = _run(on_device, request)
    assert device_picks["n"] == 0
    host, _ = _run_on_host(on_device, request)
    assert [e.token_id for e in device] == [e.token_id for e in host]


# Every stage the device chain has, in an order where stages run on the model's whole row first (a logit
# bias by text, through the tokenizer; temperature), one changes nothing (top_k 500 after min_p) and XTC
# fires on some tokens.
EVERY_STAGE = SamplerSettings(temperature=0.9, top_k=500, top_p=0.97, min_p=0.02, typical_p=0.98,
                              top_n_sigma=3.0, xtc_probability=0.5, xtc_threshold=0.05, seed=99,
                              repetition_penalty=1.2, frequency_penalty=0.2, penalty_last_n=-1,
                              logit_bias=((" apples", 2.0), (" the", -1.5)), smoothing_factor=0.2,
                              dry_multiplier=0.8, dry_allowed_length=2, dynatemp_range=0.3, adaptive_target=0.5,
                              order=("logit_bias", "temperature", "top_n_sigma", "min_p", "top_k", "penalties",
                                     "dry", "smoothing", "typical_p", "top_p", "xtc", "adaptive_p"))


@pytest.mark.parametrize("sampler", [EVERY_STAGE, SAMPLED, GREEDY.with_(top_k=3)],
                         ids=["every stage", "seeded sampling", "greedy with top-k"])
def test_stage_records_made_from_the_device_rows_are_the_numpy_chains(on_device, device_picks,
                                                                      sampler):
    request = GenerationRequest(messages=MESSAGES, sampler=sampler, max_new_tokens=24, top_n=8, record_stages=True)
    device, _ = _run(on_device, request)
    assert device_picks["n"] == len(device)
    host, _ = _run_on_host(on_device, request)
    _same_answer(device, host)
    for a, b in zip(device, host):
        assert a.stages is not None and b.stages is not None
        assert [s.stage for s in a.stages] == [s.stage for s in b.stages] and a.stages
        for x, y in zip(a.stages, b.stages):
            assert (x.survivors, x.removed) == (y.survivors, y.removed), (a.index, x.stage)
            assert x.mass_kept == pytest.approx(y.mass_kept, abs=1e-5)
            assert x.entropy == pytest.approx(y.entropy, abs=2e-4)
            assert [t.logprob for t in x.top] == pytest.approx([t.logprob for t in y.top], abs=2e-4)
    if sampler is EVERY_STAGE:  # the order above did what it says at least once
        assert any(s.stage == "xtc" and s.survivors < prev.survivors for e in host
                   for prev, s in zip(e.stages, e.stages[1:]))


SCHEMA = {"type": "object", "properties": {"fruit": {"type": "string", "maxLength": 12},
                                           "sweet": {"type": "boolean"}},
          "required": ["fruit", "sweet"], "additionalProperties": False}


@pytest.mark.parametrize("constraint", [Constraint.json_schema(SCHEMA), Constraint.regex("[A-Z][a-z ]{4,30}\\.")],
                         ids=["json schema", "regex"])
@pytest.mark.parametrize("sampler", [SAMPLED, GREEDY], ids=["seeded sampling", "greedy"])
def test_a_constraint_cuts_the_device_row_as_it_cuts_the_host_one(on_device, device_picks,
                                                                    constraint, sampler):
    """llguidance's mask, made on the host, cuts the row on the device: the same answer, and the same record
    of what the constraint did at each step (allowed, mass kept, the most likely removed tokens, forced)."""
    request = GenerationRequest(messages=MESSAGES, sampler=sampler, max_new_tokens=40, top_n=5,
                                constraint=constraint)
    device, device_done = _run(on_device, request)
    assert device_picks["n"] == len(device)
    host, host_done = _run_on_host(on_device, request)
    _same_answer(device, host)
    assert device_done.stats.text == host_done.stats.text
    assert device_done.stats.constraint_status == host_done.stats.constraint_status
    assert device_done.stats.constraint_logprob == pytest.approx(host_done.stats.constraint_logprob, abs=1e-3)
    assert any(e.constraint.disallowed for e in host), "the constraint removed nothing: the case tests nothing"
    for a, b in zip(device, host):
        x, y = a.constraint, b.constraint
        assert (x.allowed, x.forced, x.note) == (y.allowed, y.forced, y.note), a.index
        assert x.mass_kept == pytest.approx(y.mass_kept, abs=1e-5)
        assert [t.token_id for t in x.disallowed] == [t.token_id for t in y.disallowed]
        assert [t.logprob for t in x.disallowed] == pytest.approx([t.logprob for t in y.disallowed], abs=2e-4)


def test_the_looms_batched_rows_keep_the_numpy_chain(on_device, device_picks):
    """The loom's rows come from its batch runner as host rows: sampling them on the device would copy each
    to the device and back, so they keep the numpy chain."""
    from engine.loom import continuation_events
    from engine.loom.continuations import collect

    request = GenerationRequest(messages=MESSAGES, sampler=SAMPLED, max_new_tokens=6, top_n=3)
    children, _ = collect(continuation_events(on_device, request, 2), 2)
    assert [len(c) for c in children] == [6, 6]
    assert device_picks["n"] == 0
