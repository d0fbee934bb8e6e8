"""Tokenization shared by every backend: encoding, chat templates, streaming detokenization.

Both backends load the same Hugging Face tokenizer from the model folder, so
the token ids (and therefore the sampler's inputs) agree across backends.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
from typing import Any, Protocol, runtime_checkable

from engine.errors import TokenIdError

REPLACEMENT = "\ufffd"
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece byte-fallback pieces
_METASPACE = "\u2581"  # SentencePiece's "▁" (a space)
# For base models without a chat template: a plain transcript they can continue.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}User: {{ m['content'] }}\n"
    "{% else %}Assistant: {{ m['content'] }}\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)


def check_token_ids(ids: Iterable[Any], n_vocab: int, what: str = "token id") -> None:
    """Refuse any id that is not in [0, n_vocab): the one check every id entering the engine goes through.

    Ids come from files (an imported loom tree), the Python API, servers and step mode; llama.cpp
    aborts the whole process (std::out_of_range) on an id past its vocabulary, and a negative or
    huge id indexes the wrong row elsewhere. `n_vocab` <= 0 means the size is unknown: only
    non-integers and negative ids are refused then.

    Raises:
        TokenIdError: naming the first bad id and the vocabulary's range.
    """
    limit = int(n_vocab) if n_vocab and n_vocab > 0 else None
    where = f"this model's vocabulary (0..{limit - 1})" if limit else "a vocabulary (ids are 0 or more)"
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise TokenIdError(f"{what} {t!r} is not an integer; token ids are whole numbers in {where}")
        if t < 0 or (limit is not None and t >= limit):
            raise TokenIdError(f"{what} {int(t)} is outside {where}")


def check_token_array(ids: np.ndarray, n_vocab: int, what: str = "token id") -> None:
    """`check_token_ids` for an integer array, without a Python loop over a long prompt."""
    if ids.size and (ids.min() < 0 or (n_vocab > 0 and ids.max() >= n_vocab)):
        bad = ids[(ids < 0) | (ids >= n_vocab)] if n_vocab > 0 else ids[ids < 0]
        check_token_ids([int(bad[0])], n_vocab, what)


def vocabulary_size(tokenizer: Any) -> int:
    """How many ids `tokenizer` can turn into text (0 when it cannot say)."""
    count = getattr(tokenizer, "token_count", None)
    try:
        return int(count()) if callable(count) else int(getattr(tokenizer, "vocab_size", 0) or 0)
    except (TypeError, ValueError, AttributeError, NotImplementedError):
        return 0


@runtime_checkable
class TokenizerLike(Protocol):
    """What the engine asks of a backend's tokenizer (`Backend.tokenizer`): ids both ways, and the chat template.

    Every backend's tokenizer has it: `Tokenizer` (Hugging Face: torch, MLX), llama.cpp's, a server's
    (`RemoteTokenizer`, or `MissingTokenizer` on a server without a tokenize endpoint) and the mock's. The
    chat-template facts are fields: `template_override` / `template_override_name` hold a template the user
    chose (engine.templates.choice writes them; None / "" for the model's own), `guessed_template` names a
    built-in one guessed for a server that does not say its own ("" otherwise), `has_chat_template` says
    whether the model brings one.
    """

    eos_token_ids: frozenset[int]
    template_override: str | None
    template_override_name: str
    guessed_template: str

    @property
    def has_chat_template(self) -> bool: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_text(self, token_id: int) -> str: ...

    def token_bytes(self, token_id: int) -> bytes: ...

    def chat_text(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str: ...

    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]: ...


class Tokenizer:
    """A thin wrapper over a Hugging Face tokenizer with the few operations the engine needs."""

    def __init__(self, hf_tokenizer: Any, eos_token_ids: Iterable[int]):
        self.hf = hf_tokenizer
        self.eos_token_ids: frozenset[int] = frozenset(int(i) for i in eos_token_ids)
        self._piece_cache: dict[int, str] = {}
        self._bytes_cache: dict[int, bytes] = {}
        self._byte_level: bool | None = None  # GPT-2 style byte-level BPE? (decided on first use)
        self._added_ids: frozenset[int] | None = None
        self.template_override: str | None = None  # a chosen template (engine.templates.choice), else the model's
        self.template_override_name = ""
        self.guessed_template = ""  # a server's tokenizer guesses one (engine.backends.remote.tokenizer)

    @classmethod
    def from_folder(cls, folder: Path, trust_remote_code: bool = False) -> "Tokenizer":
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
        return cls(hf, eos_ids_from_folder(folder, hf))

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        ids = list(ids)
        check_token_ids(ids, self.token_count())
        return self.hf.decode(ids, skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        """The surface text of one token (memoised: the UI asks for the same ids again and again)."""
        text = self._piece_cache.get(token_id)
        if text is None:
            text = self.decode([token_id])  # subclasses (the remote tokenizer) bring their own decode
            self._piece_cache[token_id] = text
        return text

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes token `token_id` contributes to the text (memoised).

        Byte-level BPE vocabularies (GPT-2, Llama 3, SmolLM2) spell bytes as printable characters;
        SentencePiece byte fallback has pieces `<0xF0>`; SentencePiece's "▁" is a space. A piece
        holding only part of a multi-byte character decodes to U+FFFD as text; these are its bytes.
        """
        raw = self._bytes_cache.get(token_id)
        if raw is None:
            if self.hf is not None:  # a subclass without `hf` (the remote tokenizer) checks its own
                check_token_ids([token_id], self.token_count())
            raw = self._piece_bytes(int(token_id))
            self._bytes_cache[token_id] = raw
        return raw

    def token_count(self) -> int:
        """How many token ids the vocabulary has, added tokens included (`ByteVocabulary`)."""
        n = self.__dict__.get("_token_count")
        if n is None:  # len() of a fast tokenizer walks its added tokens: once is enough
            n = self.__dict__["_token_count"] = len(self.hf)
        return n

    def special_token_ids(self) -> frozenset[int]:
        """Added tokens flagged special (<|im_start|>, <|endoftext|>, ...) and the named special tokens."""
        added = getattr(self.hf, "added_tokens_decoder", {}) or {}
        flagged = {int(i) for i, t in added.items() if getattr(t, "special", False)}
        return frozenset(flagged | set(getattr(self.hf, "all_special_ids", ()) or ()) | self.eos_token_ids)

    def _piece_bytes(self, token_id: int) -> bytes:
        if self._added_ids is None:
            self._added_ids = frozenset(getattr(self.hf, "added_tokens_decoder", {}) or ()) | frozenset(
                getattr(self.hf, "all_special_ids", ()) or ()
            )
        if token_id in self._added_ids:  # special and added tokens are whole strings
            return self.token_text(token_id).encode("utf-8")
        convert = getattr(self.hf, "convert_ids_to_tokens", None)
        piece = convert(token_id) if convert is not None else None
        if not isinstance(piece, str):  # no vocabulary at hand (a subclass without `hf`): the text is all we know
            return self.token_text(token_id).encode("utf-8")
        m = _BYTE_FALLBACK.fullmatch(piece)
        if m:
            return bytes([int(m.group(1), 16)])
        if self._byte_level is None:
            self._byte_level = _is_byte_level(self.hf)
        if self._byte_level:
            table = _byte_decoder()
            if all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        return piece.replace(_METASPACE, " ").encode("utf-8")

    def chat_text(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The prompt text: the model's template rendered as transformers' `apply_chat_template` renders it,
        but within `engine.templates.render`'s time and size limits (the template is the model's code)."""
        return self.tool_chat_text(messages, None, add_generation_prompt)

    def tool_chat_text(self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None,
                       add_generation_prompt: bool = True) -> str:
        """`chat_text` with the template's `tools` variable set (OpenAI's tool shape; engine.tools.render)."""
        from engine.templates.render import ChatTemplateError, render_chat_template

        template = self.template_override or FALLBACK_TEMPLATE
        if self.has_chat_template and not self.template_override:
            try:
                template = self.hf.get_chat_template()
            except ValueError as e:  # several named templates and none is the default
                raise ChatTemplateError(f"the model's chat template cannot be chosen: {e}") from None
        variables = {**self.hf.special_tokens_map, "messages": [dict(m) for m in messages], "tools": tools,
                     "documents": None, "add_generation_prompt": add_generation_prompt}
        return render_chat_template(template, variables)

    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        # The template text already carries BOS where the model wants one.
        return self.encode(self.chat_text(messages, add_generation_prompt), add_special_tokens=False)


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted (openai/gpt-2 `bytes_to_unicode`)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _is_byte_level(hf: Any) -> bool:
    """Whether the tokenizer's pieces are GPT-2 byte-level strings (its decoder says so)."""
    if getattr(hf, "byte_decoder", None) is not None:  # slow GPT-2 style tokenizers
        return True
    backend = getattr(hf, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    if decoder is None:
        return False
    try:
        return '"ByteLevel"' in json.dumps(json.loads(decoder.__getstate__()))
    except (TypeError, ValueError, AttributeError):
        return type(decoder).__name__ == "ByteLevel"


def incomplete_utf8_tail(data: bytes) -> int:
    """How many bytes at the end of `data` start a UTF-8 character that is not complete yet."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    decoder.decode(data, final=False)
    return len(decoder.getstate()[0])


def eos_ids_from_folder(folder: Path, hf_tokenizer: Any) -> set[int]:
    """EOS ids from the generation config (may be a list) plus the tokenizer's own."""
    ids: set[int] = set()
    try:
        from transformers import GenerationConfig

        eos = GenerationConfig.from_pretrained(str(folder)).eos_token_id
        if eos is not None:
            ids.update([eos] if isinstance(eos, int) else eos)
    except (OSError, ValueError):
        pass
    if hf_tokenizer.eos_token_id is not None:
        ids.add(hf_tokenizer.eos_token_id)
    return ids


def _starts_mid_character(raw: bytes) -> bool:
    return bool(raw) and 0x80 <= raw[0] <= 0xBF  # a UTF-8 continuation byte


def partial_token_bytes(tokenizer: Any, token_id: int, text: str) -> bytes | None:
    """The token's bytes if they are only part of a UTF-8 character (its `text` shows U+FFFD), else None."""
    if REPLACEMENT not in text:
        return None
    raw = tokenizer.token_bytes(token_id)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw
    return None  # a genuine U+FFFD character


class StreamDetokenizer:
    """Turns a token stream into text pieces without ever emitting half a character.

    Decodes a short window (`prefix_offset:`) and emits only the new suffix, and
    only when it does not end in U+FFFD: byte-level BPE splits multi-byte
    UTF-8 characters across tokens, and the replacement character means "wait
    for the next token". Seeded with a few context tokens (the end of the
    prompt) so SentencePiece's leading-space handling sees what precedes.

    Tokens that end in an unfinished character are never emitted by `flush`
    either: an answer cut there leaves them out of its text, and a stream
    seeded with them (Continue) emits them once the character is complete.
    """

    def __init__(self, tokenizer: TokenizerLike, context_ids: Sequence[int] = ()):
        self._tok = tokenizer
        context = list(context_ids)
        start = max(0, len(context) - 4)
        # Start the window on a character boundary: byte-fallback decoders turn a whole run of byte
        # pieces into U+FFFDs when it begins with a stray continuation byte.
        while start > 0 and len(context) - start < 8 and _starts_mid_character(tokenizer.token_bytes(context[start])):
            start -= 1
        self._ids: list[int] = context[start:]
        self._prefix_offset = 0
        # Context tokens ending inside a character were never shown: treat them as not yet read.
        self._read_offset = self._complete_upto(len(self._ids))

    def _complete_upto(self, end: int) -> int:
        """The largest k <= end where ids[prefix_offset:k] does not stop inside a UTF-8 character."""
        k = end
        while k > self._prefix_offset and incomplete_utf8_tail(
            b"".join(self._tok.token_bytes(i) for i in self._ids[self._prefix_offset : k])
        ):
            k -= 1
        return k

    def add(self, token_id: int) -> str:
        self._ids.append(token_id)
        prefix_text = self._tok.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._tok.decode(self._ids[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT):
            piece = new_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return piece
        return ""

    def flush(self) -> str:
        """Whatever is still held back, except tokens that end inside an unfinished character.

        Those stay out of the text (a cut-off emoji does not become U+FFFD); a stream seeded with
        them as context emits them once a later token completes the character. Invalid bytes that
        no later byte could complete are released (as U+FFFD), as before.
        """
        end = self._complete_upto(len(self._ids))
        prefix_text = self._tok.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._tok.decode(self._ids[self._prefix_offset : end])
        self._prefix_offset = self._read_offset = end
        return new_text[len(prefix_text) :]
