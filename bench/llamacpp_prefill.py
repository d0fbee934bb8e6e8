"""What one llama.cpp decode of N prompt positions costs per token, for N from 10 to 500, at 1 and 2 threads.

Why it matters: batching texts into fewer, longer decodes (batch scoring, a server's shared prefill) only pays
where a long decode costs less per token than a short one. On the CPU it barely does; on a GPU it would.

    python bench/llamacpp_prefill.py [--threads 1,2] [--sizes 10,50,200,500]

Prints one line per (threads, size): `threads=T tokens=N: X ms, Y ms/token` (best of 3).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import llama_cpp  # noqa: E402

from engine.backends.llamacpp import LlamaCppBackend  # noqa: E402
from engine.backends.llamacpp.runner import LlamaCppRunner  # noqa: E402
from engine.sources import resolve_spec  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--sizes", default="10,50,200,500")
    args = ap.parse_args()
    source = resolve_spec(None)
    for threads in (int(t) for t in args.threads.split(",")):
        backend = LlamaCppBackend(source.path, spec="default", display_name=source.name, n_threads=threads)
        ids = backend.tokenizer.encode("The old sailor walked slowly to the harbour before dawn. " * 60)
        runner = LlamaCppRunner(backend, max_seqs=1, n_batch=512)
        try:
            for n in (int(s) for s in args.sizes.split(",")):
                best = float("inf")
                for _ in range(3):
                    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(runner.ctx), False)
                    t0 = time.perf_counter()
                    runner.start([ids[:n]])
                    best = min(best, time.perf_counter() - t0)
                print(f"threads={threads} tokens={n}: {best * 1000:.1f} ms, {best * 1000 / n:.2f} ms/token", flush=True)
        finally:
            runner.close()
            backend.close()


if __name__ == "__main__":
    main()
