"""Proxy mode's record of a stream (`--record-dir`: engine.serve.trace_sink.TraceDirectorySink) is written as the
stream goes (issue 43 item 9), not held until it ends.

The upstream is tests/hostile_upstream.py on 127.0.0.1 in its `drip` mode (a stream of one token every 0.1 s,
without end); the proxy runs on 127.0.0.1 with the sink `--record-dir` makes (engine/cli/serve.py). While the
client still reads, a file in the record folder already holds the tokens it was sent (its run: header, then
the tokens, no end yet), and it grows with them; when the client leaves, the record is the usual whole trace
file, its run closed with its end (the client gone, finish "cancelled"), and nothing in progress is left.
Before, nothing was written until the stream ended: an endless stream was a record that never reached disk.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from engine.experiments.trace import read_trace
from engine.serve import ServeOptions, start_server
from engine.serve.proxy_limits import ProxyLimits
from engine.serve import trace_sink
from engine.serve.trace_sink import TraceDirectorySink
from hostile_upstream import HostileUpstream
from serve_helpers import RecordingSink

pytestmark = pytest.mark.slow

LIMITS = ProxyLimits(disconnect_poll_s=0.05)
WAIT_S = 10.0  # bounded waits: the machine's cores are shared, and the upstream drips a token every 0.1 s


@pytest.fixture
def proxy(tmp_path):
    with HostileUpstream(drip_s=0.1) as upstream:
        sink = RecordingSink()
        server = start_server(upstream=upstream.url, sink=[sink, TraceDirectorySink(tmp_path)],
                              options=ServeOptions(proxy=LIMITS))
        try:
            yield server.url, sink, upstream
        finally:
            server.stop()


def _recorded_tokens(folder: Path) -> list[str]:
    """The token texts of the one record in `folder` as it stands now ([] while there is none to read)."""
    files = [p for p in folder.iterdir() if not p.name.startswith(".")]  # not an atomic write's temporary
    if len(files) != 1:
        return []
    try:
        (run,) = read_trace(files[0])
    except ValueError:  # a line caught half written
        return []
    return [t["text"] for t in run.tokens]


def _wait_for(what, done, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if done(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


@pytest.mark.parametrize("held", [None, 0], ids=["file-held-open", "appended-past-the-open-file-cap"])
def test_a_streams_record_is_on_disk_while_it_streams_and_closed_with_its_end_when_the_client_leaves(
        proxy, tmp_path, monkeypatch, held):
    if held is not None:
        monkeypatch.setattr(trace_sink, "MAX_OPEN_LIVE", held)  # 0: every line opens and closes its file
    url, sink, upstream = proxy
    body = {"model": "drip", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    received = 0
    with httpx.stream("POST", url + "/chat/completions", json=body, timeout=WAIT_S) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        for target in (3, 6):  # twice: the file grows with the stream, it is not one early write
            while received < target:
                line = next(lines)
                if line.startswith("data:"):
                    assert json.loads(line[5:])["choices"][0]["delta"]["content"] == "a"
                    received += 1
            on_disk = _wait_for(lambda: _recorded_tokens(tmp_path), lambda got: len(got) >= received)
            assert len(on_disk) >= received and set(on_disk) == {"a"}, (
                f"the client has {received} tokens, the record folder {len(on_disk)}: {sorted(tmp_path.iterdir())}")
        assert sink.ended == [], "the stream is still open: its record must not have ended"

    (ended,) = sink.wait_ends(1, timeout=WAIT_S)
    assert ended.disconnected and ended.choices[0].finish_reason == "cancelled"
    name = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(ended.started_at))}-{ended.id}.jsonl"
    whole = _wait_for(lambda: sorted(tmp_path.iterdir()), lambda files: [p.name for p in files] == [name])
    assert [p.name for p in whole] == [name], "one whole trace file, nothing in progress left"
    (run,) = read_trace(whole[0])
    assert run.end is not None and run.end["served_finish_reason"] == "cancelled"
    assert run.header["served"]["disconnected"] and run.header["served"]["finished_at"] is not None
    assert len(run.tokens) == len(ended.choices[0].events) >= received
    assert upstream.wait_idle(WAIT_S)
