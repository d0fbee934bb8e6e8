"""What a served model can do, as `GET /v1/models` says it in each model's `capabilities`: one table, so a
client (or docs/serve.md's test) reads the same answer the routes give."""

from __future__ import annotations

from typing import Any

from engine.model_info import ModelInfo
from engine.serve.limits import MAX_N, MAX_PROMPTS, MAX_TOP_LOGPROBS


def capabilities(info: ModelInfo) -> dict[str, Any]:
    """What requests to this model can ask, as `GET /v1/models` says it (per model; an alias is the same model).

    A model on another server (a remote backend) has no tools here (they need the engine's decode loop and
    grammar), and its prompt log-probs are scored step by step from that server's top N: a token outside them
    reads -inf, so `prompt_logprobs_exact` is false."""
    local = info.runs_locally
    return {
        "chat_completions": True, "completions": True, "streaming": True,
        "logprobs": True, "max_top_logprobs": MAX_TOP_LOGPROBS, "max_n": MAX_N,
        "echo": True, "prompt_logprobs": True, "prompt_logprobs_exact": local, "score_only": True,
        "max_prompts": MAX_PROMPTS,
        "tools": local, "responses": True, "messages": True, "count_tokens": True,
        "response_format": True, "grammar": True,
        "embeddings": False, "vision": False, "audio": False,
    }
