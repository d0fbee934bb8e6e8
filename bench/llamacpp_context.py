"""llama.cpp's own decode speed after prompts of different lengths: what a longer prompt costs every step.

    python bench/llamacpp_context.py [--threads 1] [--prompts 40,205,300] [--tokens 96] [--no-flash-attn]

No sampler and none of our code: llama-cpp-python's `Llama` on the default model, one context per prompt
length, each filled with its prompt, then one token decoded on each in turn (so a drifting machine slows all
alike), `--tokens` times. Every decode step attends over the whole cache, so the cost grows with what came
before. bench/tools.py's answers with tools carry a ~205-token prompt (the tools' block) against ~40 without:
this is the part of its `ratio_tools_vs_plain` that no tool code pays. Prints tok/s per prompt length and, for
each length, `ratio_<length>_vs_<first>=`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import llama_cpp  # noqa: E402

from engine.sources.default_model import default_model_path  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", default="40,205,300", help="prompt lengths in tokens, the first the reference")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--no-flash-attn", action="store_true", help="llama.cpp's attention without flash attention")
    args = ap.parse_args()
    lengths = [int(x) for x in args.prompts.split(",")]
    path = str(default_model_path())
    models = []
    for n in lengths:
        llm = llama_cpp.Llama(path, n_ctx=max(lengths) + args.tokens + 16, n_threads=args.threads,
                              n_threads_batch=args.threads, flash_attn=not args.no_flash_attn, verbose=False)
        llm.eval([(i * 37) % 40_000 + 100 for i in range(n)])  # any ids: the cost is the cache's length
        models.append(llm)
    seconds = [0.0] * len(lengths)
    for i in range(args.tokens):
        for j, llm in enumerate(models):
            t0 = time.perf_counter()
            llm.eval([(i * 91) % 40_000 + 100])
            seconds[j] += time.perf_counter() - t0
    print(f"model={Path(path).name} threads={args.threads} flash_attn={not args.no_flash_attn} tokens={args.tokens}")
    for n, s in zip(lengths, seconds):
        print(f"prompt {n} tokens: {args.tokens / s:.1f} tok/s")
    for n, s in zip(lengths[1:], seconds[1:]):
        print(f"ratio_{n}_vs_{lengths[0]}={seconds[0] / s:.3f}")
    for llm in models:
        llm.close()


if __name__ == "__main__":
    main()
