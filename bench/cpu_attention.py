"""One decode step's attention on the CPU: the C kernel (engine/backends/cpu_attention.py) vs torch's.

    python bench/cpu_attention.py [--positions 512 1500 3000] [--rounds 8] [--model SPEC] [--step-rounds 6]

Shapes are the default model's (30 layers, 3 KV heads of 3 query heads each, head size 64), float32,
each layer's keys and values in a buffer of their own (138 MB at 3,000 positions, more than the CPU's
caches, as in a real step), and a 5 MB matmul before each layer's attention, as a step has, so that no
layer finds the previous one's bytes in cache. Per length, alternating in rounds: the kernel; torch's
`scaled_dot_product_attention` with the query heads of a KV head as its queries (what the lean step
runs without the kernel); and a plain `sum` over the same keys and values (how fast this machine reads
them). Medians over the rounds, us per layer and GB/s of K/V read.
Then the default model's (or --model's) lean decode step, ms per token at 150 and 3,000 cached tokens,
with the kernel and with torch's attention, alternating (medians of --step-rounds, 40 steps each;
0 skips it): its time at 150 over its time at 3,000 is what `long_context_ratio` in bench/decode.py
measures through a whole 3,000-token generation, here without the drift of a 4-minute run on a
shared host.
Last lines: step_ratio_kernel=X.XX, step_ratio_torch=X.XX, kernel_speedup=X.XX (torch's attention
time / the kernel's, at the longest length).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from cpu_linear import step_ms  # noqa: E402  (bench/cpu_linear.py: bench/ is the script folder, first on sys.path)

from engine.backends import cpu_attention  # noqa: E402
from engine.backends.torch_backend import TorchBackend  # noqa: E402
from engine.loading import materialize, resolve_spec  # noqa: E402
from engine.quiet import quiet_third_party  # noqa: E402

LAYERS, KV_HEADS, GROUP, HEAD_DIM = 30, 3, 3, 64


def lean_step_ratios(spec: str | None, kernel: cpu_attention.DecodeAttention, rounds: int) -> dict[str, float]:
    """{"kernel"|"torch": ms per step at 150 cached tokens / ms at 3,000} for the model's lean step."""
    quiet_third_party()
    source = resolve_spec(spec)
    backend = TorchBackend(materialize(source), spec=source.spec, display_name=source.name, device="cpu")
    lean = backend.lean
    if lean is None:
        sys.exit("this model has no lean decode step (not Llama-shaped)")
    lean.attention_kernel, kernels = kernel, dict(lean.kernels)
    prompt = torch.randint(100, backend.info.vocab_size - 100, (3000,), generator=torch.Generator().manual_seed(0))
    backend.forward(prompt.tolist())  # a real cache of 3,000 tokens; the shorter runs crop it
    ms: dict[tuple[str, int], float] = {}
    for cached in (3000, 150):  # the cache only crops: longest first
        times: dict[str, list[float]] = {"kernel": [], "torch": []}
        for _ in range(rounds):
            for attention in times:
                lean.use_attention_kernel = attention == "kernel"
                times[attention].append(step_ms(backend, kernels, cached))
        for attention, spent in times.items():
            ms[attention, cached] = statistics.median(spent)
        print(f"lean step of {backend.info.name} at {cached} cached tokens: {ms['kernel', cached]:.1f} ms/token with "
              f"the kernel, {ms['torch', cached]:.1f} with torch's attention (medians of {rounds})")
    backend.close()
    return {attention: ms[attention, 150] / ms[attention, 3000] for attention in ("kernel", "torch")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--positions", type=int, nargs="+", default=[512, 1500, 3000])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--model", default=None)
    ap.add_argument("--step-rounds", type=int, default=6, help="rounds of the lean step timing; 0 skips it")
    args = ap.parse_args()
    kernel = cpu_attention.load()
    if kernel is None:
        sys.exit("no CPU attention kernel on this machine (see the log above)")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; kernel {kernel.path.name}")
    generator = torch.Generator().manual_seed(0)
    capacity = max(args.positions)
    keys = [torch.randn(1, KV_HEADS, capacity, HEAD_DIM, generator=generator) for _ in range(LAYERS)]
    values = [torch.randn(1, KV_HEADS, capacity, HEAD_DIM, generator=generator) for _ in range(LAYERS)]
    weights = [torch.randn(2304, 576, generator=generator) for _ in range(LAYERS)]
    row = torch.randn(1, 576, generator=generator)
    q = torch.randn(1, KV_HEADS, GROUP, HEAD_DIM, generator=generator)
    scale = HEAD_DIM**-0.5
    ways = {
        "kernel": lambda k, v: kernel(q, k, v, scale),
        "torch sdpa": lambda k, v: F.scaled_dot_product_attention(q, k, v, scale=scale),
        "plain read": lambda k, v: (k.sum(), v.sum()),
    }
    speedup = None
    with torch.inference_mode():
        for n in args.positions:
            k0, v0 = keys[0][:, :, :n], values[0][:, :, :n]
            error = (ways["kernel"](k0, v0) - ways["torch sdpa"](k0, v0)).abs().max().item()
            times: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(args.rounds):
                for name, way in ways.items():
                    spent = 0.0
                    for layer in range(LAYERS):
                        F.linear(row, weights[layer])
                        k, v = keys[layer][:, :, :n], values[layer][:, :, :n]
                        start = time.perf_counter()
                        way(k, v)
                        spent += time.perf_counter() - start
                    times[name].append(spent / LAYERS)
            nbytes = 2 * KV_HEADS * n * HEAD_DIM * 4
            print(f"{n} positions ({nbytes * LAYERS / 1e6:.0f} MB of K/V a step; "
                  f"kernel vs torch max diff {error:.1e}):")
            for name, spent in times.items():
                median = statistics.median(spent)
                print(f"  {name:11s} {median * 1e6:7.1f} us a layer, {nbytes / median / 1e9:5.1f} GB/s")
            speedup = statistics.median(times["torch sdpa"]) / statistics.median(times["kernel"])
    if args.step_rounds:
        for attention, ratio in lean_step_ratios(args.model, kernel, args.step_rounds).items():
            print(f"step_ratio_{attention}={ratio:.2f}")
    print(f"kernel_speedup={speedup:.2f}")


if __name__ == "__main__":
    main()
