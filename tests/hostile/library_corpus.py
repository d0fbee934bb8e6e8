"""Hostile files for the model library, made in the test: lying GGUF headers (sparse, so 64 GB cost nothing on
disk), JSON nested thousands deep, FIFOs and devices where files belong, names with terminal escapes."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

GGUF_STRING, GGUF_ARRAY, GGUF_U8 = 8, 9, 0
SPARSE_BYTES = 64 * 10**9  # "a sparse 64 GB GGUF": only the header's bytes are on disk
ANSI_NAME = "\x1b[2J\x1b[31mred\x1b]0;pwned\x07"  # clear screen, red text, set the terminal's title


def _string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def gguf_header(n_tensors: int, n_kv: int, kvs: bytes = b"") -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kvs


def sparse_file(path: Path, head: bytes, size: int = SPARSE_BYTES) -> Path:
    """`head`, then zeros up to `size` bytes, without writing them (a hole)."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def lying_gguf_headers() -> dict[str, bytes]:
    """Headers whose counts "fit" a 64 GB file (the old check: count <= file size), each a different lie."""
    array_of_strings = _string(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", GGUF_ARRAY, GGUF_STRING, 2**32)
    nested = _string(b"deep") + struct.pack("<I", GGUF_ARRAY) + struct.pack("<IQ", GGUF_ARRAY, 1) * 6
    nested += struct.pack("<IQ", GGUF_U8, 1) + b"\0"
    return {
        # The case found: billions of key/values of zeros, each an empty key and a one-byte value.
        "huge counts": gguf_header(2**32, 2**32),
        # Plausible counts, then zeros: the second empty key is a duplicate.
        "zeros after plausible counts": gguf_header(100, 60_000),
        "an array of 4 billion strings": gguf_header(0, 1, array_of_strings),
        "a key of 32 GB": gguf_header(0, 1, struct.pack("<Q", 2**35)),
        "arrays nested 7 deep": gguf_header(0, 1, nested),
    }


def deep_json(depth: int = 100_000) -> bytes:
    return b"[" * depth + b"]" * depth


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def write_json(path: Path, doc) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path
