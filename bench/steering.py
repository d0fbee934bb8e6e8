"""Decoding with a control vector against without it, on llama.cpp and torch; and training time from 32 pairs.

    python bench/steering.py [--model SPEC] [--tokens 64] [--repeat 5] [--pairs 32] [--backends llamacpp,torch]
                             [--threads N]

Per backend: the vector is trained there from the built-in happy-sad set (the time is printed), then
greedy answers of `--tokens` tokens (end of sequence ignored) alternate plain / steered `--repeat` times
each, and the median decode speeds are compared:

    llamacpp: train_s=... pairs=32  plain=... tok/s  steered=... tok/s  ratio_steered_vs_plain=0.99

The issue's goal is ratio >= 0.95 and training under 30 s on two cores. Figures depend on the machine and on
what else runs on it (print /proc/loadavg beside them).
"""

from __future__ import annotations

import argparse
import statistics
import time

from engine import Engine, GenerationRequest, SamplerSettings
from engine.steering import Steering, builtin_pair_sets

PROMPT = [{"role": "user", "content": "Tell me about your favourite season and why."}]


def speed(eng: Engine, steering: Steering | None, tokens: int) -> float:
    stats = eng.complete(GenerationRequest(messages=tuple(PROMPT), sampler=SamplerSettings(temperature=0.0),
                                           max_new_tokens=tokens, ignore_eos=True, steering=steering))
    return stats.decode_tokens_per_s


def bench_backend(spec: str | None, backend: str, tokens: int, repeat: int, n_pairs: int, threads: int | None) -> None:
    # llama.cpp otherwise picks its threads per answer from the cores free at that moment: on a shared machine
    # the plain and the steered answers could then run on different thread counts.
    fixed = {"n_threads": threads} if threads and backend == "llamacpp" else {}
    with Engine.load(spec, backend=backend, **fixed) as eng:
        pairs = builtin_pair_sets()["happy-sad"].limited(n_pairs)
        t0 = time.perf_counter()
        vector = eng.train_steering_vector(pairs)
        train_s = time.perf_counter() - t0
        steering = Steering.of((vector, 4.0))
        speed(eng, None, 8)  # warm: first-use work (the lean step's check, kernel choice) is not timed
        speed(eng, steering, 8)
        plain, steered = [], []
        for _ in range(repeat):  # alternated, so a change in the machine's load falls on both
            plain.append(speed(eng, None, tokens))
            steered.append(speed(eng, steering, tokens))
        p, s = statistics.median(plain), statistics.median(steered)
        print(f"{backend}: {eng.info.name} ({eng.info.device}) train_s={train_s:.2f} pairs={len(pairs)}  "
              f"plain={p:.1f} tok/s  steered={s:.1f} tok/s  ratio_steered_vs_plain={s / p:.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=32)
    parser.add_argument("--backends", default="llamacpp,torch")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp's threads, the same for every answer")
    args = parser.parse_args()
    for backend in args.backends.split(","):
        bench_backend(args.model, backend.strip(), args.tokens, args.repeat, args.pairs, args.threads)


if __name__ == "__main__":
    main()
