"""How many tokens of the model's context the selected conversation fills, counted as the engine counts.

A visible path ending in an answer fills the chat prompt up to its question
(system prompt, messages, generation prompt) plus the answer's tokens, which
is `prompt_tokens + generated_tokens` of the run that wrote it. A finished
answer's saved stats say exactly that; a streaming (or unfinished) answer is
counted from the chat template plus its token records so far, with the
prompt's length cached so a token arriving costs nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from app.state.conversation import Conversation, Message

_CACHE_SIZE = 64


class ContextCounter:
    """`used(conversation, tokenizer)`: tokens in context, or None when it cannot be known yet."""

    def __init__(self) -> None:
        # (conversation id, question id, system prompt, tokenizer id) -> chat prompt length
        self._prompts: OrderedDict[tuple[Any, ...], int] = OrderedDict()

    def used(self, conv: Conversation | None, tokenizer: Any | None) -> int | None:
        if conv is None:
            return None
        path = conv.path()
        if not path:
            return 0
        last = path[-1]
        if last.is_assistant and not last.generating:
            stats = last.stats or {}
            if "prompt_tokens" in stats and "generated_tokens" in stats:
                return int(stats["prompt_tokens"]) + int(stats["generated_tokens"])
        question = conv.messages[last.parent_id] if last.is_assistant and last.parent_id is not None else last
        prompt = self.prompt_tokens(conv, question, tokenizer)
        if prompt is None:
            return None
        return prompt + (len(conv.tokens(last)) if last.is_assistant else 0)

    def clear(self) -> None:
        """Forget cached prompt lengths (another model, another tokenizer)."""
        self._prompts.clear()

    def prompt_tokens(self, conv: Conversation, question: Message, tokenizer: Any | None) -> int | None:
        """Length of the chat prompt that asks `question` (None without a tokenizer)."""
        if tokenizer is None:
            return None
        key = (conv.id, question.id, conv.system_prompt, id(tokenizer))
        n = self._prompts.get(key)
        if n is None:
            n = len(tokenizer.chat_ids(conv.history(question), add_generation_prompt=True))
            self._prompts[key] = n
            while len(self._prompts) > _CACHE_SIZE:
                self._prompts.popitem(last=False)
        else:
            self._prompts.move_to_end(key)
        return n
