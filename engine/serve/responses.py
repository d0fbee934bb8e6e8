"""Answers in OpenAI's shapes: whole responses, streamed chunks, usage, and log-probs.

Log-probs: chat `choices[].logprobs.content[]` = {token, logprob, bytes, top_logprobs: [{token, logprob,
bytes}]}; completions `logprobs` = {tokens, token_logprobs, top_logprobs: [{text: logprob}], text_offset}.
Both also carry each token's `id` (chat entries, and a `content` list beside the completions fields, as
llama.cpp's server does), so a client that knows token ids (our remote backend) needs no tokenizer round trip.
A log-prob JSON cannot carry (-inf: a token the sampler had cut) is written as -9999.0, as OpenAI does.
A model's end-of-sequence token (`TokenEvent.special`) ends the answer and is not part of it.

`echo` (completions): the prompt comes first in `text` and in the log-probs, its first token's log-prob and
alternatives `null` (nothing predicts it), then the answer's; `text_offset` counts from the prompt's start.
vLLM's `prompt_logprobs`: `[null, {"id": {"logprob", "rank", "decoded_token"}}, ...]` per choice, the prompt's
token and its top alternatives at each position, ranks from 1.
"""

from __future__ import annotations

import math
import time
from typing import Any

from engine.events import GenerationStats, TokenEvent, TokenProb
from engine.experiments.score import ScoreResult, ScoredToken
from engine.serve.parse import ServedRequest
from engine.serve.tool_calls import tool_streams, tools_finish_reason, whole_message
from engine.tokenizer import StreamDetokenizer

FLOOR_LOGPROB = -9999.0


def finish_reason(stats: GenerationStats | None) -> str:
    """Our finish reason in OpenAI's words: the model's end, a stop string and a Stop all read "stop"; an answer
    that ended on a tool call "tool_calls"."""
    if stats is None or stats.finish_reason == "error":
        return "error"
    if tools_finish_reason(stats):
        return "tool_calls"
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


def chat_logprob(event: TokenEvent, req: ServedRequest,
                 alternatives: tuple[TokenProb, ...] | None = None) -> dict[str, Any]:
    """One token's chat log-prob entry; `alternatives`: its `_alternatives`, when the caller has them already."""
    top = _alternatives(event, req) if alternatives is None else alternatives
    return {
        "id": event.token_id, "token": event.token_text, "logprob": _chosen_lp(event, req),
        "bytes": _bytes(event.token_text, event.token_bytes),
        "top_logprobs": [{"id": p.token_id, "token": p.text, "logprob": _lp(p.logprob),
                          "bytes": _bytes(p.text, p.token_bytes)} for p in top],
    }


def completion_logprobs(events: list[TokenEvent], req: ServedRequest, offset: int = 0) -> dict[str, Any]:
    """OpenAI's completions log-probs of `events`, whose text starts at `offset` in the answer; each token's
    alternatives are picked once, for both its `top_logprobs` and its `content` entry."""
    tokens, lps, tops, offsets, content = [], [], [], [], []
    for e in events:
        alternatives = _alternatives(e, req)
        tokens.append(e.token_text)
        lps.append(_chosen_lp(e, req))
        top: dict[str, float] = {}
        for p in alternatives:
            top.setdefault(p.text, _lp(p.logprob))  # two tokens with one text: the likelier one (listed first)
        tops.append(top)
        offsets.append(offset)
        offset += len(e.text)
        content.append(chat_logprob(e, req, alternatives))
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets,
            "content": content}


def _prompt_pieces(tokenizer: Any, ids: tuple[int, ...], text: str | None) -> list[int]:
    """Where each prompt token starts in the echoed text; a special token the text does not spell (a BOS the
    tokenizer put in front) takes no room."""
    specials: frozenset[int] | None = None  # looked up only where a piece is not the text's (a vocabulary scan)
    detok = StreamDetokenizer(tokenizer)
    offsets, at = [], 0
    for t in ids:
        offsets.append(at)
        piece = detok.add(t)
        if text is not None and piece and not text.startswith(piece, at):
            if specials is None:
                special_ids = getattr(tokenizer, "special_token_ids", None)
                specials = special_ids() if callable(special_ids) else frozenset()
            if t in specials:
                continue
        at += len(piece)
    return offsets


def prompt_logprobs(req: ServedRequest, tokenizer: Any, scored: ScoreResult | None, top: int) -> dict[str, Any]:
    """The prompt's part of an echoed answer's completions log-probs (first token null)."""
    ids = req.prompt_ids
    by_pos: dict[int, ScoredToken] = {t.index: t for t in scored.tokens} if scored is not None else {}
    tokens = [tokenizer.token_text(t) for t in ids]
    lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    content: list[dict[str, Any]] = []
    for pos, (t, text) in enumerate(zip(ids, tokens)):
        s = by_pos.get(pos)
        alternatives = [p for p in s.top if not p.is_rest][:top] if s is not None else []
        lps.append(_lp(s.logprob) if s is not None else None)
        if s is None:
            tops.append(None)
        else:
            d: dict[str, float] = {}
            for p in alternatives:
                d.setdefault(p.text, _lp(p.logprob))
            tops.append(d)
        content.append({"id": t, "token": text, "logprob": lps[-1], "bytes": _bytes(text, tokenizer.token_bytes(t)),
                        "top_logprobs": [{"id": p.token_id, "token": p.text, "logprob": _lp(p.logprob),
                                          "bytes": _bytes(p.text, p.token_bytes)} for p in alternatives]})
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops,
            "text_offset": _prompt_pieces(tokenizer, ids, req.prompt), "content": content}


def vllm_prompt_logprobs(req: ServedRequest, scored: ScoreResult | None, top: int) -> list[dict[str, Any] | None]:
    """vLLM's `prompt_logprobs` of one prompt: None first, then the token and its top alternatives per position."""
    by_pos: dict[int, ScoredToken] = {t.index: t for t in scored.tokens} if scored is not None else {}
    out: list[dict[str, Any] | None] = []
    for pos in range(len(req.prompt_ids)):
        s = by_pos.get(pos)
        if s is None:
            out.append(None)
            continue
        entry = {str(s.token_id): {"logprob": _lp(s.logprob), "rank": s.rank + 1, "decoded_token": s.token_text}}
        for rank, p in enumerate((p for p in s.top if not p.is_rest), 1):
            if rank > top:
                break
            entry.setdefault(str(p.token_id), {"logprob": _lp(p.logprob), "rank": rank, "decoded_token": p.text})
        out.append(entry)
    return out


def completion_answer(req: ServedRequest, tokenizer: Any, scored: ScoreResult | None, events: list[TokenEvent],
                      text: str, reason: str, *, index: int) -> dict[str, Any]:
    """One choice of a completions answer with `echo`, `prompt_logprobs` or several prompts (engine.serve.scoring):
    the prompt (echo) and the answer, their log-probs as asked."""
    shown = [e for e in events if not e.special]
    prompt_text = (req.prompt if req.prompt is not None else tokenizer.decode(list(req.prompt_ids))) if req.echo else ""
    lp: dict[str, Any] | None = None
    if req.top_logprobs is not None:
        lp = completion_logprobs(shown, req, len(prompt_text))
        if req.echo:
            head = prompt_logprobs(req, tokenizer, scored, req.top_logprobs)
            lp = {k: head[k] + lp[k] for k in lp}
    choice: dict[str, Any] = {"index": index, "text": prompt_text + text, "logprobs": lp, "finish_reason": reason}
    if req.prompt_logprobs is not None:
        choice["prompt_logprobs"] = vllm_prompt_logprobs(req, scored, req.prompt_logprobs)
    return choice


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
        self.tool_streams = tool_streams(req.tools, req.n) if self.chat else None  # tool_calls deltas per choice

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
        if self.chat and self.tool_streams is not None:
            read = self.tool_streams[index].feed(event, chat_logprob(event, self.req) if want else None)
            if read is None:
                return None  # nothing to send yet (a call's opener): its log-prob goes with the next chunk
            return self._doc("chat.completion.chunk", [{"index": index, "delta": read[0], "logprobs":
                                                        {"content": read[1]} if want else None, "finish_reason": None}])
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

    def end_chunks(self, index: int, stats: GenerationStats) -> list[dict[str, Any]]:
        """The chunks that end choice `index`: with tools, what its stream still holds (engine.serve.tool_calls),
        then the one with its finish reason (carrying the log-probs still held)."""
        if self.tool_streams is None:
            return [self.final_chunk(index, finish_reason(stats))]
        deltas, lps = self.tool_streams[index].finish(stats)
        docs = [self._doc("chat.completion.chunk", [{"index": index, "delta": d, "logprobs": None,
                                                     "finish_reason": None}]) for d in deltas]
        last = self.final_chunk(index, finish_reason(stats))
        if self.req.top_logprobs is not None and lps:
            last["choices"][0]["logprobs"] = {"content": lps}
        return docs + [last]

    def recorded_stats(self, index: int, stats: GenerationStats) -> GenerationStats:
        """The stats to record for a streamed choice (its call keeps the id the client was sent)."""
        return stats if self.tool_streams is None else self.tool_streams[index].recorded(stats)

    def usage_chunk(self, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
        doc = self._doc("chat.completion.chunk" if self.chat else "text_completion", [])
        doc["usage"] = usage(len(self.req.prompt_ids), completion_tokens, cached_tokens)
        return doc

    # --- whole -----------------------------------------------------------------------------------------------

    def whole(self, per_choice: list[tuple[list[TokenEvent], str, str]], cached_tokens: int,
              stats: list[GenerationStats | None] | None = None) -> dict[str, Any]:
        """The response to a request without stream: per choice (its events, its text, its finish reason);
        `stats` per choice gives a chat answer's tool calls (engine.serve.tool_calls)."""
        want = self.req.top_logprobs is not None
        choices = []
        completion_tokens = 0
        for i, (events, text, reason) in enumerate(per_choice):
            shown = [e for e in events if not e.special]
            completion_tokens += len(events)
            if self.chat:
                lp = {"content": [chat_logprob(e, self.req) for e in shown]} if want else None
                message = (whole_message(text, stats[i], self.req.tools) if stats and self.req.tools is not None
                           else {"role": "assistant", "content": text, "refusal": None})
                choices.append({"index": i, "message": message, "logprobs": lp, "finish_reason": reason})
            else:
                lp = completion_logprobs(shown, self.req) if want else None
                choices.append({"index": i, "text": text, "logprobs": lp, "finish_reason": reason})
        doc = self._doc("chat.completion" if self.chat else "text_completion", choices)
        doc["usage"] = usage(len(self.req.prompt_ids), completion_tokens, cached_tokens)
        return doc
