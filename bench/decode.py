"""Decode speed with full inspection vs `model.generate()` on the same loaded model, same process.

    python bench/decode.py [--model SPEC] [--new-tokens 128] [--rounds 3]

Runs alternate (ours, generate, ours, ...) so drift hits both alike. Both are
greedy and ignore EOS so every run makes exactly --new-tokens tokens. Decode
tokens/s counts tokens after the first over the time after the first (prefill
excluded) for both. Then: time to first token of chat turn 5 vs turn 1 for
equal new input. Last line: ratio_vs_generate=X.XX
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from transformers.generation.streamers import BaseStreamer  # noqa: E402

from engine.backends.torch_backend import TorchBackend  # noqa: E402
from engine.chat import ChatSession  # noqa: E402
from engine.decode import generate_events  # noqa: E402
from engine.events import Done  # noqa: E402
from engine.loading import materialize, resolve_spec  # noqa: E402
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


def ours(backend: TorchBackend, prompt_ids: list[int], n: int) -> float:
    backend.trim_cache(0)  # no reuse: the same work generate() does
    req = GenerationRequest(prompt_ids=tuple(prompt_ids), sampler=GREEDY, max_new_tokens=n, top_n=20, ignore_eos=True)
    done = [e for e in generate_events(backend, req)][-1]
    assert isinstance(done, Done) and done.stats.generated_tokens == n
    return done.stats.decode_tokens_per_s


def theirs(backend: TorchBackend, prompt_ids: list[int], n: int) -> float:
    streamer = TimingStreamer()
    with torch.inference_mode():
        out = backend.model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False, streamer=streamer
        )
    assert out.shape[1] == len(prompt_ids) + n
    first, last = streamer.times[1], streamer.times[-1]
    return (n - 1) / (last - first)


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


def chat_ttft(backend: TorchBackend, turns: int = 5) -> list[float]:
    backend.trim_cache(0)
    session = ChatSession(system_prompt="You are a concise assistant.")
    ttfts = []
    for i in range(turns):
        question = f"Give me fact number {i + 1} about the ocean."
        req = session.request(question, sampler=GREEDY, max_new_tokens=32, top_n=20)
        done = [e for e in generate_events(backend, req)][-1]
        ttfts.append(done.stats.time_to_first_token_s)
        session.add_turn(question, done.stats.text)
        print(f"  turn {i + 1}: prompt {done.stats.prompt_tokens} tokens, reused {done.stats.reused_tokens}, "
              f"ttft {done.stats.time_to_first_token_s * 1000:.1f} ms")
    return ttfts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    quiet_third_party()
    source = resolve_spec(args.model)
    backend = TorchBackend(materialize(source), spec=source.spec, display_name=source.name)
    print(f"model {backend.info.name}: {backend.info.parameters / 1e6:.0f}M params, vocab {backend.info.vocab_size}, "
          f"{backend.info.device}, torch {torch.__version__}")
    prompt_ids = backend.tokenizer.chat_ids([{"role": "user", "content": PROMPT}])
    print(f"prompt {len(prompt_ids)} tokens, {args.new_tokens} new tokens, {args.rounds} rounds (after one warm-up each)")
    ours(backend, prompt_ids, 8)
    theirs(backend, prompt_ids, 8)
    a, b = [], []
    for r in range(args.rounds):
        a.append(ours(backend, prompt_ids, args.new_tokens))
        b.append(theirs(backend, prompt_ids, args.new_tokens))
        print(f"round {r + 1}: ours {a[-1]:.1f} tok/s (inspection: top-20 + entropy), generate() {b[-1]:.1f} tok/s")
    cost = sampler_cost_ms(backend, prompt_ids)
    print(f"sampler + inspection on real logits (vocab {backend.info.vocab_size}): {cost['plain']:.2f} ms/token, "
          f"{cost['stages']:.2f} ms/token with per-stage snapshots")
    print("chat time to first token, equal new input per turn:")
    ttfts = chat_ttft(backend)
    print(f"ttft turn5/turn1 = {ttfts[4] / ttfts[0]:.2f}")
    print(f"ours median {statistics.median(a):.1f} tok/s, generate() median {statistics.median(b):.1f} tok/s")
    print(f"ratio_vs_generate={statistics.median(a) / statistics.median(b):.2f}")


if __name__ == "__main__":
    main()
