"""Two processes converting the same GGUF at once: the second waits for the first and uses its folder.

The GGUF is a real (tiny) file written with the `gguf` package and each converter is a real process calling
`ensure_converted`; only transformers' de-quantizing step is replaced (by a step that waits for the test's
word), because its 20-50 s are what the lock saves and the test's point is the lock, not the conversion.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from engine.sources import gguf_convert

REPO = Path(__file__).resolve().parents[2]

# The converter process: `_convert` writes a file naming its process, says it started, then waits for the
# test's release file, so the test decides when the first conversion ends (no timing guess).
CONVERTER = r"""
import os, sys, time
from pathlib import Path
from engine.sources import gguf_convert

work = Path(sys.argv[2])

def fake_convert(path, out):
    (work / f"started-{os.getpid()}").write_text("")
    while not (work / "release").exists():
        time.sleep(0.02)
    (out / "weights").write_text(str(os.getpid()))

def progress(message, fraction):
    print("progress:", message, flush=True)

gguf_convert._convert = fake_convert
print("folder:", gguf_convert.ensure_converted(Path(sys.argv[1]), progress), flush=True)
"""


def tiny_gguf(path: Path) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def start_converter(gguf_path: Path, work: Path, cache: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "LOGITLAB_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", CONVERTER, str(gguf_path), str(work)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def read_line_with(proc: subprocess.Popen[str], text: str) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        if text in line:
            return line
    raise AssertionError(f"the converter ended without printing {text!r}: {proc.stderr.read() if proc.stderr else ''}")


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    work = tmp_path / "work"
    work.mkdir()
    return tiny_gguf(tmp_path / "tiny.gguf"), work, tmp_path / "cache"


@pytest.mark.slow  # seconds on two cores (junit times, 2026-12-04)
def test_a_second_converter_waits_for_the_first_and_uses_its_folder(setup: tuple[Path, Path, Path]) -> None:
    gguf_path, work, cache = setup
    first = start_converter(gguf_path, work, cache)
    try:
        wait_for(lambda: any(work.glob("started-*")), "the first conversion to start")
        second = start_converter(gguf_path, work, cache)
        # The second says it waits (it could not take the lock) while the first is still converting.
        assert "waiting for another conversion" in read_line_with(second, "progress:")
        (work / "release").write_text("")
        out1, err1 = first.communicate(timeout=30)
        out2, err2 = second.communicate(timeout=30)
    finally:
        for p in (first, locals().get("second")):
            if p is not None and p.poll() is None:
                p.kill()
    assert first.returncode == 0, err1
    assert second.returncode == 0, err2
    folder1 = out1.split("folder: ")[-1].strip()
    folder2 = out2.split("folder: ")[-1].strip()
    assert folder1 == folder2
    assert [p.name for p in work.glob("started-*")] == [f"started-{first.pid}"]  # converted once, by the first
    assert Path(folder1, "weights").read_text() == str(first.pid)
    assert (Path(folder1) / gguf_convert.COMPLETE_MARKER).is_file()


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
@pytest.mark.slow  # seconds on two cores (junit times, 2026-12-04)
def test_a_converter_killed_mid_conversion_lets_the_waiting_one_convert(setup: tuple[Path, Path, Path]) -> None:
    gguf_path, work, cache = setup
    first = start_converter(gguf_path, work, cache)
    second = None
    try:
        wait_for(lambda: any(work.glob("started-*")), "the first conversion to start")
        second = start_converter(gguf_path, work, cache)
        assert "waiting for another conversion" in read_line_with(second, "progress:")
        # The operating system drops a dead process's lock, so the waiting converter takes over.
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        wait_for(lambda: (work / f"started-{second.pid}").exists(), "the second conversion to start")  # type: ignore[union-attr]
        (work / "release").write_text("")
        out2, err2 = second.communicate(timeout=30)
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
    assert second.returncode == 0, err2
    folder = Path(out2.split("folder: ")[-1].strip())
    assert (folder / "weights").read_text() == str(second.pid)
    assert (folder / gguf_convert.COMPLETE_MARKER).is_file()
