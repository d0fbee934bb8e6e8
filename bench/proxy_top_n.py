"""What asking an upstream for log-probs costs in proxy mode (issue 46 item 5).

    python bench/proxy_top_n.py [--rounds 3] [--tokens 64]

llama-cpp-python's server (tests/remote_server.py) serves the default model; `logitlab-cli serve --upstream`'s
server (`start_server(upstream=...)`) proxies it twice: as it is by default (the client's body unchanged) and with
`--upstream-top-n 20` (the upstream asked for the top 20 of every token). The same greedy chat request goes
through each, rounds alternated, after one warm-up each. Prints each round's seconds, whether the greedy text was
the same, and `ratio_top20_vs_plain=` (median seconds with the top 20 / median without).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from remote_server import running_llama_server  # noqa: E402

from engine.serve import ServeOptions, start_server  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    with running_llama_server() as upstream:
        model = httpx.get(upstream + "/models", timeout=60).json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": "Tell me a story about a cat."}],
                "max_tokens": args.tokens, "temperature": 0}
        with start_server(upstream=upstream) as plain, \
                start_server(upstream=upstream, options=ServeOptions(upstream_top_n=20)) as top20:
            urls = {"plain": plain.url, "top20": top20.url}
            times: dict[str, list[float]] = {name: [] for name in urls}
            texts: dict[str, str] = {}
            for name, url in urls.items():  # warm-up: the upstream's first request loads its cache
                httpx.post(url + "/chat/completions", json=body, timeout=600)
            for _ in range(args.rounds):
                for name, url in urls.items():
                    start = time.perf_counter()
                    answer = httpx.post(url + "/chat/completions", json=body, timeout=600).json()
                    times[name].append(time.perf_counter() - start)
                    texts[name] = answer["choices"][0]["message"]["content"]
    for name, seconds in times.items():
        print(f"{name}: " + " ".join(f"{s:.2f}" for s in seconds) + " s")
    print(f"same_greedy_text={texts['plain'] == texts['top20']}")
    print(f"ratio_top20_vs_plain={statistics.median(times['top20']) / statistics.median(times['plain']):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
