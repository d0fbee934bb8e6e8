"""Read and check a GGUF file's header before llama.cpp sees it.

llama.cpp aborts the whole process on some malformed files (a failed
GGML_ASSERT is `abort()`, not an error code), so the things we can check
cheaply are checked here first: the magic and version, that every key/value
and tensor record parses, and that every tensor's data lies inside the file
(a truncated download is the common case). The file is memory-mapped and
only the header is touched, so this costs milliseconds even for a 40 GB file
(`gguf.GGUFReader` builds numpy views of every field: ~3 s for the 98 MB
default model).

Layout (GGUF v2/v3, little-endian): magic "GGUF", u32 version, u64 tensor
count, u64 key/value count; the key/values; the tensor records (name, u32
n_dims, u64 dims[n_dims], u32 ggml type, u64 offset); padding to
`general.alignment` (32); the tensor data.
"""

from __future__ import annotations

import functools
import math
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.backends.llamacpp.gguf_strings import Truncated, skip_strings
from engine.errors import ModelLoadError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# GGUF value types -> struct format of one scalar; 8 is string, 9 is array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_U32, _U64, _TYPE_OFFSET = struct.Struct("<I"), struct.Struct("<Q"), struct.Struct("<IQ")
_DIMS = [struct.Struct(f"<{n}Q") for n in range(9)]  # a tensor record's dimensions, by their count
MAX_ARRAY_KEPT = 64  # arrays longer than this (vocabularies, merges) are skipped, only their length kept


_Truncated = Truncated  # the file ends inside the header


@dataclass(frozen=True)
class GGUFHeader:
    """What the header says. `metadata` holds scalars, strings and short arrays; long arrays map to their length."""

    version: int
    metadata: dict[str, Any]
    tensor_count: int
    data_offset: int  # where tensor data starts
    data_end: int  # end of the last tensor's data, when every tensor type is known; else 0
    file_bytes: int
    unknown_types: frozenset[int] = field(default_factory=frozenset)
    parameter_count: int = 0  # elements over all tensors (the model library shows it; no weights are read)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_value(self, key: str, default: Any = None) -> Any:
        """`<architecture>.<key>`, e.g. arch_value("context_length")."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    @property
    def context_length(self) -> int:
        return int(self.arch_value("context_length", 0) or 0)

    @property
    def chat_template(self) -> str:
        value = self.metadata.get("tokenizer.chat_template", "")
        return value if isinstance(value, str) else ""

    @property
    def quantization(self) -> str:
        """The file type as people name it: "Q4_K_M", "Q8_0", "F16"; "" when the file does not say."""
        return file_type_name(self.metadata.get("general.file_type"))


def file_type_name(file_type: Any) -> str:
    if not isinstance(file_type, int):
        return ""
    from gguf.constants import LlamaFileType

    try:
        name = LlamaFileType(file_type).name
    except ValueError:
        return f"type {file_type}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes):
        self.buf = buf
        self.pos = 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise _Truncated
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise _Truncated
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        n = self.take("<Q")
        self.pos += n
        if self.pos > len(self.buf):
            raise _Truncated

    def skip_strings(self, count: int) -> None:
        # A vocabulary is 50k-250k strings, most of a header read and of a model library scan:
        # gguf_strings steps over them all at once (exactly where the walk string by string ends).
        self.pos = skip_strings(self.buf, self.pos, count)

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type, count = self.take("<I"), self.take("<Q")
            if count <= MAX_ARRAY_KEPT:
                return [self.value(item_type) for _ in range(count)]
            if item_type in _SCALARS:  # fixed-size items: jump over them
                self.pos += count * struct.calcsize(_SCALARS[item_type])
                if self.pos > len(self.buf):
                    raise _Truncated
            elif item_type == _STRING:
                self.skip_strings(count)
            else:
                for _ in range(count):
                    self.value(item_type)
            return count
        raise ValueError(f"unknown GGUF value type {vtype}")


KV_BYTES_PER_VALUE = 2  # the cache is float16 (llama.cpp's default type_k/type_v)


def kv_bytes_per_token(header: GGUFHeader, bytes_per_value: int = KV_BYTES_PER_VALUE) -> int:
    """Keys and values of one position over all layers, from the file's hyperparameters (0 if unknown).

    The one place this is computed: the backend sizes its context with it, the model library its
    memory estimate. `bytes_per_value` 2: llama.cpp's default float16 cache (type_k/type_v).
    """
    layers = int(header.arch_value("block_count", 0) or 0)
    heads = header.arch_value("attention.head_count", 0)
    kv_heads = header.arch_value("attention.head_count_kv", heads)
    embd = int(header.arch_value("embedding_length", 0) or 0)
    if isinstance(heads, list):  # per-layer head counts (some architectures)
        heads = max(heads or [0])
    if isinstance(kv_heads, list):
        kv_heads = max(kv_heads or [0])
    if not (layers and heads and kv_heads and embd):
        return 0
    key_dim = int(header.arch_value("attention.key_length", embd // int(heads)) or 0)
    value_dim = int(header.arch_value("attention.value_length", key_dim) or 0)
    return layers * int(kv_heads) * (key_dim + value_dim) * bytes_per_value


@functools.cache
def _quant_sizes() -> dict[int, tuple[int, int]]:
    """ggml type -> (elements per block, bytes per block), for the types the installed gguf package knows."""
    from gguf.constants import GGML_QUANT_SIZES

    return {int(kind): sizes for kind, sizes in GGML_QUANT_SIZES.items()}


def _tensor_records(buf: mmap.mmap, pos: int, n_tensors: int, path: Path) -> tuple[int, int, set[int], int]:
    """Walk the tensor records from `pos`: (elements over all tensors, the end of the furthest tensor's
    data counted from the data's start (-1 with no tensors), the ggml types the gguf package does not know,
    where the records end).

    Bound unpacks instead of _Cursor.take (a few hundred records in every header of a model library
    scan). A field past the end raises _Truncated, as the cursor does.
    """
    u32, u64, type_offset, dims_of = _U32.unpack_from, _U64.unpack_from, _TYPE_OFFSET.unpack_from, _DIMS
    sizes = _quant_sizes()
    elements, furthest, unknown = 0, -1, set()
    try:
        for _ in range(n_tensors):
            name_at = pos + 8
            pos = name_at + u64(buf, pos)[0]
            n_dims = u32(buf, pos)[0]
            if n_dims > 8:
                name = bytes(buf[name_at:pos]).decode("utf-8", errors="replace")
                raise ModelLoadError(f"{path} has a corrupt tensor record ({name!r} claims {n_dims} dimensions)")
            tensor_elements = math.prod(dims_of[n_dims].unpack_from(buf, pos + 4))
            pos += 4 + 8 * n_dims
            ggml_type, end = type_offset(buf, pos)
            pos += 12
            elements += tensor_elements
            block = sizes.get(ggml_type)
            if block is None:  # a type newer than the installed gguf package: llama.cpp may still know it
                unknown.add(ggml_type)
            else:
                end += tensor_elements // block[0] * block[1]
            if end > furthest:
                furthest = end
    except (struct.error, OverflowError):  # a field runs past the end of the file
        raise _Truncated from None
    return elements, furthest, unknown, pos


def read_header(path: Path) -> GGUFHeader:
    """Parse and check `path`'s header; raise ModelLoadError saying what is wrong."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            if size < 24 or f.read(4) != MAGIC:
                raise ModelLoadError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(buf, path, size)
    except OSError as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from e


def _parse(buf: mmap.mmap, path: Path, size: int) -> GGUFHeader:
    cur = _Cursor(buf)
    cur.pos = 4
    try:
        version = cur.take("<I")
        if version not in (2, 3):
            raise ModelLoadError(f"{path} is GGUF version {version}; llama.cpp reads versions 2 and 3")
        n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
        if n_tensors > size or n_kv > size:  # counts that cannot fit: garbage, not a header
            raise ModelLoadError(f"{path} has a corrupt GGUF header (tensor or key counts out of range)")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            metadata[key] = cur.value(cur.take("<I"))
        elements, furthest, unknown, cur.pos = _tensor_records(buf, cur.pos, n_tensors, path)
    except _Truncated:
        raise ModelLoadError(f"{path} is truncated: the file ends inside its GGUF header ({size:,} bytes)") from None
    except (ValueError, struct.error) as e:
        raise ModelLoadError(f"{path} has a corrupt GGUF header: {e}") from None
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0:
        alignment = DEFAULT_ALIGNMENT
    data_offset = -(-cur.pos // alignment) * alignment
    data_end = data_offset + furthest if furthest >= 0 else 0
    if data_end > size:
        raise ModelLoadError(
            f"{path} is truncated: its tensors need {data_end:,} bytes but the file has {size:,} "
            f"(an interrupted download?)"
        )
    return GGUFHeader(
        version=version,
        metadata=metadata,
        tensor_count=n_tensors,
        data_offset=data_offset,
        data_end=0 if unknown else data_end,
        file_bytes=size,
        unknown_types=frozenset(unknown),
        parameter_count=elements,
    )
