"""A test run killed outright (SIGKILL: no `finally`, no fixture teardown) leaves no llama.cpp server behind.

The suite's server fixture starts `python -m llama_cpp.server` in its own session; before
`dies_with_this_process` such a server outlived a killed run for good (issue 44).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

# A stand-in for a pytest run: starts the fixture's server, prints its pid, then waits to be killed.
RUN = f"""
import sys, time
sys.path.insert(0, {str(TESTS)!r})
import remote_server
started = []
real_popen = remote_server.subprocess.Popen
def popen(*a, **k):
    proc = real_popen(*a, **k)
    started.append(proc.pid)
    return proc
remote_server.subprocess.Popen = popen
with remote_server.running_llama_server() as url:
    print(started[0], url, flush=True)
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (dead, not yet reaped by its new parent) counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_run_takes_its_llama_server_with_it(default_model_folder):
    pytest.importorskip("llama_cpp.server", reason="needs llama-cpp-python[server] (the test extra)")
    run = subprocess.Popen([sys.executable, "-c", RUN], stdout=subprocess.PIPE, text=True)
    try:
        line = run.stdout.readline().split()
        assert line, "the stand-in run printed nothing (its server did not start)"
        server_pid = int(line[0])
        assert _alive(server_pid)
        run.send_signal(signal.SIGKILL)
        run.wait(10)
        deadline = time.monotonic() + 10
        while _alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server_pid), f"the server (pid {server_pid}) outlived the run that started it"
    finally:
        if run.poll() is None:
            run.kill()
