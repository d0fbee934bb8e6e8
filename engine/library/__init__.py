"""The model library: models already on this machine (LM Studio, Ollama, the Hugging Face cache, GPT4All,
Jan, llama.cpp's cache, the user's folders), read from their headers without loading weights; and
downloads of hub ids and .gguf URLs with progress, cancel, resume and checksums.

Nothing here imports Qt, torch or llama_cpp: the window and the CLI call it from a worker thread.
"""

from engine.library.discovery import ScanResult, scan
from engine.library.entry import LibraryEntry, ModelFacts
from engine.library.locations import Location, default_locations

__all__ = ["LibraryEntry", "Location", "ModelFacts", "ScanResult", "default_locations", "scan"]
