"""Before Qt starts on Linux: is there a display, and are the system libraries of Qt's xcb (X11) plugin there?

Without a display (a server, an ssh session without X forwarding) Qt tries
the xcb plugin anyway and aborts with a message about a missing platform
plugin (or libxcb-cursor0), which sends people installing packages they do
not need. `no_display_message` says there is no display instead.

PySide6's wheels carry Qt but not the X11 helper libraries its xcb plugin
links against. On a minimal Debian/Ubuntu some are missing (libxcb-cursor0
first of all), and Qt then prints "Could not load the Qt platform plugin
"xcb"" and aborts. This check names the missing apt packages in one line
instead. It only reads: nothing is installed or changed.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

# soname -> Debian/Ubuntu package: what PySide6's libqxcb.so needs beyond what QtGui itself needs.
XCB_LIBRARIES: dict[str, str] = {
    "libxcb.so.1": "libxcb1",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxkbcommon.so.0": "libxkbcommon0",
}
# Platforms that do not load the xcb plugin.
NON_XCB_PLATFORMS = ("offscreen", "minimal", "wayland", "eglfs", "linuxfb", "vnc", "vkkhrdisplay")


def library_loads(soname: str) -> bool:
    """Whether the dynamic loader finds `soname`, as it will when Qt loads the plugin.

    dlopen rather than `ldconfig -p`: it honours LD_LIBRARY_PATH and a packaged app's own
    folder exactly as Qt's loader will (the libraries are loaded moments later anyway).
    """
    try:
        ctypes.CDLL(soname)
    except OSError:
        return False
    return True


def uses_xcb(environ: Mapping[str, str]) -> bool:
    """Whether Qt will try the xcb plugin first: QT_QPA_PLATFORM names xcb first, or is unset outside
    a Wayland session (Qt 6 starts on Wayland by itself in one)."""
    platform = environ.get("QT_QPA_PLATFORM", "").split(";")[0].split(":")[0].strip().lower()
    if not platform:
        return not (environ.get("XDG_SESSION_TYPE") == "wayland" and environ.get("WAYLAND_DISPLAY"))
    return not platform.startswith(NON_XCB_PLATFORMS)


# Platforms that draw without a window system (no DISPLAY or WAYLAND_DISPLAY needed).
HEADLESS_PLATFORMS = ("offscreen", "minimal", "eglfs", "linuxfb", "vnc", "vkkhrdisplay")


def _platform_has_display(platform: str, environ: Mapping[str, str]) -> bool:
    """Whether Qt's platform plugin `platform` (one entry of QT_QPA_PLATFORM) has what it needs to show a window."""
    if platform.startswith(HEADLESS_PLATFORMS):
        return True
    if platform.startswith("wayland"):
        return bool(environ.get("WAYLAND_DISPLAY") or environ.get("WAYLAND_SOCKET"))
    if platform.startswith("xcb"):
        return bool(environ.get("DISPLAY")) or "display=" in platform
    return True  # a plugin we do not know: let Qt decide


def no_display_message(environ: Mapping[str, str] | None = None, platform: str | None = None) -> str | None:
    """On Linux, when no platform Qt would try can reach a display: one line saying so; else None."""
    environ = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    if not platform.startswith("linux"):
        return None
    choices = [p.strip().lower() for p in environ.get("QT_QPA_PLATFORM", "").split(";") if p.strip()]
    if not choices:  # Qt's own default: Wayland in a Wayland session, else X11
        choices = ["wayland", "xcb"]
    if any(_platform_has_display(p, environ) for p in choices):
        return None
    return (
        "Logit Lab cannot open its window: there is no display (neither DISPLAY nor WAYLAND_DISPLAY is set). "
        "Start it from a desktop session, or over ssh with X forwarding (ssh -X); logitlab-cli works without one."
    )


def missing_xcb_packages(lookup: Callable[[str], bool] | None = None) -> list[str]:
    """The apt packages whose libraries `lookup` (default: `library_loads`) cannot find, in XCB_LIBRARIES order."""
    lookup = lookup or library_loads
    return [package for soname, package in XCB_LIBRARIES.items() if not lookup(soname)]


def missing_libraries_message(packages: list[str]) -> str:
    """One line a user can act on."""
    names = " ".join(packages)
    return (
        f"Logit Lab cannot open its window: Qt's X11 (xcb) platform plugin needs system libraries that are "
        f"missing. Install them with: sudo apt install {names} "
        f"(Fedora: sudo dnf install xcb-util-cursor xcb-util-wm xcb-util-keysyms xcb-util-image "
        f"xcb-util-renderutil libxkbcommon-x11), or start it on Wayland with QT_QPA_PLATFORM=wayland."
    )


def check_linux_desktop_libraries(
    environ: Mapping[str, str] | None = None,
    platform: str | None = None,
    lookup: Callable[[str], bool] | None = None,
) -> str | None:
    """On Linux with the xcb plugin ahead: the one-line message naming missing packages, or None if all is well.

    The message is also logged (to stderr and the log file) so a user who started the app from a
    terminal or opens the log sees what to install.
    """
    environ = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    if not platform.startswith("linux") or not uses_xcb(environ):
        return None
    missing = missing_xcb_packages(lookup)
    if not missing:
        return None
    message = missing_libraries_message(missing)
    log.error("%s", message)
    return message
