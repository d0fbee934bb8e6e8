"""A `Tokenizer` whose vocabulary lives on the server: tokenize/detokenize endpoints, cached.

Servers disagree on where these endpoints are and what they are called:

- llama-cpp-python: POST /extras/tokenize {"input"} and /extras/detokenize {"tokens"}
- vLLM, SGLang:      POST /tokenize {"model", "prompt"} and /detokenize {"model", "tokens"}
  (vLLM's /tokenize also takes chat "messages" and applies the model's template)
- llama.cpp server:  POST /tokenize {"content"}, /detokenize {"tokens"}, /apply-template {"messages"}

`probe_tokenize` finds which one answers. Servers that report alternatives as
text (the OpenAI completions format) are mapped back to ids by tokenizing the
text: a string that is exactly one token gives its id; anything else (half a
UTF-8 character) has no id and is dropped. The empty text is how
llama-cpp-python spells a special token: it is read as the end-of-turn token,
the only special one a completion's alternatives normally hold.

Speed (a text-only server costs requests per step, not just one): the texts of
one step's alternatives are tokenized in one request, joined by a special
token the server splits on (`learn_ids`), when the server proved at connect
that this gives what tokenizing each alone gives; and llama-cpp-python's
detokenize is a plain concatenation of token pieces, so a decode of tokens
whose pieces are known costs no request (`decode`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.backends.remote.checks import MAX_TOKEN_ID
from engine.backends.remote.client import ServerClient
from engine.backends.remote.errors import ServerError, UnsupportedByServerError
from engine.errors import TokenIdError
from engine.tokenizer import FALLBACK_TEMPLATE, REPLACEMENT, Tokenizer, check_token_ids

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


def check_server_token_ids(ids: Sequence[int], n_vocab: int = 0, what: str = "token id") -> None:
    """The vocabulary check (`engine.tokenizer.check_token_ids`, `TokenIdError`) for ids that go to a server or
    are decoded by it: against the vocabulary the server states (`n_vocab`), else against a bound past every
    real vocabulary (`MAX_TOKEN_ID`), so an id of 2**40 from a file or the API is refused here in words rather
    than sent (a server may crash on it, as llama.cpp's does, or answer garbage)."""
    check_token_ids(ids, n_vocab, what)  # non-integers, negatives, and past a stated vocabulary
    if n_vocab <= 0:
        for t in ids:
            if t > MAX_TOKEN_ID:
                raise TokenIdError(
                    f"{what} {int(t):,} is beyond any vocabulary (no model has ids past {MAX_TOKEN_ID:,}; "
                    "the server does not state its vocabulary's size)"
                )


class RemoteTokenizer(Tokenizer):
    """Encode/decode through the server, memoised; the same interface as the local `Tokenizer`.

    `n_vocab`: the vocabulary's size as the server states it (0: unstated). Every id that enters through this
    tokenizer (decode, a prompt's ids, a piece's text) is checked against it (`check_server_token_ids`).
    """

    def __init__(self, client: ServerClient, model: str, dialect: TokenizeDialect, n_vocab: int = 0):
        super().__init__(None, ())
        self._client = client
        self._model = model
        self.dialect = dialect
        self.n_vocab = n_vocab
        self._encode_cache: dict[str, tuple[int, ...]] = {}
        self._id_of_text: dict[str, int | None] = {}
        self._exact_piece: dict[int, str] = {}  # pieces that tokenize back to their token alone (see `decode`)
        self._decoded: dict[tuple[int, ...], str] = {}  # recent server decodes
        self._bos: tuple[int, ...] = tuple(self._tokenize(""))  # what the server puts before any text
        specials = [(s, i) for s in EOS_CANDIDATES if (i := self._single_special(s)) is not None]
        self.eos_token_ids = frozenset(i for _, i in specials)
        if specials:  # "" in a text-keyed answer is a special token's (empty) text: the end of turn
            self._id_of_text[""] = specials[0][1]
        self._chat_template = CHATML if self._single_special("<|im_start|>") is not None else FALLBACK_TEMPLATE
        self.guessed_template = "chatml" if self._chat_template is CHATML else ""  # engine.templates.choice names it
        self._separator = self._batch_separator(specials)  # (text, id) that splits a batch, or None
        self._pieces_compose = self.dialect.name == "llama-cpp-python" and self._check_pieces()

    # --- server calls -----------------------------------------------------------

    def _body(self, **fields: object) -> dict:
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

    def _check_pieces(self) -> bool:
        """Whether a text that is one token alone is that token's whole piece (byte-level BPE: yes; SentencePiece
        adds a space before a text), checked on two samples: then known pieces compose a decode."""
        try:
            for text in ("Hello", " world"):
                ids = self._tokenize(text)[len(self._bos) :]
                if len(ids) != 1 or self._detokenize(ids) != text:
                    return False
        except ServerError:
            return False
        return True

    def _batch_separator(self, specials: list[tuple[str, int]]) -> tuple[str, int] | None:
        """A special token that splits a batch of texts as if each were tokenized alone, checked on two samples."""
        if not specials:
            return None
        text, sep = specials[0]
        samples = ("Hello", " world\n", "1")
        try:
            alone = [self._tokenize(t)[len(self._bos) :] for t in samples]
            joined = self._tokenize(text.join(samples))
        except ServerError:
            return None
        expected = list(self._bos) + alone[0] + [sep] + alone[1] + [sep] + alone[2]
        if joined != expected:
            log.info("the server does not split texts at %r as it tokenizes each alone: no batched tokenize", text)
            return None
        return text, sep

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
        self.check_ids(ids, "prompt token id")
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
        self.check_ids(ids)
        key = tuple(int(i) for i in ids)
        if self._pieces_compose and key and key[0] not in self._bos:
            # Its detokenize concatenates token pieces (llama_token_to_piece), so known pieces need no request.
            pieces = [self._exact_piece.get(i) for i in key]
            known = [p for p in pieces if p is not None]
            if len(known) == len(pieces):
                return "".join(known)
        if key in self._decoded:
            return self._decoded[key]
        text = self._decode_on_server(list(key))
        if len(self._decoded) >= 512:
            del self._decoded[next(iter(self._decoded))]
        self._decoded[key] = text
        return text

    def check_ids(self, ids: Sequence[int], what: str = "token id") -> None:
        """TokenIdError for an id outside the vocabulary the server states (or past every real one)."""
        check_server_token_ids(ids, self.n_vocab, what)

    def token_count(self) -> int:
        """The vocabulary's size as the server states it, so the engine's own checks (`vocabulary_size`: prompt
        and forced ids, the research API) use it too. Unstated: NotImplementedError (`vocabulary_size` reads 0,
        unknown), never the bound, which is no vocabulary's size."""
        if self.n_vocab <= 0:
            raise NotImplementedError("the server does not state its vocabulary's size")
        return self.n_vocab

    def token_bytes(self, token_id: int) -> bytes:
        self.check_ids([token_id])  # the base class checks only a local vocabulary
        return super().token_bytes(token_id)

    def _decode_on_server(self, ids: list[int]) -> str:
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
        self.learn_ids([text])
        return self._id_of_text[text]

    def learn_ids(self, texts: Sequence[str]) -> None:
        """Find the ids of the texts not seen before (see `id_of`): one request for all of them when the server
        splits a batch at a special token as it tokenizes each text alone, else one request per text."""
        new = [t for t in dict.fromkeys(texts) if t not in self._id_of_text]
        if not new:
            return
        batchable = [t for t in new if self._separator is not None and self._separator[0] not in t]
        results: dict[str, list[int]] = {}
        if len(batchable) > 1 and self._separator is not None:
            text, sep = self._separator
            ids = self._tokenize(text.join(batchable))[len(self._bos) :]
            parts: list[list[int]] = [[]]
            for i in ids:
                if i == sep:
                    parts.append([])
                else:
                    parts[-1].append(i)
            if len(parts) == len(batchable):
                results = dict(zip(batchable, parts))
            else:
                log.debug("a batch of %d texts came back in %d parts; asking one by one", len(batchable), len(parts))
        for t in new:
            ids = results[t] if t in results else self._tokenize(t)[len(self._bos) :]
            tid = ids[0] if len(ids) == 1 else None
            if tid is not None:
                self._piece_cache.setdefault(tid, t)
                self._exact_piece.setdefault(tid, t)
            self._id_of_text[t] = tid

    def chat_text(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        # The server's real template is not exposed by llama-cpp-python; ChatML when the vocabulary has
        # its markers (Qwen, SmolLM, many others), else the plain transcript. Server sampling of a chat uses
        # /v1/chat/completions instead, where the server applies its own template.
        from jinja2 import Environment

        if self.template_override:  # chosen by the user (engine.templates.choice): rendered in the sandbox
            from engine.templates.render import render_chat_template

            return render_chat_template(self.template_override, {
                "messages": [dict(m) for m in messages], "add_generation_prompt": add_generation_prompt,
                "bos_token": "", "eos_token": "", "tools": None, "documents": None})

        template = Environment(keep_trailing_newline=True).from_string(self._chat_template)
        return template.render(messages=list(messages), add_generation_prompt=add_generation_prompt)

    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.chat_text(messages, add_generation_prompt))


class NoTokenizeEndpointError(UnsupportedByServerError, AttributeError):
    """A use of the tokenizer of a server that has none. An AttributeError too, so `getattr(tok, name, default)`
    (code asking whether a tokenizer has an optional feature) still gets its default."""


class MissingTokenizer:
    """What `RemoteBackend.tokenizer` is on a server without a tokenize endpoint: any use says so in words.

    Generic code (scoring a text, comparing settings, the decode loop) asks the backend's tokenizer for ids; on
    such a server there is none, and `None` would end in an AttributeError traceback instead of a sentence.
    """

    # The chat-template facts (`TokenizerLike`) are known without a tokenize endpoint: none chosen, none guessed.
    template_override: str | None = None
    template_override_name = ""
    guessed_template = ""
    has_chat_template = False

    def __init__(self, host: str):
        self._host = host

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and friends probing for protocol methods
            raise AttributeError(name)
        raise NoTokenizeEndpointError(
            f"{self._host} has no tokenize endpoint, so text cannot be turned into its token ids here: scoring, "
            "compare and our own sampling need them. Use server sampling (logitlab-cli --server-sampling; in the "
            "window, tick “The server samples”) or a server with a tokenize endpoint (llama.cpp, vLLM, SGLang)"
        )


def require_tokenizer(tokenizer: Tokenizer | None, what: str) -> Tokenizer:
    if tokenizer is None:
        raise UnsupportedByServerError(f"{what} needs the server's tokenizer, and this server has no tokenize endpoint")
    return tokenizer
