"""llama.cpp backend (llama-cpp-python): GGUF files run natively, quantized, with the engine's own sampler.

Importing this package does not import `llama_cpp` (the model library reads
GGUF headers through `gguf_header` on machines without it); `LlamaCppBackend`
is loaded on first use, and `engine.backends.select` decides whether
llama-cpp-python is installed before anything asks for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.backends.llamacpp.backend import LlamaCppBackend

__all__ = ["LlamaCppBackend"]


def __getattr__(name: str) -> Any:
    if name == "LlamaCppBackend":
        from engine.backends.llamacpp.backend import LlamaCppBackend

        return LlamaCppBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
