"""Soak: our server under slow clients, abandoned streams and a hostile upstream, while a normal client keeps asking.

Three child processes, all on 127.0.0.1: the hostile upstream (tests/hostile_upstream.py), our server in engine
mode on the default model, and our server in proxy mode in front of the hostile upstream (each server alone in
its process, as a user runs one, so its peak RSS is its own). Then, for `--seconds` (default 60), at once:

- `--slow` (200) slow clients, three in four on the engine server and one in four on the proxy: half send a
  request's headers one byte per second, half send part of them once and then nothing; a connection the
  server closes is opened again half a second later (so the count holds);
- `--abandoned` (50) clients that each start a streamed chat (max_tokens 64) on the engine server, read its
  first chunk with a token (the model has started on it), hang up, wait `--abandon-gap` s (1.0), start again;
- `--hostile` (8) clients sending the proxy, in turn: endless streams (and an endless whole answer), slow
  drips left after three chunks, a trickle and a hanging upstream left after 1 s, and garbage (a JSON list,
  an `index` of "abc" and null, status 600, a chunk `[1,2]`, a line with no end, empty chunks forever);
- one normal client, in a loop: a chat on the engine server (max_tokens 8), GET /health there, a chat
  through the proxy to the upstream's well-behaved model, GET /health there; each request's latency kept.

At the end it prints, on stdout, exactly:

    normal_p99_ms=   the 99th percentile of the normal client's latencies (all four kinds together), ms
    max_rss_mb=      the larger of the two servers' peak resident memory (VmHWM), MiB
    errors_500=      answers with HTTP status >= 500, and stream error events, that no one asked for:
                     every one the normal client got (any 5xx status, any error event, whatever its code),
                     and, for the hostile traffic (slow, abandoned and hostile-upstream clients), every one
                     except a deliberate 502 or 503 (statuses, and error events with code `bad_upstream`,
                     `upstream_busy` or `server_busy`); a status 500 or an error event of another code counts

The hostile clients connect from 127.0.0.2 (loopback too: nothing leaves the machine), the normal client from
127.0.0.1, as a flood comes from another host than a user's: the engine server's fair queue takes turns by
host, so the normal client waits for at most one of the flood's turns. `--same-host` sends everything from
127.0.0.1, where the normal client queues behind every abandoned stream before it.

Details (per kind, the servers' own figures, requests with no answer at all) go to stderr.

    python bench/serve_soak.py [--seconds 60] [--slow 200] [--abandoned 50] [--hostile 8] [--threads N] [--same-host]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402

HOSTILE_SOURCE = "127.0.0.2"  # the hostile clients' address (still loopback): the server's fair queue takes turns by host
DELIBERATE_CODES = {"bad_upstream", "upstream_busy", "server_busy"}
HOSTILE_CASES = [  # (model, stream, seconds the client waits before it hangs up; None: reads to the end)
    ("endless", True, None), ("drip", True, "3 chunks"), ("list", True, None), ("index-abc", False, None),
    ("trickle", True, 1.0), ("index-null", True, None), ("status-600", False, None), ("hang", False, 1.0),
    ("empty-deltas", True, None), ("list", False, None), ("long-line", True, None), ("endless", False, None),
    ("index-abc", True, None), ("hang", True, 1.0), ("surrogate", True, None), ("nan", False, None),
]


# --- the children ---------------------------------------------------------------------------------------------


def child(kind: str, upstream: str | None, threads: int | None) -> None:
    """One server (or the hostile upstream) on a free port: its URL on stdout, then it runs until stdin closes."""
    if kind == "upstream":
        from hostile_upstream import HostileUpstream

        server = HostileUpstream(drip_s=0.5)
        print(server.url, flush=True)
        sys.stdin.read()
        server.close()
        return
    from engine.serve import start_server

    engine = None
    if kind == "engine":
        from engine import Engine

        engine = Engine.load(n_threads=threads) if threads else Engine.load()
        running = start_server(engine)
    else:
        running = start_server(upstream=upstream)
    print(running.url, flush=True)
    sys.stdin.read()
    running.stop()
    if engine is not None:
        engine.close()


class Child:
    def __init__(self, kind: str, log_dir: Path, *args: str) -> None:
        self.kind = kind
        self.log = log_dir / f"{kind}.log"
        self.proc = subprocess.Popen([sys.executable, __file__, "--child", kind, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log.open("wb"), text=True)
        line = self.proc.stdout.readline().strip() if self.proc.stdout else ""
        if not line.startswith("http://127.0.0.1:"):
            self.stop()
            raise SystemExit(f"the {kind} child did not start: {self.log.read_text()[-2000:]}")
        self.url = line

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --- the clients ------------------------------------------------------------------------------------------


class Tally:
    """What every client got: per kind, the outcomes; `unwanted` the errors that count in errors_500."""

    def __init__(self) -> None:
        self.outcomes: dict[str, Counter[str]] = {}
        self.unwanted: Counter[str] = Counter()
        self.lock = threading.Lock()

    def note(self, kind: str, outcome: str, *, hostile: bool, status: int = 0, code: str | None = None,
             event: bool = False) -> None:
        with self.lock:
            self.outcomes.setdefault(kind, Counter())[outcome] += 1
            failed = status >= 500 or event
            deliberate = hostile and (code in DELIBERATE_CODES if event else status in (502, 503))
            if failed and not deliberate:
                self.unwanted[f"{kind}:{outcome}"] += 1


def _host_port(url: str) -> tuple[str, int]:
    hostport = url.split("//", 1)[1].split("/", 1)[0]
    host, port = hostport.rsplit(":", 1)
    return host, int(port)


async def slow_client(url: str, kind: str, i: int, deadline: float, tally: Tally, source: str) -> None:
    host, port = _host_port(url)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            "Content-Length: 200\r\nX-Slow: " + "s" * 64 + "\r\n").encode()
    byte_by_byte = i % 2 == 0
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, local_addr=(source, 0)), 5)
        except (OSError, asyncio.TimeoutError):
            tally.note(kind, "connect failed", hostile=True)
            await asyncio.sleep(0.5)
            continue
        try:
            async def send() -> None:
                if byte_by_byte:
                    for k in range(len(head)):
                        writer.write(head[k:k + 1])
                        await writer.drain()
                        await asyncio.sleep(1.0)
                else:
                    writer.write(head[: len(head) // 2])
                    await writer.drain()
                await asyncio.sleep(deadline - time.monotonic())

            sender = asyncio.ensure_future(send())
            reading = asyncio.ensure_future(reader.read(4096))
            left = max(deadline - time.monotonic(), 0.01)
            done, _ = await asyncio.wait({sender, reading}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            sender.cancel()
            if reading in done and not reading.cancelled() and reading.exception() is None:
                data = reading.result()
                status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.") else 0
                tally.note(kind, f"closed by the server ({status or 'no answer'})", hostile=True, status=status)
            elif reading in done:
                tally.note(kind, "reset by the server", hostile=True)
            else:
                reading.cancel()
                tally.note(kind, "held to the end", hostile=True)
        except OSError:
            tally.note(kind, "reset by the server", hostile=True)
        finally:
            writer.close()
        await asyncio.sleep(0.5)


def _chat(model: str, stream: bool, max_tokens: int, content: str = "Say something.") -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], "stream": stream,
            "max_tokens": max_tokens}


def _error_of(data: str) -> dict | None:
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc.get("error") if isinstance(doc, dict) and isinstance(doc.get("error"), dict) else None


async def abandoned_client(client: httpx.AsyncClient, url: str, model: str, i: int, gap: float, deadline: float,
                           tally: Tally) -> None:
    while time.monotonic() < deadline:
        body = _chat(model, True, 64, f"Tell me about the number {i}.")
        try:
            async with client.stream("POST", url + "/chat/completions", json=body, timeout=30) as r:
                if r.status_code != 200:
                    await r.aread()
                    code = (_error_of(r.text) or {}).get("code")
                    tally.note("abandoned", f"status {r.status_code} {code}", hostile=True, status=r.status_code,
                               code=code)
                else:
                    async for line in r.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        err = _error_of(line[5:])
                        if err:
                            tally.note("abandoned", f"error event {err.get('code')}", hostile=True,
                                       code=err.get("code"), event=True)
                            break
                        if '"role"' not in line:  # the first token (the chunk before it names the role only)
                            tally.note("abandoned", "first token, then hung up", hostile=True)
                            break
                    else:
                        tally.note("abandoned", "ended before its first token", hostile=True)
        except httpx.HTTPError as e:
            tally.note("abandoned", f"no answer: {type(e).__name__}", hostile=True)
        await asyncio.sleep(gap)


async def hostile_request(client: httpx.AsyncClient, url: str, model: str, stream: bool,
                          leave: float | str | None, tally: Tally) -> None:
    kind = f"hostile:{model}{'/stream' if stream else ''}"
    body = _chat(model, stream, 16)
    timeout = httpx.Timeout(leave if isinstance(leave, float) else 60.0)
    try:
        async with client.stream("POST", url + "/chat/completions", json=body, timeout=timeout) as r:
            if r.status_code != 200 or not stream:
                raw = b""
                async for part in r.aiter_raw():
                    raw = (raw + part)[-4096:]  # an endless whole answer is the proxy's to cut, not ours
                code = (_error_of(raw.decode("utf-8", "replace")) or {}).get("code")
                tally.note(kind, f"status {r.status_code} {code}", hostile=True, status=r.status_code, code=code)
                return
            chunks = 0
            last = ""
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                chunks += 1
                last = line[5:].strip()
                err = _error_of(last)
                if err:
                    tally.note(kind, f"error event {err.get('code')}", hostile=True, code=err.get("code"), event=True)
                if leave == "3 chunks" and chunks == 3:
                    tally.note(kind, "left after 3 chunks", hostile=True)
                    return
            tally.note(kind, "ended with [DONE]" if last == "[DONE]" else "ended without [DONE]", hostile=True)
    except httpx.TimeoutException:
        tally.note(kind, "gave up (client timeout)", hostile=True)
    except httpx.HTTPError as e:
        tally.note(kind, f"no answer: {type(e).__name__}", hostile=True)
    except asyncio.CancelledError:
        tally.note(kind, "cut at the soak's end", hostile=True)
        raise


async def hostile_client(client: httpx.AsyncClient, url: str, i: int, deadline: float, tally: Tally) -> None:
    k = i
    while time.monotonic() < deadline:
        model, stream, leave = HOSTILE_CASES[k % len(HOSTILE_CASES)]
        k += 1
        try:  # an endless stream takes the proxy ~30 s to cut at its caps: the soak's end cuts it first
            await asyncio.wait_for(hostile_request(client, url, model, stream, leave, tally),
                                   max(deadline - time.monotonic(), 0.1))
        except asyncio.TimeoutError:
            pass


def normal_client(engine_url: str, model: str, proxy_url: str, deadline: float, tally: Tally,
                  latencies: dict[str, list[float]]) -> None:
    """Blocking, on its own thread: each request waits for its answer, as a person's client does."""
    calls = [("engine chat", "POST", engine_url + "/chat/completions", _chat(model, False, 8)),
             ("engine health", "GET", engine_url.removesuffix("/v1") + "/health", None),
             ("proxy chat", "POST", proxy_url + "/chat/completions", _chat("ok", False, 8)),
             ("proxy health", "GET", proxy_url.removesuffix("/v1") + "/health", None)]
    with httpx.Client(timeout=60) as client:
        k = 0
        while time.monotonic() < deadline:
            kind, method, url, body = calls[k % len(calls)]
            k += 1
            t0 = time.perf_counter()
            try:
                r = client.request(method, url, json=body)
            except httpx.HTTPError as e:
                tally.note("normal", f"{kind}: no answer: {type(e).__name__}", hostile=False)
                continue
            latencies.setdefault(kind, []).append((time.perf_counter() - t0) * 1000)
            code = (_error_of(r.text) or {}).get("code") if r.status_code >= 400 else None
            tally.note("normal", f"{kind}: {r.status_code}{' ' + str(code) if code else ''}", hostile=False,
                       status=r.status_code, code=code)


async def traffic(args: argparse.Namespace, engine_url: str, proxy_url: str, tally: Tally,
                  latencies: dict[str, list[float]]) -> None:
    model = httpx.get(engine_url + "/models", timeout=30).json()["data"][0]["id"]
    deadline = time.monotonic() + args.seconds
    normal = threading.Thread(target=normal_client, args=(engine_url, model, proxy_url, deadline, tally, latencies))
    normal.start()
    limits = httpx.Limits(max_connections=args.abandoned + args.hostile + 10)
    source = "127.0.0.1" if args.same_host else HOSTILE_SOURCE
    transport = httpx.AsyncHTTPTransport(local_address=source, limits=limits)
    async with httpx.AsyncClient(transport=transport) as client:
        tasks = [slow_client(proxy_url, "slow-proxy", i, deadline, tally, source) if i % 4 == 3 else
                 slow_client(engine_url, "slow-engine", i, deadline, tally, source) for i in range(args.slow)]
        tasks += [abandoned_client(client, engine_url, model, i, args.abandon_gap, deadline, tally)
                  for i in range(args.abandoned)]
        tasks += [hostile_client(client, proxy_url, i, deadline, tally) for i in range(args.hostile)]
        running = [asyncio.ensure_future(t) for t in tasks]
        await asyncio.wait(running, timeout=args.seconds + 40)  # each request is bounded by a timeout and the end
        for t in running:
            t.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    normal.join(90)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--slow", type=int, default=200)
    parser.add_argument("--abandoned", type=int, default=50)
    parser.add_argument("--abandon-gap", type=float, default=1.0)
    parser.add_argument("--hostile", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--same-host", action="store_true",
                        help="send the hostile traffic from 127.0.0.1 too (the normal client's address)")
    parser.add_argument("--child", choices=["upstream", "engine", "proxy"], help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.upstream, args.threads)
        return
    import tempfile

    log_dir = Path(tempfile.mkdtemp(prefix="serve-soak-"))
    upstream = Child("upstream", log_dir)
    servers: list[Child] = []
    try:
        servers.append(Child("engine", log_dir, *(["--threads", str(args.threads)] if args.threads else [])))
        servers.append(Child("proxy", log_dir, "--upstream", upstream.url))
        engine, proxy = servers
        tally = Tally()
        latencies: dict[str, list[float]] = {}
        t0 = time.monotonic()
        asyncio.run(traffic(args, engine.url, proxy.url, tally, latencies))
        ran = time.monotonic() - t0
        rss = {s.kind: s.peak_rss_mb() for s in servers}
    finally:
        for s in servers:
            s.stop()
        upstream.stop()
    every = [ms for values in latencies.values() for ms in values]
    print(f"ran {ran:.1f} s; servers' logs in {log_dir}", file=sys.stderr)
    for kind, values in sorted(latencies.items()):
        print(f"  normal {kind}: n={len(values)} p50={percentile(values, 0.5):.0f} ms "
              f"p99={percentile(values, 0.99):.0f} ms max={max(values):.0f} ms", file=sys.stderr)
    for kind, outcomes in sorted(tally.outcomes.items()):
        print(f"  {kind}: " + ", ".join(f"{o} x{n}" for o, n in outcomes.most_common()), file=sys.stderr)
    for s in servers:
        text = s.log.read_text(errors="replace")
        print(f"  {s.kind} server: peak RSS {rss[s.kind]:.0f} MiB, log {len(text):,} bytes, "
              f"{text.count('Traceback')} tracebacks", file=sys.stderr)
    if tally.unwanted:
        print("  counted in errors_500: " + ", ".join(f"{k} x{n}" for k, n in tally.unwanted.most_common()),
              file=sys.stderr)
    print(f"normal_p99_ms={percentile(every, 0.99):.0f}")
    print(f"max_rss_mb={max(rss.values()):.0f}")
    print(f"errors_500={sum(tally.unwanted.values())}")


if __name__ == "__main__":
    main()
