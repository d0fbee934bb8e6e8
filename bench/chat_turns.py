"""Chat time to first token over several turns, on any backend: does each turn reuse the last one's cache?

Shared by bench/decode.py (torch) and bench/llamacpp_decode.py: equal new
input per turn, so with prefix reuse turn 5 costs about what turn 1 does.
"""

from __future__ import annotations

from engine.backend import Backend
from engine.chat import ChatSession
from engine.decode.loop import generate_events
from engine.sampling.settings import SamplerSettings

GREEDY = SamplerSettings(temperature=0.0)


def chat_ttft(backend: Backend, turns: int = 5) -> list[float]:
    """Seconds to the first token of each turn, printing what each turn prefilled."""
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
