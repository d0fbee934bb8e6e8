"""A `Tokenizer` whose vocabulary lives on the server: tokenize/detokenize endpoints, cached.

Servers disagree on where these endpoints are and what they are called:

- llama-cpp-python: POST /extras/tokenize {"input"} and /extras/detokenize {"tokens"}
- vLLM, SGLang:      POST /tokenize {"model", "prompt"} and /detokenize {"model", "tokens"}
  (vLLM's /tokenize also takes chat "messages" and applies the model's template)
- llama.cpp server:  POST /tokenize {"content"}, /detokenize {"tokens"}, /apply-template {"messages"}

`probe_tokenize` finds which one answers. Servers that report alternatives as
text (the OpenAI completions format) are mapped back to ids by tokenizing the
text: a string that is exactly one token gives its id; anything else (empty
text of special tokens, half a UTF-8 character) has no id and is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from engine.backends.remote.client import ServerClient
from engine.backends.remote.errors import ServerError, UnsupportedByServerError
from engine.tokenizer import FALLBACK_TEMPLATE, REPLACEMENT, Tokenizer

log = logging.getLogger(__name__)

# Special tokens that end a turn in common chat formats; the ones that are a single token on this server count as EOS.
EOS_CANDIDATES = ("<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>")
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TokenizeDialect:
    name: str
    tokenize_path: str
    detokenize_path: str
    text_key: str  # request field holding the text
    tokens_out: str  # response field holding the ids
    text_out: str  # detokenize response field holding the text
    with_model: bool  # send "model" in the body


DIALECTS = (
    TokenizeDialect("llama-cpp-python", "/extras/tokenize", "/extras/detokenize", "input", "tokens", "text", True),
    TokenizeDialect("vllm", "/tokenize", "/detokenize", "prompt", "tokens", "prompt", True),
    TokenizeDialect("llama.cpp", "/tokenize", "/detokenize", "content", "tokens", "content", False),
)


def probe_tokenize(client: ServerClient, model: str) -> TokenizeDialect | None:
    """The tokenize dialect this server answers, or None (then only server sampling on text works)."""
    for d in DIALECTS:
        body = {d.text_key: "Hello world"}
        if d.with_model:
            body["model"] = model
        try:
            doc = client.post_json(d.tokenize_path, body, root=True, retry=False)
        except ServerError as e:
            log.debug("no %s tokenize endpoint: %s", d.name, e)
            continue
        if isinstance(doc, dict) and isinstance(doc.get(d.tokens_out), list) and doc[d.tokens_out]:
            if all(isinstance(t, int) for t in doc[d.tokens_out]):
                return d
    return None


class RemoteTokenizer(Tokenizer):
    """Encode/decode through the server, memoised; the same interface as the local `Tokenizer`."""

    def __init__(self, client: ServerClient, model: str, dialect: TokenizeDialect):
        super().__init__(None, ())
        self._client = client
        self._model = model
        self.dialect = dialect
        self._encode_cache: dict[str, tuple[int, ...]] = {}
        self._id_of_text: dict[str, int | None] = {}
        self._bos: tuple[int, ...] = tuple(self._tokenize(""))  # what the server puts before any text
        self.eos_token_ids = frozenset(i for s in EOS_CANDIDATES if (i := self._single_special(s)) is not None)
        self._chat_template = CHATML if self._single_special("<|im_start|>") is not None else FALLBACK_TEMPLATE

    # --- server calls -----------------------------------------------------------

    def _body(self, **fields) -> dict:
        if self.dialect.with_model and self._model:
            fields["model"] = self._model
        return fields

    def _tokenize(self, text: str) -> list[int]:
        doc = self._client.post_json(self.dialect.tokenize_path, self._body(**{self.dialect.text_key: text}), root=True)
        return [int(t) for t in doc[self.dialect.tokens_out]]

    def _detokenize(self, ids: Sequence[int]) -> str:
        doc = self._client.post_json(
            self.dialect.detokenize_path, self._body(tokens=list(ids)), root=True, retry=False
        )
        return str(doc[self.dialect.text_out])

    def _single_special(self, text: str) -> int | None:
        ids = self._tokenize(text)[len(self._bos) :]
        return ids[0] if len(ids) == 1 else None

    # --- the Tokenizer interface ---------------------------------------------------

    @property
    def has_chat_template(self) -> bool:
        return self._chat_template is CHATML

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The server's own tokenization (so a text prompt round-trips); BOS as the server adds it."""
        ids = self._encode_cache.get(text)
        if ids is None:
            ids = tuple(self._tokenize(text))
            self.remember(text, ids)
        if not add_special_tokens and self._bos and ids[: len(self._bos)] == self._bos:
            return list(ids[len(self._bos) :])
        return list(ids)

    def remember(self, text: str, ids: Sequence[int]) -> None:
        """Record that the server tokenizes `text` as `ids` (the oldest of 256 entries is forgotten)."""
        if len(self._encode_cache) >= 256:
            del self._encode_cache[next(iter(self._encode_cache))]
        self._encode_cache[text] = tuple(ids)

    def text_for(self, ids: Sequence[int]) -> str:
        """A text the server should tokenize as `ids`: a remembered text for the longest known prefix, then
        the decoded rest. (Decoding special tokens gives "" on some servers, so prompts are not decoded whole.)"""
        ids = tuple(ids)
        best_text, best_len = "", 0
        for text, enc in self._encode_cache.items():
            n = len(enc)
            if best_len < n <= len(ids) and ids[:n] == enc:
                best_text, best_len = text, n
        rest = ids[best_len:]
        return best_text + (self.decode(rest) if rest else "")

    @property
    def bos_ids(self) -> tuple[int, ...]:
        return self._bos

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`; a cut-off multi-byte character ends in U+FFFD (some servers refuse to decode it)."""
        ids = list(ids)
        for cut in range(min(4, len(ids)) + 1):  # a UTF-8 character spans at most 4 tokens
            try:
                text = self._detokenize(ids[: len(ids) - cut]) if cut < len(ids) else ""
            except ServerError:
                continue
            return text + (REPLACEMENT if cut else "")
        return REPLACEMENT

    def id_of(self, text: str, cached_only: bool = False) -> int | None:
        """The id of the token whose text is exactly `text`, or None when the text is not one token.

        `cached_only`: answer from memory, without asking the server (None when unknown). Used while a
        completion streams: llama-cpp-python's server ends a running stream when another request arrives.
        """
        if text in self._id_of_text:
            return self._id_of_text[text]
        if cached_only:
            return None
        tid = None
        if text:
            ids = self._tokenize(text)[len(self._bos) :]
            if len(ids) == 1:
                tid = ids[0]
                self._piece_cache.setdefault(tid, text)
        self._id_of_text[text] = tid
        return tid

    def chat_text(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        # The server's real template is not exposed by llama-cpp-python; ChatML when the vocabulary has
        # its markers (Qwen, SmolLM, many others), else the plain transcript. Server sampling of a chat uses
        # /v1/chat/completions instead, where the server applies its own template.
        from jinja2 import Environment

        template = Environment(keep_trailing_newline=True).from_string(self._chat_template)
        return template.render(messages=list(messages), add_generation_prompt=add_generation_prompt)

    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.chat_text(messages, add_generation_prompt))


def require_tokenizer(tokenizer: Tokenizer | None, what: str) -> Tokenizer:
    if tokenizer is None:
        raise UnsupportedByServerError(f"{what} needs the server's tokenizer, and this server has no tokenize endpoint")
    return tokenizer
