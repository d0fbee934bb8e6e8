"""llama.cpp backend (llama-cpp-python): GGUF files run natively, quantized, with the engine's own sampler.

Importing this package imports `llama_cpp`; `engine.backends.select` decides
whether it is installed before anything imports it.
"""

from engine.backends.llamacpp.backend import LlamaCppBackend

__all__ = ["LlamaCppBackend"]
