"""Notebook mode (as mikupad and text-generation-webui's Notebook): one text that the model continues, no template.

A notebook is a `Conversation` whose `mode` is "notebook". Its text is the
visible path read as one string: user messages are the parts the person wrote,
assistant messages the parts the model wrote, each with its token records — so
the heatmap, the inspector, branching from any token, the stage view, Compare
and Replay work on a notebook's generated parts exactly as on a chat answer.
The prompt of a generated part is the text before it, tokenized as a raw prompt
(`GenerationRequest(prompt=...)`), never wrapped in a chat template.

Editing the text never loses a version: `apply_text` keeps the parts the edit
left alone, and puts the edited rest in a new sibling of the first part it
changed (the old part stays one ‹ › step away, as an edited chat message does).

Qt-free, like the chat's state and controller.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.state.conversation import Conversation, Message


class Answerer(Protocol):
    """What a notebook needs of the chat controller (app.controllers.chat.ChatController): no import of it, no circle."""

    async def continue_answer(self, message: Message) -> Message: ...

    async def answer_after(self, parent: Message) -> Message: ...


NOTEBOOK = "notebook"
CHAT = "chat"
NOTEBOOK_TITLE = "New notebook"


def is_notebook(conv: Conversation | None) -> bool:
    return conv is not None and conv.mode == NOTEBOOK


@dataclass(frozen=True)
class Prompt:
    """What a generation continues: a chat's messages (the model's template applies) or a notebook's raw text."""

    messages: tuple[dict[str, str], ...] | None = None
    text: str | None = None

    def request_fields(self) -> dict[str, Any]:
        """The `GenerationRequest` field that carries it: `messages=` or `prompt=`."""
        return {"prompt": self.text} if self.text is not None else {"messages": self.messages}

    def token_ids(self, tokenizer: Any) -> list[int]:
        """The prompt's token ids as the engine makes them (`engine.decode.loop.prompt_ids_for`)."""
        if self.text is not None:
            return list(tokenizer.encode(self.text))
        return list(tokenizer.chat_ids(list(self.messages or ()), add_generation_prompt=True))


def prompt_for(conv: Conversation, parent: Message, history: Sequence[dict[str, str]] | None = None) -> Prompt:
    """The prompt of an answer that follows `parent`: a notebook's text up to it, else the chat history
    (`history` when the caller already made it, e.g. without earlier reasoning)."""
    if is_notebook(conv):
        return Prompt(text="".join(m.content for m in conv.ancestry(parent)))
    return Prompt(messages=tuple(history if history is not None else conv.history(parent)))


def prompt_ids(tokenizer: Any, prompt: "Prompt | Sequence[dict[str, str]]") -> list[int]:
    """Token ids of a `Prompt`, or of chat messages (callers that still pass a history)."""
    if isinstance(prompt, Prompt):
        return prompt.token_ids(tokenizer)
    return list(tokenizer.chat_ids(list(prompt), add_generation_prompt=True))


def notebook_text(conv: Conversation) -> str:
    """The whole text shown: every part of the visible path, in order."""
    return "".join(m.content for m in conv.path())


def spans(conv: Conversation) -> list[tuple[Message, int]]:
    """Each part of the visible path with the character offset where it starts in `notebook_text`."""
    out, offset = [], 0
    for m in conv.path():
        out.append((m, offset))
        offset += len(m.content)
    return out


def apply_text(conv: Conversation, text: str) -> Message | None:
    """Make the visible path read `text`, keeping every earlier version; returns the path's last part (None: empty).

    - Parts the text still starts with are kept as they are (generated parts keep their tokens).
    - Text added after the last part: it grows the last part when that is text the person wrote and
      nothing follows it; else it becomes a new part.
    - A changed part: the text from its start on becomes a new sibling of it (the old one is kept).
    """
    path = conv.path()
    offset = 0
    for i, m in enumerate(path):
        if text.startswith(m.content, offset):
            offset += len(m.content)
            continue
        parent = None if i == 0 else path[i - 1]
        return conv.add_message(parent, "user", text[offset:])
    rest = text[offset:]
    if not rest:
        return path[-1] if path else None
    last = path[-1] if path else None
    if last is not None and not last.is_assistant and not conv.children(last.id):
        conv.set_text(last, last.content + rest)
        return last
    return conv.add_message(last, "user", rest)


async def generate(controller: Answerer, conv: Conversation, text: str) -> Message:
    """Continue the notebook's `text` (applied first): a cut-off last part goes on in place, else a new part.

    Raises:
        ValueError: there is no text to continue.
    """
    if not text.strip():
        raise ValueError("write some text for the model to continue")
    last = apply_text(conv, text)
    assert last is not None
    tokens = conv.tokens(last)
    if last.is_assistant and last.can_continue and tokens and not tokens[-1].special:
        return await controller.continue_answer(last)
    return await controller.answer_after(last)
