"""The grammar stage's record is built after the pick (engine.sampling.grammar.GrammarStage): it must be the
record of the row the stage saw, whatever the stages after it did to that row, and the answer's log mass kept
must count every step, read or not.

The expected values are computed here directly from the row and llguidance's mask (softmax in float64 over
the whole row, the removed tokens ranked by score), not by the stage's own code."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.constraints import Constraint
from engine.sampling.grammar import TOP_DISALLOWED, grammar_stage
from engine.sampling.stages import NEG_INF, StageContext

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _expected(row: np.ndarray, allowed: np.ndarray) -> tuple[float, list[int]]:
    """(mass kept, the most likely removed ids) from the row as it entered the stage."""
    x = row.astype(np.float64)
    p = np.exp(x - x.max())
    p /= p.sum()
    removed = np.flatnonzero(~allowed & (row > NEG_INF))
    ranked = removed[np.lexsort((removed, -row[removed]))][:TOP_DISALLOWED]
    return float(p[allowed].sum()), [int(i) for i in ranked]


@pytest.fixture
def stage(default_llamacpp):
    tok = default_llamacpp.tokenizer
    return grammar_stage(Constraint.json_schema(SCHEMA), tok, default_llamacpp.info), tok


def test_the_record_is_the_row_the_stage_saw_though_a_later_stage_changed_it_in_place(stage):
    stage, tok = stage
    rng = np.random.default_rng(3)
    ctx = StageContext(np.zeros(0, dtype=np.int64), rng)
    text_ids = tok.encode('{"city": "Paris"}', add_special_tokens=False)
    expected_log_mass = []
    for t in text_ids[:6]:
        row = rng.standard_normal(tok.vocab_size).astype(np.float32) * 3
        row[t] += 12.0  # the token the "answer" takes is likely: the step's record is a real one
        seen = row.copy()
        allowed = stage.run._mask.allowed(np.zeros_like(row)).copy()  # llguidance's own mask at this step
        out = stage(row, ctx)
        assert out[t] > NEG_INF and bool(np.all((out > NEG_INF) == (allowed & (seen > NEG_INF))))
        row[:] = 0.0  # what a stage after it may do to the row it was handed
        mass, removed = _expected(seen, allowed)
        step = stage.last
        assert step is not None and step.allowed == int(allowed.sum())
        assert step.mass_kept == pytest.approx(mass, rel=1e-6)
        assert [i for i, _ in step.disallowed] == removed
        expected_log_mass.append(math.log(mass))
        stage.accept(t)
    assert stage.run.log_mass_kept == pytest.approx(sum(expected_log_mass), rel=1e-6)


def test_records_no_one_read_still_count_and_only_one_row_waits(stage):
    stage, tok = stage
    rng = np.random.default_rng(5)
    ctx = StageContext(np.zeros(0, dtype=np.int64), rng)
    expected = []
    for t in tok.encode('{"city": "Oslo"}', add_special_tokens=False)[:5]:
        row = rng.standard_normal(tok.vocab_size).astype(np.float32) * 3
        allowed = stage.run._mask.allowed(np.zeros_like(row)).copy()
        expected.append(math.log(_expected(row, allowed)[0]))
        stage(row, ctx)  # its record never read by anyone
        stage.accept(t)
    pending = [v.__self__ for v in stage.run._log_kept if callable(v)]
    assert len(pending) == 5 and sum(p._args is not None for p in pending) == 1  # the last step's alone
    assert stage.run.log_mass_kept == pytest.approx(sum(expected), rel=1e-6)
