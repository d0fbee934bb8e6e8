"""A multi-turn conversation held as messages; each turn is a request over the whole history.

Each turn re-renders the chat template over the full history; the backend
finds the longest cached token prefix, so earlier turns are not recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.request import GenerationRequest, Message


@dataclass
class ChatSession:
    system_prompt: str | None = None
    messages: list[Message] = field(default_factory=list)

    def history(self) -> list[Message]:
        head = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return head + self.messages

    def request(self, user_text: str, **kwargs) -> GenerationRequest:
        """The request for the next answer to `user_text` (not yet added to the history)."""
        return GenerationRequest(messages=tuple(self.history() + [{"role": "user", "content": user_text}]), **kwargs)

    def add_turn(self, user_text: str, answer: str) -> None:
        self.messages.append({"role": "user", "content": user_text})
        self.messages.append({"role": "assistant", "content": answer})

    def reset(self) -> None:
        self.messages.clear()
