"""One "we sample" step: the server's top-N log-probs for the token after a prompt.

Two answer formats exist: the OpenAI completions format (`top_logprobs` is a
list of {token text: logprob}; vLLM spells texts "token_id:123" when asked
with `return_tokens_as_token_ids`) and llama.cpp server's (`content` entries
with ids). Both become [(token_id, logprob)], best first.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from engine.backends.remote import checks
from engine.backends.remote.client import ServerClient
from engine.backends.remote.errors import ServerError, ServerResponseError
from engine.backends.remote.tokenizer import RemoteTokenizer

log = logging.getLogger(__name__)


def parse_alternatives(
    entry: object, tokenizer: RemoteTokenizer | None, cached_only: bool = False, asked: int | None = None
) -> list[tuple[int, str, float]]:
    """One position's alternatives as (id, text, logprob); id -1 when the text is not a single token.

    Ids, log-probs and (when `asked` is given) the count are checked before use (engine/backends/remote/checks.py):
    a ServerResponseError quoting the impossible value otherwise.
    """
    out: list[tuple[int, str, float]] = []
    if isinstance(entry, dict) and "top_logprobs" in entry and isinstance(entry["top_logprobs"], list):
        entry = entry["top_logprobs"]  # chat/llama.cpp style: a content item
    if isinstance(entry, (list, dict)):
        checks.alternatives_count(len(entry), asked)
    if isinstance(entry, list):
        for alt in entry:
            if not isinstance(alt, dict):
                raise ServerResponseError(f"the server gave an alternative that is not an object: {repr(alt)[:60]}")
            text = str(alt.get("token", ""))
            tid = alt.get("id")
            tid = id_from_text(text, tokenizer, cached_only) if tid is None else checks.token_id(tid)
            out.append((tid, text_of(text, tokenizer), checks.logprob(alt.get("logprob"), text)))
    elif isinstance(entry, dict):
        lps = {str(text): checks.logprob(lp, str(text)) for text, lp in entry.items()}  # before any request
        if tokenizer is not None and not cached_only:
            tokenizer.learn_ids([t for t in lps if not t.startswith("token_id:")])  # one request for the new ones
        for text, lp in lps.items():
            out.append((id_from_text(text, tokenizer, cached_only), text_of(text, tokenizer), lp))
    out.sort(key=lambda t: -t[2])
    return out


def text_of(text: str, tokenizer: RemoteTokenizer | None) -> str:
    """A reported token's text: vLLM's "token_id:123" (asked for, so ids are exact) becomes the token's own text.

    Only vLLM and SGLang spell tokens so, and both answer a detokenize request while a stream runs; each id is
    asked once (the tokenizer remembers pieces)."""
    if not text.startswith("token_id:") or tokenizer is None:
        return text
    try:
        return tokenizer.token_text(checks.token_id(text[len("token_id:") :]))
    except (ValueError, ServerError) as e:
        log.debug("no text for %s: %s", text, e)
        return text


def id_from_text(text: str, tokenizer: RemoteTokenizer | None, cached_only: bool = False) -> int:
    """A token's id from its reported text ("token_id:123" from vLLM); -1 when unknown."""
    if text.startswith("token_id:"):
        return checks.token_id(text[len("token_id:") :])
    if tokenizer is None:
        return -1
    tid = tokenizer.id_of(text, cached_only)
    return -1 if tid is None else tid


def position_entries(logprobs: dict) -> list:
    """Per generated position, the raw alternatives entry, in either format."""
    if not isinstance(logprobs, dict):
        raise ServerResponseError(f"the server gave log-probs that are not an object: {repr(logprobs)[:60]}")
    listed = logprobs.get("content") if logprobs.get("content") is not None else logprobs.get("top_logprobs") or []
    if not isinstance(listed, list):
        raise ServerResponseError(f"the server gave per-token log-probs that are not a list: {repr(listed)[:60]}")
    return listed


def chosen_tokens(logprobs: dict) -> list[tuple[int | None, str, float]]:
    """Per generated position: (id if given, token text, logprob; nan when the server gave none), checked."""
    if not isinstance(logprobs, dict):
        raise ServerResponseError(f"the server gave log-probs that are not an object: {repr(logprobs)[:60]}")
    if logprobs.get("content") is not None:
        out = []
        for c in position_entries(logprobs):
            if not isinstance(c, dict):
                raise ServerResponseError(f"the server gave a token that is not an object: {repr(c)[:60]}")
            token = str(c.get("token", ""))
            tid = c.get("id")
            lp = c.get("logprob")
            out.append((None if tid is None else checks.token_id(tid), token,
                        float("nan") if lp is None else checks.logprob(lp, token)))
        return out
    tokens, lps = logprobs.get("tokens") or [], logprobs.get("token_logprobs") or []
    if not isinstance(tokens, list) or not isinstance(lps, list):
        raise ServerResponseError("the server gave tokens or token log-probs that are not lists")
    return [(None, str(t), checks.logprob(lp, str(t)) if lp is not None else float("nan")) for t, lp in zip(tokens, lps)]


def next_token_top(
    client: ServerClient,
    model: str,
    prompt: str | Sequence[int],
    n: int,
    tokenizer: RemoteTokenizer | None,
    kind: str,
) -> list[tuple[int, str, float]]:
    """The server's top-n (id, text, logprob) for the next token after `prompt` (one max_tokens=1 request)."""
    body: dict[str, Any] = {"model": model, "prompt": prompt if isinstance(prompt, str) else list(prompt), "max_tokens": 1,
            "logprobs": n, "temperature": 0}
    if kind in ("vllm", "sglang"):
        body["return_tokens_as_token_ids"] = True
    doc = client.post_json("/completions", body)  # a pure function of its input: safe to retry
    picked_end = False
    if _stopped_without_logprobs(doc) and tokenizer is not None and tokenizer.eos_token_ids:
        # llama-cpp-python reports no log-probs when its pick is the end of turn (the answer is then empty).
        # Asked again with that token banned from its pick, it reports the same (raw) log-probs, end of turn
        # included, for the token it picks instead.
        body["logit_bias"] = {str(i): -100 for i in tokenizer.eos_token_ids}
        doc = client.post_json("/completions", body)
        picked_end = True
    top = _top_of(doc, client, tokenizer, n)
    if picked_end and n > 1 and tokenizer is not None:
        # Its text-keyed alternatives spell every special token "" and keep the last one written, the least
        # likely: among 64 another special's log-prob can stand where the end of turn's should. The end of turn
        # was its pick, so it is the most likely: its own top-1 gives its log-prob alone.
        first = _top_of(client.post_json("/completions", {**body, "logprobs": 1}), client, tokenizer, 1)
        if first and first[0][0] in tokenizer.eos_token_ids:
            top = sorted([first[0], *(t for t in top if t[0] != first[0][0])], key=lambda t: -t[2])
    return top


def _top_of(doc: Any, client: ServerClient, tokenizer: RemoteTokenizer | None, n: int) -> list[tuple[int, str, float]]:
    try:
        entries = position_entries(doc["choices"][0]["logprobs"])
        return [t for t in parse_alternatives(entries[0], tokenizer, asked=n) if t[0] >= 0]
    except (KeyError, IndexError, TypeError, AttributeError):
        raise ServerResponseError(f"{client.options.host} answered a completion without log-probs") from None


def _stopped_without_logprobs(doc: Any) -> bool:  # doc: the server's JSON, of any shape
    try:
        choice = doc["choices"][0]
        return not choice["text"] and not position_entries(choice.get("logprobs") or {})
    except (KeyError, IndexError, TypeError, AttributeError):
        return False
