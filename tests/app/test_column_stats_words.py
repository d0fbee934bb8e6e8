"""A Compare or Replay column says how its run ended in words, not in the engine's names.

The README's Compare screenshot read "48 tokens · length · 2.30 bits/token" and "34 tokens · eos · …";
the chat itself says "cut off at the length limit".
"""

from __future__ import annotations

from engine import experiments

from app.widgets.inspection.token_column import stats_text


def _stats(finish_reason: str) -> experiments.ColumnStats:
    return experiments.ColumnStats(length=48, mean_surprisal_bits=2.3, mean_entropy=2.76, distinct_2=0.96,
                                   repeated_ngrams=1, finish_reason=finish_reason, tokens_per_s=48.0)


def test_the_finish_reason_is_said_in_words():
    assert stats_text(_stats("length")).startswith("48 tokens · cut off at the length limit · 2.30 bits/token")
    assert " · ended · " in stats_text(_stats("eos")) and " eos " not in stats_text(_stats("eos"))
    assert " · ended at a stop string · " in stats_text(_stats("stop"))
    assert " · stopped · " in stats_text(_stats("cancelled"))
    assert " · something new · " in stats_text(_stats("something new"))  # an unknown reason still shows
