"""Answers in OpenAI's shapes: whole responses, streamed chunks, usage, and log-probs.

Log-probs: chat `choices[].logprobs.content[]` = {token, logprob, bytes, top_logprobs: [{token, logprob,
bytes}]}; completions `logprobs` = {tokens, token_logprobs, top_logprobs: [{text: logprob}], text_offset}.
Both also carry each token's `id` (chat entries, and a `content` list beside the completions fields, as
llama.cpp's server does), so a client that knows token ids (our remote backend) needs no tokenizer round trip.
A log-prob JSON cannot carry (-inf: a token the sampler had cut) is written as -9999.0, as OpenAI does.
A model's end-of-sequence token (`TokenEvent.special`) ends the answer and is not part of it.
"""

from __future__ import annotations

import math
import time
from typing import Any

from engine.events import GenerationStats, TokenEvent, TokenProb
from engine.serve.parse import ServedRequest

FLOOR_LOGPROB = -9999.0


def finish_reason(stats: GenerationStats | None) -> str:
    """Our finish reason in OpenAI's words: the model's end, a stop string and a Stop all read "stop"."""
    if stats is None or stats.finish_reason == "error":
        return "error"
    return "length" if stats.finish_reason == "length" else "stop"


def _lp(value: float) -> float:
    return value if math.isfinite(value) else FLOOR_LOGPROB


def _bytes(text: str, raw: bytes | None) -> list[int]:
    return list(raw if raw is not None else text.encode("utf-8", "surrogatepass"))


def _alternatives(event: TokenEvent, req: ServedRequest) -> tuple[TokenProb, ...]:
    top = event.top_sampler if req.post_sampling_probs else event.top_model
    return tuple(p for p in top if not p.is_rest)[: req.top_logprobs or 0]


def _chosen_lp(event: TokenEvent, req: ServedRequest) -> float:
    return _lp(event.sampler_logprob if req.post_sampling_probs else event.logprob)


def chat_logprob(event: TokenEvent, req: ServedRequest) -> dict[str, Any]:
    return {
        "id": event.token_id, "token": event.token_text, "logprob": _chosen_lp(event, req),
        "bytes": _bytes(event.token_text, event.token_bytes),
        "top_logprobs": [{"id": p.token_id, "token": p.text, "logprob": _lp(p.logprob),
                          "bytes": _bytes(p.text, p.token_bytes)} for p in _alternatives(event, req)],
    }


def completion_logprobs(events: list[TokenEvent], req: ServedRequest, offset: int = 0) -> dict[str, Any]:
    """OpenAI's completions log-probs of `events`, whose text starts at `offset` in the answer."""
    tokens, lps, tops, offsets = [], [], [], []
    for e in events:
        tokens.append(e.token_text)
        lps.append(_chosen_lp(e, req))
        top: dict[str, float] = {}
        for p in _alternatives(e, req):
            top.setdefault(p.text, _lp(p.logprob))  # two tokens with one text: the likelier one (listed first)
        tops.append(top)
        offsets.append(offset)
        offset += len(e.text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets,
            "content": [chat_logprob(e, req) for e in events]}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """OpenAI's usage; `cached_tokens`: the prompt's tokens taken from a cache instead of computed (OpenAI's and
    llama.cpp server's `prompt_tokens_details.cached_tokens`)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


class AnswerWriter:
    """Builds the response documents of one answer (`req`), whole or as stream chunks."""

    def __init__(self, answer_id: str, req: ServedRequest) -> None:
        self.id = answer_id
        self.req = req
        self.created = int(time.time())
        self.chat = req.endpoint == "chat.completions"
        self._offsets = [0] * req.n

    def _doc(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        doc = {"id": self.id, "object": obj, "created": self.created, "model": self.req.model, "choices": choices,
               "system_fingerprint": None}
        if self.req.stream and self.req.include_usage:
            doc["usage"] = None
        return doc

    # --- streamed --------------------------------------------------------------------------------------------

    def first_chunks(self) -> list[dict[str, Any]]:
        """The chat stream's opening chunk per choice (the assistant role); none for completions."""
        if not self.chat:
            return []
        return [self._doc("chat.completion.chunk", [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                     "logprobs": None, "finish_reason": None}])
                for i in range(self.req.n)]

    def token_chunk(self, index: int, event: TokenEvent) -> dict[str, Any] | None:
        """The chunk for one token; None for the model's end-of-sequence token."""
        if event.special:
            return None
        want = self.req.top_logprobs is not None
        if self.chat:
            choice = {"index": index, "delta": {"content": event.text},
                      "logprobs": {"content": [chat_logprob(event, self.req)]} if want else None,
                      "finish_reason": None}
            return self._doc("chat.completion.chunk", [choice])
        lp = completion_logprobs([event], self.req, self._offsets[index]) if want else None
        self._offsets[index] += len(event.text)
        return self._doc("text_completion", [{"index": index, "text": event.text, "logprobs": lp,
                                              "finish_reason": None}])

    def final_chunk(self, index: int, reason: str) -> dict[str, Any]:
        if self.chat:
            return self._doc("chat.completion.chunk", [{"index": index, "delta": {}, "logprobs": None,
                                                        "finish_reason": reason}])
        return self._doc("text_completion", [{"index": index, "text": "", "logprobs": None, "finish_reason": reason}])

    def usage_chunk(self, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
        doc = self._doc("chat.completion.chunk" if self.chat else "text_completion", [])
        doc["usage"] = usage(len(self.req.prompt_ids), completion_tokens, cached_tokens)
        return doc

    # --- whole -----------------------------------------------------------------------------------------------

    def whole(self, per_choice: list[tuple[list[TokenEvent], str, str]], cached_tokens: int) -> dict[str, Any]:
        """The response to a request without stream: per choice (its events, its text, its finish reason)."""
        want = self.req.top_logprobs is not None
        choices = []
        completion_tokens = 0
        for i, (events, text, reason) in enumerate(per_choice):
            shown = [e for e in events if not e.special]
            completion_tokens += len(events)
            if self.chat:
                lp = {"content": [chat_logprob(e, self.req) for e in shown]} if want else None
                choices.append({"index": i, "message": {"role": "assistant", "content": text, "refusal": None},
                                "logprobs": lp, "finish_reason": reason})
            else:
                lp = completion_logprobs(shown, self.req) if want else None
                choices.append({"index": i, "text": text, "logprobs": lp, "finish_reason": reason})
        doc = self._doc("chat.completion" if self.chat else "text_completion", choices)
        doc["usage"] = usage(len(self.req.prompt_ids), completion_tokens, cached_tokens)
        return doc
