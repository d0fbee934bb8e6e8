"""A hostile OpenAI-compatible upstream for proxy mode: real HTTP on 127.0.0.1, one behaviour per `model` name.

`HostileUpstream()` listens on a free port (`.url` ends in /v1); a request's `model` field picks what it gets
(`MODES`), so one server serves every case of a test or of `bench/serve_soak.py`. `busy` counts the answers
under way (hanging or streaming) and drops as soon as the proxy hangs up on one, which is how a test sees
that a client who left closed its upstream call. Everything ends when `close()` is called: no answer outlives
the server by more than a poll.
"""

from __future__ import annotations

import json
import math
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler

from remote_server import HangUpTolerantServer

POLL_S = 0.05

_TOP = [{"id": 100 + k, "token": f"t{k}", "logprob": math.log(0.5 / (k + 1))} for k in range(20)]


def token_chunk(text: str = "a", index: int = 0, chat: bool = True, finish: str | None = None) -> dict:
    """A streamed chunk of one token with 20 alternatives (llama.cpp's shape), about 1.5 KB of JSON."""
    logprobs = {"content": [{"id": 100, "token": text, "logprob": math.log(0.5), "top_logprobs": _TOP}]}
    choice: dict = {"index": index, "logprobs": logprobs, "finish_reason": finish}
    if chat:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    return {"id": "up-1", "object": "chat.completion.chunk", "model": "hostile", "choices": [choice]}


def whole_answer(text: str = "ok", chat: bool = True) -> dict:
    choice: dict = {"index": 0, "finish_reason": "stop"}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {"id": "up-1", "object": "chat.completion", "model": "hostile", "choices": [choice],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1}}


# What each `model` gets. Streams are answered as streams when the request asks for one.
MODES = {
    "ok": "a short normal answer (whole or streamed: three tokens, then [DONE])",
    "hang": "the request is read and never answered; busy until the caller hangs up",
    "drip": "a stream whose headers come at once, then one token every `drip_s`, forever",
    "trickle": "a stream that sends one byte every `drip_s` and never ends a line",
    "endless": "a stream of tokens (or a whole answer's bytes) as fast as the caller reads, forever",
    "empty-deltas": "a stream of chunks with no text, as fast as the caller reads, forever",
    "long-line": "a stream of one line that never ends, as fast as the caller reads",
    "list": "a whole answer (or a stream's chunk) that is the JSON list [1, 2]",
    "index-abc": "a choice whose index is \"abc\"",
    "index-null": "a choice whose index is null",
    "status-600": "HTTP status 600 with an error document",
    "nan": "an answer with NaN in it",
    "surrogate": "an answer whose text is a lone surrogate (\\ud800)",
    "deep": "an answer nested 10,000 deep",
    "not-json": "a body that is not JSON",
}


class HostileUpstream:
    """The hostile upstream; `requests` counts the requests per mode, `busy` the answers under way."""

    def __init__(self, drip_s: float = 0.2) -> None:
        self.drip_s = drip_s
        self.closing = threading.Event()
        self.requests: dict[str, int] = {}
        self.busy = 0
        self._lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.endswith("/models"):
                    self._whole({"object": "list", "data": [{"id": m, "object": "model"} for m in MODES]})
                else:
                    self._whole({"error": {"message": "no such route"}}, 404)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {}
                mode = str(body.get("model", "ok"))
                with upstream._lock:
                    upstream.requests[mode] = upstream.requests.get(mode, 0) + 1
                    upstream.busy += 1
                try:
                    self._answer(mode, bool(body.get("stream")), self.path.endswith("chat/completions"))
                except OSError:  # the caller hung up: what a proxy that lets go does
                    self.close_connection = True
                finally:
                    with upstream._lock:
                        upstream.busy -= 1

            def _answer(self, mode: str, stream: bool, chat: bool) -> None:
                if mode == "hang":
                    self._wait_for_hangup()
                elif mode == "status-600":
                    self._whole({"error": {"message": "six hundred"}}, 600)
                elif mode == "not-json":
                    self._raw(b"<html>502 Bad Gateway</html>", "text/html")
                elif mode == "deep":
                    self._raw(b"[" * 10_000 + b"]" * 10_000)
                elif mode in ("list", "index-abc", "index-null", "nan", "surrogate"):
                    doc = _bad_doc(mode, chat, stream)
                    if stream:
                        self._stream_head()
                        self._event(token_chunk(chat=chat))
                        self._event(doc)
                        self._done()
                    else:
                        self._raw(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
                elif mode == "endless" and not stream:
                    self._endless_whole()
                elif not stream:
                    self._whole(whole_answer(chat=chat))
                elif mode == "ok":
                    self._stream_head()
                    for k in range(3):
                        self._event(token_chunk("ab"[k % 2], chat=chat, finish="stop" if k == 2 else None))
                    self._done()
                elif mode == "long-line":
                    self._stream_head()
                    self._chunk(b"data: {")
                    while not upstream.closing.is_set():
                        self._chunk(b"x" * 65536)
                elif mode == "trickle":
                    self._stream_head()
                    while not upstream.closing.wait(upstream.drip_s):
                        self._chunk(b"x")
                else:  # drip, endless, empty-deltas
                    self._stream_head()
                    event = (f"data: {json.dumps(token_chunk(chat=chat))}\n\n".encode() if mode != "empty-deltas" else
                             b'data: {"choices":[{"index":0,"delta":{},"finish_reason":null}]}\n\n')
                    batch = event if mode == "drip" else event * max(1, 16384 // len(event))
                    while not upstream.closing.is_set():
                        self._chunk(batch)
                        if mode == "drip" and upstream.closing.wait(upstream.drip_s):
                            break
                self.close_connection = self.close_connection or upstream.closing.is_set()

            def _wait_for_hangup(self) -> None:
                """Hold the request unanswered until the caller closes the connection (or the server closes)."""
                conn = self.connection
                while not upstream.closing.is_set():
                    readable, _, _ = select.select([conn], [], [], POLL_S)
                    if readable:
                        try:
                            if conn.recv(1, socket.MSG_PEEK) == b"":
                                break
                        except OSError:
                            break
                self.close_connection = True

            def _whole(self, doc: object, status: int = 200) -> None:
                self._raw(json.dumps(doc).encode(), status=status)

            def _raw(self, data: bytes, content_type: str = "application/json", status: int = 200) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _endless_whole(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self._chunk(b'{"choices":[{"index":0,"message":{"role":"assistant","content":"')
                block = b"x" * 65536
                while not upstream.closing.is_set():
                    self._chunk(block)
                self.close_connection = True

            def _stream_head(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

            def _event(self, doc: object) -> None:
                data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
                self._chunk(b"data: " + data + b"\n\n")

            def _done(self) -> None:
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

        self.server = HangUpTolerantServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, name="hostile-upstream", daemon=True)
        self._thread.start()

    def wait_idle(self, timeout: float) -> bool:
        """Whether every answer under way ended (its caller hung up) within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.busy == 0:
                return True
            time.sleep(POLL_S)
        return self.busy == 0

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "HostileUpstream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _bad_doc(mode: str, chat: bool, stream: bool) -> object:
    good = token_chunk(chat=chat) if stream else whole_answer(chat=chat)
    if mode == "list":
        return [1, 2]
    if mode in ("index-abc", "index-null"):
        good["choices"][0]["index"] = "abc" if mode == "index-abc" else None
        return good
    if mode == "nan":
        return json.dumps(good).replace('"finish_reason"', '"score": NaN, "finish_reason"', 1).encode()
    # surrogate: the escape \ud800 is valid JSON text and no Unicode
    return json.dumps(good).replace('"ok"' if not stream else '"a"', '"\\ud800"', 1).encode()
