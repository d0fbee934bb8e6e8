"""Where a model comes from: a spec (nothing, a folder, a .gguf file, a hub id) turned into local files."""

from engine.sources.resolve import ModelSource, ProgressCallback, materialize, resolve_spec

__all__ = ["ModelSource", "ProgressCallback", "materialize", "resolve_spec"]
