"""A replay that did not repeat never says only "fingerprint: no recorded difference" (issue 43 item 1: the window
said "Verdict: diverged at token 6" and "fingerprint: no recorded difference" in one line, as if nothing could
explain it). With no recorded fact differing, the verdict says the cause is outside the record, and names
what the record lacks where it can: an older record without its prompt's hash, or without the pieces its
prompt's cache was computed in. The Replay window shows `fingerprint_text()` as it is (app/widgets/experiment_windows/replay_view.py).
"""

from __future__ import annotations

import dataclasses

import pytest

from engine.events import TokenEvent
from engine.experiments.replay import replay_verdict
from engine.fingerprints.record import Fingerprint

FULL = Fingerprint("m", "a" * 64, "", "llamacpp", "cpu", (("llama-cpp-python", "0.3.36"),),
                   (("n_threads", 2),), 7, {"temperature": 0.8}, prompt_sha256="b" * 64,
                   cache_schedule=((12, 12, 1), (1, 1, 1)))
OUTSIDE = "so the cause is something the record does not hold"


def _events(*pairs: tuple[int, float]) -> list[TokenEvent]:
    return [TokenEvent(i, tid, "x", f"t{tid}", lp, lp, 0, 0.0, (), ()) for i, (tid, lp) in enumerate(pairs)]


ORIGINAL = _events((5, -1.0), (6, -2.0), (7, -0.5))
DIVERGED = _events((5, -1.0), (9, -2.5), (7, -0.5))
WITHIN = _events((5, -1.0), (6, -2.0 + 1e-3), (7, -0.5))


def test_an_identical_replay_with_nothing_recorded_differing_says_just_that():
    v = replay_verdict(ORIGINAL, ORIGINAL, FULL, FULL)
    assert v.describe() == "identical; fingerprint: no recorded difference"


@pytest.mark.parametrize("replay", [DIVERGED, WITHIN], ids=["diverged", "within"])
def test_a_replay_that_did_not_repeat_with_nothing_recorded_differing_says_the_cause_is_outside_the_record(replay):
    v = replay_verdict(ORIGINAL, replay, FULL, FULL)
    assert not v.identical and v.fingerprint_changes == ()
    text = v.fingerprint_text()
    assert text.startswith(f"fingerprint: no recorded difference, {OUTSIDE}"), text
    assert "(please report it)" in text  # both records are whole: nothing known is missing from them


@pytest.mark.parametrize("older, lacks", [
    ({"prompt_sha256": ""}, "older than prompt hashes"),
    ({"cache_schedule": ()}, "in which pieces its prompt's cache was computed"),
], ids=["no-prompt-hash", "no-cache-schedule"])
def test_a_replay_of_an_older_record_that_did_not_repeat_names_what_the_record_lacks(older, lacks):
    original = dataclasses.replace(FULL, **older)
    v = replay_verdict(ORIGINAL, DIVERGED, original, FULL)
    assert v.headline() == "diverged at token 2 ('t6' vs 't9')"
    assert v.fingerprint_changes == ()  # the missing field is compared only when both runs recorded it
    text = v.describe()
    assert f"no recorded difference, {OUTSIDE}" in text and lacks in text, text
    assert "please report" not in text
