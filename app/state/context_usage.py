"""How many tokens of the model's context the selected conversation fills, counted as the engine counts.

A visible path ending in an answer fills the chat prompt up to its question
(system prompt, messages, generation prompt) plus the answer's tokens, which
is `prompt_tokens + generated_tokens` of the run that wrote it. A finished
answer's saved stats say exactly that; a streaming (or unfinished) answer is
counted from the chat template plus its token records so far, with the
prompt's length cached so a token arriving costs nothing.

Counting a prompt renders the model's chat template, which is the model's
code: it may be slow, or never end (the engine stops it at its time limit).
So it never runs on the caller's (the UI) thread: `count_later` runs it on
a worker thread, `used` says None meanwhile, and `counted` fires when the
number (or the template's error) is in.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from engine import reasoning

from app.state.conversation import Conversation, Message
from app.state.observable import Signal

log = logging.getLogger(__name__)

_CACHE_SIZE = 64

# Runs a job off the UI thread and calls done(result, error) back on it; False if it could not start.
CountLater = Callable[[Callable[[], int], Callable[[Any, "BaseException | None"], None]], bool]


class ContextCounter:
    """`used(conversation, tokenizer)`: tokens in context, or None when it cannot be known (yet)."""

    def __init__(self, count_later: CountLater | None = None) -> None:
        self._count_later = count_later
        # (conversation id, question id, system prompt, tokenizer id) -> chat prompt length
        self._prompts: OrderedDict[tuple[Any, ...], int] = OrderedDict()
        self._pending: set[tuple[Any, ...]] = set()
        self._failed: dict[tuple[Any, ...], str] = {}
        # (tokenizer id, chosen template) -> how its model writes reasoning (two template renders to learn)
        self._formats: dict[tuple[Any, ...], reasoning.ReasoningFormat] = {}
        self._epoch = 0  # bumped by clear(): counts started for another model are dropped
        self.counted = Signal()  # () a prompt length (or a template error) arrived
        self.error: str | None = None  # why the last prompt asked about cannot be counted

    @property
    def counting(self) -> bool:
        return bool(self._pending)

    def used(self, conv: Conversation | None, tokenizer: Any | None) -> int | None:
        self.error = None
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
        self._pending.clear()
        self._failed.clear()
        self._formats.clear()
        self._epoch += 1

    def prompt_tokens(self, conv: Conversation, question: Message, tokenizer: Any | None) -> int | None:
        """Length of the chat prompt that asks `question`; None without a tokenizer or while it is counted."""
        if tokenizer is None:
            return None
        # The chosen chat template (engine.templates.choice) and a notebook's text, which grows in place, count too.
        key = (conv.id, question.id, conv.system_prompt, id(tokenizer), tokenizer.template_override,
               conv.mode, len(question.content))
        n = self._prompts.get(key)
        if n is not None:
            self._prompts.move_to_end(key)
            return n
        if key in self._failed:
            self.error = self._failed[key]
            return None
        history = conv.history(question)
        notebook_text = "".join(m.content for m in conv.ancestry(question)) if conv.mode == "notebook" else None

        def count() -> int:
            if notebook_text is not None:  # a notebook: its raw text, no template (app/state/notebook.py)
                return len(tokenizer.encode(notebook_text))
            # Earlier answers' reasoning is left out as the send leaves it out (app/controllers/chat.py).
            fmt_key = (id(tokenizer), tokenizer.template_override)
            fmt = self._formats.get(fmt_key)
            if fmt is None:
                fmt = self._formats[fmt_key] = reasoning.prompt_format(tokenizer)
            return len(tokenizer.chat_ids(reasoning.prompt_history(history, fmt), add_generation_prompt=True))

        if self._count_later is None:  # no worker to hand it to (scripts): count here
            self._store(key, count())
            return self._prompts[key]
        if key not in self._pending:
            epoch = self._epoch

            def done(result: Any, error: BaseException | None) -> None:
                if epoch != self._epoch:
                    return
                self._pending.discard(key)
                if error is not None:
                    log.info("the context count failed: %s", error)
                    self._failed[key] = str(error) or type(error).__name__
                else:
                    self._store(key, int(result))
                self.counted.emit()

            self._pending.add(key)
            if not self._count_later(count, done):
                self._pending.discard(key)
        return None

    def _store(self, key: tuple[Any, ...], n: int) -> None:
        self._prompts[key] = n
        while len(self._prompts) > _CACHE_SIZE:
            self._prompts.popitem(last=False)
