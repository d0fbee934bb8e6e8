"""Which backend runs a model: MLX on Apple Silicon, torch elsewhere; always overridable."""

from __future__ import annotations

import importlib.util
import platform
import sys

BACKENDS = ("auto", "torch", "mlx", "mock")


def is_apple_silicon() -> bool:
    return sys.platform == "darwin" and platform.machine() == "arm64"


def mlx_available() -> bool:
    return importlib.util.find_spec("mlx") is not None and importlib.util.find_spec("mlx_lm") is not None


def choose_backend(requested: str | None = None) -> str:
    """Resolve "auto" (or None) to a concrete backend name; validate explicit names."""
    name = (requested or "auto").lower()
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {requested!r}; choose one of {', '.join(BACKENDS)}")
    if name != "auto":
        if name == "mlx" and not mlx_available():
            raise ValueError("the mlx backend needs mlx-lm: pip install 'logitlab[mlx]'")
        return name
    if is_apple_silicon() and mlx_available():
        return "mlx"
    return "torch"
