"""`logitlab-cli serve`: the model as an OpenAI-compatible server (engine.serve), in the foreground until Ctrl-C.

    logitlab-cli serve [-m MODEL] [--host 127.0.0.1] [--port 8080] [-a ALIAS] [--api-key KEY] [--record-dir DIR]
                       [--timeout S] [--header-timeout S] [--max-connections N]
    logitlab-cli serve --upstream http://host:port/v1 [--upstream-api-key KEY] [--upstream-top-n N] [--record-dir DIR]

The model options are the other commands' (llama.cpp's names: -m, -c, -t, -ngl, ...). Any host but a loopback
address needs --api-key, and the start line says the server is reachable from other machines.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from engine.cli.input import UsageError
from engine.top_n import TOP_LOGPROBS_MAX

DEFAULT_PORT = 8080  # llama.cpp server's


def add_serve_parser(sub: Any, add_model_args: Callable[[argparse.ArgumentParser], None]) -> None:
    from engine.serve.endpoints import endpoints_help

    p = sub.add_parser("serve", help="serve the model to OpenAI-compatible clients (docs/serve.md)",
                       description="Serve the model to OpenAI-compatible (and Anthropic) clients; every answer "
                                   "is recorded with its tokens' alternatives (in proxy mode, those the upstream "
                                   "was asked for: --upstream-top-n).",
                       epilog=endpoints_help(), formatter_class=_ServeHelp)
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; any other needs --api-key)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("-a", "--alias", action="append", default=[], metavar="NAME",
                   help="another model name the server answers to (llama.cpp server's -a; repeatable or "
                        "comma-separated: -a gpt-3.5-turbo,gpt-4o-mini); a request naming any other model is a 404")
    p.add_argument("--api-key", default=None, help="every request must send 'Authorization: Bearer KEY'")
    p.add_argument("--upstream", default=None, metavar="URL",
                   help="proxy mode: forward each request to this OpenAI-compatible server (e.g. "
                        "http://127.0.0.1:8000/v1) and record its answers; no model is loaded here")
    p.add_argument("--upstream-api-key", default=None, metavar="KEY", help="the API key the upstream wants")
    p.add_argument("--upstream-top-n", type=int, default=None, metavar="N",
                   help="proxy mode: ask the upstream for N alternatives per token (0 to 20; 0: the chosen "
                        "tokens' log-probs only) where the client asked fewer, so the record has them; the client "
                        "still gets what it asked (default: forward the client's request as it is; behind "
                        "llama.cpp's server log-probs cost several times the plain answer's time)")
    p.add_argument("--record-dir", default=None, metavar="DIR",
                   help="write every served answer as a trace file (JSONL, read by read_trace) into DIR "
                        "(default: not recorded)")
    p.add_argument("--record-top-n", type=int, default=20, metavar="N",
                   help="alternatives recorded per token, whatever the client asks for (default 20; proxy mode: "
                        "--upstream-top-n)")
    p.add_argument("--no-stages", action="store_true", help="do not record each sampler stage per token")
    from engine.serve.limits import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, MAX_CONNECTIONS

    p.add_argument("-to", "--timeout", type=float, default=BODY_TIMEOUT_S, metavar="SECONDS",
                   help=f"a request's body must all come within this many seconds of its headers, else 408 and the "
                        f"connection closes (llama.cpp server's name for its read timeout; default {BODY_TIMEOUT_S:g})")
    p.add_argument("--header-timeout", type=float, default=HEADER_TIMEOUT_S, metavar="SECONDS",
                   help="a connection's request line and headers must all come within this many seconds, else 408 "
                        f"and it closes (default {HEADER_TIMEOUT_S:g})")
    p.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS, metavar="N",
                   help="connections open at once; past it a new one gets a 503 and is closed (default "
                        f"{MAX_CONNECTIONS}, lowered to what the open-file limit leaves room for)")
    p.add_argument("-nocb", "--no-cont-batching", dest="cont_batching", action="store_false",
                   help="requests that come while a shared batch runs wait for the next turn instead of joining "
                        "it (llama.cpp server's name; joining is on by default)")


class _ServeHelp(argparse.RawDescriptionHelpFormatter):
    """`serve --help`: the endpoints (the epilog), then the fields each takes, read from the parsers only when
    help is printed (importing them costs every other command ~0.4 s)."""

    def add_text(self, text: str | None) -> None:
        super().add_text(text)
        if text is not None and text.startswith("endpoints ("):
            from engine.serve.endpoints import fields_help

            super().add_text(fields_help())


def check_serve_args(args: argparse.Namespace) -> None:
    from engine.serve.running import is_loopback

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be from 0 to 65535, got {args.port}")
    if not 0 <= args.record_top_n <= 100:
        raise UsageError(f"--record-top-n must be from 0 to 100, got {args.record_top_n}")
    for flag, value in (("--timeout", args.timeout), ("--header-timeout", args.header_timeout)):
        if not 0 < value <= 86_400:  # NaN fails this too
            raise UsageError(f"{flag} must be a number of seconds from more than 0 to 86400, got {value:g}")
    if not 1 <= args.max_connections <= 1_000_000:
        raise UsageError(f"--max-connections must be from 1 to 1,000,000, got {args.max_connections}")
    args.alias = aliases(args.alias)
    if args.alias and args.upstream is not None:
        raise UsageError("--alias names the model served here; in proxy mode the upstream decides which names it serves")
    if not is_loopback(args.host) and not args.api_key:
        raise UsageError(f"--host {args.host} makes the model reachable from other machines: give --api-key KEY too")
    if args.upstream_top_n is not None:
        if args.upstream is None:
            raise UsageError("--upstream-top-n says what proxy mode asks of its upstream: give --upstream URL too")
        if not 0 <= args.upstream_top_n <= TOP_LOGPROBS_MAX:
            raise UsageError(f"--upstream-top-n must be from 0 to {TOP_LOGPROBS_MAX}, got {args.upstream_top_n}")
    if args.upstream is not None:
        if args.model is not None:
            raise UsageError("give either --model (serve it here) or --upstream (forward to another server), not both")
        if not args.upstream.startswith(("http://", "https://")):
            raise UsageError(f"--upstream must be an http:// or https:// URL, got {args.upstream!r}")


def aliases(given: list[str]) -> tuple[str, ...]:
    """`-a A -a B,C` -> (A, B, C): each name once, in order; an empty or overlong name is a usage error."""
    names: list[str] = []
    for part in (p.strip() for g in given for p in g.split(",")):
        if not part or len(part) > 256:
            raise UsageError(f"--alias takes model names of 1 to 256 characters, got {part[:40]!r}")
        if part not in names:
            names.append(part)
    return tuple(names)


def cmd_serve(args: argparse.Namespace, load: Callable[[argparse.Namespace], Any]) -> int:
    from engine.serve.running import is_loopback, start_server
    from engine.serve.service import ServeOptions
    from engine.serve.trace_sink import TraceDirectorySink

    check_serve_args(args)
    engine = None if args.upstream else load(args)
    try:
        sink = TraceDirectorySink(args.record_dir, engine.info if engine else None) if args.record_dir else None
        options = ServeOptions(top_n=args.record_top_n, record_stages=not args.no_stages,
                               cont_batching=args.cont_batching, header_timeout_s=args.header_timeout,
                               body_timeout_s=args.timeout, max_connections=args.max_connections,
                               aliases=args.alias, upstream_top_n=args.upstream_top_n)
        server = start_server(engine, args.host, args.port, args.api_key, sink, upstream=args.upstream,
                              upstream_api_key=args.upstream_api_key, options=options)
        what = f"serving {engine.info.name}" if engine is not None else f"forwarding to {args.upstream}"
        print(f"{what} at {server.url} (OpenAI-compatible; Ctrl-C stops)", file=sys.stderr, flush=True)
        if not is_loopback(args.host):
            print(f"listening on {args.host}: reachable from other machines; every request needs the API key",
                  file=sys.stderr, flush=True)
        elif args.api_key:
            print("every request needs the API key", file=sys.stderr, flush=True)
        if args.record_dir:
            print(f"recording every answer as a trace file in {args.record_dir}", file=sys.stderr, flush=True)
        _stop_on_sigterm()
        try:
            server.wait()
        except KeyboardInterrupt:
            print("stopping", file=sys.stderr)
        finally:
            server.stop()
    finally:
        if engine is not None:
            engine.close(cancel=True)
    return 0


def _stop_on_sigterm() -> None:
    """SIGTERM (a service manager, `kill`) stops the server like Ctrl-C: answers under way end properly."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
