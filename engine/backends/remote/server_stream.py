""""Server samples": one streamed completion, our settings mapped to the server's parameters.

Each streamed token carries the server's log-prob and top-N alternatives, so
the heatmap, hover and alternatives work; the per-stage view gets a single
"server" stage that says plainly the server sampled (its stages are not
visible). Token ids come from the server when it gives them (llama.cpp,
vLLM with `return_tokens_as_token_ids`), else from the tokenizer (-1 when a
text is not exactly one token).

Cancellation closes the HTTP stream between chunks. If the connection dies
after some tokens arrived, those tokens are kept: the generation ends with a
`Done` whose finish reason is "error" and whose text holds them.

`server_choice_events` is the one reader of such a stream: it can ask for
several choices of one prompt at once (the API's `n`, for the loom's N
continuations: `many_choices.py`) and routes each chunk by its choice index;
`server_sampled_events` is its one-choice case.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from engine.backends.remote.errors import RequestCancelledError, ServerError, ServerResponseError, UnsupportedByServerError
from engine.backends.remote.server_constraint import constraint_fields
from engine.backends.remote.server_params import server_parameters
from engine.backends.remote.step import chosen_tokens, id_from_text, parse_alternatives, position_entries, text_of
from engine.backends.remote.tokenizer import RemoteTokenizer, check_server_token_ids
from engine.decode.stats import AnswerRecord
from engine.events import Done, Event, FinishReason, StageSnapshot, TokenEvent, TokenProb, rest_entry
from engine.request import GenerationRequest
from engine.top_n import TOP_LOGPROBS_MAX

if TYPE_CHECKING:
    from engine.backends.remote.backend import RemoteBackend

log = logging.getLogger(__name__)

SERVER_STAGE_NOTE = "sampled by the server: only its top-N log-probs are visible, not what each of its stages did"
EXTRA_TOKENS = 16  # tokens a choice may stream past max_tokens (a stop string's or template's tail) before it is cut


def check_server_sampling(backend: RemoteBackend, request: GenerationRequest) -> dict:
    """The request body's sampling fields; raises UnsupportedByServerError naming what cannot be done."""
    we_sample_ok = backend.caps.we_sample_ok
    if request.forced_tokens:
        raise UnsupportedByServerError(
            "forced tokens (branching from an alternative) need we-sample mode" if we_sample_ok else
            f"forced tokens (branching from an alternative) need we-sample mode, which {backend.client.options.host} "
            "cannot do (no tokenize endpoint or no log-probs): continue the answer as it is, or use another server"
        )
    if request.ignore_eos and backend.caps.kind not in ("vllm", "sglang"):
        raise UnsupportedByServerError(f"a {backend.caps.kind} server cannot be told to ignore end-of-sequence")
    if (request.prompt_ids is not None or request.assistant_prefix) and backend.server_tokenizer is None and not backend.caps.token_prompts:
        raise UnsupportedByServerError(
            f"{backend.client.options.host} has no tokenize endpoint and takes no token-id prompts, so it can only "
            "answer from text: start from a message or a text prompt instead of token ids or a partial answer"
        )
    check_server_token_ids(request.prompt_ids or (), backend.caps.n_vocab, "prompt token id")  # sent as they are
    check_server_token_ids(request.assistant_prefix, backend.caps.n_vocab, "answer token id")
    params = server_parameters(request.sampler, backend.caps.kind, backend.caps.seed, we_sample_ok)
    if request.ignore_eos:
        params["ignore_eos"] = True
    return params


def server_sampled_events(
    backend: RemoteBackend, request: GenerationRequest, cancel: threading.Event
) -> Iterator[Event]:
    """One streamed completion: the server's tokens as TokenEvents, then one Done."""
    for _, event in server_choice_events(backend, request, cancel):
        yield event


def server_choice_events(
    backend: RemoteBackend, request: GenerationRequest, cancel: threading.Event, n: int = 1
) -> Iterator[tuple[int, Event]]:
    """One streamed completion asking for `n` choices (the OpenAI API's `n`), as (choice index, event).

    Chunks are routed by their `choices[i].index` (vLLM and SGLang stream one choice per chunk, interleaved), so
    each choice's TokenEvents come in its own order. After the stream, a Done for choice 0 and for every other
    choice the server answered; a server that ignores `n` answers choice 0 only, and the caller sees which
    choices got no Done. A cancel or a failure after some tokens ends every choice (each keeps its tokens).

    Raises:
        ServerError: the request failed before any token arrived (e.g. the server refused `n`).
    """
    tok, host = backend.server_tokenizer, backend.client.options.host
    t0 = time.perf_counter()
    path, body, prompt_len, seed = _request(backend, request)
    if n > 1:
        body["n"] = n
    choices = [_Choice(t0, _asked(body), request.max_new_tokens + EXTRA_TOKENS) for _ in range(n)]
    ended: FinishReason | None = None  # "cancelled" or "error": the run ended for every choice at once
    error: str | None = None
    stream = backend.client.stream_events(path, body, cancel=cancel)
    try:
        for chunk in stream:
            if not isinstance(chunk, dict):
                raise ServerResponseError(f"{host} streamed an event that is not a JSON object: {repr(chunk)[:60]}")
            given_usage = chunk.get("usage")
            usage = given_usage if isinstance(given_usage, dict) else {}
            given = usage.get("prompt_tokens")
            prompt_len = given if isinstance(given, int) and not isinstance(given, bool) and given > 0 else prompt_len
            listed = chunk.get("choices")
            real = isinstance(listed, list) and bool(listed)
            for choice in listed if isinstance(listed, list) and real else [{}]:  # a usage chunk has no choices
                i = choice.get("index", 0) if n > 1 and isinstance(choice, dict) else 0
                if not isinstance(i, int) or not 0 <= i < n:
                    log.warning("%s streamed choice %r of the %d asked for: ignored", host, i, n)
                    continue
                for event in choices[i].feed(choice, usage, tok, request, answered=real):
                    yield i, event
            if cancel.is_set():
                ended = "cancelled"
                break
    except RequestCancelledError:
        ended = "cancelled"  # the request in flight was abandoned at once (a server that never answered)
    except ServerError as e:
        if not any(c.record.token_ids for c in choices):
            raise
        ended, error = "error", str(e)  # keep what arrived: the answers so far are worth showing
    finally:
        stream.close()  # closes the connection; the server stops generating
    if ended is None:
        _learn_ids(tok, choices)
    now = time.perf_counter()
    for i, c in enumerate(choices):
        if ended is not None or i == 0 or c.answered:
            yield i, c.done(now, prompt_len, seed, ended, error, host)


def _asked(body: dict) -> int:
    """How many alternatives per token the request asks for (0: none), whichever API's field says it."""
    for key in ("top_logprobs", "logprobs"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def _request(backend: RemoteBackend, request: GenerationRequest) -> tuple[str, dict, int, int | None]:
    """The streamed request: its path, body, prompt length (0: not known yet) and seed (None: the server's)."""
    caps = backend.caps
    body = {"model": caps.model, "max_tokens": request.max_new_tokens, "stream": True,
            **check_server_sampling(backend, request)}
    seed = request.sampler.seed
    if seed is None and caps.seed:
        seed = body["seed"] = secrets.randbits(31)  # drawn here so the run can be replayed
    if request.stop:
        body["stop"] = list(request.stop)
    n_top = min(request.top_n, caps.max_top_logprobs)
    if caps.kind in ("vllm", "sglang"):
        body["return_tokens_as_token_ids"] = True
    prompt_len = 0
    chat = request.messages is not None and not request.assistant_prefix
    body |= constraint_fields(request.constraint, caps.kind, chat, backend.client.options.host)  # before any request
    if chat:
        path = "/chat/completions"  # the server applies the model's own chat template
        body["messages"] = [dict(m) for m in request.messages or ()]
        if n_top:
            body |= {"logprobs": True, "top_logprobs": min(n_top, TOP_LOGPROBS_MAX)}
    else:
        path = "/completions"
        body["prompt"], prompt_len = _completion_prompt(backend, request)
        if n_top:
            body["logprobs"] = n_top
    return path, body, prompt_len, seed


class _Choice:
    """One choice of a streamed completion: its tokens so far, how it ended, and what the server said.

    The server decides the tokens, detokenizes them and applies the stop strings; what is kept per token (the
    ids, the times, how it ended) is the decode loop's own record (engine/decode/stats.py), so the stats
    mean the same here as on a local model.
    """

    def __init__(self, t0: float, asked: int = 0, max_tokens: int = 0) -> None:
        self.asked = asked  # alternatives per token asked for: more is refused (checks.alternatives_count)
        self.max_tokens = max_tokens  # 0: no limit
        self.record = AnswerRecord(t0)
        self.texts: list[str] = []
        self.token_texts: list[str] = []
        self.answered = False  # the server streamed this choice (a server that ignores `n` streams choice 0 only)
        self.said = _WhatTheServerSaid()

    def feed(self, choice: object, usage: dict, tok: RemoteTokenizer | None, request: GenerationRequest,
             answered: bool) -> Iterator[TokenEvent]:
        """The TokenEvents of one streamed chunk of this choice."""
        self.answered = self.answered or answered
        self.said.chunk(choice, usage)
        if not isinstance(choice, dict):
            return
        piece = choice.get("text")
        if piece is None:
            delta = choice.get("delta")
            piece = (delta.get("content") if isinstance(delta, dict) else None) or ""
        if not isinstance(piece, str):
            raise ServerResponseError(f"the server streamed a text that is not a string: {repr(piece)[:60]}")
        tokens = _tokens_of(choice.get("logprobs"), tok, self.asked)
        if self.max_tokens and (tokens or piece) and len(self.record.token_ids) + max(len(tokens), 1) > self.max_tokens:
            raise ServerResponseError(f"the server streamed more than the {self.max_tokens - EXTRA_TOKENS:,} tokens "
                                      "asked for: the answer was cut there")
        if not tokens and piece:
            tokens = [(_id(None, piece, tok), piece, math.nan, [])]  # a server that sent no log-probs
        for k, (tid, token_text, lp, alts) in enumerate(tokens):
            text = piece if k == len(tokens) - 1 else ""
            self.record.took(tid)
            self.texts.append(text)
            self.token_texts.append(token_text)
            yield _event(len(self.record.token_ids) - 1, tid, text, token_text, lp, alts, request.record_stages)
        if choice.get("finish_reason"):
            reason = choice["finish_reason"]
            self.record.end("length" if reason == "length" else ("stop" if request.stop else "eos"))

    def done(self, now: float, prompt_len: int, seed: int | None, ended: FinishReason | None,
             error: str | None, host: str) -> Done:
        if ended is not None:
            self.record.end(ended)
        if error is None and self.record.finish != "cancelled" and not "".join(self.texts):
            error = self.said.empty_answer(host, len(self.record.token_ids))  # an empty answer is explained
        return Done(self.record.stats(prompt_tokens=prompt_len, text="".join(self.texts),
                                      seed=seed if seed is not None else -1, now=now, error=error))


def _completion_prompt(backend: RemoteBackend, request: GenerationRequest) -> tuple[str | list[int], int]:
    tok = backend.server_tokenizer
    if request.prompt is not None and not request.assistant_prefix:
        return request.prompt, 0
    if tok is None and request.messages is not None:
        raise UnsupportedByServerError(
            f"continuing an assistant answer needs the server's tokenizer, and {backend.client.options.host} has no "
            "tokenize endpoint: send a new message instead"
        )
    from engine.decode.loop import prompt_ids_for

    ids = prompt_ids_for(tok, request) if tok is not None else list(request.prompt_ids or ())
    if backend.caps.token_prompts:
        return ids, len(ids)
    assert tok is not None  # token ids without a tokenizer or token prompts: refused by check_server_sampling
    return tok.text_for(ids), len(ids)


def _id(given: int | None, text: str, tok: RemoteTokenizer | None, cached_only: bool = True) -> int:
    if given is not None:
        return int(given)
    return id_from_text(text, tok, cached_only)


def _tokens_of(
    logprobs: dict | None, tok: RemoteTokenizer | None, asked: int | None = None
) -> list[tuple[int, str, float, list[tuple[int, str, float]]]]:
    """(id, text, logprob, alternatives) per streamed token. Ids of texts come from the tokenizer's memory
    only (-1 when unseen): asking the server now would end the stream on llama-cpp-python. Ids, log-probs and
    the alternatives' count are checked (checks.py): a ServerResponseError otherwise."""
    if not logprobs:
        return []
    chosen = chosen_tokens(logprobs)
    entries = position_entries(logprobs)
    out = []
    for i, (given, text, lp) in enumerate(chosen):
        alts = parse_alternatives(entries[i], tok, cached_only=True, asked=asked) if i < len(entries) and entries[i] else []
        out.append((_id(given, text, tok), text_of(text, tok), lp, alts))
    return out


def _learn_ids(tok: RemoteTokenizer | None, choices: list[_Choice]) -> None:
    """After the stream: ask the server for the ids it did not give (one request for every choice), so Done and
    the next run have them."""
    if tok is None:
        return
    tok.learn_ids([text for c in choices for tid, text in zip(c.record.token_ids, c.token_texts) if tid < 0 and text])
    for c in choices:
        ids = c.record.token_ids
        for i, (tid, text) in enumerate(zip(ids, c.token_texts)):
            if tid < 0 and text:
                ids[i] = id_from_text(text, tok)


def _event(index: int, tid: int, text: str, token_text: str, lp: float, alts: list[tuple[int, str, float]],
           record_stages: bool) -> TokenEvent:
    top = tuple(TokenProb(i, t, l) for i, t, l in alts)
    rank = next((r for r, (i, t, _) in enumerate(alts) if (i == tid and tid >= 0) or t == token_text), len(alts))
    probs = [math.exp(l) for _, _, l in alts]
    mass = sum(probs)
    rest = rest_entry(mass) if alts else None
    # The server's log-probs as it gave them, and the unreported rest as one outcome: the entropy of that is a
    # lower bound of the model's (spreading the rest over many tokens can only raise it).
    entropy = -sum(p * math.log(p) for p in probs if p > 0) + (-rest.prob * rest.logprob if rest else 0.0)
    stages = None
    if record_stages:
        stages = (StageSnapshot("server", len(alts), mass, max(entropy, 0.0), top, note=SERVER_STAGE_NOTE),)
    if rest is not None:
        top += (rest,)
    if tid >= 0 and not token_text:
        token_text = text
    return TokenEvent(
        index=index, token_id=tid, text=text, token_text=token_text, logprob=lp,
        sampler_logprob=lp,  # the server does not say what its sampler gave the token; the model's is shown
        rank=rank, entropy=max(entropy, 0.0), top_model=top, top_sampler=(), stages=stages,
    )


class _WhatTheServerSaid:
    """Enough of a stream to explain an empty answer: the finish reason, usage, and fields we do not read."""

    READ = frozenset({"text", "delta", "logprobs", "finish_reason", "index"})

    def __init__(self) -> None:
        self.chunks = 0
        self.finish_reason: str | None = None
        self.usage: dict = {}
        self.other_fields: dict[str, str] = {}

    def chunk(self, choice: object, usage: dict) -> None:
        """One streamed chunk of this choice (`choice` {} for a chunk without choices) and the chunk's usage."""
        self.chunks += 1
        self.usage = usage or self.usage
        if not isinstance(choice, dict):
            return
        self.finish_reason = choice.get("finish_reason") or self.finish_reason
        fields = {k: v for k, v in choice.items() if k not in self.READ}
        delta = choice.get("delta")
        if isinstance(delta, dict):  # e.g. a thinking model's "reasoning_content" beside an empty "content"
            fields |= {f"delta.{k}": v for k, v in delta.items() if k not in ("content", "role")}
        for k, v in fields.items():
            if v not in (None, "", [], {}):
                self.other_fields.setdefault(k, repr(v)[:60])

    def empty_answer(self, host: str, tokens: int) -> str:
        """What the server answered, in words, for an answer without text."""
        parts = [f"{self.chunks} streamed event{'s' if self.chunks != 1 else ''}",
                 f"{tokens} token{'s' if tokens != 1 else ''}"]
        parts.append(f"finish_reason {self.finish_reason!r}" if self.finish_reason else "no finish_reason")
        if self.usage:
            parts.append("usage " + ", ".join(f"{k}={v}" for k, v in self.usage.items() if isinstance(v, int)))
        if self.other_fields:
            parts.append("other fields: " + ", ".join(f"{k}={v}" for k, v in self.other_fields.items()))
        why = ("it ended the answer at once (the model's first token was an end of turn)"
               if self.finish_reason in ("stop", "eos") and not tokens else "it sent no text")
        return f"{host} answered with no text: {why}; it sent {'; '.join(parts)}"
