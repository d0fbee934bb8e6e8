"""A real OpenAI-compatible server for tests: llama-cpp-python's, on the default model, on 127.0.0.1 only.

`tests/conftest.py` turns `running_llama_server` into the session fixture
`llama_server_url`, so the engine and the app tests share one server process;
`bench/remote.py` starts its server with it too, so it raises plain errors
rather than depending on pytest.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + STARTUP_LIMIT_S
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the llama.cpp server exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(url + "/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the llama.cpp server did not answer within {STARTUP_LIMIT_S} s")
            time.sleep(0.2)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
