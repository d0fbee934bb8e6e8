"""The lean decode step's matmul kernels on this CPU: torch's (MKL) against oneDNN's, same process.

    python bench/cpu_linear.py [--model SPEC] [--rounds 6] [--positions 150,3000]

First, per weight role (qkv, o, gate/up, down, head), one row times every
layer's weight of that role, swept as a decode step meets them, with each
kernel (best of --rounds sweeps): what `cpu_linear.fastest` times at load,
with more rounds. Then the whole lean step, ms per token at each of
--positions cached tokens, with every role on torch's kernel against the
kernels picked at load ("auto"), alternating so that drift on a shared host
hits both. Last line: auto_speedup=X.XX (torch ms / auto ms at the fewest
cached tokens).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engine.backends.torch import linear as cpu_linear  # noqa: E402
from engine.backends.torch.backend import TorchBackend  # noqa: E402
from engine.sources import materialize, resolve_spec  # noqa: E402
from engine.quiet import quiet_third_party  # noqa: E402


def step_ms(backend: TorchBackend, kernels, cached: int, steps: int = 40) -> float:
    lean = backend.lean
    lean.choose_kernels(kernels)
    cache = backend._cache
    cache.crop(cached - cache.get_seq_length())  # back to `cached` tokens: the steps below append to it
    start = time.perf_counter()
    for _ in range(steps):
        lean.step(1000, cache)
    return (time.perf_counter() - start) / steps * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--positions", default="150,3000")
    args = ap.parse_args()
    quiet_third_party()
    source = resolve_spec(args.model)
    backend = TorchBackend(materialize(source), spec=source.spec, display_name=source.name, device="cpu")
    lean = backend.lean
    if lean is None:
        sys.exit("this model has no lean decode step (not Llama-shaped)")
    if cpu_linear.candidates(lean.head) == ["torch"]:
        sys.exit("this torch build or dtype has only torch's kernel: nothing to compare")
    auto = dict(lean.kernels)
    print(f"model {backend.info.name}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("picked at load: " + ", ".join(f"{role} {name}" for role, name in auto.items()))
    cpu_linear.ROUNDS = args.rounds
    for role, (weights, biases) in lean.weights_by_role().items():
        pick, seconds = cpu_linear.fastest(weights, biases)
        mib = sum(w.numel() * w.element_size() for w in weights) / 2**20
        rates = ", ".join(f"{k} {s * 1e3:.2f} ms ({mib * 2**20 / s / 1e9:.1f} GB/s)" for k, s in seconds.items())
        print(f"  {role:8s} {tuple(weights[0].shape)} x{len(weights)}: {rates} -> {pick}")
    positions = [int(p) for p in args.positions.split(",")]
    longest = max(positions)
    prompt = torch.randint(100, backend.info.vocab_size - 100, (longest,), generator=torch.Generator().manual_seed(0))
    backend.forward(prompt.tolist())  # a real cache of `longest` tokens; shorter runs crop it
    speedups = {}
    for cached in sorted(positions, reverse=True):  # the cache only crops: longest first
        times: dict[str, list[float]] = {"torch": [], "auto": []}
        for _ in range(args.rounds):
            times["torch"].append(step_ms(backend, "torch", cached))
            times["auto"].append(step_ms(backend, auto, cached))
        a, b = statistics.median(times["torch"]), statistics.median(times["auto"])
        speedups[cached] = a / b
        print(f"lean step at {cached} cached tokens: torch kernels {a:.1f} ms/token, auto {b:.1f} ms/token "
              f"({a / b:.2f}x; medians of {args.rounds}, 40 steps each)")
    print(f"auto_speedup={speedups[min(positions)]:.2f}")


if __name__ == "__main__":
    main()
