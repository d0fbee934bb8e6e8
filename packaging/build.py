"""Build the double-clickable Logit Lab for this platform and say where it is and how big.

    python packaging/build.py              # dist/LogitLab/ (Linux, Windows) or dist/LogitLab.app (macOS)
    python packaging/build.py --clean      # forget PyInstaller's cache first
    python packaging/build.py --check      # then start the result once: window, default model, 8 tokens

Needs PyInstaller and Pillow (`pip install -e ".[packaging]"`). A build takes
3.5 to 4.5 minutes on two cores; PyInstaller's work folder is build/pyinstaller.
This file is not a module of a `packaging` package on purpose: that name
belongs to the PyPI library PyInstaller itself imports.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SPEC = HERE / "logitlab.spec"
EXE_NAME = "LogitLab"
DEFAULT_DIST = ROOT / "dist"
DEFAULT_WORK = ROOT / "build" / "pyinstaller"
# A bundle carries the Python it was built with, so a release is built with one: the newest the project
# supports (pyproject's requires-python), the one with the longest life ahead of it.
RELEASE_PYTHON_ENV = "LOGITLAB_BUNDLE_ANY_PYTHON"  # set to build-test the bundle on another Python too


def release_python() -> tuple[int, int]:
    """(3, minor) of the newest Python pyproject's requires-python admits (">=3.11,<3.14" -> (3, 13))."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    spec = re.search(r'^requires-python\s*=\s*"([^"]+)"', text, re.M)
    upper = re.search(r"<\s*3\.(\d+)", spec.group(1)) if spec else None
    if upper is None:
        raise RuntimeError("pyproject.toml's requires-python names no upper bound (<3.N)")
    return (3, int(upper.group(1)) - 1)


def pyinstaller_missing() -> str | None:
    """Why a build cannot run here (a message), or None when it can."""
    try:
        import PyInstaller  # noqa: F401
    except ImportError:
        return 'PyInstaller is not installed: pip install -e ".[packaging]" (or pip install pyinstaller pillow)'
    try:
        import PIL  # noqa: F401
    except ImportError:
        return 'Pillow is not installed (it makes the .ico/.icns icons): pip install -e ".[packaging]"'
    return None


def bundle_path(dist: Path = DEFAULT_DIST) -> Path:
    """What a person double-clicks, or the folder holding it: LogitLab.app on macOS, the LogitLab folder elsewhere."""
    return dist / f"{EXE_NAME}.app" if sys.platform == "darwin" else dist / EXE_NAME


def executable(dist: Path = DEFAULT_DIST) -> Path:
    """The program inside the bundle."""
    if sys.platform == "darwin":
        return bundle_path(dist) / "Contents" / "MacOS" / EXE_NAME
    return bundle_path(dist) / (EXE_NAME + (".exe" if sys.platform == "win32" else ""))


def tree_size(path: Path) -> tuple[int, int]:
    """(bytes, files) under `path`, symlinks not followed (as the bundle would be copied)."""
    total = files = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            p = Path(root, name)
            if not p.is_symlink():
                total += p.stat().st_size
                files += 1
    return total, files


def build(dist: Path = DEFAULT_DIST, work: Path = DEFAULT_WORK, *, clean: bool = False, quiet: bool = False) -> Path:
    """Run PyInstaller on packaging/logitlab.spec; returns the bundle path. Raises CalledProcessError on failure."""
    why = pyinstaller_missing()
    if why:
        raise RuntimeError(why)
    cmd = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--distpath", str(dist), "--workpath", str(work)]
    if clean:
        cmd.append("--clean")
    if quiet:
        cmd += ["--log-level", "WARN"]
    cmd.append(str(SPEC))
    env = {**os.environ, "QT_QPA_PLATFORM": os.environ.get("QT_QPA_PLATFORM", "offscreen")}  # icons render headless
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    return bundle_path(dist)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Build Logit Lab's double-clickable app for this platform.")
    p.add_argument("--dist", type=Path, default=DEFAULT_DIST, help=f"output folder (default: {DEFAULT_DIST})")
    p.add_argument("--work", type=Path, default=DEFAULT_WORK, help=f"PyInstaller's work folder (default: {DEFAULT_WORK})")
    p.add_argument("--clean", action="store_true", help="clear PyInstaller's cache before building")
    p.add_argument("--quiet", action="store_true", help="show PyInstaller's warnings only")
    p.add_argument("--check", action="store_true", help="start the built app once with --self-test (offscreen)")
    args = p.parse_args(argv)
    why = pyinstaller_missing()
    if why:
        print(why, file=sys.stderr)
        return 2
    release = release_python()
    if sys.version_info[:2] != release:
        print(f"note: a release is built with Python {release[0]}.{release[1]}; this bundle will carry "
              f"{sys.version_info[0]}.{sys.version_info[1]}", file=sys.stderr)
    t0 = time.monotonic()
    try:
        bundle = build(args.dist, args.work, clean=args.clean, quiet=args.quiet)
    except subprocess.CalledProcessError as e:
        print(f"PyInstaller failed (exit status {e.returncode}); see its output above", file=sys.stderr)
        return 1
    size, files = tree_size(bundle)
    print(f"\nbuilt {bundle} in {time.monotonic() - t0:.0f} s")
    print(f"  run:  {executable(args.dist)}")
    print(f"  size: {size / 2**20:,.0f} MiB in {files:,} files")
    if sys.platform.startswith("linux"):
        print(f"  menu entry: {bundle / 'install-desktop-entry.sh'}")
    elif sys.platform == "darwin":
        print(f"  sign and notarize: packaging/macos/sign_and_notarize.sh {bundle}")
    if args.check:
        env = {**os.environ, "QT_QPA_PLATFORM": os.environ.get("QT_QPA_PLATFORM", "offscreen")}
        result = subprocess.run([str(executable(args.dist)), "--self-test", "--tokens", "8"], env=env)
        print(f"  self-test: {'passed' if result.returncode == 0 else f'FAILED (exit status {result.returncode})'}")
        return result.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
