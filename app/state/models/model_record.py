"""Which model made an answer, as saved with it: the chat, Compare and Replay record the same fields."""

from __future__ import annotations

from typing import Any

from engine import ModelInfo

# `revision` is the hub commit of the weights ("" for local files).
MODEL_FIELDS = ("name", "spec", "architecture", "parameters", "dtype", "context_length", "backend", "device", "revision")


def model_record(info: ModelInfo) -> dict[str, Any]:
    """The fields of `info` saved with an answer (`Message.model`)."""
    return {k: getattr(info, k) for k in MODEL_FIELDS}
