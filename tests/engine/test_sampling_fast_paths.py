"""The chain's fast paths give the slow paths' answers, to the bit.

- `choose` then `Choice.report` (the decode loop builds a token's report while
  the next forward runs) equals `pick`, even when the report comes after the
  chain has gone on to the next token;
- the stages after the first cut run on the survivors alone: the same tokens
  and the same recorded numbers as when every stage gets the whole row;
- `kth_largest` is `np.partition`'s k-th largest.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.sampling import SamplerChain, SamplerSettings
from engine.sampling import chain as chain_mod
from engine.sampling.stages import kth_largest

SETTINGS = {
    "balanced": dict(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, repetition_penalty=1.1),
    "creative": dict(temperature=1.2, min_p=0.05, repetition_penalty=1.05, xtc_probability=0.5, xtc_threshold=0.1),
    "typical": dict(temperature=0.9, typical_p=0.9, top_k=100),
    "sigma_dynatemp": dict(top_n_sigma=1.5, temperature=0.8, dynatemp_range=0.5, top_p=0.9),
    "smoothing": dict(smoothing_factor=0.3, top_k=60, temperature=0.8),
    "mirostat_after_a_cut": dict(mirostat=2, top_k=40, temperature=0.9),
    "adaptive_after_a_cut": dict(adaptive_target=0.3, top_k=30, min_p=0.01),
    # penalties after the cut: the survivors go back to a whole row for a stage that needs token ids
    "penalties_after_the_cut": dict(order=["top_k", "penalties", "temperature", "top_p"], top_k=30,
                                    repetition_penalty=1.3, temperature=0.9, top_p=0.8),
    "greedy": dict(temperature=0, repetition_penalty=1.3, top_k=10),
}


def rows(v: int, n: int = 12, seed: int = 0) -> list[np.ndarray]:
    """Rows shaped like a model's: a broad floor, a few strong candidates, some already masked."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = (rng.standard_normal(v) * (1 + i % 3)).astype(np.float32)
        x[rng.integers(0, v, 6)] += 7.0
        if i % 4 == 1:
            x[rng.integers(0, v, v // 3)] = -np.inf
        out.append(x)
    return out


def history(v: int) -> np.ndarray:
    return np.random.default_rng(1).integers(0, v, 200)


def run(kw: dict, xs: list[np.ndarray], record: bool) -> list:
    chain = SamplerChain(SamplerSettings(seed=11, **kw))
    hist = history(xs[0].size)
    return [chain.pick(x, hist[: 100 + i], top_n=10, record_stages=record, banned=(3,) if i % 5 == 2 else ())
            for i, x in enumerate(xs)]


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_a_late_report_equals_pick(name):
    xs = rows(3000)
    hist = history(3000)
    for record in (False, True):
        chain = SamplerChain(SamplerSettings(seed=11, **SETTINGS[name]))
        choices = [chain.choose(x, hist[: 100 + i], record_stages=record) for i, x in enumerate(xs)]
        late = [c.report(10) for c in choices]  # every report after the chain has moved on
        chain = SamplerChain(SamplerSettings(seed=11, **SETTINGS[name]))
        assert late == [chain.pick(x, hist[: 100 + i], top_n=10, record_stages=record) for i, x in enumerate(xs)]


@pytest.mark.parametrize("name", sorted(SETTINGS))
@pytest.mark.parametrize("v", [3000, 49152])
def test_stages_on_the_survivors_give_the_whole_rows_answers(name, v, monkeypatch):
    xs = rows(v, n=8)
    fast = run(SETTINGS[name], xs, record=True)
    monkeypatch.setattr(chain_mod, "_ON_SURVIVORS", frozenset())  # every stage gets the whole row
    slow = run(SETTINGS[name], xs, record=True)
    assert fast == slow  # tokens, log-probs, entropies, every stage's survivors, mass and top-N: bit for bit


def test_kth_largest_is_the_partitions_kth():
    rng = np.random.default_rng(3)
    for v in (50, 1000, 262_144):
        for scale in (0.3, 3.0, 30.0):
            x = (rng.standard_normal(v) * scale).astype(np.float32)
            x[rng.integers(0, v, v // 4)] = -np.inf
            x[rng.integers(0, v, 20)] = x.max()  # ties at the top
            for k in (1, 5, 40, 41, v // 2, v - 1):
                assert kth_largest(x, k) == np.partition(x, v - k)[v - k]
