"""The routes about the model itself, for the engine's service: models, tokenize, detokenize, props.

`/v1/models` says `owned_by: "llamacpp"` with llama.cpp's `meta` (n_vocab, n_ctx_train): the server speaks
llama.cpp server's dialect (its sampler field names, `/tokenize` and `/detokenize`), so a client that knows
llama.cpp's server (our own remote backend, SillyTavern) uses all of it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from engine.engine import Engine
from engine.errors import TokenIdError
from engine.sampling.llamacpp_json import llamacpp_fields
from engine.sampling.settings import SamplerSettings
from engine.serve import fields as f
from engine.serve.errors import ApiError, bad_field
from engine.tokenizer import check_token_ids, vocabulary_size

_STARTED = int(time.time())


class ModelRoutes:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.info = engine.info
        self.n_vocab = vocabulary_size(engine.tokenizer)

    async def models(self) -> dict[str, Any]:
        ctx = self.info.context_length
        return {"object": "list", "data": [{
            "id": self.info.name, "object": "model", "created": _STARTED, "owned_by": "llamacpp",
            "context_length": ctx, "meta": {"n_vocab": self.n_vocab, "n_ctx_train": ctx, "backend": self.info.backend},
        }]}

    async def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        _only(body, {"content", "add_special", "with_pieces", "parse_special"})
        content = f.text(body, "content")
        if content is None:
            raise bad_field("content", 'tokenize needs {"content": "text"}')
        add_special = f.flag(body, "add_special")
        with_pieces = f.flag(body, "with_pieces")
        f.flag(body, "parse_special", True)
        tok = self.engine.tokenizer
        ids = await asyncio.to_thread(tok.encode, content, add_special)
        if with_pieces:
            return {"tokens": [{"id": i, "piece": tok.token_text(i)} for i in ids]}
        return {"tokens": ids}

    async def detokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        _only(body, {"tokens"})
        ids = body.get("tokens")
        if not isinstance(ids, list):
            raise bad_field("tokens", 'detokenize needs {"tokens": [token ids]}')
        try:
            check_token_ids(ids, self.n_vocab, "token id")
        except (TokenIdError, TypeError, ValueError) as e:
            raise bad_field("tokens", str(e)) from None
        return {"content": await asyncio.to_thread(self.engine.tokenizer.decode, ids)}

    async def props(self) -> dict[str, Any]:
        params, _ = llamacpp_fields(SamplerSettings())
        return {"default_generation_settings": {"n_ctx": self.info.context_length, "params": params},
                "total_slots": 1, "model_alias": self.info.name, "build_info": "logitlab serve",
                "modalities": {"vision": False, "audio": False}}


def _only(body: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise ApiError(400, f"unknown field {unknown[0]!r} (this route takes {', '.join(sorted(known))})",
                       param=unknown[0], code="unknown_parameter")
