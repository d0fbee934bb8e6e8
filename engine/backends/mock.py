"""A deterministic stand-in model, for UI tests only (no weights, no torch).

Its vocabulary is a few hundred English words; its logits are a fixed
function of the last two tokens, so the same history always gives the same
distribution and UI tests can assert exact behaviour. `delay_s` simulates
per-token compute so streaming and cancellation can be exercised.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence

import numpy as np

from engine.backend import CachedTokens
from engine.model_info import ModelInfo
from engine.tokenizer import FALLBACK_TEMPLATE

_WORDS = (
    "the a an of to in and is was it that for on with as by at from this be are or not but have had "
    "cat dog model token probability sampler temperature branch answer question light dark window "
    "river mountain city paris france capital language small large quick brown fox jumps over lazy "
    "one two three four five six seven eight nine ten red green blue yellow orange purple "
    "think know see say make go come take give find tell ask work seem feel try leave call "
    "good new first last long great little own other old right big high different important "
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program number night point home water room"
).split()
PIECES: tuple[str, ...] = ("<eos>", ".", ",", "\n", "é") + tuple(" " + w for w in _WORDS)
EOS_ID = 0


class MockTokenizer:
    """Word-level tokenizer over `PIECES` (greedy longest match; unknown characters are dropped)."""

    def __init__(self) -> None:
        self.eos_token_ids = frozenset({EOS_ID})
        self._index = {p: i for i, p in enumerate(PIECES)}
        self.has_chat_template = False
        self.template_override: str | None = None  # engine.templates.choice: rendered as the real tokenizers do
        self.template_override_name = ""
        self.guessed_template = ""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            for n in range(min(16, len(text) - i), 0, -1):
                tid = self._index.get(text[i : i + n])
                if tid is not None:
                    ids.append(tid)
                    i += n
                    break
            else:
                i += 1
        return ids or [self._index[" the"]]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(PIECES[i] for i in ids if i != EOS_ID)

    def token_text(self, token_id: int) -> str:
        return PIECES[token_id]

    def token_bytes(self, token_id: int) -> bytes:
        return PIECES[token_id].encode("utf-8")

    def chat_text(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        from jinja2 import Template

        return Template(self.template_override or FALLBACK_TEMPLATE).render(messages=list(messages), add_generation_prompt=add_generation_prompt)

    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.chat_text(messages, add_generation_prompt))


class MockBackend(CachedTokens):
    name = "mock"

    def __init__(self, delay_s: float = 0.0, context_length: int = 4096):
        self.tokenizer = MockTokenizer()
        self.delay_s = delay_s
        self._tokens: list[int] = []
        self.forward_calls = 0
        self.info = ModelInfo(
            name="mock",
            spec="mock",
            path="",
            architecture="MockForCausalLM",
            parameters=0,
            dtype="float32",
            context_length=context_length,
            vocab_size=len(PIECES),
            bytes=0,
            backend=self.name,
            device="cpu",
        )

    def _cut_cache(self, keep: int) -> bool:
        return True  # no real cache: the token list is all there is

    def _clear_cache(self) -> None:
        pass

    def forward(self, token_ids: Sequence[int]) -> np.ndarray:
        self.forward_calls += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        self._tokens.extend(int(t) for t in token_ids)
        return self.logits_after(self._tokens)

    @staticmethod
    def logits_after(tokens: Sequence[int]) -> np.ndarray:
        """Peaked pseudo-random logits seeded by the last two tokens; EOS grows likelier with length."""
        key = zlib.crc32(np.asarray(tokens[-2:], dtype=np.int64).tobytes())
        rng = np.random.default_rng(key)
        logits = rng.standard_normal(len(PIECES)).astype(np.float32) * 2.0
        logits[rng.integers(5, len(PIECES), size=3)] += 4.0
        logits[EOS_ID] = -4.0 + 0.05 * len(tokens)
        return logits

    def peak_memory_bytes(self) -> int:
        return 0

    def close(self) -> None:
        self._tokens = []
