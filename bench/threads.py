"""llama.cpp decode (and prompt) speed by thread count, alone and beside a busy program.

    python bench/threads.py [--model PATH.gguf] [--max-threads N] [--tokens 64] [--repeats 3] [--prompt-tokens 256]

For every thread count 1..N (N: the CPUs this process may use), the model is
loaded with that many threads for decoding and for the prompt, and the bench
measures greedy decode tok/s (one `forward` per token, argmax, no sampler) and prompt tok/s (one cold prefill),
first with nothing else running, then beside a competing process: a Python
busy loop that keeps one core at 100% (what a browser tab or a build does on
a desktop). Each figure is the median of --repeats runs, the runs alone and
busy alternating so a drifting machine hits both alike.

Why: llama.cpp's threads meet at a barrier after every graph node (hundreds
per token) and wait there by spinning; when one of them shares its core with
another program, every barrier waits for the scheduler to give it a slice,
and decode falls from ~130 to 5-17 tok/s on a 2-core machine. The last
lines print the engine's static default (engine.backends.llamacpp.threads) and
`busy_ratio_default=X.XX` (decode tok/s with the busy program / alone, at
the default thread count).

Then the engine's own choice: the model loaded without a thread count, so
each answer runs on the cores free at its start (engine/cpu_load.py), idle
and beside the busy program, against 1 and 2 fixed threads; the first-token
time is the chat prompt's cold prefill. The last line is
`auto_idle_tok_s=... auto_busy_tok_s=... chosen_idle=N chosen_busy=N`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
BUSY_LOOP = "while True:\n    pass\n"


def decode_rate(backend, prompt_ids: list[int], n: int) -> float:
    """Greedy steps per second after the prompt: one `forward` of one token each (argmax picks it)."""
    from engine.backend import prefill

    backend.trim_cache(0)
    logits, _ = prefill(backend, prompt_ids)
    t0 = time.perf_counter()
    for _ in range(n):
        logits = backend.forward([int(logits.argmax())])
    return n / (time.perf_counter() - t0)


def prompt_rate(backend, ids: list[int]) -> float:
    from engine.backend import prefill

    backend.trim_cache(0)
    t0 = time.perf_counter()
    prefill(backend, ids)
    return len(ids) / (time.perf_counter() - t0)


class BusyProgram:
    """A separate Python process spinning on one core for as long as the `with` block lasts."""

    def __enter__(self) -> "BusyProgram":
        self.proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
        time.sleep(0.2)  # let the scheduler place it
        return self

    def __exit__(self, *exc) -> None:
        self.proc.kill()
        self.proc.wait()


def first_token_s(backend, prompt_ids: list[int]) -> float:
    """A cold prefill of the chat prompt: what the first token waits for."""
    from engine.backend import prefill

    backend.trim_cache(0)
    t0 = time.perf_counter()
    prefill(backend, prompt_ids)
    return time.perf_counter() - t0


def measure(backend, prompt_ids: list[int], long_ids: list[int], tokens: int, repeats: int,
            settle_s: float = 0.0) -> dict[str, float]:
    """Median figures alone and busy; `settle_s`: a pause after the busy program starts and after it ends, so a
    backend that chooses its threads from the measured load sees the new situation (engine.cpu_load.WINDOW_S)."""
    runs: dict[str, list[float]] = {k: [] for k in ("decode", "prompt", "first", "threads",
                                                    "decode_busy", "prompt_busy", "first_busy", "threads_busy")}
    for _ in range(repeats):
        time.sleep(settle_s)
        runs["first"].append(first_token_s(backend, prompt_ids))
        runs["decode"].append(decode_rate(backend, prompt_ids, tokens))
        runs["threads"].append(backend.n_threads)
        runs["prompt"].append(prompt_rate(backend, long_ids))
        with BusyProgram():
            time.sleep(settle_s)
            runs["first_busy"].append(first_token_s(backend, prompt_ids))
            runs["decode_busy"].append(decode_rate(backend, prompt_ids, tokens))
            runs["threads_busy"].append(backend.n_threads)
            runs["prompt_busy"].append(prompt_rate(backend, long_ids))
    return {k: statistics.median(v) for k, v in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a .gguf file (default: the default model)")
    parser.add_argument("--max-threads", type=int, default=None, help="largest thread count (default: usable CPUs)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens decoded per run")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="tokens in the cold prefill")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (the median is shown)")
    args = parser.parse_args()

    from engine.backends.llamacpp import LlamaCppBackend
    from engine.backends.llamacpp.threads import default_threads
    from engine.quiet import quiet_third_party
    from engine.sources import resolve_spec

    quiet_third_party()
    source = resolve_spec(args.model)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    top = args.max_threads or usable
    rows = {}
    print(f"model {source.name}; {usable} usable CPUs; decode {args.tokens} tokens, prompt {args.prompt_tokens} tokens; "
          f"median of {args.repeats}")
    print(f"{'threads':>7} | {'decode tok/s':>12} {'busy':>8} {'ratio':>6} | {'prompt tok/s':>12} {'busy':>8} {'ratio':>6}")
    for n in range(1, top + 1):
        backend = LlamaCppBackend(source.path, spec=source.spec, display_name=source.name, n_ctx=2048,
                                  n_threads=n, n_threads_batch=n)
        prompt_ids = backend.tokenizer.chat_ids([{"role": "user", "content": PROMPT}])
        long_ids = (backend.tokenizer.encode(PROMPT + " ") * (args.prompt_tokens // 8 + 1))[: args.prompt_tokens]
        r = rows[n] = measure(backend, prompt_ids, long_ids, args.tokens, args.repeats)
        backend.close()
        print(f"{n:>7} | {r['decode']:>12.1f} {r['decode_busy']:>8.1f} {r['decode_busy'] / r['decode']:>6.2f} | "
              f"{r['prompt']:>12.0f} {r['prompt_busy']:>8.0f} {r['prompt_busy'] / r['prompt']:>6.2f}", flush=True)
    chosen = default_threads()
    print(f"engine static default: {chosen} thread{'s' * (chosen > 1)} (decode and prompt)")
    if chosen in rows:
        r = rows[chosen]
        print(f"busy_ratio_default={r['decode_busy'] / r['decode']:.2f}")

    # The engine's own choice per answer: no thread count given.
    from engine.cpu_load import WINDOW_S

    backend = LlamaCppBackend(source.path, spec=source.spec, display_name=source.name, n_ctx=2048)
    prompt_ids = backend.tokenizer.chat_ids([{"role": "user", "content": PROMPT}])
    long_ids = (backend.tokenizer.encode(PROMPT + " ") * (args.prompt_tokens // 8 + 1))[: args.prompt_tokens]
    auto = measure(backend, prompt_ids, long_ids, args.tokens, args.repeats, settle_s=WINDOW_S + 0.3)
    backend.close()
    print(f"\n{'case':>5} | {'chosen':>6} {'auto tok/s':>10} {'1 thread':>9} {'2 threads':>9} | "
          f"{'first token ms: auto':>20} {'1':>6} {'2':>6}")
    for case, key in (("idle", ""), ("busy", "_busy")):
        fixed = [rows.get(n) for n in (1, 2)]
        rates = [f"{r['decode' + key]:>9.1f}" if r else f"{'-':>9}" for r in fixed]
        firsts = [f"{r['first' + key] * 1000:>6.0f}" if r else f"{'-':>6}" for r in fixed]
        print(f"{case:>5} | {auto['threads' + key]:>6.0f} {auto['decode' + key]:>10.1f} {rates[0]} {rates[1]} | "
              f"{auto['first' + key] * 1000:>20.0f} {firsts[0]} {firsts[1]}")
    print(f"auto_idle_tok_s={auto['decode']:.1f} auto_busy_tok_s={auto['decode_busy']:.1f} "
          f"chosen_idle={auto['threads']:.0f} chosen_busy={auto['threads_busy']:.0f}")
    print(f"load: {Path('/proc/loadavg').read_text().strip() if Path('/proc/loadavg').exists() else 'unknown'}")


if __name__ == "__main__":
    main()
