"""A multi-turn conversation held as messages; each turn is a request over the whole history.

Each turn re-renders the chat template over the full history; the backend
finds the longest cached token prefix, so earlier turns are not recomputed.
Earlier answers' reasoning (`<think>…</think>`) stays out of that history the
way the model's template wants (`engine.reasoning`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.reasoning import DEFAULT_FORMAT, ReasoningFormat, prompt_history
from engine.request import GenerationRequest, Message


@dataclass
class ChatSession:
    system_prompt: str | None = None
    messages: list[Message] = field(default_factory=list)
    # How the model writes reasoning: `engine.reasoning.prompt_format(engine.tokenizer)` knows the model's.
    reasoning: ReasoningFormat = DEFAULT_FORMAT

    def history(self) -> list[Message]:
        """The messages of the next prompt (answers as the model wrote them, less their reasoning)."""
        head = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return prompt_history(head + self.messages, self.reasoning)

    def request(self, user_text: str, **kwargs: Any) -> GenerationRequest:  # kwargs: GenerationRequest's fields
        """The request for the next answer to `user_text` (not yet added to the history)."""
        return GenerationRequest(messages=tuple(self.history() + [{"role": "user", "content": user_text}]), **kwargs)

    def add_turn(self, user_text: str, answer: str) -> None:
        self.messages.append({"role": "user", "content": user_text})
        self.messages.append({"role": "assistant", "content": answer})

    def reset(self) -> None:
        self.messages.clear()
