"""Where an answer token looked in the attached documents, from the layer view's own capture (Qt-free).

The inspector's layer view already holds the selected token's attention (`lens_jobs.layer_view`, captured with
`attention=True`): the passages' masses are that array summed over their tokens
(`engine.documents.attention.passage_mass`), so opening this view runs nothing on the model. Only the
passages' token ranges are made here, off the UI thread: the prompt's tokens (the chat template renders)
and, for each earlier message with files, where its composed text lies in them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine import Engine, documents

from app.controllers.engine_host import EngineHost
from app.controllers.lens_jobs import LensView, answer_parts, check_model
from app.state.conversation import Conversation, Message


@dataclass(frozen=True)
class PassageView:
    """What the passage panel draws for one answer token: its attention and the passages it is summed over."""

    index: int  # the token's index in the answer
    attention: np.ndarray  # (layers, heads, position): the layer view's capture of the token
    passages: tuple[documents.Passage, ...]
    caveat: str = documents.CAVEAT


def attached_messages(conv: Conversation, message: Message) -> list[Message]:
    """The messages before answer `message` that carry files, oldest first."""
    if message.parent_id is None:
        return []
    return [m for m in conv.ancestry(conv.messages[message.parent_id]) if m.attachments]


def prompt_passages(tokenizer: Any, prompt: Sequence[int], messages: Sequence[Message]) -> list[documents.Passage]:
    """Every attached passage of `messages` with its token range in `prompt`; a message whose text is not in
    the prompt (a notebook's raw text, a history cut to fit) gives none."""
    out: list[documents.Passage] = []
    for m in messages:
        composed = documents.compose_message(m.content, m.attachments)
        try:
            out.extend(documents.passages_in_prompt(tokenizer, prompt, composed, m.attachments))
        except ValueError:
            continue
    return out


async def _prompt_passages(host: EngineHost, conv: Conversation, message: Message
                           ) -> tuple[Engine, list[int], list[int], list[documents.Passage]] | None:
    """(the engine, the prompt's ids, the answer's ids, the attached passages in the prompt) for answer `message`;
    None when its prompt holds no attached file."""
    messages = attached_messages(conv, message)
    if not messages:
        return None
    engine = await host.wait_engine()
    check_model(engine, message, "where it looked")
    history, answer = answer_parts(conv, message)
    prompt = await host.off_ui_thread(history.token_ids, engine.tokenizer)
    passages = await host.off_ui_thread(prompt_passages, engine.tokenizer, prompt, messages)
    return (engine, prompt, answer, passages) if passages else None


async def passage_view(host: EngineHost, conv: Conversation, message: Message, view: LensView) -> PassageView | None:
    """The passages the answer token of `view` looked at; None when its prompt holds no attached file."""
    attention = view.capture.attention
    found = None if attention is None else await _prompt_passages(host, conv, message)
    if attention is None or found is None:
        return None
    return PassageView(view.index, attention, tuple(found[3]))


async def answer_attention(host: EngineHost, conv: Conversation, message: Message) -> documents.AnswerAttention | None:
    """The whole answer's attention on the attached passages (the panel's per-passage bar), computed on the
    model's worker; None when its prompt holds no attached file."""
    found = await _prompt_passages(host, conv, message)
    if found is None or not found[2]:
        return None
    engine, prompt, answer, passages = found
    ids = [*prompt, *answer]
    return await asyncio.wrap_future(engine.start_answer_attention(ids, range(len(prompt), len(ids)), passages))
