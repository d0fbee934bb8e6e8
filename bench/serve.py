"""The server (engine.serve) against the engine called directly, on the default model, in the same run.

- **one stream**: tokens/s of a streamed chat answer through `logitlab-cli serve`'s server with the official
  `openai` client, run in a process of its own as a real client is (also printed: the client in this
  process, where its parsing competes with the server and the model for one interpreter on 2 cores), vs the
  same request run on the `Engine` directly (`engine.generate`: the very
  `GenerationRequest` the server ran, read from its record: same prompt ids, settings, seed, top-N and stage
  records, `ignore_eos` so both make exactly `--tokens` tokens). Timed from sending to the last token, best of
  `--rounds`, alternating so drift hits both alike. Last line of the part: `ratio_served_vs_direct=X.XX`
  (goal >= 0.9).
- **8 streams at once**: eight clients stream at the same time; every one must finish. Prints the aggregate
  tokens/s (all tokens / wall time), each stream's time to its first token, and how many answers shared each
  batch (requests that wait for the model together run as rows of one batch where the model has batch
  runners: the first one finds the model free and runs alone, the other seven wait and then share). Then the
  same eight one after another: `sequential_tok_s=` and `concurrent_vs_sequential=` (what sharing the
  batch gives, in the same run).

    python bench/serve.py [--tokens 128] [--rounds 3] [--streams 8 (0: the first part alone)] [--stream-tokens 32] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import openai  # noqa: E402

from engine import Engine  # noqa: E402
from engine.events import Done, TokenEvent  # noqa: E402
from engine.serve import ServedExchange, start_server  # noqa: E402

MESSAGES = [{"role": "user", "content": "Write a long story about a lighthouse keeper who finds a message in a bottle."}]


class LastRequest:
    """A sink that keeps the request the server ran (to run it directly)."""

    def __init__(self) -> None:
        self.exchange: ServedExchange | None = None
        self.batch_rows: list[int] = []  # per ended answer: how many rows its batch had (1: it ran alone)

    def on_start(self, exchange: ServedExchange) -> None:
        self.exchange = exchange

    def on_token(self, exchange_id: str, choice: int, event: TokenEvent) -> None:
        pass

    def on_end(self, exchange: ServedExchange) -> None:
        stats = exchange.choices[0].stats if exchange.choices else None
        if stats is not None and stats.fingerprint is not None:
            self.batch_rows.append(int(stats.fingerprint.extras.get("batch_rows", 1)))


def served_stream(client: openai.OpenAI, model: str, tokens: int) -> tuple[int, float, float]:
    """(tokens, seconds to the last token, seconds to the first) of one streamed answer through the server."""
    t0 = time.perf_counter()
    first = None
    n = 0
    for chunk in client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=tokens, seed=1,
                                                temperature=0.8, stream=True, extra_body={"ignore_eos": True}):
        if chunk.choices and chunk.choices[0].delta.content is not None and chunk.choices[0].finish_reason is None \
                and chunk.choices[0].delta.role is None:
            n += 1
            first = first or time.perf_counter()
    return n, time.perf_counter() - t0, (first or t0) - t0


def client_process_stream(url: str, model: str, tokens: int) -> tuple[int, float, float]:
    """`served_stream` run by a client in a process of its own (as SillyTavern or a script would be): the
    client's parsing then does not compete with the server and the model for this process's interpreter."""
    out = subprocess.run([sys.executable, __file__, "--as-client", url, model, str(tokens)], capture_output=True,
                         text=True, timeout=600, check=True).stdout
    n, seconds, first = json.loads(out.strip().splitlines()[-1])
    return int(n), float(seconds), float(first)


def direct_stream(engine: Engine, request) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = 0
    for event in engine.generate(request):
        if isinstance(event, TokenEvent):
            n += 1
        elif isinstance(event, Done):
            break
    return n, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--streams", type=int, default=8, help="clients at once in the second part (0: skip it)")
    ap.add_argument("--stream-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None,
                    help="llama.cpp threads, held for the whole run (default: chosen per answer from the free cores)")
    ap.add_argument("--as-client", nargs=3, metavar=("URL", "MODEL", "TOKENS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.as_client:  # the client process of `client_process_stream`
        url, model_name, tokens = args.as_client
        client = openai.OpenAI(base_url=url, api_key="bench", max_retries=0, timeout=600)
        print(json.dumps(served_stream(client, model_name, int(tokens))))
        return

    engine = Engine.load(n_threads=args.threads) if args.threads else Engine.load()
    sink = LastRequest()
    server = start_server(engine, sink=sink)
    client = openai.OpenAI(base_url=server.url, api_key="bench", max_retries=0, timeout=600)
    model = engine.info.name
    try:
        served_stream(client, model, 8)  # warm both paths (template process, prompt cache)
        assert sink.exchange is not None and sink.exchange.request is not None
        from dataclasses import replace

        request = replace(sink.exchange.request, max_new_tokens=args.tokens)
        direct_stream(engine, replace(request, max_new_tokens=8))
        client_process_stream(server.url, model, 8)  # warm the client process's path too
        served_rates, in_process_rates, direct_rates = [], [], []
        for _ in range(args.rounds):
            n, s, _ = client_process_stream(server.url, model, args.tokens)
            served_rates.append(n / s)
            n1, s1, _ = served_stream(client, model, args.tokens)
            in_process_rates.append(n1 / s1)
            n2, s2 = direct_stream(engine, request)
            direct_rates.append(n2 / s2)
            print(f"round: served {n} tokens {n / s:.1f} tok/s (client in its own process), "
                  f"{n1 / s1:.1f} tok/s (client in this process), direct {n2} tokens {n2 / s2:.1f} tok/s", flush=True)
        served, in_process, direct = max(served_rates), max(in_process_rates), max(direct_rates)
        print(f"model={model} backend={engine.info.backend} tokens={args.tokens} top_n={request.top_n} "
              f"record_stages={request.record_stages}")
        print(f"direct_tok_s={direct:.1f}")
        print(f"served_tok_s={served:.1f}")
        print(f"served_in_process_tok_s={in_process:.1f}")
        print(f"ratio_in_process_client_vs_direct={in_process / direct:.2f}")
        print(f"ratio_served_vs_direct={served / direct:.2f}")
        if args.streams <= 0:  # --streams 0: the one-stream part alone
            return

        results: dict[int, tuple[int, float, float]] = {}

        def one(i: int) -> None:
            c = openai.OpenAI(base_url=server.url, api_key="bench", max_retries=0, timeout=600)
            results[i] = served_stream(c, model, args.stream_tokens)

        sink.batch_rows.clear()
        t0 = time.perf_counter()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(args.streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        total = sum(n for n, _, _ in results.values())
        ttfts = sorted(first for _, _, first in results.values())
        print(f"concurrent_streams={args.streams} finished={len(results)} tokens_each={args.stream_tokens} "
              f"wall_s={wall:.2f}")
        print(f"aggregate_tok_s={total / wall:.1f}")
        print("ttft_s=" + ",".join(f"{t:.2f}" for t in ttfts))
        time.sleep(0.5)  # the last answer's end reaches the sink
        print("batch_rows=" + ",".join(str(r) for r in sorted(sink.batch_rows)))
        concurrent = total / wall
        t0 = time.perf_counter()
        sequential_total = sum(served_stream(client, model, args.stream_tokens)[0] for _ in range(args.streams))
        sequential = sequential_total / (time.perf_counter() - t0)
        print(f"sequential_tok_s={sequential:.1f}")
        print(f"concurrent_vs_sequential={concurrent / sequential:.2f}")
    finally:
        server.stop()
        engine.close()


if __name__ == "__main__":
    main()
