"""Two models, one text: 1,000 tokens of the default model (Q4_1 GGUF on llama.cpp) against its float32 torch twin.

    python bench/model_diff.py [--tokens 1000] [--repeat 1] [--no-alone] [--model-a SPEC --backend-a llamacpp]
                               [--model-b SPEC --backend-b torch] [--no-floor]

Loads both models (not timed), runs `compare_models` once on a text of exactly
`--tokens` scored tokens (the project's own docs, cut to length; this first run
also reads and hashes both vocabularies, remembered after), then times it
`--repeat` more times: per token both log-probs, ranks, top 10 and KL both ways
of the full 49k distributions. Prints `model_diff_seconds_1000_tokens=<best
timed run>`, the per-token KL summary and the machine's load before and after
(`/proc/loadavg`): this runs on shared machines, where the load changes what a
second costs.

When A is on llama.cpp it also times llama-cpp-python's own `Llama.eval` of
A's tokens (bench/llamacpp_floor.py) and prints `llamacpp_eval_floor_seconds=`:
A's forward alone, which any comparison on this machine pays at least.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from engine import Engine
from engine.experiments.model_diff import compare_models
from engine.experiments.model_diff_types import ModelDiff
from engine.experiments.score import text_ids

ROOT = Path(__file__).resolve().parent.parent


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "n/a"


def text_of_tokens(tokenizer, n: int) -> str:
    """A prose-and-code text from the project's docs with exactly `n` scored tokens under `tokenizer`."""
    source = "\n\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md")))
    lo, hi = 1, len(source)
    while lo < hi:  # the shortest prefix (in characters) with n + context tokens
        mid = (lo + hi) // 2
        ids, ctx = text_ids(tokenizer, source[:mid])
        if len(ids) - ctx >= n:
            hi = mid
        else:
            lo = mid + 1
    return source[:lo]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=1, help="timed runs after the first (the best is printed)")
    ap.add_argument("--model-a", default=None)
    ap.add_argument("--backend-a", default="llamacpp")
    ap.add_argument("--model-b", default=None)
    ap.add_argument("--backend-b", default="torch")
    ap.add_argument("--no-alone", dest="alone", action="store_false",
                    help="skip timing each model scoring the text by itself")
    ap.add_argument("--no-floor", dest="floor", action="store_false",
                    help="skip timing llama.cpp's own Llama.eval of the text (bench/llamacpp_floor.py)")
    args = ap.parse_args()
    print(f"load before: {loadavg()}", flush=True)
    t0 = time.perf_counter()
    with Engine.load(args.model_a, backend=args.backend_a) as a, Engine.load(args.model_b, backend=args.backend_b) as b:
        print(f"loaded both in {time.perf_counter() - t0:.1f} s: A {a.info.name} ({a.info.backend}, "
              f"{a.info.quantization or a.info.dtype}), B {b.info.name} ({b.info.backend}, {b.info.dtype}, {b.info.device})")
        text = text_of_tokens(a.tokenizer, args.tokens)
        t = time.perf_counter()
        compare_models(a, b, text)  # the first: both vocabularies are read (then remembered), first-call costs
        print(f"first comparison (vocabularies read and hashed, runners warmed): {time.perf_counter() - t:.2f} s",
              flush=True)
        best, diff = float("inf"), None
        for _ in range(max(1, args.repeat)):
            t = time.perf_counter()
            diff = compare_models(a, b, text)
            best = min(best, time.perf_counter() - t)
        assert isinstance(diff, ModelDiff), "the two models should share a tokenizer"
        if args.alone:  # the floor: each model scoring the text by itself, one after the other
            for name, eng in (("A", a), ("B", b)):
                t = time.perf_counter()
                eng.score(text)
                print(f"{name} alone (Engine.score, the whole machine to itself): {time.perf_counter() - t:.2f} s",
                      flush=True)
        if args.floor and a.info.backend == "llamacpp":
            from llamacpp_floor import llama_eval_seconds

            backend = a.wait_ready()
            ids, _ = text_ids(a.tokenizer, text)
            [floor] = llama_eval_seconds(str(backend.path), backend, [[ids[:-1]]])
            print(f"floor: llama-cpp-python's own Llama.eval of A's {len(ids) - 1} tokens ({backend.n_threads} "
                  f"threads, only the last position's logits): {floor:.2f} s", flush=True)
            print(f"llamacpp_eval_floor_seconds={floor:.2f}")
        s = diff.summary_dict()
        print(f"{s['tokens']} tokens scored under both; forward calls A/B {diff.forward_calls}")
        print(f"per-token KL(A||B) nats: mean {s['mean_kl_ab']:.5f} median {s['median_kl_ab']:.5f} "
              f"p90 {s['p90_kl_ab']:.5f} p99 {s['p99_kl_ab']:.5f} max {s['max_kl_ab']:.5f}; "
              f"KL(B||A) mean {s['mean_kl_ba']:.5f}; same top token {s['top_token_agreement']:.1%}; "
              f"perplexity A {s['perplexity_a']:.3f} B {s['perplexity_b']:.3f}")
        print(f"load after: {loadavg()}")
        print(f"model_diff_seconds_{args.tokens}_tokens={best:.2f}")


if __name__ == "__main__":
    main()
