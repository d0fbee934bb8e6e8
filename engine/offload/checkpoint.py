"""A model folder's safetensors files, read one tensor at a time straight into a caller's buffer.

We parse the safetensors header ourselves (8-byte little-endian length, then
a JSON map name -> {dtype, shape, data_offsets}) and read each tensor with
`os.preadv` into memory we own: a reused streaming buffer, a pinned staging
buffer, or a resident tensor. Nothing else of the file enters the process.

Why not memory-map (safetensors' `safe_open`)? We tried it: computing from
mapped pages means paging each layer in before its turn and unmapping it
after. On the default model (405 MiB of layers, 2 cores) that page-table
work cost 44 + 19 ms per token against 54 ms to read the same bytes, and
the unmapping's TLB shootdowns stall the compute threads besides: 6.6
tok/s mapped vs 9.3 tok/s read, all layers on disk, in the same run.
Reading also gives an exact memory bound: the streaming buffers are all the
weight memory there is, and the page cache stays the kernel's to reclaim.
Sharded checkpoints are read through `model.safetensors.index.json`.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import ModelLoadError

log = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
_MAX_READ = 1 << 30  # bytes per read call: Linux caps one read at ~2 GiB


@dataclass(frozen=True)
class Entry:
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data in the file
    nbytes: int


def read_header(path: Path) -> dict[str, Entry]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    data_start = 8 + n
    entries = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] not in DTYPES:
            raise ModelLoadError(f"{path.name}: tensor {name} has dtype {meta['dtype']}, which offloading cannot read")
        begin, end = meta["data_offsets"]
        entries[name] = Entry(path, DTYPES[meta["dtype"]], tuple(meta["shape"]), data_start + begin, end - begin)
    return entries


def checkpoint_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / s for s in shards]
    single = folder / "model.safetensors"
    if single.exists():
        return [single]
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise ModelLoadError(f"offloading needs the weights as .safetensors files, and {folder} has none")
    return found


class Checkpoint:
    """Open safetensors files and their tensor index. Thread-safe reads. Close it when the model is released."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.entries: dict[str, Entry] = {}
        for path in checkpoint_files(self.folder):
            self.entries.update(read_header(path))
        self._files = {path: open(path, "rb", buffering=0) for path in {e.file for e in self.entries.values()}}
        self._locks = {path: threading.Lock() for path in self._files}  # only for the no-pread fallback

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def read_into(self, name: str, out: torch.Tensor) -> None:
        """Fill `out` (CPU, contiguous, the stored dtype and shape) with tensor `name`'s bytes."""
        e = self.entries[name]
        if out.device.type != "cpu" or out.dtype != e.dtype or tuple(out.shape) != e.shape or not out.is_contiguous():
            raise ValueError(
                f"buffer for {name} must be a contiguous CPU {e.dtype} tensor of shape {e.shape}, "
                f"got {out.dtype} {tuple(out.shape)} on {out.device}"
            )
        if e.nbytes == 0:
            return
        buf = memoryview(out.view(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]  # (nbytes,) aliasing `out`
        done = 0
        while done < e.nbytes:
            n = self._read_at(e.file, buf[done : done + _MAX_READ], e.offset + done)
            if n <= 0:
                raise ModelLoadError(f"{e.file.name} ended while reading {name}: the file is truncated")
            done += n

    def read(self, name: str, pin: bool = False) -> torch.Tensor:
        """A new CPU tensor holding `name` as stored (page-locked if `pin`)."""
        e = self.entries[name]
        out = torch.empty(e.shape, dtype=e.dtype, pin_memory=pin)
        self.read_into(name, out)
        return out

    def _read_at(self, path: Path, buf: memoryview, offset: int) -> int:
        f = self._files[path]
        if hasattr(os, "preadv"):  # Linux, macOS, BSD: no shared file offset, releases the GIL
            return os.preadv(f.fileno(), [buf], offset)
        with self._locks[path]:
            f.seek(offset)
            return f.readinto(buf) or 0

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
