"""Facts about a .gguf file from its header alone (engine.backends.llamacpp.gguf_header; no weights read).

A model split by llama.cpp's gguf-split ("name-00001-of-00003.gguf") is one
model: llama.cpp opens it by its first part and finds the others, so the
first part stands for it, with every part's bytes counted, and the other
parts are not listed. Vision projectors ("mmproj-*.gguf", architecture
"clip") sit beside chat models in LM Studio's folders but are not models one
can chat with, so they are left out.
"""

from __future__ import annotations

import re
from pathlib import Path

from engine.backends.llamacpp.gguf_header import kv_bytes_per_token, read_header
from engine.errors import ModelLoadError
from engine.library.entry import ModelFacts

SPLIT = re.compile(r"^(?P<stem>.*)-(?P<part>\d{5})-of-(?P<total>\d{5})$")
NOT_CHAT_MODELS = frozenset({"clip"})  # multimodal projectors


def split_part(path: Path) -> tuple[str, int, int]:
    """(stem without the split suffix, part number, part count); (stem, 1, 1) for a file that is not split."""
    m = SPLIT.match(path.stem)
    if not m:
        return path.stem, 1, 1
    return m["stem"], int(m["part"]), int(m["total"])


def is_later_part(path: Path) -> bool:
    """True for parts 2..N of a split model (they are counted in part 1)."""
    return split_part(path)[1] > 1


def is_projector(path: Path) -> bool:
    return path.name.lower().startswith("mmproj")


def _split_bytes(path: Path, size: int) -> int:
    stem, _part, total = split_part(path)
    if total == 1:
        return size
    for n in range(2, total + 1):
        try:
            size += (path.parent / f"{stem}-{n:05d}-of-{total:05d}{path.suffix}").stat().st_size
        except OSError:
            pass  # a missing part: llama.cpp says so when the model is opened
    return size


def gguf_facts(path: Path) -> tuple[ModelFacts, str]:
    """(facts, problem): problem is "" when the header reads, else why it does not (facts then hold the size only)."""
    try:
        header = read_header(path)
    except ModelLoadError as e:
        try:
            size = path.stat().st_size
        except OSError:
            size = 0
        return ModelFacts(weight_bytes=size), str(e)
    weight_bytes = _split_bytes(path, header.file_bytes)
    # The first part's header lists only its own tensors; the parts share one quantization, so the
    # count scales with the bytes (an estimate for split models, exact for the usual single file).
    parameters = header.parameter_count * weight_bytes // max(1, header.file_bytes)
    try:
        facts = ModelFacts(
            architecture=header.architecture[:200],
            parameters=parameters,
            quantization=header.quantization,
            context_length=header.context_length,
            weight_bytes=weight_bytes,
            kv_bytes_per_token=kv_bytes_per_token(header),
        )
    except (ValueError, TypeError, OverflowError, ZeroDivisionError) as e:  # a text where a number belongs
        return ModelFacts(weight_bytes=weight_bytes), f"{path} has a GGUF header with unusable values ({e})"
    return facts, ""


def display_name(path: Path) -> str:
    """A GGUF file's name in the library: its stem without the split suffix; a file named just "model"
    (Jan's models/<id>/model.gguf) is named by its folder."""
    stem = split_part(path)[0]
    return path.parent.name if stem.lower() == "model" and path.parent.name else stem
