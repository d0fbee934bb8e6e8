"""Remote backend vs the raw OpenAI client, on the same llama.cpp server, in the same run.

Starts llama-cpp-python's OpenAI-compatible server on 127.0.0.1 (the default
model), then, alternating so drift hits both sides alike:

- **server samples**: tok/s of our streaming path (`remote_events` with
  `server_sampling=True`, greedy, top-5 alternatives per token) vs the raw
  `openai` client streaming the same completion request. Last line:
  `ratio_vs_raw_client=X.XX` (goal >= 0.9).
- **we sample**: our time per token (one `max_tokens=1` request with the top-N
  log-probs, then our sampler chain) vs the raw client making that same
  one-token request: `added_ms_per_token=X.X` is what we add on top. This
  server takes text prompts only, so each step also costs tokenizer
  requests (the round-trip check, new alternatives' ids): the requests per
  token are printed by path, `requests_per_token=X.X` in all.

Needs the `openai` package (`pip install openai`); without it the raw side is
plain httpx, and the output says so.

    python bench/remote.py [--tokens 64] [--rounds 3] [--step-tokens 16]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's server starter

import httpx  # noqa: E402
from remote_server import running_llama_server  # noqa: E402

from engine.backends.remote import RemoteBackend  # noqa: E402
from engine.backends.remote.generate import remote_events  # noqa: E402
from engine.events import Done, TokenEvent  # noqa: E402
from engine.request import GenerationRequest  # noqa: E402
from engine.sampling import SamplerSettings  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
TOP_N = 5


def raw_stream(url: str, model: str, tokens: int) -> tuple[int, float]:
    """(tokens, seconds) for one streamed greedy completion through the raw client."""
    t0 = time.perf_counter()
    n = 0
    try:
        import openai
    except ImportError:
        body = {"model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0.0,
                "logprobs": TOP_N, "stream": True}
        with httpx.stream("POST", url + "/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    n += bool(json.loads(line[6:])["choices"][0].get("text"))
        return n, time.perf_counter() - t0
    client = openai.OpenAI(base_url=url, api_key="none")
    for chunk in client.completions.create(model=model, prompt=PROMPT, max_tokens=tokens, temperature=0.0,
                                           logprobs=TOP_N, stream=True):
        n += bool(chunk.choices and chunk.choices[0].text)
    return n, time.perf_counter() - t0


def raw_one_token(url: str, model: str, top_n: int) -> float:
    """Seconds for the request we-sample mode makes per step, sent by the raw client."""
    t0 = time.perf_counter()
    httpx.post(url + "/completions", json={"model": model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0.0,
                                           "logprobs": top_n}, timeout=120).raise_for_status()
    return time.perf_counter() - t0


def ours(backend: RemoteBackend, tokens: int, server_sampling: bool) -> tuple[int, float]:
    """(tokens, seconds) through our remote backend, greedy."""
    request = GenerationRequest(prompt=PROMPT, max_new_tokens=tokens, server_sampling=server_sampling,
                                top_n=TOP_N, sampler=SamplerSettings(temperature=0.0))
    t0 = time.perf_counter()
    n = 0
    for ev in remote_events(backend, request):
        if isinstance(ev, TokenEvent):
            n += 1
        elif isinstance(ev, Done) and ev.stats.finish_reason == "error":
            raise RuntimeError(ev.stats)
    return n, time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--step-tokens", type=int, default=16, help="tokens per we-sample run (one request each)")
    args = p.parse_args()
    try:
        import openai  # noqa: F401

        raw_name = "openai client"
    except ImportError:
        raw_name = "httpx (openai not installed)"
    with running_llama_server(n_threads=os.cpu_count() or 1) as url:
        backend = RemoteBackend.connect(url)
        model = backend.caps.model
        top_n = getattr(backend, "top_n", 20)
        ours(backend, 4, True)  # warm both paths (first request loads caches)
        raw_stream(url, model, 4)
        ours_rates, raw_rates = [], []
        for _ in range(args.rounds):
            n, s = ours(backend, args.tokens, True)
            ours_rates.append(n / s)
            n, s = raw_stream(url, model, args.tokens)
            raw_rates.append(n / s)
        step_ours, step_raw = [], []
        sent: collections.Counter = collections.Counter()
        backend.client._http.event_hooks["request"].append(lambda r: sent.update([r.url.path]))
        step_tokens = 0
        for _ in range(args.rounds):
            n, s = ours(backend, args.step_tokens, False)
            step_tokens += n
            step_ours.append(s / n)
            step_raw.append(statistics.median(raw_one_token(url, model, top_n) for _ in range(5)))
        backend.close()
    print(f"server: llama-cpp-python on 127.0.0.1, model {model}; raw side: {raw_name}")
    print(f"server samples, ours: {', '.join(f'{r:.1f}' for r in ours_rates)} tok/s")
    print(f"server samples, raw:  {', '.join(f'{r:.1f}' for r in raw_rates)} tok/s")
    print(f"we sample: {statistics.median(step_ours) * 1e3:.1f} ms/token (top {top_n} per step); "
          f"the raw one-token request: {statistics.median(step_raw) * 1e3:.1f} ms")
    print("we sample, requests per token: " + ", ".join(f"{path} {k / step_tokens:.1f}" for path, k in sorted(sent.items())))
    print(f"requests_per_token={sum(sent.values()) / step_tokens:.1f}")
    print(f"we_sample_tokens_per_s={1 / statistics.median(step_ours):.1f}")
    print(f"added_ms_per_token={(statistics.median(step_ours) - statistics.median(step_raw)) * 1e3:.1f}")
    print(f"ratio_vs_raw_client={statistics.median(ours_rates) / statistics.median(raw_rates):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
