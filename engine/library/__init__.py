"""The model library: models already on this machine (LM Studio, Ollama, the Hugging Face cache, GPT4All,
Jan, llama.cpp's cache, the user's folders), read from their headers without loading weights; and
downloads of hub ids and .gguf URLs with progress, cancel, resume and checksums.

Nothing here imports Qt, torch or llama_cpp: the window and the CLI call `scan` and `pull` from a
worker thread (both block).
"""

from engine.library.discovery import ScanResult, scan
from engine.library.entry import SOURCE_NAMES, LibraryEntry, ModelFacts, printable
from engine.library.errors import (
    ChecksumMismatchError,
    DiskFullError,
    DownloadCancelled,
    DownloadError,
    DownloadInterrupted,
)
# What a hub error advises when the hub cannot be reached (the Library's own dialog words it for itself).
from engine.library.hub_download import ALTERNATIVE as HUB_ALTERNATIVE
from engine.library.locations import Location, default_locations
from engine.library.memory import MachineMemory
from engine.library.progress import CancelToken, DownloadProgress, format_bytes
from engine.library.pull import IF_EXISTS_CHOICES, IfExists, PullResult, pull, url_target

__all__ = [
    "HUB_ALTERNATIVE",
    "IF_EXISTS_CHOICES",
    "SOURCE_NAMES",
    "CancelToken",
    "ChecksumMismatchError",
    "DiskFullError",
    "DownloadCancelled",
    "DownloadError",
    "DownloadInterrupted",
    "DownloadProgress",
    "IfExists",
    "LibraryEntry",
    "Location",
    "MachineMemory",
    "ModelFacts",
    "PullResult",
    "ScanResult",
    "default_locations",
    "format_bytes",
    "printable",
    "pull",
    "scan",
    "url_target",
]
