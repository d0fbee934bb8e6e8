"""Download failures, each a sentence the user can act on (the CLI prints it, the window shows it)."""

from __future__ import annotations

from engine.errors import EngineError


class DownloadError(EngineError):
    """A download failed: the address is wrong, the server refused, the connection dropped."""


class DownloadInterrupted(DownloadError):
    """The connection dropped and retries ran out; the bytes received are kept, so the next try resumes."""


class DownloadCancelled(DownloadError):
    """The user cancelled; the bytes received are kept, so the next try resumes."""


class ChecksumMismatchError(DownloadError):
    """The file's SHA-256 is not the one published for it; the file was deleted."""


class DiskFullError(DownloadError):
    """Not enough free space for the file (checked before and while writing)."""
