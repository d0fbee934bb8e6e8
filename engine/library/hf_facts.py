"""Facts about a Hugging Face model folder from config.json and the safetensors headers (no weights read).

A safetensors file starts with an 8-byte little-endian length and a JSON
header giving every tensor's dtype and shape, so the exact parameter count
and the stored precision cost one small read per shard. Quantized folders
(GPTQ, AWQ, MLX) pack several weights into each stored element, so their
count comes from the config's hyperparameters instead.
"""

from __future__ import annotations

import logging
import os
import struct
from collections import Counter
from pathlib import Path
from typing import Any

from engine.library.entry import ModelFacts
from engine.library.safe_read import Unreadable, open_regular, parse_json, read_json

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 100 * 2**20  # a safetensors header larger than this is not one (the safetensors crate's limit)
MAX_CONFIG_BYTES = 4 * 2**20  # a config.json is a few kB (with label maps, a few hundred)
MAX_SHARDS = 2000  # safetensors files read per folder
DTYPE_NAMES = {"BF16": "BF16", "F16": "F16", "F32": "F32", "F64": "F64", "F8_E4M3": "FP8", "F8_E5M2": "FP8"}


def read_config(path: Path) -> dict[str, Any]:
    """A config.json as a dict; Unreadable saying why (not a file, too large, too deep, not JSON, not an object)."""
    data = read_json(path, MAX_CONFIG_BYTES, "config.json")
    if not isinstance(data, dict):
        raise Unreadable("is not a JSON object")
    return data


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of one .safetensors file; Unreadable saying why."""
    fd = open_regular(path)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise Unreadable("is shorter than a safetensors header")
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_HEADER_BYTES:
                raise Unreadable(f"claims a {n:,}-byte header (at most {MAX_HEADER_BYTES:,})")
            body = f.read(n)
    except OSError as e:
        raise Unreadable(f"cannot be read ({e.strerror or e})") from None
    finally:
        os.close(fd)
    if len(body) < n:
        raise Unreadable("is truncated inside its header")
    header = parse_json(body, "safetensors header")
    if not isinstance(header, dict):
        raise Unreadable("has a header that is not a JSON object")
    return header


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of one .safetensors file ({} when unreadable)."""
    try:
        return read_safetensors_header(path)
    except Unreadable as e:
        log.debug("%s %s", path, e)
        return {}


def _elements(shape: Any) -> int | None:
    """Elements of a tensor of `shape` (a list of non-negative integers); None when it is not one."""
    if not isinstance(shape, list) or len(shape) > 16:
        return None
    count = 1
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            return None
        count *= d
    return count


def _int(value: Any) -> int:
    """A config's integer, 0 when it is not a non-negative integer (a string, a list, a float, true)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (multimodal configs nest it under text_config)."""
    nested = config.get("text_config")
    return {**config, **nested} if isinstance(nested, dict) else config


def _quantization(config: dict[str, Any]) -> str:
    q = config.get("quantization_config") or config.get("quantization")
    if not isinstance(q, dict):
        return ""
    method = str(q.get("quant_method") or ("mlx" if "group_size" in q else "")).upper()
    bits = q.get("bits") or q.get("w_bit") or (4 if q.get("load_in_4bit") else 8 if q.get("load_in_8bit") else None)
    return " ".join(x for x in (method, f"{bits}-bit" if bits else "") if x) or "quantized"


def config_parameter_estimate(cfg: dict[str, Any]) -> int:
    """Parameters of a decoder-only transformer from its hyperparameters (0 if they are missing)."""
    hidden, layers, vocab = _int(cfg.get("hidden_size")), _int(cfg.get("num_hidden_layers")), _int(cfg.get("vocab_size"))
    if not (hidden and layers and vocab):
        return 0
    inter = _int(cfg.get("intermediate_size")) or 4 * hidden
    heads = _int(cfg.get("num_attention_heads")) or 1
    kv_heads = _int(cfg.get("num_key_value_heads")) or heads
    head_dim = _int(cfg.get("head_dim")) or hidden // heads
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, o and k, v projections
    mlp = 3 * hidden * inter  # gate, up, down
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings", True) else 2)
    return embeddings + layers * (attention + mlp)


def kv_bytes_per_token(cfg: dict[str, Any], bytes_per_value: int) -> int:
    layers, hidden, heads = _int(cfg.get("num_hidden_layers")), _int(cfg.get("hidden_size")), _int(cfg.get("num_attention_heads"))
    if not (layers and hidden and heads):
        return 0
    kv_heads = _int(cfg.get("num_key_value_heads")) or heads
    head_dim = _int(cfg.get("head_dim")) or hidden // heads
    return 2 * layers * kv_heads * head_dim * bytes_per_value


def folder_facts(folder: Path) -> tuple[ModelFacts, str]:
    """(facts, problem) for a folder with config.json and .safetensors files."""
    try:
        config = read_config(folder / "config.json")
    except Unreadable as e:
        return ModelFacts(), f"{folder / 'config.json'} {e}"
    if not config:
        return ModelFacts(), f"{folder / 'config.json'} is empty"
    cfg = text_config(config)
    architectures = config.get("architectures")
    architecture = str(cfg.get("model_type") or (architectures[0] if isinstance(architectures, list) and architectures else ""))
    try:
        shards = sorted(folder.glob("*.safetensors"))[:MAX_SHARDS]
    except OSError:
        shards = []
    weight_bytes, elements = 0, 0
    dtypes: Counter[str] = Counter()
    for shard in shards:
        try:
            header = read_safetensors_header(shard)
            weight_bytes += shard.stat().st_size
        except (Unreadable, OSError) as e:
            return ModelFacts(architecture=architecture), f"{shard} {e}"
        for name, info in header.items():
            if name == "__metadata__" or not isinstance(info, dict):
                continue
            count = _elements(info.get("shape"))
            if count is None:
                return ModelFacts(architecture=architecture), f"{shard} gives {name[:80]!r} a shape that is not a list of sizes"
            elements += count
            dtypes[str(info.get("dtype"))[:16]] += count
    quantization = _quantization(config)
    if quantization:
        parameters = config_parameter_estimate(cfg) or elements
    else:
        parameters = elements or config_parameter_estimate(cfg)
        if dtypes:
            stored = dtypes.most_common(1)[0][0]
            quantization = DTYPE_NAMES.get(stored, stored)
    facts = ModelFacts(
        architecture=architecture,
        parameters=parameters,
        quantization=quantization,
        context_length=_int(cfg.get("max_position_embeddings")),
        weight_bytes=weight_bytes,
        kv_bytes_per_token=kv_bytes_per_token(cfg, 2),
    )
    return facts, ""
