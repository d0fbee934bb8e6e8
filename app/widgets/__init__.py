"""The window's views. Each takes its state in `__init__`, subscribes to it, and reacts in `_on_*` handlers."""

from app.qt_compat import guard_none_refcount

guard_none_refcount()  # before any view paints: see app/qt_compat.py
