"""Time `SamplerChain.pick` per token on realistic, peaked logits.

Usage: python bench/sampler.py [--repeat N]

Prints ms/token for vocab 49,152 (SmolLM2) and 262,144 (Gemma 3), with and
without per-stage recording, and the pick it made, so a regression in speed
or in the result is visible. Budgets: <= 2 ms at 49k, <= 5 ms at 262k.
Not part of the test suite: no assertions on timing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.sampling import SamplerChain, SamplerSettings  # noqa: E402

BUDGET_MS = {49_152: 2.0, 262_144: 5.0}
SETTINGS = SamplerSettings(temperature=0.8, top_k=0, top_p=0.95, min_p=0.05, repetition_penalty=1.1, seed=1234)


def peaked_logits(vocab: int, rng: np.random.Generator) -> np.ndarray:
    """A row that looks like a language model's: a broad Gaussian floor and a few strong candidates."""
    x = rng.standard_normal(vocab).astype(np.float32) * 3.0
    strong = rng.choice(vocab, size=8, replace=False)
    x[strong] = x.max() + rng.uniform(2.0, 10.0, size=8).astype(np.float32)
    return x


def bench(vocab: int, record: bool, repeat: int) -> tuple[float, float, str]:
    rng = np.random.default_rng(vocab)
    rows = [peaked_logits(vocab, rng) for _ in range(16)]
    history = rng.integers(0, vocab, size=512)
    chain = SamplerChain(SETTINGS)
    for row in rows:  # warm up caches and allocator
        chain.pick(row, history, top_n=20, record_stages=record)
    times = []
    for i in range(repeat):
        row = rows[i % len(rows)]
        t0 = time.perf_counter()
        pick = chain.pick(row, history, top_n=20, record_stages=record)
        times.append(time.perf_counter() - t0)
    ms = [t * 1e3 for t in times]
    desc = (
        f"token={pick.token_id} logprob={pick.logprob:.4f} sampler_logprob={pick.sampler_logprob:.4f} "
        f"rank={pick.rank} entropy={pick.entropy:.4f}"
    )
    if pick.stages:
        desc += " stages=" + ", ".join(f"{s.name}:{s.survivors}/{s.mass_kept:.3f}" for s in pick.stages)
    return statistics.median(ms), float(np.percentile(ms, 90)), desc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=300)
    args = ap.parse_args()
    print(f"settings: {SETTINGS}")
    for vocab in (49_152, 262_144):
        for record in (False, True):
            med, p90, desc = bench(vocab, record, args.repeat)
            ok = "ok" if med <= BUDGET_MS[vocab] else "OVER BUDGET"
            print(
                f"vocab={vocab:>7,} record_stages={record!s:5}  median {med:.3f} ms/token  p90 {p90:.3f}  "
                f"(budget {BUDGET_MS[vocab]:.0f} ms: {ok})"
            )
            print(f"    last pick: {desc}")


if __name__ == "__main__":
    main()
