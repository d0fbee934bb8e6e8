"""Sampling experiments: scoring against a transformers forward, replay, the same-draw property, compare, traces, CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Engine, GenerationRequest, SamplerSettings
from engine.backends.mock import MockBackend
from engine.cli import main as cli_main
from engine.decode.loop import generate_events
from engine.events import Done, TokenEvent, TokenProb
from engine.experiments import (
    column_stats,
    compare,
    distinct_n,
    first_divergence,
    generation_run,
    read_trace,
    repeated_ngrams,
    run_column,
    score,
    score_ids,
    text_ids,
    token_diff,
    write_trace,
)
from engine.experiments.trace import TRACE_FORMAT
from engine.backends.chunks import positions_per_chunk
from engine.sampling import SamplerChain

MULTIBYTE = "Grüße aus Köln — 東京は晴れ 🙂, said the fox."


class CountingBackend(MockBackend):
    """The mock model, counting every token it is asked to compute."""

    def __init__(self):
        super().__init__()
        self.computed = 0

    def forward(self, token_ids):
        self.computed += len(token_ids)
        return super().forward(token_ids)


# -- scoring ------------------------------------------------------------------------------------


def _oracle_logprobs(backend, ids):
    """Every position at once from the transformers model itself: (T, V) log-softmax, float64."""
    import torch

    with torch.inference_mode():
        logits = backend.model(input_ids=torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits, dim=-1).numpy()


def test_score_matches_a_teacher_forced_transformers_forward(fresh_default_torch):
    backend = fresh_default_torch
    result = score(backend, MULTIBYTE, top_n=5)
    ids = list(result.token_ids)
    assert backend.tokenizer.decode(ids) == MULTIBYTE and result.context == 1  # SmolLM2 adds no BOS
    assert len(result.tokens) == len(ids) - result.context >= 12
    lp = _oracle_logprobs(backend, ids)  # row t predicts token t + 1
    for t in result.tokens:
        row = lp[t.index - 1]
        assert t.logprob == pytest.approx(row[t.token_id], abs=1e-4)
        # tokens within float rounding of this one may rank either side of it, in any number
        clearly_above = int(np.sum(row > row[t.token_id] + 1e-6))
        assert clearly_above <= t.rank <= int(np.sum(row > row[t.token_id] - 1e-6))
        assert t.entropy == pytest.approx(float(-(np.exp(row) * row).sum()), abs=1e-3)
        assert [a.token_id for a in t.top][:3] == list(np.argsort(-row, kind="stable")[:3])
    want_ppl = math.exp(-np.mean([lp[t.index - 1][t.token_id] for t in result.tokens]))
    assert result.perplexity == pytest.approx(want_ppl, rel=1e-4)
    # One teacher-forced pass: a forward per chunk of positions (one here), not one per token.
    assert result.forward_calls == math.ceil((len(ids) - 1) / positions_per_chunk(backend.info.vocab_size)) == 1


def test_score_reuses_a_cached_context_and_stops_when_cancelled():
    backend = CountingBackend()
    tok = backend.tokenizer
    context = tok.encode(" the old man and the sea was a long story of the river")
    ids = context + tok.encode(" and the dog was there")
    first = score_ids(backend, ids, context=len(context))
    assert first.reused_tokens == 0 and backend.computed == len(ids) - 1  # the last token predicts nothing
    backend.computed = 0
    again = score_ids(backend, ids, context=len(context))
    assert again.reused_tokens == len(context) - 1 and backend.computed == 1 + len(again.tokens) - 1
    assert [t.logprob for t in again.tokens] == [t.logprob for t in first.tokens]
    calls = iter(range(100))
    partial = score_ids(backend, ids, context=len(context), cancelled=lambda: next(calls) >= 3)
    assert 0 < len(partial.tokens) < len(first.tokens)


def test_score_rejects_what_it_cannot_score():
    backend = MockBackend()
    with pytest.raises(ValueError, match="at least two tokens"):
        score_ids(backend, [5])
    with pytest.raises(ValueError, match="context must be"):
        score_ids(backend, [5, 6, 7], context=3)
    with pytest.raises(ValueError, match="empty"):
        score(backend, "")


def test_text_ids_follow_the_tokenizers_own_start_token():
    class WithBos:
        def encode(self, text, add_special_tokens=True):
            ids = [10 + ord(c) for c in text]
            return [1, *ids] if add_special_tokens else ids

    assert text_ids(WithBos(), "ab") == ([1, 107, 108], 1)  # BOS first: every text token is scored
    assert text_ids(MockBackend().tokenizer, " the cat") == ([5, 31], 1)  # nothing added: the first is context


def test_scoring_a_generated_answer_reproduces_its_recorded_logprobs():
    backend = MockBackend()
    request = GenerationRequest(prompt=" the cat is", sampler=SamplerSettings(temperature=0.9, seed=3), max_new_tokens=12, ignore_eos=True)
    events = [e for e in generate_events(backend, request) if isinstance(e, TokenEvent)]
    prompt = backend.tokenizer.encode(" the cat is")
    result = score_ids(backend, prompt + [e.token_id for e in events], context=len(prompt))
    assert [t.logprob for t in result.tokens] == pytest.approx([e.logprob for e in events], abs=1e-9)
    assert [t.rank for t in result.tokens] == [e.rank for e in events]


# -- replay and the same-draw property ----------------------------------------------------------


def _run(backend, settings, prompt="Once upon a time", n=16):
    request = GenerationRequest(prompt=prompt, sampler=settings, max_new_tokens=n, record_stages=True, top_n=1, ignore_eos=True)
    return run_column(backend, request)


@pytest.mark.slow
def test_replay_with_the_same_seed_and_settings_gives_identical_tokens(fresh_default_torch):
    s = SamplerSettings(temperature=1.1, top_p=0.95, seed=1234)
    a, b = _run(fresh_default_torch, s, n=16), _run(fresh_default_torch, s, n=16)
    assert a.token_ids == b.token_ids and token_diff(a.token_ids, b.token_ids).identical
    assert b.stats.prefilled_tokens == 1  # the replay found the prompt in the cache


def _survivors(ev: TokenEvent) -> int:
    """How many tokens survived every stage. top_p and top_k keep the most likely tokens, so on the same
    logits (true at and before the first divergence) equal counts are equal sets."""
    return ev.stages[-1].survivors


@pytest.mark.slow
def test_a_change_that_keeps_the_survivors_keeps_the_token_on_a_real_model_run(fresh_default_torch):
    backend = fresh_default_torch
    order = ("top_p", "top_k", "temperature")  # top_k after top_p: a large enough k removes nothing
    base = SamplerSettings(temperature=1.3, top_p=0.9, order=order, seed=7)
    a = _run(backend, base)
    after_top_p = [ev.stages[0].survivors for ev in a.events]
    widest = max(after_top_p)
    assert widest > 1
    # top_k at or above every step's top-p survivor count: the same survivors everywhere -> the same tokens.
    assert _run(backend, base.with_(top_k=widest)).token_ids == a.token_ids
    # top_k below some steps' survivor count: the runs may part, and only where the survivors changed.
    k = sorted(after_top_p)[len(after_top_p) // 2]
    b = _run(backend, base.with_(top_k=k))
    d = token_diff(a.token_ids, b.token_ids)
    assert not d.identical, "the change should matter somewhere in 16 hot tokens"
    i = d.first_divergence
    assert _survivors(a.events[i]) != _survivors(b.events[i])
    # Before it, every step where the survivors differed still drew the same token (one draw per step).
    changed_before = [j for j in range(i) if _survivors(a.events[j]) != _survivors(b.events[j])]
    assert all(a.token_ids[j] == b.token_ids[j] for j in changed_before)

    lower = _run(backend, base.with_(top_p=0.6))  # "replay with top_p lowered"
    j = token_diff(a.token_ids, lower.token_ids).first_divergence
    assert j is not None and _survivors(a.events[j]) != _survivors(lower.events[j])


@pytest.fixture(scope="module")
def real_rows(default_torch):
    """Model logits along a real text, one row per position (teacher-forced)."""
    backend = default_torch
    backend.trim_cache(0)
    ids = backend.tokenizer.encode("The old lighthouse keeper climbed the stairs every night, counting", add_special_tokens=False)
    rows = [backend.forward(ids[:1])]
    for t in ids[1:]:
        rows.append(backend.forward([t]))
    return np.stack(rows), np.asarray(ids)


FILTERS = st.fixed_dictionaries({
    "top_k": st.integers(1, 400),
    "top_p": st.floats(0.3, 1.0),
    "min_p": st.sampled_from([0.0, 0.01, 0.05, 0.2]),
})


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    a=FILTERS,
    b=FILTERS,
    seed=st.integers(0, 2**63 - 1),
    temperature=st.sampled_from([0.5, 1.0, 1.6]),
    order=st.sampled_from([("top_k", "top_p", "min_p", "temperature"), ("min_p", "top_p", "top_k", "temperature")]),
)
def test_same_seed_same_survivors_same_token(real_rows, a, b, seed, temperature, order):
    """THE PROPERTY: two chains with one seed, on the same logits, pick the same token wherever their survivors agree."""
    rows, ids = real_rows
    ca = SamplerChain(SamplerSettings(temperature=temperature, seed=seed, order=order, **a))
    cb = SamplerChain(SamplerSettings(temperature=temperature, seed=seed, order=order, **b))
    for step, row in enumerate(rows):
        pa = ca.pick(row, ids[: step + 1], top_n=1000, record_stages=True)
        pb = cb.pick(row, ids[: step + 1], top_n=1000, record_stages=True)
        sa, sb = {p.token_id for p in pa.top_sampler}, {p.token_id for p in pb.top_sampler}
        assert len(sa) == pa.stages[-1].survivors  # top_n covered every survivor (top_k <= 400)
        if sa == sb:
            assert pa.token_id == pb.token_id, f"step {step}: same survivors, different tokens"


def test_the_property_is_not_vacuous(real_rows):
    """Different survivors do change tokens at some steps, so the property above says something."""
    rows, ids = real_rows
    differ = 0
    for seed in range(20):
        ca = SamplerChain(SamplerSettings(temperature=1.0, top_p=0.95, seed=seed))
        cb = SamplerChain(SamplerSettings(temperature=1.0, top_p=0.5, seed=seed))
        differ += sum(ca.pick(r, ids[: i + 1]).token_id != cb.pick(r, ids[: i + 1]).token_id for i, r in enumerate(rows))
    assert differ > 0


# -- compare ------------------------------------------------------------------------------------


def test_compare_shares_the_prompt_and_the_seed():
    backend = CountingBackend()
    request = GenerationRequest(prompt=" the quick brown fox jumps over the lazy dog and the cat", max_new_tokens=30)
    same = SamplerSettings(temperature=1.0, top_k=20)
    result = compare(backend, request, [same, same, same.with_(top_k=2)])
    prompt = len(result.prompt_ids)
    assert prompt > 5
    # The prompt is computed once; later columns recompute only its last token (for the first draw's logits).
    assert result.prefilled_tokens == prompt + 2
    decoded = sum(len(c.events) - 1 for c in result.columns)  # the last token of a run is never fed back
    assert backend.computed == prompt + 2 + decoded
    seeds = {c.settings.seed for c in result.columns}
    assert len(seeds) == 1 and None not in seeds
    a, b, c = (col.token_ids for col in result.columns)
    assert a == b
    assert result.first_divergence == first_divergence([a, b, c])
    if a != c:
        assert a[: result.first_divergence] == c[: result.first_divergence]
        assert a[result.first_divergence: result.first_divergence + 1] != c[result.first_divergence: result.first_divergence + 1]


def test_compare_with_two_identical_columns_on_a_real_model(tiny_torch):
    with Engine.from_backend(tiny_torch) as engine:
        s = SamplerSettings(temperature=1.0, top_p=0.9)
        result = engine.compare("Hello there", [s, s], max_new_tokens=16, seed=5)
    a, b = result.columns
    assert a.token_ids == b.token_ids and result.first_divergence is None
    assert b.stats.prefilled_tokens == 1 and a.settings.seed == b.settings.seed == 5


def test_compare_refuses_one_column():
    with pytest.raises(ValueError, match="2 to"):
        compare(MockBackend(), GenerationRequest(prompt=" the"), [SamplerSettings()])


def _ev(token_id: int, logprob: float, entropy: float) -> TokenEvent:
    return TokenEvent(index=0, token_id=token_id, text="", token_text="", logprob=logprob, sampler_logprob=logprob,
                      rank=0, entropy=entropy, top_model=(), top_sampler=())


def test_column_stats_on_hand_checkable_lists():
    assert distinct_n([1, 2, 1, 2, 3], 2) == 3 / 4  # (1,2) (2,1) (1,2) (2,3)
    assert distinct_n([7], 2) == 0.0
    assert repeated_ngrams([1, 2, 3, 1, 2, 3, 1]) == 2  # (1,2,3) and (2,3,1) twice each
    assert repeated_ngrams([1, 2, 3, 4]) == 0
    ln2 = math.log(2)
    s = column_stats([_ev(1, -ln2, 1.0), _ev(2, -2 * ln2, 2.0), _ev(1, -3 * ln2, 0.0)], "eos", 12.5)
    assert (s.length, s.finish_reason, s.tokens_per_s) == (3, "eos", 12.5)
    assert s.mean_surprisal_bits == pytest.approx(2.0) and s.mean_entropy == pytest.approx(1.0)
    assert s.distinct_2 == 1.0 and s.repeated_ngrams == 0
    assert column_stats([], "cancelled", 0.0).length == 0


def test_first_divergence_and_token_diff():
    assert first_divergence([[1, 2, 3], [1, 2, 3]]) is None
    assert first_divergence([[1, 2, 3], [1, 2, 4]]) == 2
    assert first_divergence([[1, 2], [1, 2, 3]]) == 2  # one column ended
    assert first_divergence([[1, 2, 3], [1, 2, 3], [9]]) == 0
    d = token_diff([1, 2, 3, 4], [1, 2, 5, 4, 6])
    assert d.first_divergence == 2 and d.changed == (2, 4) and not d.identical
    assert ("replace", 2, 3, 2, 3) in d.opcodes and ("insert", 4, 4, 4, 5) in d.opcodes


# -- traces -------------------------------------------------------------------------------------


def test_trace_round_trips_with_one_line_per_token(tmp_path):
    backend = MockBackend()
    request = GenerationRequest(prompt=" the cat", sampler=SamplerSettings(temperature=1.0, top_k=5, seed=11),
                                max_new_tokens=15, record_stages=True, top_n=5)
    events = list(generate_events(backend, request))
    done = events.pop()
    assert isinstance(done, Done)
    # A forced token the sampler had cut has sampler log-prob -inf: JSON has no such number.
    cut = TokenEvent(index=len(events), token_id=3, text="\n", token_text="\n", logprob=-9.0, sampler_logprob=-math.inf,
                     rank=80, entropy=2.0, top_model=(TokenProb(1, ".", -0.5),), top_sampler=(), forced=True)
    events.append(cut)
    lines = generation_run(model=backend.info, prompt_ids=backend.tokenizer.encode(" the cat"), settings=request.sampler,
                           seed=done.stats.seed, events=events, stats=done.stats)
    path = tmp_path / "trace.jsonl"
    assert write_trace(path, lines) == len(events) + 2
    raw = path.read_text(encoding="utf-8").splitlines()
    assert len(raw) == len(events) + 2
    head = json.loads(raw[0])
    assert head["format"] == TRACE_FORMAT and head["backend"] == "mock" and head["seed"] == 11
    assert head["settings"]["top_k"] == 5 and head["prompt_ids"] == backend.tokenizer.encode(" the cat")
    assert json.loads(raw[-2])["sampler_logprob"] is None
    (run,) = read_trace(path)
    assert run.events() == events  # every field, stages included, exactly
    assert run.end["token_ids"] == list(done.stats.token_ids)


def test_read_trace_says_what_is_wrong():
    with pytest.raises(ValueError, match="line 1 of the trace is not JSON"):
        read_trace(["{nope"])
    with pytest.raises(ValueError, match="outside a run"):
        read_trace(['{"type": "token"}'])


# -- CLI ----------------------------------------------------------------------------------------


def _jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_cli_score_and_compare_write_jsonl(tiny_llama_folder, tmp_path, capsys):
    model = ["--model", str(tiny_llama_folder), "--backend", "torch"]
    out = tmp_path / "score.jsonl"
    assert cli_main(["score", "--text", MULTIBYTE, "--top-n", "3", "--output", str(out), *model]) == 0
    lines = _jsonl(out)
    head, *tokens, end = lines
    assert head["type"] == "header" and head["kind"] == "score" and head["model"]["backend"] == "torch"
    assert len(tokens) == end["scored_tokens"] == len(head["prompt_ids"]) - head["context"]
    assert {"token_id", "token_text", "logprob", "surprisal_bits", "rank", "entropy", "top_model"} <= set(tokens[0])
    assert end["perplexity"] == pytest.approx(2 ** end["mean_surprisal_bits"], rel=1e-6)

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"temperature": 0.8}))
    b.write_text(json.dumps({"temperature": 0.8, "top_k": 3}))
    out = tmp_path / "compare.jsonl"
    argv = ["compare", "--prompt", "Hello", "--settings", str(a), "--settings", str(b), "--seed", "4",
            "--max-new-tokens", "8", "--output", str(out), *model]
    assert cli_main(argv) == 0
    runs = read_trace(out)
    assert [r.header["column"] for r in runs] == [0, 1]
    for r in runs:
        assert r.header["seed"] == 4 and r.header["settings"]["temperature"] == 0.8
        assert len(r.tokens) == r.end["generated_tokens"] == r.end["summary"]["length"]
        assert r.tokens[0]["stages"] and {"stage", "survivors", "mass_kept", "entropy", "top"} <= set(r.tokens[0]["stages"][0])

    capsys.readouterr()
    assert cli_main(["compare", "--prompt", "x", "--settings", str(tmp_path / "missing.json"), "--settings", str(a), *model]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: settings file not found") and "\n" not in err
