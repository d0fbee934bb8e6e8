"""Continuous batching on the server: clients that arrive one after another while a batch runs, joining it or not.

`--clients` clients (default 8) each stream one chat answer of `--tokens` tokens (default 64) (`ignore_eos`, each its own
seed); client i sends at i x `--gap` seconds (default 0.5), so most arrive while earlier answers are still being decoded. The
same arrivals run twice on one loaded model, alternating `--rounds` times: through a server that lets a
request join the batch under way (the default), and through one started with `cont_batching=False`
(llama.cpp server's `--no-cont-batching`), where a request that comes while a batch runs waits for the next
turn. Printed per round and mode: each client's time to first token, the batch sizes its answers were
decoded in, the wall time from the first send to the last token and the aggregate tokens/s; then per mode
the medians over rounds, and, round by round, `cont_batching_ttft_ratio=` (mean time to first token
waiting / joining) and `cont_batching_throughput_ratio=` (aggregate tokens/s joining / waiting), medians.

    python bench/serve_joins.py [--clients 8] [--gap 0.5] [--tokens 64] [--rounds 3] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from engine import Engine  # noqa: E402
from engine.serve import ServedExchange, start_server  # noqa: E402
from engine.serve.service import ServeOptions  # noqa: E402

PROMPTS = ["Tell me about lighthouses.", "Describe a forest at dawn.", "Explain how bread rises.",
           "Write about a long train journey.", "What do cats dream about?", "Describe the sea in winter.",
           "Tell a story about a clockmaker.", "Explain how rain forms."]


class BatchSizes:
    """A sink that keeps, per ended answer, how many rows its batch had (1: it ran alone)."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def on_start(self, exchange: ServedExchange) -> None:
        pass

    def on_token(self, *args: object) -> None:
        pass

    def on_end(self, exchange: ServedExchange) -> None:
        stats = exchange.choices[0].stats if exchange.choices else None
        if stats is not None and stats.fingerprint is not None:
            self.rows.append(int(stats.fingerprint.extras.get("batch_rows", 1)))


def stream_one(url: str, i: int, tokens: int, start: float, out: dict[int, tuple[float, float, int]]) -> None:
    """Client i: sends at `start`, streams its answer; out[i] = (first token, last token, tokens), times from
    the run's start."""
    time.sleep(max(0.0, start - time.perf_counter()))
    body = {"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], "max_tokens": tokens,
            "seed": 100 + i, "temperature": 0.8, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    first, n = None, 0
    with httpx.stream("POST", url + "/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]  # a chunk may hold no text (part of a character)
            choice = chunk["choices"]
            if choice and choice[0]["delta"].get("content") and "role" not in choice[0]["delta"]:  # not the opening
                first = first or time.perf_counter()
    out[i] = ((first or time.perf_counter()), time.perf_counter(), n)


def arrivals(engine: Engine, cont_batching: bool, clients: int, gap: float, tokens: int) -> dict:
    sink = BatchSizes()
    server = start_server(engine, sink=sink, options=ServeOptions(cont_batching=cont_batching))
    try:
        out: dict[int, tuple[float, float, int]] = {}
        t0 = time.perf_counter() + 0.05
        sends = [t0 + i * gap for i in range(clients)]
        threads = [threading.Thread(target=stream_one, args=(server.url, i, tokens, sends[i], out))
                   for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(0.3)  # the last answer's end reaches the sink
    finally:
        server.stop()
    ttft = [out[i][0] - sends[i] for i in range(clients)]
    wall = max(last for _, last, _ in out.values()) - t0
    return {"ttft": ttft, "wall": wall, "tok_s": sum(n for _, _, n in out.values()) / wall,
            "rows": sorted(sink.rows), "complete": all(out[i][2] == tokens for i in range(clients))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--gap", type=float, default=0.5, help="seconds between two clients' requests")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None,
                    help="llama.cpp threads, held for the whole run (default: chosen per answer from the free cores)")
    args = ap.parse_args()
    engine = Engine.load(n_threads=args.threads) if args.threads else Engine.load()
    try:
        arrivals(engine, True, 2, 0.0, 4)  # warm: template process, runner contexts
        runs: dict[bool, list[dict]] = {True: [], False: []}
        for r in range(args.rounds):  # alternating, so that drift hits both modes alike
            for mode in (True, False):
                run = arrivals(engine, mode, args.clients, args.gap, args.tokens)
                name = "joining" if mode else "waiting"
                print(f"round {r + 1} {name}: ttft_s {','.join(f'{t:.2f}' for t in run['ttft'])}, mean "
                      f"{statistics.mean(run['ttft']):.2f} s, wall {run['wall']:.2f} s, {run['tok_s']:.1f} tok/s, "
                      f"batch_rows {run['rows']}", flush=True)
                assert run["complete"], "a client got fewer tokens than it asked for"
                runs[mode].append(run)
        print(f"model={engine.info.name} backend={engine.info.backend} clients={args.clients} gap_s={args.gap} "
              f"tokens_each={args.tokens} rounds={args.rounds} (medians over rounds)")
        for mode, name in ((True, "joining"), (False, "waiting")):
            print(f"mean_ttft_s_{name}={statistics.median(statistics.mean(r['ttft']) for r in runs[mode]):.2f}")
            print(f"max_ttft_s_{name}={statistics.median(max(r['ttft']) for r in runs[mode]):.2f}")
            print(f"aggregate_tok_s_{name}={statistics.median(r['tok_s'] for r in runs[mode]):.1f}")
        pairs = list(zip(runs[True], runs[False]))  # round by round
        ttft = statistics.median(statistics.mean(w["ttft"]) / statistics.mean(j["ttft"]) for j, w in pairs)
        print(f"cont_batching_ttft_ratio={ttft:.2f}")
        print(f"cont_batching_throughput_ratio={statistics.median(j['tok_s'] / w['tok_s'] for j, w in pairs):.2f}")
    finally:
        engine.close()


if __name__ == "__main__":
    main()
