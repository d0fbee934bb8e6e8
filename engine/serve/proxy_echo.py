"""The echoed prompt in a proxied `/v1/completions` answer with `echo: true`: cut off before the answer is recorded.

With `echo` the upstream's `text` starts with the prompt and its log-probs list the prompt's tokens first (the
first with a null log-prob). The record holds the answer only (the prompt is the exchange's `prompt`), so
each choice's echoed part is cut off its text and its log-prob lists: the tokens whose `text_offset` is
inside the prompt's text where the upstream gives offsets (OpenAI's legacy shape, vLLM, ours), else the
prompt's own token count (a token-id prompt), and the text up to the prompt's length (a text prompt) or the
first answer token's offset. What cannot be told apart (a token-id prompt from an upstream that gives no
log-probs) stays in the record as it came. The tokens cut are the choice's prompt tokens in its stats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_PER_TOKEN = ("tokens", "token_logprobs", "top_logprobs", "text_offset", "content")  # the lists, one entry a token


@dataclass
class EchoCut:
    """One choice's echoed prompt: its length in characters and tokens where known, and how much was cut."""

    chars: int | None  # the prompt's text length (None: a token-id prompt, found from the first answer offset)
    tokens: int | None  # the prompt's tokens (None: unknown, a text prompt: told by the offsets)
    cut_chars: int = 0
    cut_tokens: int = 0
    seen_tokens: int = 0

    def cut(self, text: str, logprobs: Any) -> tuple[str, Any]:
        """`text` and `logprobs` (one chunk's, or a whole choice's) without the prompt's part."""
        k, count = 0, 0
        if isinstance(logprobs, dict):
            count = _token_count(logprobs)
            offsets = logprobs.get("text_offset")
            offsets = offsets if isinstance(offsets, list) and len(offsets) == count else None
            for j in range(count):
                at = offsets[j] if offsets is not None else None
                if self.chars is not None and isinstance(at, int) and not isinstance(at, bool):
                    is_prompt = at < self.chars
                elif self.tokens is not None:
                    is_prompt = self.seen_tokens + j < self.tokens
                else:
                    is_prompt = False
                if not is_prompt:
                    if self.chars is None and isinstance(at, int) and not isinstance(at, bool):
                        self.chars = at  # a token-id prompt: the answer starts where its first token does
                    break
                k += 1
            if k:
                logprobs = {key: (v[k:] if key in _PER_TOKEN and isinstance(v, list) else v)
                            for key, v in logprobs.items()}
        self.seen_tokens += count
        self.cut_tokens += k
        if self.chars is None and self.tokens is not None and k == count and count and self.seen_tokens <= self.tokens:
            chars = len(text)  # every token so far is the prompt's: so is the text
        else:
            chars = max(0, min(len(text), (self.chars or 0) - self.cut_chars))
        self.cut_chars += chars
        return text[chars:], logprobs


def _token_count(logprobs: dict[str, Any]) -> int:
    for key in ("content", "tokens"):
        if isinstance(logprobs.get(key), list):
            return len(logprobs[key])
    return 0


def echo_cuts(body: dict[str, Any], n: int) -> list[EchoCut | None]:
    """Per choice (prompt p's j-th answer is choice p * n + j, as OpenAI numbers them), its cut; None each when
    the body does not ask for `echo`."""
    prompts = prompt_list(body)
    if body.get("echo") is not True:
        return [None] * (n * len(prompts))
    out: list[EchoCut | None] = []
    for p in prompts:
        cut = EchoCut(len(p), None) if isinstance(p, str) else EchoCut(None, len(p) if isinstance(p, list) else None)
        out += [EchoCut(cut.chars, cut.tokens) for _ in range(n)]
    return out


def prompt_list(body: dict[str, Any]) -> list[Any]:
    """A completions body's prompts: a text or token ids is one; a list of texts or of token-id lists is each."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return prompt
    return [prompt]
