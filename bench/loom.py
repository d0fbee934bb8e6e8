"""The loom's N continuations vs the same N answers one after another, on the default model.

    python bench/loom.py [--model SPEC] [--backend auto|torch|mlx|llamacpp] [--n 8] [--tokens 64] [--repeats 3]

Both ways make the same children (row r seeded `seed + r`, the same sampler,
`ignore_eos` so every child is `--tokens` long) from one chat prompt:

- one after another: N regenerations through the ordinary decode loop
  (`generate_events`), the prompt's KV cache reused between them as a
  regenerate in the chat reuses it;
- together: `engine.loom.continuation_events`, the prefix once and one
  batched forward per step for all N rows.

Prints each time (best of `--repeats`) and `loom_speedup` = sequential / batched.
Goal >= 4x for 8 x 64 tokens. Timings on a shared machine move with the load.

It also prints `batching_ceiling`: one forward of N rows against N forwards of
one row, timed on the model's own batch runner (the same prefix, 20 steps
each). No loom can beat it: when the model's forward for 8 rows costs as much
as 3.7 forwards of one (llama.cpp on a CPU, where a quantised matmul's cost
grows with the rows), 8 children cannot come faster than 8 / 3.7 = 2.2x.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.quiet import quiet_third_party  # noqa: E402

PROMPT = "Tell me a short story about a lighthouse keeper and a storm."


def batching_ceiling(backend, prompt: list[int], n: int, steps: int = 20) -> float:
    """(time of `steps` one-row forwards x n) / (time of `steps` n-row forwards), on the backend's batch runner."""
    per_step = {}
    for rows in (1, n):
        runner = backend.batch_runner()
        try:
            runner.start([prompt])
            runner.reorder([0] * rows)
            runner.step([prompt[-1]] * rows)  # warm-up
            t = time.perf_counter()
            for _ in range(steps):
                runner.step([prompt[-1]] * rows)
            per_step[rows] = (time.perf_counter() - t) / steps
        finally:
            close = getattr(runner, "close", None)
            if close is not None:
                close()
    print(f"one forward: 1 row {per_step[1] * 1000:.1f} ms, {n} rows {per_step[n] * 1000:.1f} ms")
    return n * per_step[1] / per_step[n]


def best_alternating(sequential, batched, repeats: int) -> tuple[float, float, int, int]:
    """Warm both up, then time them in turn `repeats` times (so drift hits both alike); returns (best sequential
    seconds, best batched seconds, tokens the last sequential run made, tokens the last batched run made)."""
    sequential()  # warm-up: the prompt is cached for the sequential runs, as after a first answer
    batched()
    best_seq = best_bat = float("inf")
    made_seq = made_bat = 0
    for _ in range(repeats):
        t = time.perf_counter()
        made_seq = sequential()
        best_seq = min(best_seq, time.perf_counter() - t)
        t = time.perf_counter()
        made_bat = batched()
        best_bat = min(best_bat, time.perf_counter() - t)
    return best_seq, best_bat, made_seq, made_bat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model spec (default: the default model)")
    parser.add_argument("--backend", default="auto", help="auto, torch, mlx or llamacpp")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    quiet_third_party()

    from engine.decode.loop import generate_events, prompt_ids_for
    from engine.events import TokenEvent
    from engine.loom import continuation_events
    from engine.loom.continuations import collect
    from engine.open_model import load_model
    from engine.request import GenerationRequest
    from engine.sampling import SamplerSettings

    backend = load_model(args.model, backend=args.backend)
    request = GenerationRequest(
        messages=({"role": "user", "content": PROMPT},),
        sampler=SamplerSettings(temperature=0.8, top_p=0.95, seed=7),
        max_new_tokens=args.tokens, top_n=20, ignore_eos=True,
    )
    print(f"{backend.info.name} ({backend.info.backend}): {args.n} children of {args.tokens} tokens")

    def sequential() -> int:
        made = 0
        for r in range(args.n):
            row = GenerationRequest(**{**request.__dict__, "sampler": request.sampler.with_(seed=7 + r)})
            made += sum(isinstance(e, TokenEvent) for e in generate_events(backend, row))
        return made

    def batched() -> int:
        tokens, _ = collect(continuation_events(backend, request, args.n), args.n)
        return sum(len(t) for t in tokens)

    ceiling = batching_ceiling(backend, prompt_ids_for(backend.tokenizer, request), args.n)
    best_seq, best_bat, made_seq, made_bat = best_alternating(sequential, batched, args.repeats)
    assert made_seq == made_bat == args.n * args.tokens, (made_seq, made_bat)
    print(f"one after another: {best_seq:.2f} s ({made_seq / best_seq:.0f} tokens/s)")
    print(f"together (batched): {best_bat:.2f} s ({made_bat / best_bat:.0f} tokens/s)")
    print(f"batching_ceiling={ceiling:.2f} (one forward of {args.n} rows vs {args.n} forwards of one)")
    print(f"loom_speedup={best_seq / best_bat:.2f}")
    backend.close()


if __name__ == "__main__":
    main()
