"""A GGUF's tokenizer without its weights: llama.cpp's `vocab_only` load.

Checks that need only token counts (a text to score must be two tokens or more) run before the model loads:
`llama_model_load_from_file` with `vocab_only=True` reads the header and the vocabulary and allocates no
weights, no context and no KV cache (the default model: tens of milliseconds, against a full load's second or
more on a busy machine), and its tokenizer is the one the loaded model will use.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import llama_cpp

from engine.backends.llamacpp import native
from engine.backends.llamacpp.tokenizer import LlamaCppTokenizer
from engine.errors import ModelLoadError


@contextmanager
def vocabulary_of(path: str | Path) -> Iterator[LlamaCppTokenizer]:
    """The tokenizer of the GGUF at `path`, loaded without weights; freed on leaving the block."""
    native.init()  # llama.cpp's log goes to Python logging, not the terminal
    params = native.model_params(0)
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
    if not model:
        why = native.take_recent_errors() or "see the log"
        raise ModelLoadError(f"llama.cpp could not read the vocabulary of {Path(path).name}: {why}")
    tokenizer = LlamaCppTokenizer(model)
    try:
        yield tokenizer
    finally:
        tokenizer.detach()
        llama_cpp.llama_model_free(model)
