"""Tiny random-weight models for tests: the sizes they share, and saving one with the default model's tokenizer."""

from __future__ import annotations

import shutil
from pathlib import Path

# A 2-layer decoder with grouped-query attention (4 query heads, 2 KV heads) and the default model's vocabulary.
TINY_DECODER = dict(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def save_with_default_tokenizer(model, folder: Path, default_model_folder: Path) -> Path:
    """Save `model` as a Hugging Face folder that tokenizes like the default model."""
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (default_model_folder / name).exists():
            shutil.copy(default_model_folder / name, folder / name)
    return folder
