"""The start-up check for the Linux X11 (xcb) libraries Qt's platform plugin needs, with a fake library lookup."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app import platform_check
from app.platform_check import XCB_LIBRARIES, check_linux_desktop_libraries, library_loads, no_display_message, uses_xcb

ROOT = Path(__file__).resolve().parents[2]
ABSENT = {"libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-keysyms.so.1"}


def _lookup_without(absent: set[str]):
    asked: list[str] = []

    def lookup(soname: str) -> bool:
        asked.append(soname)
        return soname not in absent

    return lookup, asked


def test_missing_libraries_give_one_line_naming_their_apt_packages(caplog):
    lookup, asked = _lookup_without(ABSENT)
    with caplog.at_level(logging.ERROR, logger="app.platform_check"):
        message = check_linux_desktop_libraries({"DISPLAY": ":0"}, "linux", lookup)
    assert message is not None and "\n" not in message
    assert "sudo apt install libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 (" in message
    for present in set(XCB_LIBRARIES) - ABSENT:  # only what is missing is named
        assert f" {XCB_LIBRARIES[present]} " not in message.split("(")[0]
    assert set(asked) == set(XCB_LIBRARIES)
    assert [r.getMessage() for r in caplog.records] == [message]


def test_nothing_is_said_when_everything_is_there_or_xcb_is_not_used():
    lookup, asked = _lookup_without(set())
    assert check_linux_desktop_libraries({}, "linux", lookup) is None
    assert asked  # it did look
    lookup, asked = _lookup_without(set(XCB_LIBRARIES))
    for env in (
        {"QT_QPA_PLATFORM": "offscreen"},
        {"QT_QPA_PLATFORM": "minimal"},
        {"QT_QPA_PLATFORM": "wayland"},
        {"QT_QPA_PLATFORM": "wayland;xcb"},
        {"XDG_SESSION_TYPE": "wayland", "WAYLAND_DISPLAY": "wayland-0"},
    ):
        assert check_linux_desktop_libraries(env, "linux", lookup) is None, env
    assert check_linux_desktop_libraries({}, "darwin", lookup) is None
    assert check_linux_desktop_libraries({}, "win32", lookup) is None
    assert not asked  # skipped without looking
    assert uses_xcb({"QT_QPA_PLATFORM": "xcb"}) and uses_xcb({"QT_QPA_PLATFORM": "xcb:display=:1"})
    assert uses_xcb({}) and uses_xcb({"XDG_SESSION_TYPE": "x11"})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the dynamic loader check is Linux-only")
def test_the_real_lookup_asks_the_dynamic_loader():
    assert library_loads("libc.so.6")
    assert not library_loads("libxcb-surely-not-a-library.so.9")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the check runs on Linux only")
def test_the_app_says_it_before_qt_fails(tmp_path):
    """`python -m app` with libxcb-cursor reported missing and no X display: our line comes first."""
    code = (
        "import app.platform_check as pc, sys\n"
        # Only libxcb-cursor is missing, whatever this machine really has (a minimal one lacks others too).
        "pc.library_loads = lambda soname: soname != 'libxcb-cursor.so.0'\n"
        "from app.__main__ import run\n"
        "sys.exit(run([]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "XDG_SESSION_TYPE")}
    env.update(
        DISPLAY=":97",  # a display is named (none runs there): without one, the app says that instead
        QT_QPA_PLATFORM="xcb",
        LOGITLAB_DATA_DIR=str(tmp_path / "data"),
        LOGITLAB_LOG_DIR=str(tmp_path / "logs"),
        PYTHONPATH=str(ROOT),
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0  # Qt cannot start without a display either way
    ours = [line for line in result.stderr.splitlines() if "sudo apt install" in line]
    assert len(ours) == 1 and "libxcb-cursor0" in ours[0] and "libxcb-icccm4" not in ours[0].split("(")[0]
    assert "qt.qpa" not in result.stderr.split(ours[0])[0]  # before Qt's own messages


# -- issue 37 item 16: no display at all ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"QT_QPA_PLATFORM": "xcb"},
        {"QT_QPA_PLATFORM": "wayland"},
        {"QT_QPA_PLATFORM": "wayland;xcb"},
        {"XDG_SESSION_TYPE": "wayland"},
        {"WAYLAND_DISPLAY": "wayland-0", "QT_QPA_PLATFORM": "xcb"},  # a Wayland socket does not serve xcb
    ],
)
def test_no_display_is_said_in_one_line(env):
    message = no_display_message(env, "linux")
    assert message is not None and "\n" not in message
    assert "no display" in message and "DISPLAY" in message and "WAYLAND_DISPLAY" in message


@pytest.mark.parametrize(
    "env",
    [
        {"DISPLAY": ":0"},
        {"WAYLAND_DISPLAY": "wayland-0"},
        {"QT_QPA_PLATFORM": "offscreen"},
        {"QT_QPA_PLATFORM": "minimal"},
        {"QT_QPA_PLATFORM": "vnc"},
        {"QT_QPA_PLATFORM": "wayland;xcb", "DISPLAY": ":1"},
        {"QT_QPA_PLATFORM": "xcb:display=:1"},
    ],
)
def test_a_display_or_a_platform_that_needs_none_is_fine(env):
    assert no_display_message(env, "linux") is None


def test_other_systems_are_not_asked_about_a_display():
    assert no_display_message({}, "darwin") is None and no_display_message({}, "win32") is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the display check runs on Linux only")
def test_the_app_without_a_display_says_so_instead_of_qts_plugin_message(tmp_path):
    """`python -m app` with no DISPLAY or WAYLAND_DISPLAY: one line of ours, exit status 1, Qt never starts."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "XDG_SESSION_TYPE", "QT_QPA_PLATFORM")}
    env.update(LOGITLAB_DATA_DIR=str(tmp_path / "data"), LOGITLAB_LOG_DIR=str(tmp_path / "logs"), PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-m", "app"], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "there is no display" in lines[0], result.stderr
    assert "xcb" not in result.stderr and "qt.qpa" not in result.stderr
