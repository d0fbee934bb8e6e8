"""Facts about a Hugging Face model folder from config.json and the safetensors headers (no weights read).

A safetensors file starts with an 8-byte little-endian length and a JSON
header giving every tensor's dtype and shape, so the exact parameter count
and the stored precision cost one small read per shard. Quantized folders
(GPTQ, AWQ, MLX) pack several weights into each stored element, so their
count comes from the config's hyperparameters instead.
"""

from __future__ import annotations

import json
import logging
import struct
from collections import Counter
from pathlib import Path
from typing import Any

from engine.library.entry import ModelFacts

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 100 * 2**20  # a safetensors header larger than this is not one
DTYPE_NAMES = {"BF16": "BF16", "F16": "F16", "F32": "F32", "F64": "F64", "F8_E4M3": "FP8", "F8_E5M2": "FP8"}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of one .safetensors file ({} when unreadable)."""
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                return {}
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_HEADER_BYTES:
                return {}
            header = json.loads(f.read(n))
    except (OSError, ValueError):
        return {}
    return header if isinstance(header, dict) else {}


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
    try:
        hidden, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
        vocab, inter = int(cfg["vocab_size"]), int(cfg.get("intermediate_size") or 4 * hidden)
        heads = int(cfg.get("num_attention_heads") or 1)
    except (KeyError, TypeError, ValueError):
        return 0
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, o and k, v projections
    mlp = 3 * hidden * inter  # gate, up, down
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings", True) else 2)
    return embeddings + layers * (attention + mlp)


def kv_bytes_per_token(cfg: dict[str, Any], bytes_per_value: int) -> int:
    try:
        layers, hidden = int(cfg["num_hidden_layers"]), int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
    except (KeyError, TypeError, ValueError):
        return 0
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    return 2 * layers * kv_heads * head_dim * bytes_per_value


def folder_facts(folder: Path) -> tuple[ModelFacts, str]:
    """(facts, problem) for a folder with config.json and .safetensors files."""
    config = _read_json(folder / "config.json")
    if not config:
        return ModelFacts(), f"{folder / 'config.json'} cannot be read as JSON"
    cfg = text_config(config)
    architectures = config.get("architectures")
    architecture = str(cfg.get("model_type") or (architectures[0] if isinstance(architectures, list) and architectures else ""))
    shards = sorted(folder.glob("*.safetensors"))
    weight_bytes, elements, dtypes = 0, 0, Counter()
    for shard in shards:
        try:
            weight_bytes += shard.stat().st_size
        except OSError:
            continue
        for name, info in safetensors_header(shard).items():
            if name == "__metadata__" or not isinstance(info, dict):
                continue
            count = 1
            for d in info.get("shape") or []:
                count *= int(d)
            elements += count
            dtypes[str(info.get("dtype"))] += count
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
        context_length=int(cfg.get("max_position_embeddings") or 0),
        weight_bytes=weight_bytes,
        kv_bytes_per_token=kv_bytes_per_token(cfg, 2),
    )
    return facts, ""
