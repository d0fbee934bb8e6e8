"""Turning a model spec (nothing, a folder, a .gguf file, a hub id) into a local folder."""

from engine.loading.resolve import ModelSource, ProgressCallback, materialize, resolve_spec

__all__ = ["ModelSource", "ProgressCallback", "materialize", "resolve_spec"]
