"""The routes about the model itself, for the engine's service: models, tokenize, detokenize, props.

`/v1/models` says `owned_by: "llamacpp"` with llama.cpp's `meta` (n_vocab, n_ctx_train) and what the model can
do (`capabilities`, engine.serve.endpoints): the server speaks
llama.cpp server's dialect (its sampler field names, `/tokenize` and `/detokenize`), so a client that knows
llama.cpp's server (our own remote backend, SillyTavern) uses all of it. `/tokenize` also takes vLLM's names
(`prompt`, `add_special_tokens`), `/detokenize` answers under both (`content`, vLLM's `prompt`), and
`GET /tokenizer_info` is vLLM's: lm-eval's `local-completions` finds them and tokenizes through the server
(its `tokenizer_backend=remote`), so it needs no tokenizer of its own (nor the Hugging Face hub).
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
from engine.serve.model_capabilities import capabilities
from engine.serve.errors import ApiError, bad_field
from engine.serve.parse import check_model
from engine.tokenizer import check_token_ids, vocabulary_size

_STARTED = int(time.time())


class ModelRoutes:
    def __init__(self, engine: Engine, aliases: tuple[str, ...] = ()) -> None:
        self.engine = engine
        self.aliases = aliases
        self.info = engine.info
        self.n_vocab = vocabulary_size(engine.tokenizer)

    async def models(self) -> dict[str, Any]:
        ctx = self.info.context_length
        # The model under its own name, then under each alias (`serve --alias`), as llama.cpp's server lists them.
        return {"object": "list", "data": [{
            "id": name, "object": "model", "created": _STARTED, "owned_by": "llamacpp",
            "context_length": ctx, "meta": {"n_vocab": self.n_vocab, "n_ctx_train": ctx, "backend": self.info.backend},
            "capabilities": capabilities(self.info),
        } for name in (self.info.name, *self.aliases)]}

    async def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        _only(body, {"content", "add_special", "with_pieces", "parse_special", "prompt", "add_special_tokens", "model"})
        for ours, vllms in (("content", "prompt"), ("add_special", "add_special_tokens")):
            if body.get(ours) is not None and body.get(vllms) is not None:
                raise bad_field(vllms, f"give {ours} (llama.cpp's name) or {vllms} (vLLM's), not both")
        content = f.text(body, "content") if body.get("prompt") is None else f.text(body, "prompt")
        if content is None:
            raise bad_field("content", 'tokenize needs {"content": "text"}')
        if body.get("model") is not None:
            check_model(body, self.info.name, self.aliases)
        add_special = f.flag(body, "add_special") or f.flag(body, "add_special_tokens")
        with_pieces = f.flag(body, "with_pieces")
        f.flag(body, "parse_special", True)
        tok = self.engine.tokenizer
        ids = await asyncio.to_thread(tok.encode, content, add_special)
        if with_pieces:
            return {"tokens": [{"id": i, "piece": tok.token_text(i)} for i in ids]}
        return {"tokens": ids, "count": len(ids), "max_model_len": self.info.context_length}

    async def detokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        _only(body, {"tokens"})
        ids = body.get("tokens")
        if not isinstance(ids, list):
            raise bad_field("tokens", 'detokenize needs {"tokens": [token ids]}')
        try:
            check_token_ids(ids, self.n_vocab, "token id")
        except (TokenIdError, TypeError, ValueError) as e:
            raise bad_field("tokens", str(e)) from None
        text = await asyncio.to_thread(self.engine.tokenizer.decode, ids)
        return {"content": text, "prompt": text}

    async def tokenizer_info(self) -> dict[str, Any]:
        """vLLM's `GET /tokenizer_info`: the special tokens' texts and the chat template."""
        tok = self.engine.tokenizer
        eos = sorted(tok.eos_token_ids)
        bos = getattr(tok, "bos_token_id", None)
        add_bos = getattr(tok, "add_bos", None)
        template = getattr(tok, "template_override", None) or getattr(tok, "chat_template", None)
        hf = getattr(tok, "hf", None)
        if hf is not None:
            bos = getattr(hf, "bos_token_id", None)
            template = template or getattr(hf, "chat_template", None)
        return {"eos_token": tok.token_text(eos[0]) if eos else None,
                "bos_token": tok.token_text(bos) if isinstance(bos, int) and bos >= 0 and add_bos is not False else None,
                "pad_token": None, "chat_template": template if isinstance(template, str) else None,
                "model_max_length": self.info.context_length, "tokenizer_class": type(tok).__name__}

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
