"""Remote failures, each a clear one-line error: a stub HTTP server on 127.0.0.1 plays the bad server.

(The happy paths run against a real llama.cpp server in test_remote_server.py.)
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine import GenerationRequest, SamplerSettings
from engine.backends.remote import (
    RemoteBackend,
    ServerAuthError,
    ServerResponseError,
    ServerTimeoutError,
    StreamCutError,
    UnknownServerModelError,
)
from engine.backends.remote.client import ServerClient
from engine.backends.remote.generate import remote_events
from engine.backends.remote.options import ConnectionOptions
from engine.backends.remote.probe import ServerCapabilities
from engine.events import Done, TokenEvent

MODELS = {"object": "list", "data": [{"id": "stub-model", "object": "model", "owned_by": "me"}]}


class Stub:
    """Scripted answers: path -> list of (status, body | list of SSE chunks, options); the last one repeats."""

    def __init__(self) -> None:
        self.script: dict[str, list[tuple]] = {}
        self.hits: dict[str, int] = {}
        self.auth_headers: list[str | None] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep pytest output clean
                pass

            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self._answer()

            def _answer(self) -> None:
                stub.auth_headers.append(self.headers.get("Authorization"))
                n = stub.hits[self.path] = stub.hits.get(self.path, 0) + 1
                answers = stub.script.get(self.path) or [(404, {"error": {"message": "no such route"}}, {})]
                status, body, opts = answers[min(n, len(answers)) - 1]
                time.sleep(opts.get("delay", 0))
                if isinstance(body, list):  # a stream: SSE chunks, maybe cut before [DONE]
                    self.send_response(status)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for chunk in body:
                        self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
                        time.sleep(opts.get("gap", 0))
                    if opts.get("cut"):
                        self.wfile.flush()
                        self.connection.shutdown(2)  # the server dies mid-answer: no [DONE], no last chunk
                        return
                    self._chunk(b"data: [DONE]\n\n")
                    self._chunk(b"")
                    return
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in opts.get("headers", {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    s = Stub()
    yield s
    s.close()


def client(stub: Stub, **kw) -> ServerClient:
    return ServerClient(ConnectionOptions(stub.url, "stub-model", **kw))


def token_chunk(text: str, lp: float) -> dict:
    return {"choices": [{"text": text, "index": 0, "finish_reason": None, "logprobs": {
        "tokens": [text], "token_logprobs": [lp], "top_logprobs": [{text: lp, "x": lp - 1}], "text_offset": [0]}}]}


def stream_backend(stub: Stub) -> RemoteBackend:
    caps = ServerCapabilities(kind="openai", model="stub-model", models=("stub-model",), max_top_logprobs=5,
                              token_prompts=False, tokenize=None, prompt_logprobs=False, seed=False)
    return RemoteBackend(client(stub, timeout_s=2), caps, None, stub.url)


def test_bad_key_is_a_clear_error_and_never_echoed(stub, monkeypatch):
    stub.script["/v1/models"] = [(401, {"error": {"message": "Invalid API key"}}, {})]
    monkeypatch.setenv("LOGITLAB_API_KEY", "sekrit-123")
    with pytest.raises(ServerAuthError, match="401: the API key was refused") as info:
        RemoteBackend.connect(stub.url)
    assert "sekrit" not in str(info.value)
    assert stub.auth_headers[-1] == "Bearer sekrit-123"
    assert stub.hits["/v1/models"] == 1  # auth failures are not retried


def test_unknown_model_names_what_the_server_has(stub):
    stub.script["/v1/models"] = [(200, MODELS, {})]
    with pytest.raises(UnknownServerModelError, match="no model 'gpt-9'.*stub-model"):
        RemoteBackend.connect(stub.url + "#gpt-9")


def test_429_then_ok_is_retried_with_backoff(stub):
    stub.script["/v1/models"] = [(429, {"error": "slow down"}, {"headers": {"Retry-After": "0.05"}}),
                                 (503, {"error": "busy"}, {}), (200, MODELS, {})]
    assert client(stub).get_json("/models") == MODELS
    assert stub.hits["/v1/models"] == 3


@pytest.mark.slow
def test_retries_are_bounded_and_500_is_reported(stub):
    stub.script["/v1/models"] = [(500, {"error": {"message": "CUDA out of memory"}}, {})]
    with pytest.raises(ServerResponseError, match=r"internal error \(500\): CUDA out of memory"):
        client(stub, retries=2).get_json("/models")
    assert stub.hits["/v1/models"] == 3


def test_non_idempotent_requests_are_not_retried(stub):
    stub.script["/v1/completions"] = [(503, {"error": "busy"}, {})]
    with pytest.raises(ServerResponseError, match="503"):
        client(stub).post_json("/completions", {"prompt": "x"}, idempotent=False)
    assert stub.hits["/v1/completions"] == 1


def test_slow_server_times_out_with_the_users_timeout(stub):
    # The server answers after 3 s; the client gives up after its own 0.3 s (the bound leaves a busy machine 1.7 s).
    stub.script["/v1/models"] = [(200, MODELS, {"delay": 3.0})]
    t0 = time.perf_counter()
    with pytest.raises(ServerTimeoutError, match="within 0.3 s"):
        client(stub, timeout_s=0.3, retries=0).get_json("/models")
    assert time.perf_counter() - t0 < 2.0


def test_stream_cut_mid_answer_keeps_the_tokens(stub):
    stub.script["/v1/completions"] = [(200, [token_chunk(" Hello", -0.1), token_chunk(" world", -0.5)], {"cut": True})]
    events = list(remote_events(stream_backend(stub), GenerationRequest(prompt="Say", max_new_tokens=10, server_sampling=True)))
    tokens, done = events[:-1], events[-1]
    assert [e.text for e in tokens] == [" Hello", " world"] and all(isinstance(e, TokenEvent) for e in tokens)
    assert isinstance(done, Done) and done.stats.finish_reason == "error"
    assert done.stats.text == " Hello world" and "ended in the middle of the answer" in done.stats.error


def test_stream_cut_before_any_token_raises(stub):
    stub.script["/v1/completions"] = [(200, [], {"cut": True})]
    with pytest.raises(StreamCutError):
        list(remote_events(stream_backend(stub), GenerationRequest(prompt="Say", server_sampling=True)))


def test_server_sampling_maps_settings_for_a_plain_openai_server(stub):
    backend = stream_backend(stub)
    with pytest.raises(ValueError, match="top_k=5, min_p=0.1"):
        list(remote_events(backend, GenerationRequest(prompt="x", sampler=SamplerSettings(top_k=5, min_p=0.1),
                                                      server_sampling=True)))
    assert "/v1/completions" not in stub.hits  # refused before anything was sent
