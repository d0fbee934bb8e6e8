"""The stage records built when read (issue 47): the same values as the records built at once, whenever read.

The decode loop hands out each token's stage snapshots as a `LazyTuple` (engine/lazy_tuple.py): the records of
the short rows at the end of the chain are built from what the token kept (`deferred_stage_records`). Here
whole answers of the real models run through the real decode loop (the overlapped forward on llama.cpp), each
token's records are also built at once, the old way (`stage_records` on the same steps, at the time), and only
after the whole answer has ended -- every later token chosen, every array the chain made since -- are the
deferred ones read and compared, field for field, float for float, every stage, on both vocabularies.
"""

from __future__ import annotations

import dataclasses
import pickle
import threading

import numpy as np
import pytest

import engine.sampling.pick as pick_module
from engine.decode.loop import generate_events
from engine.events import StageSnapshot, TokenEvent
from engine.lazy_tuple import LazyTuple, as_tuple
from engine.request import GenerationRequest
from engine.sampling import SamplerChain, SamplerSettings
from engine.sampling.alternatives import TokenNames
from engine.sampling.distribution import Dist
from engine.sampling.pick import DEFER_MAX, deferred_stage_records, stage_records

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a message in a bottle."}]
SETTINGS = {
    # The window's default: top-k first, so every record after it is on 40 survivors (all deferred).
    "balanced": SamplerSettings(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=7),
    # Penalties and XTC: a (V,) row recorded at once, then min-p's cut and the rest deferred.
    "creative": SamplerSettings(temperature=1.2, min_p=0.05, repetition_penalty=1.05, xtc_probability=0.5,
                                xtc_threshold=0.1, seed=7),
    "topk_after_penalty": SamplerSettings(temperature=0.7, top_k=20, repetition_penalty=1.1, seed=7),
    # A first cut by top-nσ and typical-p, then top-p: cuts that may leave a long row.
    "sigma_typical": SamplerSettings(temperature=1.0, top_n_sigma=2.0, typical_p=0.9, top_p=0.9, seed=7),
    # Mirostat needs token ids: the row goes back to (V,) after the cuts, so nothing is left to defer.
    "mirostat": SamplerSettings(temperature=0.8, top_k=40, mirostat=2, seed=7),
    "greedy": SamplerSettings(temperature=0, top_k=40, seed=7),
}
TOKENS = 24


def _answer_with_both(backend, settings: SamplerSettings, monkeypatch) -> tuple[list[TokenEvent], list, int]:
    """One answer through the decode loop; for each token, its deferred records and the records built at once."""
    made: list[tuple[object, list]] = []

    def both(steps, names, token_id, model, model_top, top_n):
        deferred = deferred_stage_records(steps, names, token_id, model, model_top, top_n)
        made.append((deferred, stage_records(steps, names, token_id, model, model_top, top_n)))
        return deferred

    monkeypatch.setattr(pick_module, "deferred_stage_records", both)
    backend.trim_cache(0)
    request = GenerationRequest(messages=PROMPT, sampler=settings, max_new_tokens=TOKENS, ignore_eos=True, top_n=20,
                                record_stages=True)
    events = [e for e in generate_events(backend, request) if isinstance(e, TokenEvent)]
    deferred_count = sum(isinstance(d, LazyTuple) and not d.built for d, _ in made)
    return events, made, deferred_count


def _compare(events: list[TokenEvent], made: list) -> int:
    assert len(events) == len(made) == TOKENS
    stages = 0
    for event, (deferred, at_once) in zip(events, made, strict=True):
        assert tuple(deferred) == tuple(at_once)
        assert event.stages == tuple(
            StageSnapshot(s.name, s.survivors, s.mass_kept, s.entropy, s.top, removed=s.removed) for s in at_once
        )
        stages += len(at_once)
    return stages


@pytest.mark.model
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_deferred_records_equal_those_built_at_once_over_whole_answers(default_llamacpp, monkeypatch, name) -> None:
    events, made, deferred = _answer_with_both(default_llamacpp, SETTINGS[name], monkeypatch)
    if name in ("balanced", "creative", "topk_after_penalty"):
        assert deferred == TOKENS  # every token's records were still to build when the answer ended
    if name == "mirostat":
        assert deferred == 0  # its last stage needs a (V,) row: recorded at once, nothing held
    assert _compare(events, made) >= TOKENS


@pytest.mark.slow
@pytest.mark.parametrize("name", ["balanced", "creative", "sigma_typical"])
def test_deferred_records_equal_those_built_at_once_on_a_262k_vocabulary(gemma_llamacpp, monkeypatch, name) -> None:
    assert gemma_llamacpp.n_vocab == 262144
    events, made, _ = _answer_with_both(gemma_llamacpp, SETTINGS[name], monkeypatch)
    assert _compare(events, made) >= TOKENS


def _steps_of(settings: SamplerSettings, row: np.ndarray):
    chain = SamplerChain(settings)
    choice = chain.choose(row, np.arange(30, dtype=np.int64), record_stages=True)
    model = Dist(choice._scores)
    return choice, model, model.top(20)


def test_no_long_row_is_held_for_later() -> None:
    """A deferred record keeps only short rows: a chain whose last stage leaves a (V,) row, or a cut wider than
    DEFER_MAX, is recorded at once; a top-k first keeps its 40 survivors."""
    rng = np.random.default_rng(5)
    row = (rng.standard_normal(50_000) * 2).astype(np.float32)
    for settings, lazy in [
        (SamplerSettings(temperature=0.8, top_k=40, top_p=0.9, seed=1), True),
        (SamplerSettings(temperature=0.8, repetition_penalty=1.2, seed=1), False),  # the penalties' (V,) row last
        (SamplerSettings(temperature=1.0, min_p=1e-6, seed=1), False),  # a cut keeping most of the row
    ]:
        choice, model, top = _steps_of(settings, row)
        records = deferred_stage_records(choice._steps, TokenNames(None), choice.token_id, model, top, 20)
        assert isinstance(records, LazyTuple) is lazy, settings
        if lazy:
            held = [a for cell in records._build.__closure__ for a in _arrays_in(cell.cell_contents)]
            assert held and max(a.size for a in held) <= DEFER_MAX
        assert tuple(records) == tuple(stage_records(choice._steps, TokenNames(None), choice.token_id, model, top, 20))


def _arrays_in(value) -> list[np.ndarray]:
    if isinstance(value, np.ndarray):
        return [value]
    if isinstance(value, Dist):
        return [a for a in (value.ids, value.vals) if a is not None]
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _arrays_in(v)]
    return []


def test_a_part_of_a_row_refuses_what_it_does_not_know() -> None:
    row = np.linspace(-5, 5, 10_000, dtype=np.float32)
    whole = Dist(row)
    top = whole.top(20)
    part = whole.part(np.array([9_999, 3, 9_990]))
    assert part.top(20) == top and part.count == whole.count and part.entropy == whole.entropy
    np.testing.assert_array_equal(part.finite_at(np.array([3, 9_990])), [True, True])
    with pytest.raises(RuntimeError, match="top 5"):
        part.top(5)


def test_a_lazy_tuple_reads_as_its_tuple_and_builds_once() -> None:
    calls = []

    def build():
        calls.append(1)
        return (1, 2, 3)

    lazy = LazyTuple(build)
    assert not lazy.built
    assert lazy == (1, 2, 3) and (1, 2, 3) == lazy and lazy != (1, 2)
    assert lazy[-1] == 3 and lazy[:2] == (1, 2) and len(lazy) == 3 and list(lazy) == [1, 2, 3] and lazy
    assert hash(lazy) == hash((1, 2, 3)) and lazy.built and len(calls) == 1
    assert pickle.loads(pickle.dumps(lazy)) == (1, 2, 3) and type(pickle.loads(pickle.dumps(lazy))) is tuple
    assert as_tuple(LazyTuple(lambda: ())) == () and not LazyTuple(lambda: ())
    assert as_tuple(None) is None


def test_threads_reading_at_once_see_one_tuple() -> None:
    start = threading.Barrier(8)
    lazy = LazyTuple(lambda: tuple(range(100_000)))
    seen = []

    def read():
        start.wait()
        seen.append(lazy.get())

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 8 and all(s == tuple(range(100_000)) for s in seen)


@pytest.mark.model
def test_an_event_with_deferred_stages_gives_plain_values(default_llamacpp) -> None:
    """to_dict and dataclasses.replace see the built tuple, as they would a tuple."""
    default_llamacpp.trim_cache(0)
    request = GenerationRequest(messages=PROMPT, sampler=SETTINGS["balanced"], max_new_tokens=3, top_n=5,
                                record_stages=True)
    event = next(e for e in generate_events(default_llamacpp, request) if isinstance(e, TokenEvent))
    assert isinstance(event.stages, LazyTuple)
    d = event.to_dict()
    assert isinstance(d["stages"], tuple) and d["stages"][0]["stage"] == "top_k"
    assert dataclasses.replace(event, text="x").stages == event.stages
