"""Time the packaged app: start to a visible window, model loaded, first token of the first answer.

    python packaging/measure.py [--dist dist] [--runs 3] [--cold] [--xvfb]

Starts the bundle's `--self-test` several times and reads its report. Times
are from the moment this script starts the process (so the PyInstaller
bootloader, Python's start-up and every import are counted) to the window
being exposed on the display, the model being ready, and the first answer
token reaching the conversation. `--xvfb` runs under a real X server (Xvfb)
instead of Qt's offscreen platform; `--cold` drops the page cache before the
first run (root only), which is what a first double-click after a reboot sees.
The default model is passed as `$LOGITLAB_DEFAULT_MODEL` when this Python
environment has it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

import build  # noqa: E402 - packaging/build.py

REPORT_PREFIX = "LOGITLAB_SELFTEST "


def drop_page_cache() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def start_xvfb(display: str = ":99") -> subprocess.Popen:
    if not shutil.which("Xvfb"):
        raise SystemExit("Xvfb is not installed (apt-get install -y xvfb)")
    proc = subprocess.Popen(["Xvfb", display, "-screen", "0", "1920x1080x24", "-nolisten", "tcp"], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not Path(f"/tmp/.X11-unix/X{display[1:]}").exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("Xvfb did not start")
        time.sleep(0.05)
    return proc


def run_once(executable: Path, env: dict[str, str], tokens: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report_file = Path(tmp) / "report.json"
        t0 = time.time()
        result = subprocess.run(
            [str(executable), "--self-test", "--tokens", str(tokens), "--report", str(report_file)],
            env={**env, "LOGITLAB_LOG_DIR": tmp},
            capture_output=True,
            text=True,
            timeout=900,
        )
        wall = time.time() - t0
        if result.returncode != 0 or not report_file.exists():
            raise SystemExit(f"self-test failed ({result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}")
        r = json.loads(report_file.read_text())
    return {
        "window_visible_s": r["window_visible_at"] - t0,
        "model_loaded_s": r["model_loaded_at"] - t0,
        "first_token_after_send_s": r["first_token_s"],
        "engine_ttft_s": r["stats"]["time_to_first_token_s"],
        "process_wall_s": wall,
        "qt_platform": r["qt_platform"],
        "answer": r["answer"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dist", type=Path, default=build.DEFAULT_DIST)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--cold", action="store_true", help="drop the page cache before the first run (root)")
    p.add_argument("--xvfb", action="store_true", help="run under Xvfb instead of QT_QPA_PLATFORM=offscreen")
    args = p.parse_args(argv)

    executable = build.executable(args.dist)
    if not executable.is_file():
        raise SystemExit(f"no bundle at {executable}: python packaging/build.py first")
    env = dict(os.environ)
    xvfb = None
    if args.xvfb:
        xvfb = start_xvfb()
        env["DISPLAY"] = ":99"
        env.pop("QT_QPA_PLATFORM", None)
        env.pop("WAYLAND_DISPLAY", None)
    else:
        env["QT_QPA_PLATFORM"] = "offscreen"
    try:
        from engine.sources.default_model import default_model_path

        env.setdefault("LOGITLAB_DEFAULT_MODEL", str(default_model_path()))
    except Exception:  # noqa: BLE001 - the bundle may find it on its own (user models folder)
        pass
    size, files = build.tree_size(build.bundle_path(args.dist))
    print(f"bundle {build.bundle_path(args.dist)}: {size / 2**20:,.0f} MiB in {files:,} files")
    rows = []
    try:
        for i in range(args.runs):
            cold = args.cold and i == 0 and drop_page_cache()
            row = run_once(executable, env, args.tokens)
            rows.append(row)
            print(
                f"run {i + 1}{' (page cache dropped)' if cold else ''} [{row['qt_platform']}]: "
                f"window visible {row['window_visible_s']:.2f} s, model ready {row['model_loaded_s']:.2f} s, "
                f"first token {row['first_token_after_send_s']:.2f} s after Send "
                f"(engine TTFT {row['engine_ttft_s']:.2f} s), process {row['process_wall_s']:.1f} s; "
                f"answer {row['answer']!r}"
            )
    finally:
        if xvfb is not None:
            xvfb.terminate()
            xvfb.wait()
    if len(rows) > 1:
        for key in ("window_visible_s", "model_loaded_s", "first_token_after_send_s"):
            print(f"median {key}: {statistics.median(r[key] for r in rows):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
