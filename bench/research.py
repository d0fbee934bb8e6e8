"""Research API speed on the default model.

    python bench/research.py [--model SPEC] [--backend torch|mlx]

1. 32 concurrent `await next_token_logprobs` requests sharing a 200-token
   prefix vs 32 sequential uncached calls (cache cleared before each).
   Goal >= 5x.
2. `generate` of 16 prompts in one batch vs the same 16 prompts one at a
   time: generated tokens/s. Goal >= 4x.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.quiet import quiet_third_party  # noqa: E402
from engine.research import LanguageModel  # noqa: E402

TEXT = ("The history of the city begins with a small fishing village on the river bank, where traders from the north "
        "exchanged furs and salt for grain. Over the centuries the village grew into a market town, then a fortified "
        "city with walls, gates and a cathedral whose spire could be seen from every farm in the valley. ")


def bench_logprobs(lm: LanguageModel) -> float:
    prefix = (lm.tokenizer.encode(TEXT * 4))[:200]
    suffixes = [lm.tokenizer.encode(f" Fact {i}:", add_special_tokens=False) for i in range(32)]
    requests = [prefix + s for s in suffixes]

    lm.clear_cache()
    lm.next_token_logprobs_sync(requests[0])  # warm-up
    t = time.perf_counter()
    for r in requests:
        lm.clear_cache()
        lm.next_token_logprobs_sync(r)
    sequential = time.perf_counter() - t

    async def concurrent() -> None:
        await asyncio.gather(*(lm.next_token_logprobs(r) for r in requests))

    lm.clear_cache()
    calls = lm.forward_calls
    t = time.perf_counter()
    asyncio.run(concurrent())
    together = time.perf_counter() - t
    print(f"32 x next_token_logprobs, 200-token shared prefix: sequential uncached {sequential:.2f} s, "
          f"concurrent {together:.3f} s ({lm.forward_calls - calls} forward calls)")
    ratio = sequential / together
    print(f"logprobs_speedup={ratio:.1f}")
    return ratio


def bench_generate(lm: LanguageModel, n_new: int) -> float:
    prompts = [lm.tokenizer.chat_ids([{"role": "user", "content": f"Tell me about the number {i}."}]) for i in range(16)]
    lm.generate(prompts[:2], max_new_tokens=4)  # warm-up
    t = time.perf_counter()
    for p in prompts:
        lm.generate([p], max_new_tokens=n_new)
    single = 16 * n_new / (time.perf_counter() - t)
    t = time.perf_counter()
    out = lm.generate(prompts, max_new_tokens=n_new)
    batched = out.shape[0] * n_new / (time.perf_counter() - t)
    print(f"generate, 16 prompts x {n_new} new tokens: one at a time {single:.1f} tok/s, one batch {batched:.1f} tok/s")
    ratio = batched / single
    print(f"batch_generate_speedup={ratio:.1f}")
    return ratio


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args()
    quiet_third_party()
    lm = LanguageModel.load(args.model, backend=args.backend)
    print(f"model {lm.backend.info.name} on {lm.backend.info.backend}/{lm.backend.info.device}")
    bench_logprobs(lm)
    bench_generate(lm, args.new_tokens)
    lm.close()


if __name__ == "__main__":
    main()
