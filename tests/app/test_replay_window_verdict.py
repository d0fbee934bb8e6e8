"""The Replay window says the verdict (issue 35 item 4): "Identical" only when tokens and log-probs are equal bit for
bit, "Same tokens, log-probs within x nats" when only the log-probs moved, and which fingerprint fields differ."""

from __future__ import annotations

import pytest

from app.actions.experiments import open_replay
from qt_helpers import run_task, send


@pytest.mark.slow
def test_replay_window_shows_the_verdict_and_the_fingerprint(qtbot, window, closing):
    window.settings.update_sampler(seed=3, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0)
    answer = send(qtbot, window, "the dog")
    conv = window.library.current
    assert answer.stats["fingerprint"]["seed"] == 3 and answer.stats["fingerprint"]["backend"] == "mock"

    same = open_replay(window.context, with_change=False)
    closing(same)
    qtbot.waitUntil(lambda: same.diff is not None, timeout=15000)
    text = same.summary.text()
    assert text.startswith("Identical: all ") and "Fingerprint: no recorded difference." in text, text
    same.close()

    # The stored answer's log-probs nudged (as an answer made with other numerics would be): the same tokens,
    # and the window says by how much instead of "Identical".
    events = conv.tokens(answer)
    nudged = [events[0].__class__(**{**{f: getattr(events[0], f) for f in events[0].__slots__},
                                     "logprob": events[0].logprob - 0.125}), *events[1:]]
    answer.tokens = nudged
    again = open_replay(window.context, with_change=False)
    closing(again)
    qtbot.waitUntil(lambda: again.diff is not None, timeout=15000)
    assert again.summary.text().startswith("Same tokens, log-probs within 0.125 nats: all "), again.summary.text()
    again.close()

    changed = open_replay(window.context, with_change=True)
    closing(changed)
    changed.field.setCurrentText("top_k")
    changed.value.setText("1")
    run_task(qtbot, changed.run())
    text = changed.summary.text()
    # One statement of where, numbered from 1 as the token detail numbers tokens (it once said "First divergence
    # at token 7" and "Verdict: diverged at token 6" in one line).
    assert text.startswith(f"Diverged at token {changed.diff.first_divergence + 1} ("), text
    assert text.count("token ") == 1 + text.count("tokens before"), text
    assert "Fingerprint differs: sampler.top_k 0 -> 1." in text, text
