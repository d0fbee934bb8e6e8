"""Convert a GGUF file once into a safetensors folder that transformers and mlx-lm both load.

Loading a GGUF through transformers de-quantizes every tensor (~20 s for the
135M default model on two cores); loading the converted folder takes well
under a second. The folder is keyed by the file's SHA-256 and the converting transformers release, written to a
temporary sibling and renamed into place, so an interrupted conversion never
leaves a half folder that a later load would trust; a file lock lets one process convert while others wait.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from collections.abc import Iterator
from typing import TYPE_CHECKING

from engine.atomic_file import write_text_atomic
from engine.errors import ModelLoadError
from engine.sources.cache_dir import cache_root

if TYPE_CHECKING:
    from engine.sources.progress import ProgressCallback

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
# Written last inside the temp folder: a folder without it is never used.
COMPLETE_MARKER = "logitlab-converted.json"


def file_sha256(path: Path) -> str:
    """SHA-256 of `path`, memoised by (size, mtime) so a 1 GB file is hashed once, not every start."""
    st = path.stat()
    memo_file = cache_root() / "gguf-hashes.json"
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    try:
        memo = json.loads(memo_file.read_text())
    except (OSError, ValueError):
        memo = {}
    if key in memo:
        return memo[key]
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    digest = h.hexdigest()
    memo[key] = digest
    write_text_atomic(memo_file, json.dumps(memo, indent=0))
    return digest


def converter_version() -> str:
    """The transformers release that converts (read from its metadata, without importing it).

    It is part of the folder's key: releases write different tokenizer files for the same GGUF (5.0 saves
    SmolLM2's byte-level BPE as a CodeLlamaTokenizer that 5.24 then reads as SentencePiece, encoding every
    newline as <unk>), so a folder converted by one release is never trusted by another.
    """
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def converted_dir_for(path: Path) -> Path:
    return cache_root() / "converted" / f"{path.stem}-{file_sha256(path)[:16]}-tf{converter_version()}"


def ensure_converted(path: Path, progress: ProgressCallback | None = None) -> Path:
    """Return the converted folder for GGUF `path`, converting it first if needed.

    Two processes (two pytest-xdist workers, two app instances) asking at once would both spend the 20-50 s of a
    conversion; a file lock beside the folder makes the second wait for the first and then use its folder.
    """
    # The whole header is checked (a regular file; lying counts refused at once) before the file is hashed, so
    # a broken or hostile file is refused in words instead of being read end to end first.
    from engine.backends.llamacpp.gguf_header import read_header

    read_header(path)
    target = converted_dir_for(path)
    if (target / COMPLETE_MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _conversion_lock(target, progress):
        # Checked again under the lock: whoever held it before us may have just finished this very folder.
        if (target / COMPLETE_MARKER).is_file():
            return target
        _convert_into(path, target, progress)
    return target


@contextlib.contextmanager
def _conversion_lock(target: Path, progress: ProgressCallback | None) -> Iterator[None]:
    """Hold the lock of `target`'s conversion, waiting (and saying so) while another process or thread holds it."""
    from filelock import FileLock, Timeout

    # thread_local=False: one lock object per call anyway; a lock held by one thread is simply not ours.
    lock = FileLock(str(target.parent / f".{target.name}.lock"), thread_local=False)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if progress:
            progress(f"waiting for another conversion of {target.name}", None)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _convert_into(path: Path, target: Path, progress: ProgressCallback | None) -> None:
    if target.exists():  # a folder without the marker is a leftover from a crash
        shutil.rmtree(target, ignore_errors=True)
    if progress:
        progress(f"converting {path.name} (once)", None)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        _convert(path, tmp)
        (tmp / COMPLETE_MARKER).write_text(json.dumps({"source": str(path), "sha256": file_sha256(path), "transformers": converter_version()}))
        try:
            os.replace(tmp, target)
        except OSError:
            # A process that ran without the lock (an older release) converted the same file meanwhile: keep theirs.
            if not (target / COMPLETE_MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("converted %s into %s", path, target)


def _convert(path: Path, out: Path) -> None:
    # Heavy imports stay here so that resolving a spec does not pay for them.
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(path.parent), path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype="float32")
    except Exception as e:  # gguf raises many kinds of errors on bad files
        raise ModelLoadError(f"could not read GGUF file {path}: {type(e).__name__}: {e}") from e
    # The de-quantized weights are plain tensors; drop the GGUF quantizer so
    # save_pretrained writes them as ordinary float32 safetensors.
    model.hf_quantizer = None  # type: ignore[assignment]  # transformers' attribute, not a submodule
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    try:
        GenerationConfig.from_pretrained(folder, gguf_file=name).save_pretrained(out)
    except Exception:
        model.generation_config.save_pretrained(out)
    add_top_level_rope_theta(out / "config.json")


def add_top_level_rope_theta(config_path: Path) -> None:
    """mlx-lm reads `rope_theta` only at the top level; transformers 5 writes it under `rope_parameters`."""
    config = json.loads(config_path.read_text())
    rope = config.get("rope_parameters") or {}
    # Gemma 3 nests per-layer-type parameters: {"full_attention": {...}, "sliding_attention": {...}}.
    theta = rope.get("rope_theta") or (rope.get("full_attention") or {}).get("rope_theta")
    local = (rope.get("sliding_attention") or {}).get("rope_theta")
    if theta is not None and "rope_theta" not in config:
        config["rope_theta"] = theta
    if local is not None and "rope_local_base_freq" not in config:
        config["rope_local_base_freq"] = local
    config_path.write_text(json.dumps(config, indent=2))
