"""Which transformers model families the bundle carries, and their modules (read by logitlab.spec).

A module of its own so the tests can check it without running PyInstaller (tests/packaging/test_bundle.py).
Not a module of a `packaging` package: that name belongs to the PyPI library PyInstaller imports.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

# The default model's family (llama) plus the causal-LM families whose GGUF files transformers converts and a
# few common folder-only ones. Everything else under transformers.models (~540 families, mostly vision, audio
# and encoders) is left out.
MODEL_FAMILIES = [
    "llama",  # SmolLM2-135M-Instruct, the default model
    "auto",  # AutoConfig / AutoModelForCausalLM / AutoTokenizer
    "gpt2",  # GPT-2 style BPE tokenizers used by many GGUF files
    # imported by transformers itself while loading any tokenizer or GGUF file
    # (AutoTokenizer -> encoder_decoder; integrations/gguf/gguf_tokenizer_mapping -> gemma, qwen2, qwen3_5, t5)
    "encoder_decoder", "t5", "qwen3_5",
    "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "gemma", "gemma2", "gemma3",
    "smollm3", "lfm2", "falcon", "stablelm", "starcoder2", "nemotron", "gpt_oss", "olmo2", "granite",
]


def models_folder() -> Path:
    spec = importlib.util.find_spec("transformers")
    assert spec is not None and spec.origin is not None, "transformers is not installed"
    return Path(spec.origin).parent / "models"


def unused_families() -> list[str]:
    """Every other family's package, to exclude."""
    return sorted(f"transformers.models.{p.name}" for p in models_folder().iterdir()
                  if p.is_dir() and not p.name.startswith("__") and p.name not in MODEL_FAMILIES)


def family_modules(family: str) -> list[str]:
    """The modules of one family, read off its folder: what PyInstaller's
    `collect_submodules(f"transformers.models.{family}")` lists (the packaging test checks that), without its
    price — it starts a Python that imports transformers, once per family, and the 24 families took ~95 s of
    every build."""
    folder = models_folder() / family
    names = []
    for p in sorted(folder.rglob("*.py")):
        rel = p.relative_to(folder).with_suffix("")
        parts = rel.parts[:-1] if p.name == "__init__.py" else rel.parts
        names.append(".".join(["transformers", "models", family, *parts]))
    return names
