"""Decode speed with full inspection vs `model.generate()` on the same loaded model, same process.

    python bench/decode.py [--model SPEC] [--new-tokens 128] [--rounds 3]

Runs alternate (ours, generate, ours, ...) so drift hits both alike. Both are
greedy and ignore EOS so every run makes exactly --new-tokens tokens. Decode
tokens/s counts tokens after the first over the time after the first (prefill
excluded) for both, and the tokens must be the same. Then: time to first
token of chat turn 5 vs turn 1 for equal new input. Then one long greedy
generation (--long-tokens, 3,000 by default) through the decode loop the
engine's worker runs (`generate_events`) on this torch backend: tok/s over
tokens 2,900-3,000 divided by tok/s over 100-200 (1.00 = no slowdown as the
answer grows). It runs on this (main) thread, not through `Engine`: once
the main thread has run torch's OpenMP kernels, the same kernels run ~30%
slower from a second thread (measured: 383 vs 275 us per gemv), which would
make the long run's rates say nothing about the cache. The app never hits
this: its engine loads and runs the model on the worker thread only
(`Engine.load`: 36 tok/s, as here).
Also: the weights floor, the time of one step's matmuls alone (every
linear layer's weight times one input row, head included): a decode step
cannot be faster than reading its weights, so ours / floor says how much of
a step is anything else; it is given for each matmul kernel the lean step
can pick on this machine (torch's, and oneDNN's for float32 on the CPU).
`--lean off` measures transformers' forward for our decode steps instead of
the lean step (engine/backends/torch/lean.py); `--linear torch|onednn` pins
the lean step's matmul kernel instead of timing both at load.
With `--compile on` the compiled step over the fixed-shape (static) cache is waited for, then timed against
the lean step on the same model and tokens, in turn (`ratio_static_vs_lean=`: the static step's tok/s over
the lean step's; 1.00 or more: no slower).
Last lines: ratio_vs_generate=X.XX, long_context_ratio=X.XX and (with --compile on) ratio_static_vs_lean=X.XX
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from chat_turns import chat_ttft  # noqa: E402  (bench/ is the script folder, first on sys.path)
from transformers.generation.streamers import BaseStreamer  # noqa: E402

from engine.backends.torch import linear as cpu_linear  # noqa: E402
from engine.backends.torch.backend import TorchBackend  # noqa: E402
from engine.decode.loop import generate_events  # noqa: E402
from engine.events import Done  # noqa: E402
from engine.sources import materialize, resolve_spec  # noqa: E402
from engine.quiet import quiet_third_party  # noqa: E402
from engine.request import GenerationRequest  # noqa: E402
from engine.sampling.settings import SamplerSettings  # noqa: E402

PROMPT = (
    "Write a detailed, friendly explanation of how rainbows form, covering sunlight, water droplets, "
    "refraction, reflection and why the colours always appear in the same order."
)
GREEDY = SamplerSettings(temperature=0.0)


class TimingStreamer(BaseStreamer):
    """Records when generate() produces each token (the first put() is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def ours(backend: TorchBackend, prompt_ids: list[int], n: int) -> tuple[float, list[int]]:
    backend.trim_cache(0)  # no reuse: the same work generate() does
    req = GenerationRequest(prompt_ids=tuple(prompt_ids), sampler=GREEDY, max_new_tokens=n, top_n=20, ignore_eos=True)
    done = [e for e in generate_events(backend, req)][-1]
    assert isinstance(done, Done) and done.stats.generated_tokens == n
    return done.stats.decode_tokens_per_s, list(done.stats.token_ids)


def theirs(backend: TorchBackend, prompt_ids: list[int], n: int) -> tuple[float, list[int]]:
    streamer = TimingStreamer()
    with torch.inference_mode():
        out = backend.model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False, streamer=streamer
        )
    assert out.shape[1] == len(prompt_ids) + n
    first, last = streamer.times[1], streamer.times[-1]
    return (n - 1) / (last - first), out[0, len(prompt_ids) :].tolist()


def sampler_cost_ms(backend: TorchBackend, prompt_ids: list[int], n: int = 64) -> dict[str, float]:
    """Median ms per token of SamplerChain.pick (chain + top-20 + entropy) on this model's real logits."""
    import numpy as np

    from engine.sampling import SamplerChain

    backend.trim_cache(0)
    rows, logits = [], backend.forward(prompt_ids)
    for _ in range(n):  # greedy walk, keeping each step's logits
        rows.append(logits)
        logits = backend.forward([int(np.argmax(logits))])
    history = np.asarray(prompt_ids, dtype=np.int64)
    settings = SamplerSettings(temperature=0.8, top_p=0.95, min_p=0.05, repetition_penalty=1.1, seed=0)
    out = {}
    for record in (False, True):
        chain, times = SamplerChain(settings), []
        for row in rows:
            t = time.perf_counter()
            chain.pick(row, history, top_n=20, record_stages=record)
            times.append(time.perf_counter() - t)
        out["stages" if record else "plain"] = statistics.median(times) * 1000
    return out


def weights_floor_ms(backend: TorchBackend, kernel: str = "torch", rounds: int = 20) -> tuple[float, int]:
    """Median ms of one pass of matmuls over every linear layer's weight (one input row each, with `kernel`
    from engine/backends/torch/linear.py), and their bytes."""
    linear = cpu_linear.KERNELS[kernel]
    linears = [m for m in backend.model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {m: torch.ones(1, m.in_features, dtype=m.weight.dtype, device=m.weight.device) for m in linears}
    nbytes = sum(m.weight.numel() * m.weight.element_size() for m in linears)
    times = []
    with torch.inference_mode():
        for _ in range(rounds + 1):
            t = time.perf_counter()
            for m in linears:
                linear(inputs[m], m.weight, None)
            if backend.device.type == "cuda":
                torch.cuda.synchronize(backend.device)
            times.append(time.perf_counter() - t)
    return statistics.median(times[1:]) * 1000, nbytes


def long_context_ratio(backend: TorchBackend, prompt_ids: list[int], n: int) -> float:
    """tok/s over tokens n-100..n over tok/s over 100..200 of one greedy generation through the decode loop."""
    from engine.events import TokenEvent

    backend.trim_cache(0)
    req = GenerationRequest(prompt_ids=tuple(prompt_ids), sampler=GREEDY, max_new_tokens=n, top_n=20, ignore_eos=True)
    times = [time.perf_counter() for e in generate_events(backend, req) if isinstance(e, TokenEvent)]
    assert len(times) == n

    def rate(a: int, b: int) -> float:  # tokens a..b (0-based), b - a of them after token a
        return (b - a) / (times[b - 1] - times[a - 1])

    early, late = rate(100, 200), rate(n - 100, n)
    for a in range(0, n - 99, max(n // 10, 100)):
        if a:
            print(f"  tokens {a}-{a + 100}: {rate(a, a + 100):.1f} tok/s")
    print(f"long generation ({n} tokens, the decode loop, torch): tokens 100-200 {early:.1f} tok/s, "
          f"tokens {n - 100}-{n} {late:.1f} tok/s")
    return late / early


def static_vs_lean(backend: TorchBackend, prompt_ids: list[int], n: int, rounds: int) -> tuple[float, bool]:
    """(the compiled static step's decode tok/s over the lean step's, whether their tokens were the same),
    taken in turn on one backend: the lean step runs while the compiled one is set aside."""
    compiled = backend.compiled
    static, lean, same = [], [], True
    for r in range(rounds):
        rate, static_tokens = ours(backend, prompt_ids, n)
        static.append(rate)
        backend.compiled = None  # forward() then takes the lean step
        try:
            rate, lean_tokens = ours(backend, prompt_ids, n)
        finally:
            backend.compiled = compiled
        lean.append(rate)
        same = same and static_tokens == lean_tokens
        print(f"round {r + 1}: static (compiled) step {static[-1]:.1f} tok/s, lean step {lean[-1]:.1f} tok/s")
    return statistics.median(static) / statistics.median(lean), same


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--long-tokens", type=int, default=3000, help="length of the long generation; 0 skips it")
    ap.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                    help="the backend's compiled decode step (auto: on for CUDA, off for the CPU); waited for")
    ap.add_argument("--lean", choices=("on", "off"), default="on",
                    help="the lean decode step for Llama-shaped models (off: transformers' forward every step)")
    ap.add_argument("--linear", choices=("auto", *cpu_linear.KERNELS), default="auto",
                    help="the lean step's matmul kernels (auto: the faster of torch's and oneDNN's per weight role, "
                         "timed at load)")
    args = ap.parse_args()
    quiet_third_party()
    source = resolve_spec(args.model)
    compile_step = {"auto": None, "on": True, "off": False}[args.compile]
    # TorchBackend directly: the default model would otherwise pick llama.cpp.
    backend = TorchBackend(materialize(source), spec=source.spec, display_name=source.name, compile_step=compile_step)
    if args.lean == "off":
        backend.lean = None
    elif backend.lean is not None:
        kernels = backend.lean.choose_kernels(args.linear) if args.linear != "auto" else backend.lean.kernels
        print("lean step kernels: " + ", ".join(f"{role} {name}" for role, name in kernels.items()))
    print(f"decode step: {'compiled' if backend.compiled else 'lean' if backend.lean else 'transformers forward'}")
    if backend.compiled is not None:
        t = time.perf_counter()
        usable = backend.compiled.wait()
        print(f"compiled decode step: {'ready' if usable else 'failed'} after {time.perf_counter() - t:.0f} s")
    print(f"model {backend.info.name}: {backend.info.parameters / 1e6:.0f}M params, vocab {backend.info.vocab_size}, "
          f"{backend.info.device}, torch {torch.__version__}")
    prompt_ids = backend.tokenizer.chat_ids([{"role": "user", "content": PROMPT}])
    print(f"prompt {len(prompt_ids)} tokens, {args.new_tokens} new tokens, {args.rounds} rounds (after one warm-up each)")
    ours(backend, prompt_ids, 8)
    theirs(backend, prompt_ids, 8)
    a, b, same = [], [], True
    for r in range(args.rounds):
        rate, our_tokens = ours(backend, prompt_ids, args.new_tokens)
        a.append(rate)
        rate, their_tokens = theirs(backend, prompt_ids, args.new_tokens)
        b.append(rate)
        same = same and our_tokens == their_tokens
        print(f"round {r + 1}: ours {a[-1]:.1f} tok/s (inspection: top-20 + entropy), generate() {b[-1]:.1f} tok/s")
    cost = sampler_cost_ms(backend, prompt_ids)
    print(f"sampler + inspection on real logits (vocab {backend.info.vocab_size}): {cost['plain']:.2f} ms/token, "
          f"{cost['stages']:.2f} ms/token with per-stage snapshots")
    print("chat time to first token, equal new input per turn:")
    ttfts = chat_ttft(backend)
    print(f"ttft turn5/turn1 = {ttfts[4] / ttfts[0]:.2f}")
    print(f"ours median {statistics.median(a):.1f} tok/s, generate() median {statistics.median(b):.1f} tok/s, "
          f"same tokens: {'yes' if same else 'NO'}")
    ours_ms = 1000 / statistics.median(a)
    for kernel in cpu_linear.candidates(next(backend.model.parameters())):
        floor_ms, nbytes = weights_floor_ms(backend, kernel)
        print(f"weights floor ({kernel} kernel): {floor_ms:.1f} ms per step for {nbytes / 2**20:.0f} MiB of linear "
              f"weights ({nbytes / floor_ms / 1e6:.1f} GB/s); ours {ours_ms:.1f} ms/token, "
              f"{floor_ms / ours_ms:.0%} of the floor's speed")
    ratio = statistics.median(a) / statistics.median(b)
    long_ratio = long_context_ratio(backend, prompt_ids, args.long_tokens) if args.long_tokens >= 300 else None
    static_ratio = None
    if backend.compiled is not None and backend.compiled.step is not None and backend.lean is not None:
        static_ratio, same_static = static_vs_lean(backend, prompt_ids, args.new_tokens, args.rounds)
        print(f"static step vs lean step: same tokens: {'yes' if same_static else 'NO'}")
    print(f"ratio_vs_generate={ratio:.2f}")
    if long_ratio is not None:
        print(f"long_context_ratio={long_ratio:.2f}")
    if static_ratio is not None:
        print(f"ratio_static_vs_lean={static_ratio:.2f}")


if __name__ == "__main__":
    main()
