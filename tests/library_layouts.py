"""Real folder layouts of other programs' model stores, built in a temporary home for the model library's tests.

Each builder writes what that program writes: LM Studio's publisher/repo
folders of .gguf files, Ollama's manifests and content-addressed blobs, the
Hugging Face hub cache with refs/, snapshots/ linking into blobs/. GGUF files
are real (tests/tiny_gguf.py, written with the `gguf` package), so headers
are parsed, not faked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from tiny_gguf import write_tiny_llama_gguf

OLLAMA_CONFIG_MEDIA = "application/vnd.docker.container.image.v1+json"
MANIFEST_MEDIA = "application/vnd.docker.distribution.manifest.v2+json"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def put_gguf(path: Path, n_ctx: int = 256, layers: int = 2, seed: int = 0, template: Path | None = None) -> Path:
    """A tiny real GGUF at `path` (copied from `template` when given: same bytes, written once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if template is not None:
        shutil.copyfile(template, path)
        return path
    return write_tiny_llama_gguf(path, n_ctx=n_ctx, layers=layers, seed=seed)


def lmstudio_model(home: Path, publisher: str, repo: str, file: str, **kw) -> Path:
    return put_gguf(home / ".lmstudio" / "models" / publisher / repo / file, **kw)


def ollama_model(models: Path, name: str, tag: str, gguf_bytes: bytes, namespace: str = "library",
                 host: str = "registry.ollama.ai") -> Path:
    """Store `gguf_bytes` as Ollama does: blobs/sha256-<hex> plus a manifest at manifests/host/ns/name/tag."""
    blobs = models / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)

    def blob(data: bytes) -> dict:
        digest = _sha256(data)
        (blobs / f"sha256-{digest}").write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    config = json.dumps({"model_format": "gguf", "model_family": "llama", "file_type": "F32"}).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA,
        "config": {"mediaType": OLLAMA_CONFIG_MEDIA, **blob(config)},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", **blob(gguf_bytes)},
            {"mediaType": "application/vnd.ollama.image.template", **blob(b"{{ .Prompt }}")},
            {"mediaType": "application/vnd.ollama.image.params", **blob(b'{"stop": ["<|im_end|>"]}')},
        ],
    }
    path = models / "manifests" / host / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return path


def hf_cache_file(cache: Path, repo_id: str, commit: str, filename: str, data: bytes, ref: str | None = "main") -> Path:
    """One file in the hub cache the way huggingface_hub stores it: the blob, a relative link, refs/<ref>."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    etag = _sha256(data)
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "blobs" / etag).write_bytes(data)
    link = repo / "snapshots" / commit / filename
    link.parent.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(repo / "blobs" / etag, link.parent)
    link.unlink(missing_ok=True)
    link.symlink_to(target)
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return link


def safetensors_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    from safetensors.numpy import save

    return save(tensors)


TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 64,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


def tiny_llama_tensors(cfg: dict = TINY_CONFIG, dtype=np.float16) -> dict[str, np.ndarray]:
    """Llama-shaped tensors for `cfg` (their element count is the model's parameter count)."""
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    out = {"model.embed_tokens.weight": np.zeros((v, h), dtype), "model.norm.weight": np.zeros((h,), dtype)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": np.zeros((h, h), dtype),
            p + "self_attn.k_proj.weight": np.zeros((kv, h), dtype),
            p + "self_attn.v_proj.weight": np.zeros((kv, h), dtype),
            p + "self_attn.o_proj.weight": np.zeros((h, h), dtype),
            p + "mlp.gate_proj.weight": np.zeros((inter, h), dtype),
            p + "mlp.up_proj.weight": np.zeros((inter, h), dtype),
            p + "mlp.down_proj.weight": np.zeros((h, inter), dtype),
            p + "input_layernorm.weight": np.zeros((h,), dtype),
            p + "post_attention_layernorm.weight": np.zeros((h,), dtype),
        }
    return out


def hf_cache_folder_model(cache: Path, repo_id: str, commit: str, cfg: dict = TINY_CONFIG) -> Path:
    """A safetensors model in the hub cache: config.json and model.safetensors under snapshots/<commit>."""
    hf_cache_file(cache, repo_id, commit, "config.json", json.dumps(cfg).encode())
    hf_cache_file(cache, repo_id, commit, "model.safetensors", safetensors_bytes(tiny_llama_tensors(cfg)))
    return cache / ("models--" + repo_id.replace("/", "--")) / "snapshots" / commit
