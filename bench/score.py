"""What teacher-forced scoring costs: one single-token forward per position vs one all-positions forward.

    python bench/score.py [--model SPEC] [--backend torch] [--repeat 2]

Scoring goes through the 5-method Backend protocol (last-position logits
only), so a text of n tokens costs n small forwards. This prints that time
next to one transformers forward over the whole text (torch backends only),
the ratio between them, and the perplexity.
"""

from __future__ import annotations

import argparse
import time

from engine import Engine
from engine.experiments import score

TEXT = (
    "The lighthouse keeper climbed the narrow stairs every evening, counting each step out loud, "
    "because his father had done the same and his grandfather before him. "
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--backend", default="torch")
    p.add_argument("--repeat", type=int, default=2, help="copies of the sample text")
    args = p.parse_args()
    text = TEXT * args.repeat
    with Engine.load(args.model, backend=args.backend) as eng:
        backend = eng.wait_ready()
        best = float("inf")
        for _ in range(2):  # the first run warms up
            backend.trim_cache(0)
            t0 = time.perf_counter()
            result = eng.call(lambda b: score(b, text)).result()
            best = min(best, time.perf_counter() - t0)
        n = len(result.tokens)
        print(f"{n} tokens scored step by step: {best:.2f} s ({best / n * 1000:.1f} ms/token); "
              f"perplexity {result.perplexity:.2f}")
        model = getattr(backend, "model", None)
        if model is not None:
            import torch

            ids = torch.tensor([list(result.token_ids)], device=next(model.parameters()).device)
            with torch.inference_mode():
                model(input_ids=ids)
                t0 = time.perf_counter()
                model(input_ids=ids)
                full = time.perf_counter() - t0
            print(f"one forward over all {ids.shape[1]} tokens: {full * 1000:.0f} ms; step by step is {best / full:.0f}x that")


if __name__ == "__main__":
    main()
