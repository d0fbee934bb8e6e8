"""The engine's tokenizer interface over llama.cpp's own vocabulary (no transformers import).

The token ids are the GGUF file's, so the sampler sees the same ids llama.cpp
would. Text comes from llama.cpp's detokenizer as raw bytes and is decoded
with `errors="replace"`: a multi-byte UTF-8 character split across byte-level
tokens decodes to U+FFFD until its last byte arrives, which is exactly the
signal `engine.tokenizer.StreamDetokenizer` waits on.

The chat template is the file's `tokenizer.chat_template`, rendered by
`engine.templates.render` the way transformers renders it (sandboxed, with the
special tokens as variables), within its time and size limits, so a GGUF file
and its Hugging Face original give the same prompt text.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Sequence
from typing import Any

import llama_cpp

from engine.templates.render import render_chat_template
from engine.tokenizer import FALLBACK_TEMPLATE, check_token_ids


class LlamaCppTokenizer:
    """encode/decode/token_text/token_bytes/chat_text/chat_ids over a loaded llama.cpp model's vocabulary."""

    def __init__(self, model: Any, chat_template: str = "", extra_eos_ids: Iterable[int] = ()):
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self.vocab_size = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.chat_template = chat_template or ""
        self.template_override: str | None = None  # a chosen template (engine.templates.choice), else the file's
        self.template_override_name = ""
        self.guessed_template = ""  # the file says its template (or has none): nothing is guessed
        self.bos_token_id = int(llama_cpp.llama_vocab_bos(self._vocab))
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self.pad_token_id = int(llama_cpp.llama_vocab_pad(self._vocab))  # -1 when the file names none
        # End of generation: llama.cpp's set (EOS, EOT, <|im_end|>, <|eot_id|>, ...), one C call per token once.
        eog = {i for i in range(self.vocab_size) if llama_cpp.llama_vocab_is_eog(self._vocab, i)}
        self.eos_token_ids: frozenset[int] = frozenset(eog | {int(i) for i in extra_eos_ids})
        self._piece_cache: dict[int, str] = {}
        self._bytes_cache: dict[int, bytes] = {}

    def detach(self) -> None:
        """The model is being freed: later calls fail cleanly instead of reading freed memory."""
        self._vocab = None

    def _v(self) -> llama_cpp.llama_vocab_p:
        if self._vocab is None:
            raise RuntimeError("this tokenizer's llama.cpp model has been closed")
        return self._vocab

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template)

    # --- ids <-> text ---------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids; special tokens written in the text (`<|im_start|>`) become their ids, as in transformers."""
        raw = text.encode("utf-8")
        n_max = len(raw) + 2  # at most one token per byte, plus BOS/EOS
        ids = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self._v(), raw, len(raw), ids, n_max, add_special_tokens, True)
        if n < 0:  # cannot happen with one slot per byte, but the API allows it
            n_max = -n
            ids = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self._v(), raw, len(raw), ids, n_max, add_special_tokens, True)
        return list(ids[:n])

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The raw bytes of `ids`, special tokens rendered as their text (llama.cpp's detokenizer)."""
        ids = list(ids)
        if not ids:
            return b""
        check_token_ids(ids, self.vocab_size)  # llama.cpp aborts the process (std::out_of_range) on a bad id
        arr = (llama_cpp.llama_token * len(ids))(*ids)
        size = max(64, 8 * len(ids))
        while True:
            out = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_detokenize(self._v(), arr, len(ids), out, size, False, True)
            if n >= 0:
                return out.raw[:n]
            size = -n

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token contributes: a byte-fallback token gives one byte of a UTF-8 character."""
        raw = self._bytes_cache.get(token_id)
        if raw is None:
            check_token_ids([token_id], self.vocab_size)
            # A buffer per call: the UI thread tokenizes while the worker thread decodes.
            buf = ctypes.create_string_buffer(64)
            n = llama_cpp.llama_token_to_piece(self._v(), token_id, buf, len(buf), 0, True)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self._v(), token_id, buf, len(buf), 0, True)
            raw = buf.raw[:n]
            self._bytes_cache[token_id] = raw
        return raw

    def token_count(self) -> int:
        """How many token ids the vocabulary has (`ByteVocabulary`)."""
        return self.vocab_size

    def special_token_ids(self) -> frozenset[int]:
        """Control tokens (llama.cpp's attribute: <|im_start|>, end of turn), user-defined ones spelt <...>
        (as llguidance's own llama.cpp reader counts them), and the end-of-generation set."""
        v = self._v()
        control, user = int(llama_cpp.LLAMA_TOKEN_ATTR_CONTROL), int(llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED)
        out = set(self.eos_token_ids)
        for i in range(self.vocab_size):
            attr = int(llama_cpp.llama_token_get_attr(v, i))
            if attr & control:
                out.add(i)
            elif attr & user:
                raw = self.token_bytes(i)
                if raw.startswith(b"<") and raw.endswith(b">"):
                    out.add(i)
        return frozenset(out)

    def token_text(self, token_id: int) -> str:
        """The surface text of one token (memoised: the UI asks for the same ids again and again)."""
        text = self._piece_cache.get(token_id)
        if text is None:
            text = self.decode([token_id])
            self._piece_cache[token_id] = text
        return text

    def token_str(self, token_id: int) -> str:
        """The vocabulary entry itself (e.g. 'Ġthe', '<0x0A>'), for special-token lookups."""
        check_token_ids([token_id], self.vocab_size)
        raw = llama_cpp.llama_vocab_get_text(self._v(), token_id)
        return raw.decode("utf-8", errors="replace") if raw else ""

    # --- chat -----------------------------------------------------------------------

    def _special(self, token_id: int) -> str:
        return self.token_str(token_id) if 0 <= token_id < self.vocab_size else ""

    def chat_text(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tool_chat_text(messages, None, add_generation_prompt)

    def tool_chat_text(self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None,
                       add_generation_prompt: bool = True) -> str:
        """`chat_text` with the template's `tools` variable set (engine.tools.render.ToolTemplate)."""
        v = self._v()
        return render_chat_template(self.template_override or self.chat_template or FALLBACK_TEMPLATE, {
            "messages": [dict(m) for m in messages],
            "tools": tools,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self._special(int(llama_cpp.llama_vocab_bos(v))),
            "eos_token": self._special(int(llama_cpp.llama_vocab_eos(v))),
            "pad_token": self._special(int(llama_cpp.llama_vocab_pad(v))),
        })

    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        # The template text already carries BOS where the model wants one.
        return self.encode(self.chat_text(messages, add_generation_prompt), add_special_tokens=False)
