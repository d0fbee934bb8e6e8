"""The loom audit: batched rows rerun one by one (issue 35 item 4). On llama.cpp's CPU backend a row computed in a
batch and the same row computed alone give the same floats, so the audit must report exactly 0."""

from __future__ import annotations

import dataclasses

import pytest

from engine.events import TokenEvent
from engine.experiments.audit import audit_loom, audit_rows, forced_start
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings


@pytest.mark.slow
def test_audit_of_llamacpp_batched_rows_is_exactly_zero(fresh_default_llamacpp):
    request = GenerationRequest(prompt="Once upon a time", max_new_tokens=16,
                                sampler=SamplerSettings(seed=3, temperature=0.9, top_k=0, top_p=1.0))
    audit = audit_loom(fresh_default_llamacpp, request, 4)
    assert [r.seed for r in audit.rows] == [3, 4, 5, 6]
    assert audit.max_logprob_diff == 0.0  # exactly: not "small"
    assert audit.all_identical and all(r.verdict.tokens == 16 for r in audit.rows)
    # The record says what differs between the two runs: that the original ran as a batch, and, where the free
    # cores changed between the batch and the reruns (threads are chosen per answer), the thread counts; the
    # floats are the same either way on llama.cpp's CPU backend.
    for r in audit.rows:
        changes = set(r.verdict.fingerprint_changes)
        batched = "decoded as one of 4 rows of a batch -> alone"
        assert batched in changes
        assert all(c.startswith(("n_threads ", "n_threads_batch ")) for c in changes - {batched})
    assert audit.lines()[-1] == "4 rows; largest |Δ log-prob| 0; every row identical"


@pytest.mark.slow
def test_audit_reports_a_row_that_does_not_repeat(fresh_default_llamacpp):
    """The audit is not blind: a row whose recorded tokens and log-probs are not what the model makes is reported."""
    request = GenerationRequest(prompt="Once upon a time", max_new_tokens=6, sampler=SamplerSettings(seed=3))
    audit = audit_loom(fresh_default_llamacpp, request, 2)
    row = audit.rows[0]
    assert row.verdict.identical
    # Tamper with a recorded log-prob: the rerun finds it.
    from engine.experiments.audit import rerun_alone

    events, stats = rerun_alone(fresh_default_llamacpp, request)
    nudged = [dataclasses.replace(events[0], logprob=events[0].logprob - 0.25), *events[1:]]
    result = audit_rows(fresh_default_llamacpp, [(request, nudged, stats.fingerprint)])
    assert result.rows[0].verdict.kind == "within" and result.max_logprob_diff == pytest.approx(0.25, abs=1e-6)


def test_forced_start_takes_the_leading_forced_tokens():
    def ev(i, tid, forced):
        return TokenEvent(i, tid, "", "", -1.0, -1.0, 0, 0.0, (), (), forced=forced)
    assert forced_start([ev(0, 5, True), ev(1, 6, True), ev(2, 7, False), ev(3, 8, True)]) == (5, 6)
    assert forced_start([ev(0, 5, False)]) == ()
