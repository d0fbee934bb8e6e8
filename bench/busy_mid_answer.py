"""A program that starts spinning in the middle of an answer: the answer's tok/s before it and after it.

    python bench/busy_mid_answer.py [--tokens 400] [--after-s 0.5] [--rounds 2]

The default model on llama.cpp, threads chosen by the engine (none asked for), Balanced-like sampling with the
top-20 and every stage recorded, `ignore_eos`. `--after-s` into the answer a Python busy loop starts in a
process of its own (a build, a browser tab) and runs to the answer's end. Printed per round: tok/s before it,
and after it from 0.3 s on (the time the engine has to notice). llama.cpp's threads meet at a barrier after
every graph node; two threads on two cores beside a busy program fall to a few tokens a second
(bench/threads.py), so an answer that keeps the count it started on pays that to its end, and one that follows
the free cores (engine/backends/llamacpp/backend.py, `_follow_free_cores`) drops to the threads left free.
Last line: `busy_mid_answer_tok_s=X.X ratio_after_vs_before=X.XX` (medians over the rounds).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import Engine, GenerationRequest, SamplerSettings  # noqa: E402
from engine.events import TokenEvent  # noqa: E402

SETTLE_S = 0.3  # after the busy program starts: the engine's re-reading of the free cores (0.25 s) and a margin


def one_answer(engine: Engine, tokens: int, after_s: float) -> tuple[float, float]:
    """(tok/s before the busy program, tok/s from SETTLE_S after it started) of one answer."""
    request = GenerationRequest(prompt="Once upon a time", max_new_tokens=tokens, ignore_eos=True, top_n=20,
                                record_stages=True, sampler=SamplerSettings(temperature=0.8, seed=1))
    times: list[float] = []
    spinner: subprocess.Popen | None = None
    started = 0.0
    t0 = time.perf_counter()
    try:
        for event in engine.generate(request):
            if not isinstance(event, TokenEvent):
                continue
            times.append(time.perf_counter())
            if spinner is None and times[-1] - t0 > after_s:
                spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                started = times[-1]
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    before = [t for t in times if t < started]
    after = [t for t in times if t >= started + SETTLE_S]
    if len(before) < 2 or len(after) < 2:
        raise SystemExit("the answer was too short to time both parts: raise --tokens")
    return (len(before) - 1) / (before[-1] - before[0]), (len(after) - 1) / (after[-1] - after[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--after-s", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with Engine.load() as engine:
        list(engine.generate(GenerationRequest(prompt="Hi", max_new_tokens=8)))  # warm
        befores, afters = [], []
        for _ in range(args.rounds):
            time.sleep(1.5)  # the last round's busy program out of the next answer's start reading
            before, after = one_answer(engine, args.tokens, args.after_s)
            befores.append(before)
            afters.append(after)
            print(f"round: {before:.1f} tok/s before the busy program, {after:.1f} tok/s after it", flush=True)
        print(f"model={engine.info.name} device={engine.info.device} tokens={args.tokens} after_s={args.after_s}")
        after, before = statistics.median(afters), statistics.median(befores)
        print(f"busy_mid_answer_tok_s={after:.1f} ratio_after_vs_before={after / before:.2f}")


if __name__ == "__main__":
    main()
