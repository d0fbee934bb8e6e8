"""Remote models against scripted servers on 127.0.0.1 (tests/remote_server.py: FakeServer, CharModel).

What is shown must be what the server said (the "rest" entry), and every way a
server can fail or stall mid-answer must end in words, with the answer so far
kept and the run still replayable.
"""

from __future__ import annotations

import math
import threading
import time

import pytest

from engine import GenerationRequest, SamplerSettings
from engine.__main__ import main as cli_main
from engine.backends.remote import RemoteBackend, ServerTimeoutError, UnsupportedByServerError
from engine.backends.remote.generate import remote_events
from engine.events import REST_TOKEN_ID, Done, TokenEvent
from remote_server import CharModel, FakeServer, Reply

PROBS = {"a": 0.5, "b": 0.2, "c": 0.1, "d": 0.05, "e": 0.05, "f": 0.04, "g": 0.03}  # 0.03 is never reported
PROMPT = "Once upon a time, there was"  # longer than the probe's prompts (20 characters at most)
FAIL_AT = len(PROMPT) + 4  # a we-sample step fails when 4 tokens were generated


def run(backend, **kw) -> tuple[list[TokenEvent], Done]:
    events = list(remote_events(backend, GenerationRequest(**kw)))
    assert isinstance(events[-1], Done)
    return events[:-1], events[-1]


def connect(server: FakeServer, **overrides) -> RemoteBackend:
    return RemoteBackend.connect(server.url, **overrides)


# --- item 11: the model view is the server's log-probs, with the unreported rest ------------------------------


@pytest.mark.slow
def test_we_sample_shows_the_servers_logprobs_and_the_rest(serve):
    model = CharModel(PROBS)
    backend = connect(serve(lambda *a: model(*a)))
    reported = dict(list(PROBS.items())[: backend.top_n])
    events, done = run(backend, prompt=PROMPT, max_new_tokens=3, top_n=10, record_stages=True,
                       sampler=SamplerSettings(seed=5))
    assert backend.top_n == 5 and len(reported) == 5  # the server allows 5: "f" and "g" are never reported
    rest = 1 - sum(reported.values())  # 0.1
    for ev in events:
        by_text = {p.text: p.prob for p in ev.top_model if not p.is_rest}
        assert by_text == pytest.approx(reported, abs=1e-6)  # as the server said: not renormalised
        assert ev.top_model[-1].is_rest and ev.top_model[-1].token_id == REST_TOKEN_ID
        assert ev.top_model[-1].prob == pytest.approx(rest, abs=1e-6)
        assert sum(p.prob for p in ev.top_model) == pytest.approx(1.0, abs=1e-6)
        assert ev.prob == pytest.approx(PROBS[ev.token_text], abs=1e-6)
        # Entropy: the reported tokens and the rest as one outcome (a lower bound of the model's).
        h = -sum(p * math.log(p) for p in reported.values()) - rest * math.log(rest)
        assert ev.entropy == pytest.approx(h, abs=1e-6)
        # The sampler's view is over the reported tokens, renormalised, and says so.
        assert sum(p.prob for p in ev.top_sampler) == pytest.approx(1.0, abs=1e-6)
        assert ev.sampler_prob == pytest.approx(PROBS[ev.token_text] / 0.9, abs=1e-6)
        assert all("top 5" in s.note and "90.0%" in s.note for s in ev.stages)
    assert done.stats.finish_reason == "length" and done.stats.seed == 5


@pytest.mark.slow
def test_compare_on_a_server_shows_the_servers_logprobs(serve):
    """Compare runs the decode loop itself: the model view there is the server's too (ModelInfo.reports_top_n)."""
    from engine.experiments.compare import compare

    model = CharModel(PROBS)
    backend = connect(serve(lambda *a: model(*a)))
    result = compare(backend, GenerationRequest(prompt=PROMPT, max_new_tokens=2, top_n=10),
                     [SamplerSettings(temperature=0), SamplerSettings(top_k=2)], seed=3)
    for column in result.columns:
        for ev in column.events:
            assert ev.top_model[-1].is_rest and ev.top_model[-1].prob == pytest.approx(0.1, abs=1e-6)
            assert ev.prob == pytest.approx(PROBS[ev.token_text], abs=1e-6)


@pytest.mark.slow
def test_server_sampling_shows_the_rest_too(serve):
    model = CharModel(PROBS)
    backend = connect(serve(lambda *a: model(*a)))
    events, _ = run(backend, prompt=PROMPT, max_new_tokens=3, top_n=3, server_sampling=True,
                    sampler=SamplerSettings(temperature=0))
    for ev in events:
        assert [p.text for p in ev.top_model] == ["a", "b", "c", "(the rest)"]
        assert ev.top_model[-1].prob == pytest.approx(0.2, abs=1e-6)  # 1 - (0.5 + 0.2 + 0.1)
        assert ev.prob == pytest.approx(0.5, abs=1e-6)


# --- item 12: vLLM names tokens "token_id:N"; their text is shown ----------------------------------------------


@pytest.mark.slow
def test_vllm_token_ids_are_shown_as_their_text(serve):
    model = CharModel(PROBS, kind="vllm")
    backend = connect(serve(lambda *a: model(*a)))
    assert backend.caps.kind == "vllm"
    events, done = run(backend, prompt=PROMPT, max_new_tokens=3, top_n=3, server_sampling=True,
                       sampler=SamplerSettings(temperature=0))
    assert [p.text for p in events[0].top_model] == ["a", "b", "c", "(the rest)"]
    assert [p.token_id for p in events[0].top_model[:3]] == [ord("a"), ord("b"), ord("c")]
    assert all(ev.token_text == "a" for ev in events) and done.stats.token_ids == (ord("a"),) * 3


# --- item 13: an empty answer says what the server answered ------------------------------------------------------


@pytest.mark.slow
def test_an_empty_server_answer_says_what_the_server_said(serve, capsys):
    model = CharModel(PROBS)

    def handler(method, path, body):
        if path == "/v1/completions" and body.get("stream"):
            return Reply(events=[{"choices": [{"text": "", "index": 0, "finish_reason": "stop", "stop_type": "eos"}],
                                  "usage": {"prompt_tokens": 4, "completion_tokens": 0}}])
        return model(method, path, body)

    server = serve(handler)
    events, done = run(connect(server), prompt=PROMPT, max_new_tokens=8, server_sampling=True)
    assert events == [] and done.stats.finish_reason == "eos"
    assert "answered with no text" in done.stats.error and "finish_reason 'stop'" in done.stats.error
    assert "stop_type='eos'" in done.stats.error and "completion_tokens=0" in done.stats.error
    assert cli_main(["generate", "--model", server.url, "--prompt", PROMPT, "--server-sampling"]) == 0
    assert "note: 127.0.0.1" in capsys.readouterr().err


# --- item 15: a server without a tokenize endpoint ----------------------------------------------------------------


@pytest.mark.slow
def test_no_tokenize_endpoint_says_use_server_sampling_before_anything_runs(serve, capsys):
    model = CharModel(PROBS, tokenize=False)
    server = serve(lambda *a: model(*a))
    backend = connect(server)
    sent = server.paths("/v1/completions")
    with pytest.raises(UnsupportedByServerError, match="has no tokenize endpoint.*use server sampling"):
        run(backend, messages=({"role": "user", "content": "Hi"},), max_new_tokens=3)
    assert server.paths("/v1/completions") == sent  # refused before any request
    assert cli_main(["generate", "--model", server.url, "--prompt", "Hi", "--chat"]) == 2
    err = capsys.readouterr().err
    assert "--server-sampling" in err and "Traceback" not in err and "AttributeError" not in err


def test_no_tokenize_endpoint_refusals_in_server_sampling_say_what_works(serve):
    model = CharModel(PROBS, tokenize=False, kind="openai")
    backend = connect(serve(lambda *a: model(*a)))
    with pytest.raises(UnsupportedByServerError, match="top_k=40") as info:
        run(backend, prompt=PROMPT, sampler=SamplerSettings(top_k=40), server_sampling=True)
    assert "neutral values" in str(info.value) and "use we-sample mode" not in str(info.value)
    with pytest.raises(UnsupportedByServerError, match="cannot do") as info:
        run(backend, prompt=PROMPT, forced_tokens=(97,), server_sampling=True)


# --- items 16 and 21: failures mid-answer ---------------------------------------------------------------------------


FAILURES = {
    "500": Reply({"error": {"message": "the GPU fell off the bus"}}, 500),
    "not json": Reply(raw=b"<html>Bad gateway</html>", status=502, content_type="text/html"),
    "hang": Reply(hang=True),
    "trickle": Reply(events=[], trickle=0.1),  # a byte at a time, never a whole answer
}


@pytest.mark.slow
@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_we_sample_failure_mid_answer_keeps_tokens_seed_and_speed(serve, failure):
    model = CharModel(PROBS, fail_at=FAIL_AT, fail=FAILURES[failure])
    backend = connect(serve(lambda *a: model(*a)), retries=0, timeout_s=1)
    events, done = run(backend, prompt=PROMPT, max_new_tokens=10, sampler=SamplerSettings(seed=11))
    s = done.stats
    assert s.finish_reason == "error" and len(events) == 4 == s.generated_tokens
    assert s.text == "".join(e.text for e in events) and len(s.text) == 4
    assert s.seed == 11 and s.decode_tokens_per_s > 0  # replayable, and its speed measured
    assert s.error and "127.0.0.1" in s.error
    unseeded = run(backend, prompt=PROMPT, max_new_tokens=10)[1].stats
    assert unseeded.finish_reason == "error" and 0 <= unseeded.seed < 2**63  # the drawn seed, not -1


@pytest.mark.slow
def test_we_sample_stream_cut_is_reported_by_the_cli_with_a_nonzero_exit(serve, capsys):
    model = CharModel(PROBS, fail_at=FAIL_AT)
    server = serve(lambda *a: model(*a))
    code = cli_main(["generate", "--model", server.url, "--prompt", PROMPT, "--max-new-tokens", "10", "--seed", "3",
                     "--temperature", "0"])
    out, err = capsys.readouterr()
    assert code == 1
    assert out.strip() == "aaaa"  # the text so far
    assert "error: the answer stopped after 4 tokens" in err and "GPU fell off the bus" in err
    assert "seed 3" in err and " 0.0 tok/s" not in err


@pytest.mark.slow
@pytest.mark.parametrize("how", ["cut", "500", "trickle"])
def test_server_sampling_failure_mid_answer_is_said(serve, capsys, monkeypatch, how):
    monkeypatch.setenv("LOGITLAB_REMOTE_TIMEOUT", "1")  # the trickle is given up after 1 s
    model = CharModel(PROBS)
    two = [model.chunk("a", 2), model.chunk("a", 2)]

    def handler(method, path, body):
        if path == "/v1/completions" and body.get("stream"):
            if how == "500":
                return Reply({"error": {"message": "model crashed"}}, 500)
            return Reply(events=two, cut=how == "cut", trickle=0.2 if how == "trickle" else 0)
        return model(method, path, body)

    server = serve(handler)
    code = cli_main(["generate", "--model", server.url, "--prompt", PROMPT, "--server-sampling"])
    out, err = capsys.readouterr()
    assert code == (2 if how == "500" else 1)  # nothing arrived: a plain error; else the answer so far, kept
    if how == "500":
        assert "internal error (500): model crashed" in err
    else:
        assert out.strip() == "aa" and "error: the answer stopped after 2 tokens" in err
        assert ("no complete token for 1 s" if how == "trickle" else "ended in the middle of the answer") in err


# --- item 17: hangs and trickles --------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_trickling_stream_ends_after_the_timeout_with_a_clear_error(serve):
    model = CharModel(PROBS)

    def handler(method, path, body):
        if path == "/v1/completions" and body.get("stream"):
            return Reply(events=[model.chunk("a", 2)], trickle=0.1)
        return model(method, path, body)

    backend = connect(serve(handler), timeout_s=1)
    t0 = time.perf_counter()
    events, done = run(backend, prompt=PROMPT, max_new_tokens=8, server_sampling=True)
    assert time.perf_counter() - t0 < 3
    assert len(events) == 1 and done.stats.finish_reason == "error"
    assert "sent no complete token for 1 s" in done.stats.error

    def silent(method, path, body):
        if path == "/v1/completions" and body.get("stream"):
            return Reply(events=[], trickle=0.1)
        return model(method, path, body)

    with pytest.raises(ServerTimeoutError, match="sent no complete token for 1 s"):
        run(connect(serve(silent), timeout_s=1), prompt=PROMPT, server_sampling=True)


@pytest.mark.slow
@pytest.mark.parametrize("server_sampling", [False, True])
def test_cancel_while_the_server_never_answers_returns_at_once(serve, server_sampling):
    model = CharModel(PROBS)

    def handler(method, path, body):
        if path == "/v1/completions" and len(body.get("prompt", "")) >= len(PROMPT):
            return Reply(hang=True)
        return model(method, path, body)

    backend = connect(serve(handler))  # the default 60 s timeout
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    t0 = time.perf_counter()
    events = list(remote_events(backend, GenerationRequest(prompt=PROMPT, server_sampling=server_sampling), cancel))
    assert time.perf_counter() - t0 < 1.0
    assert events[-1].stats.finish_reason == "cancelled"
    backend.close()


# --- item 23: a 200 answer that is not a stream ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_json_answer_to_a_stream_request_is_named(serve):
    model = CharModel(PROBS)

    def handler(method, path, body):
        if path == "/v1/completions" and body.get("stream"):
            return Reply({"choices": [{"text": "aaa", "index": 0, "finish_reason": "length"}]})
        return model(method, path, body)

    with pytest.raises(Exception, match="one JSON document instead of a stream") as info:
        run(connect(serve(handler)), prompt=PROMPT, server_sampling=True)
    assert "middle of the answer" not in str(info.value)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["we-sample", "server-sampling", "trickle"])
def test_ctrl_c_in_the_cli_exits_within_a_second(serve, mode):
    """Issue 20 item 17: Ctrl-C while the server never answers (or trickles a byte at a time) took 10 s."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    model = CharModel(PROBS)

    def handler(method, path, body):
        if path == "/v1/completions" and len(body.get("prompt", "")) >= len(PROMPT):
            return Reply(events=[], trickle=0.5) if mode == "trickle" else Reply(hang=True)
        return model(method, path, body)

    server = serve(handler)
    root = Path(__file__).resolve().parents[2]
    # Started from a background shell (`pytest ... &`), this process ignores SIGINT and a child would
    # inherit that (Python installs its KeyboardInterrupt handler only where SIGINT is not ignored):
    # the child puts Python's handler back first, as a CLI started from a terminal has it.
    restore_sigint = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                      "sys.argv[0] = 'engine'; runpy.run_module('engine', run_name='__main__', alter_sys=True)")
    cmd = [sys.executable, "-c", restore_sigint, "generate", "--model", server.url, "--prompt", PROMPT]
    if mode != "we-sample":
        cmd.append("--server-sampling")
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not any(p == "/v1/completions" and len((b or {}).get("prompt", "")) >= len(PROMPT)
                      for _, p, b in list(server.requests)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the CLI never asked for the answer"
            time.sleep(0.05)
        time.sleep(0.3)  # inside the request now
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=10)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert took < 1.0, f"took {took:.2f} s to exit"
    assert "Traceback" not in err


# --- item 19: credentials in a server URL -----------------------------------------------------------------------


@pytest.mark.slow
def test_credentials_in_the_url_are_sent_but_never_shown(serve, capsys):
    import base64

    model = CharModel(PROBS)
    server = serve(lambda *a: model(*a))
    secret = "sk-hunter2-xyz"
    url = server.url.replace("http://", f"http://bob:{secret}@")
    assert cli_main(["info", "--model", url]) == 0
    out, err = capsys.readouterr()
    assert secret not in out + err and "bob" not in out + err
    assert "127.0.0.1:" in out
    assert server.auth[-1] == "Basic " + base64.b64encode(f"bob:{secret}".encode()).decode()
    backend = RemoteBackend.connect(url)
    try:
        info = backend.info
        assert secret not in f"{info.spec} {info.path} {info.device} {info.name}"
        assert info.spec == server.url
    finally:
        backend.close()
