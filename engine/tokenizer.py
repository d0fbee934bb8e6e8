"""Tokenization shared by every backend: encoding, chat templates, streaming detokenization.

Both backends load the same Hugging Face tokenizer from the model folder, so
the token ids (and therefore the sampler's inputs) agree across backends.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPLACEMENT = "\ufffd"
# For base models without a chat template: a plain transcript they can continue.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}User: {{ m['content'] }}\n"
    "{% else %}Assistant: {{ m['content'] }}\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)


class Tokenizer:
    """A thin wrapper over a Hugging Face tokenizer with the few operations the engine needs."""

    def __init__(self, hf_tokenizer: Any, eos_token_ids: Iterable[int]):
        self.hf = hf_tokenizer
        self.eos_token_ids: frozenset[int] = frozenset(int(i) for i in eos_token_ids)
        self._piece_cache: dict[int, str] = {}

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
        return self.hf.decode(list(ids), skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        """The surface text of one token (memoised: the UI asks for the same ids again and again)."""
        text = self._piece_cache.get(token_id)
        if text is None:
            text = self.hf.decode([token_id], skip_special_tokens=False)
            self._piece_cache[token_id] = text
        return text

    def chat_text(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        template = None if self.has_chat_template else FALLBACK_TEMPLATE
        return self.hf.apply_chat_template(
            list(messages), chat_template=template, add_generation_prompt=add_generation_prompt, tokenize=False
        )

    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        # The template text already carries BOS where the model wants one.
        return self.encode(self.chat_text(messages, add_generation_prompt), add_special_tokens=False)


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


class StreamDetokenizer:
    """Turns a token stream into text pieces without ever emitting half a character.

    Decodes a short window (`prefix_offset:`) and emits only the new suffix, and
    only when it does not end in U+FFFD: byte-level BPE splits multi-byte
    UTF-8 characters across tokens, and the replacement character means "wait
    for the next token". Seeded with a few context tokens (the end of the
    prompt) so SentencePiece's leading-space handling sees what precedes.
    """

    def __init__(self, tokenizer: Tokenizer, context_ids: Sequence[int] = ()):
        self._tok = tokenizer
        self._ids: list[int] = list(context_ids)[-4:]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

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
        """Whatever is still held back (a genuinely broken byte sequence at the end)."""
        prefix_text = self._tok.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._tok.decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]
