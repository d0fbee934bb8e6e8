"""The floor under a llama.cpp figure: llama-cpp-python's own `Llama.eval` of the same tokens, same run.

Scoring and model comparison on a CPU are bound by the model's forward. This times llama.cpp's own class
(the same file, context, batch, threads and kernels as our backend: bench/llamacpp_decode.py `llama_class`)
evaluating the same token ids, keeping only the last position's logits, so it costs less than any scoring can
(scoring keeps every position's). A goal below this floor is out of reach on that machine for any code on
llama.cpp; the benches print it beside their figure (bench/model_diff.py, bench/score.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from llamacpp_decode import llama_class


def llama_eval_seconds(path: str, backend, runs: Sequence[Sequence[Sequence[int]]], repeat: int = 2,
                       logits_all: bool = False) -> list[float]:
    """Per run (a list of groups of ids): the best of `repeat` timings of evaluating every group from an empty
    cache, one `Llama.eval` per group. The model is loaded once for all runs (`logits_all`: see llama_class)."""
    llm = llama_class(path, backend, logits_all=logits_all)
    try:
        timings = []
        for groups in runs:
            best = float("inf")
            for _ in range(repeat):
                t0 = time.perf_counter()
                for ids in groups:
                    llm.reset()
                    llm.eval(list(ids))
                best = min(best, time.perf_counter() - t0)
            timings.append(best)
        return timings
    finally:
        llm.close()
