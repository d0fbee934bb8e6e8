"""Guard against PySide6 builds that leak references to None, True and False (6.12.0 on Python < 3.12).

With PySide6-Essentials 6.12.0 (cp310-abi3 wheels) every Python call of a
Qt method returning void hands back `None` without a new reference, so
None's reference count drops by one per call (measured: -1 per
`QObject.setObjectName`, `QPainter.setPen`, `QLabel.setText`, ...); emitting
a `Signal(bool)` does the same to True or False. Python 3.12 made these
singletons immortal, which hides the bug there; on 3.11 None starts near
5,000 references and a few seconds of painting bring it to zero: the
interpreter aborts with "Fatal Python error: none_dealloc: deallocating
None" (or "bool_dealloc"). 6.11.3 does not leak.

The guard probes for the leak and, only when it is present, gives the three
singletons reference counts so large they cannot reach zero, which is what
Python 3.12 does by design (they are static objects, never meant to be freed).
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

_PROBE_CALLS = 64
_HEADROOM = 1 << 48  # ~2.8e14 leaked references: years of painting at a million calls a second
_guarded = False


def none_refcount_leak() -> int:
    """References to None lost over `_PROBE_CALLS` calls of a void Qt method (0 on a sound build)."""
    from PySide6.QtCore import QObject

    probe = QObject()
    before = sys.getrefcount(None)
    for _ in range(_PROBE_CALLS):
        probe.setObjectName("probe")
    return max(0, before - sys.getrefcount(None))


def guard_none_refcount() -> bool:
    """Apply the guard if this PySide6 build needs it; True when applied (once per process)."""
    global _guarded
    if _guarded or sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return _guarded
    leaked = none_refcount_leak()
    if leaked < _PROBE_CALLS // 2:
        return False
    # In CPython's release builds ob_refcnt is the first field of every object.
    for singleton in (None, True, False):
        ctypes.c_ssize_t.from_address(id(singleton)).value += _HEADROOM
    _guarded = True
    from PySide6 import __version__ as pyside_version

    log.warning(
        "PySide6 %s leaks references to None/True/False on Python %d.%d; guarding against the crash. "
        "Use PySide6 6.11 or Python 3.12+ to avoid the workaround.",
        pyside_version,
        *sys.version_info[:2],
    )
    return True
