"""What teacher-forced scoring costs: one pass in chunks of positions vs one single-token forward per position.

    python bench/score.py [--model SPEC] [--backend torch] [--repeat 2] [--no-step]

`score` runs the text through the backend's research runner, every position's
logits kept, one forward per chunk of positions (256 at the default model's
vocabulary). The step-by-step fallback (`score_step_by_step`, what backends
without such a runner use) costs one forward per token. This prints both,
next to one plain transformers forward over the whole text (torch backends
only): the floor that a teacher-forced pass can reach.
"""

from __future__ import annotations

import argparse
import time

from engine import Engine
from engine.experiments import score, score_step_by_step, text_ids

TEXT = (
    "The lighthouse keeper climbed the narrow stairs every evening, counting each step out loud, "
    "because his father had done the same and his grandfather before him. "
)


def best_of_two(eng: Engine, fn) -> tuple[float, object]:
    """The faster of two runs on the model's worker thread (the first warms up), and its result."""
    best, result = float("inf"), None
    for _ in range(2):
        eng.call(lambda b: b.trim_cache(0)).result()
        t0 = time.perf_counter()
        result = eng.call(fn).result()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--backend", default="torch")
    p.add_argument("--repeat", type=int, default=2, help="copies of the sample text")
    p.add_argument("--no-step", action="store_true", help="skip the (slow) step-by-step run")
    args = p.parse_args()
    text = TEXT * args.repeat
    with Engine.load(args.model, backend=args.backend) as eng:
        backend = eng.wait_ready()
        ids, context = text_ids(backend.tokenizer, text)
        one_pass, result = best_of_two(eng, lambda b: score(b, ids, context=context))
        n = len(result.tokens)
        print(f"{args.backend}: {n} tokens scored in one pass ({result.forward_calls} forward calls): "
              f"{one_pass:.2f} s ({one_pass / n * 1000:.1f} ms/token); perplexity {result.perplexity:.2f}")
        if not args.no_step:
            step, stepped = best_of_two(eng, lambda b: score_step_by_step(b, ids, context=context))
            print(f"step by step ({stepped.forward_calls} forward calls): {step:.2f} s "
                  f"({step / n * 1000:.1f} ms/token); perplexity {stepped.perplexity:.2f}; "
                  f"one pass is {step / one_pass:.1f}x faster")
        model = getattr(backend, "model", None)
        if args.backend == "torch" and model is not None:
            import torch

            def plain_forward(b):
                t = torch.tensor([ids], device=next(model.parameters()).device)
                with torch.inference_mode():
                    model(input_ids=t)
                    t0 = time.perf_counter()
                    model(input_ids=t)
                    return time.perf_counter() - t0

            full = eng.call(plain_forward).result()
            print(f"one plain forward over all {len(ids)} tokens: {full * 1000:.0f} ms "
                  f"(one pass adds the KV cache and the per-position sampler statistics: {one_pass / full:.1f}x that)")


if __name__ == "__main__":
    main()
