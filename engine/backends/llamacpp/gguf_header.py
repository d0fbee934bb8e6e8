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

Every count the header declares is checked against the file and against
sane maxima before any loop runs over it: a sparse 64 GB file of zeros whose
counts "fit" the file would otherwise be walked 13 bytes at a time (an empty
key and a one-byte value per key/value: ~85 minutes). Keys must be distinct
(llama.cpp refuses duplicates too), so such a walk ends at the second key.
Only regular files are opened (a FIFO named .gguf would block the open).
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import stat
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
# Sane maxima, far above any real model (real headers: ~30-60 keys; a few hundred to ~14k tensors for the
# largest unmerged mixtures of experts; vocabularies up to ~262k strings), low enough that a lying header
# costs well under a second to refuse.
MAX_KV = 65_536
MAX_TENSORS = 262_144
MAX_ARRAY_ITEMS_WALKED = 1 << 22  # strings or nested arrays stepped over one by one, over the whole header
MAX_ARRAY_NESTING = 4
MAX_KEY_BYTES = 1 << 16
MAX_STRING_KEPT = 64 << 20  # a longer string value is stepped over and kept as "" (an embedded tokenizer.json is ~10 MB)
MAX_ALIGNMENT = 1 << 20
_MIN_KV_BYTES = 8 + 4 + 1  # key length (an empty key), value type, the smallest value
_MIN_TENSOR_BYTES = 8 + 4 + 4 + 8  # name length (an empty name), n_dims 0, ggml type, offset
_ITEM_MIN_BYTES = {_STRING: 8, _ARRAY: 12}


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


class _Corrupt(ValueError):
    """The header declares something no real file has (caught in _parse and said as a corrupt header)."""


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes):
        self.buf = buf
        self.pos = 0
        self.items_left = MAX_ARRAY_ITEMS_WALKED  # items of string/nested arrays this header may still make us walk

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise _Truncated
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self, max_kept: int = MAX_STRING_KEPT) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise _Truncated
        if n > max_kept:  # never copy gigabytes a length field claims
            self.pos += n
            return ""
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def key(self) -> str:
        n = self.take("<Q")
        if n > MAX_KEY_BYTES:
            raise _Corrupt(f"a key claims {n:,} bytes")
        self.pos -= 8
        return self.string()

    def skip_string(self) -> None:
        n = self.take("<Q")
        self.pos += n
        if self.pos > len(self.buf):
            raise _Truncated

    def skip_strings(self, count: int) -> None:
        # A vocabulary is 50k-250k strings, most of a header read and of a model library scan:
        # gguf_strings steps over them all at once (exactly where the walk string by string ends).
        self.pos = skip_strings(self.buf, self.pos, count)

    def value(self, vtype: int, depth: int = 0) -> Any:
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type, count = self.take("<I"), self.take("<Q")
            self._check_array(item_type, count, depth)
            if count <= MAX_ARRAY_KEPT:
                return [self.value(item_type, depth + 1) for _ in range(count)]
            if item_type in _SCALARS:  # fixed-size items: jump over them
                self.pos += count * struct.calcsize(_SCALARS[item_type])
                if self.pos > len(self.buf):
                    raise _Truncated
            elif item_type == _STRING:
                self.skip_strings(count)
            else:
                for _ in range(count):
                    self.value(item_type, depth + 1)
            return count
        raise ValueError(f"unknown GGUF value type {vtype}")

    def _check_array(self, item_type: int, count: int, depth: int) -> None:
        """Before any loop over an array: its items must fit in what is left of the file, and the walk stay short."""
        if item_type == _ARRAY and depth + 1 >= MAX_ARRAY_NESTING:
            raise _Corrupt(f"arrays nested more than {MAX_ARRAY_NESTING} deep")
        if item_type in _SCALARS:
            if self.pos + count * struct.calcsize(_SCALARS[item_type]) > len(self.buf):
                raise _Truncated
            return
        least = _ITEM_MIN_BYTES.get(item_type)
        if least is None:
            raise ValueError(f"unknown GGUF value type {item_type}")
        if self.pos + count * least > len(self.buf):
            raise _Truncated
        self.items_left -= count
        if self.items_left < 0:
            raise _Corrupt(f"its arrays hold more than {MAX_ARRAY_ITEMS_WALKED:,} strings or arrays in all")


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
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the open, a device never end
            raise ModelLoadError(f"{path} is not a regular file ({_kind_of(st.st_mode)}), so not a GGUF model")
        size = st.st_size
        with path.open("rb") as f:
            if size < 24 or f.read(4) != MAGIC:
                raise ModelLoadError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(buf, path, size)
    except OSError as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from e


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def _check_counts(n_tensors: int, n_kv: int, size: int, path: Path) -> None:
    """The declared counts against sane maxima and against the bytes the smallest records would need."""
    if n_kv > MAX_KV or n_tensors > MAX_TENSORS:
        raise _Corrupt(f"it declares {n_kv:,} keys and {n_tensors:,} tensors (at most {MAX_KV:,} and "
                       f"{MAX_TENSORS:,} are plausible)")
    least = 24 + n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_BYTES
    if least > size:
        raise ModelLoadError(f"{path} is truncated: its GGUF header declares {n_kv:,} keys and {n_tensors:,} tensors, "
                             f"at least {least:,} bytes, but the file has {size:,} (an interrupted download?)")


def _parse(buf: mmap.mmap, path: Path, size: int) -> GGUFHeader:
    cur = _Cursor(buf)
    cur.pos = 4
    try:
        version = cur.take("<I")
        if version not in (2, 3):
            raise ModelLoadError(f"{path} is GGUF version {version}; llama.cpp reads versions 2 and 3")
        n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
        _check_counts(n_tensors, n_kv, size, path)  # before any loop: counts that cannot be are garbage, not a header
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.key()
            if key in metadata:
                raise _Corrupt(f"the key {key[:80]!r} appears twice")
            metadata[key] = cur.value(cur.take("<I"))
        elements, furthest, unknown, cur.pos = _tensor_records(buf, cur.pos, n_tensors, path)
    except _Truncated:
        raise ModelLoadError(f"{path} is truncated: the file ends inside its GGUF header ({size:,} bytes)") from None
    except (ValueError, struct.error) as e:
        raise ModelLoadError(f"{path} has a corrupt GGUF header: {e}") from None
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0:
        alignment = DEFAULT_ALIGNMENT
    if alignment > MAX_ALIGNMENT or alignment & (alignment - 1):
        raise ModelLoadError(f"{path} has a corrupt GGUF header: general.alignment {alignment} is not a power of "
                             f"two up to {MAX_ALIGNMENT:,}")
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
