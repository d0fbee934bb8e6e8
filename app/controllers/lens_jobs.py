"""The layer view's work, on the model's worker thread, for one token of an answer (Qt-free).

Runs only when the user opens the view (the inspector's Layers tab): the
engine's worker runs it between generations, never inside one, so the
decode loop is not slowed while the view is closed. The prompt's tokens
(the chat template renders) and the tokens' texts are made off the UI
thread, as the chat's are; the app asks the engine for the capture by name
(`Engine.start_layer_capture`) and never holds the model itself. A position of the
layer view is the index of a predicted token in prompt + answer, so the
answer's token i is position `len(prompt) + i`.

What comes back to the window is small: per-layer top-k and the chosen
token's probability and rank (engine.lens.LayerCapture), the text of each
token the attention is over, and for the heatmap a (layers, positions)
array of the chosen tokens' probabilities.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from collections.abc import Sequence

import numpy as np

from engine import Engine, lens

from app.controllers.engine_host import EngineHost
from app.state.notebook import Prompt, prompt_for
from app.state.conversation import Conversation, Message
from app.state.models.model_match import check_answer_model
from app.state.models.model_record import model_record

TOP_K = 8
HEATMAP_WIDTH = 24  # answer positions around the selected one: each costs a layer-view row per layer
# Columns per worker call: ~1 s on the default model here, ~4 s at Gemma 3's 262k vocabulary (bench/lens.py),
# so the heatmap fills in step by step and a newer selection waits for at most one step.
HEATMAP_CHUNK = 8


@dataclass(frozen=True)
class LensView:
    """The layer view of one answer token, with what the window needs to draw it."""

    index: int  # the token's index in the answer
    capture: lens.LayerCapture
    token_texts: tuple[str, ...]  # text of every token the attention is over (prompt, then answer)
    answer_start: int  # position of the answer's first token
    top_texts: dict[int, str]  # token id -> text, for every id in the per-layer top-k
    model_name: str  # the model the view was computed with


@dataclass(frozen=True)
class LensHeatmap:
    """The chosen token's probability at every layer, for a run of answer tokens."""

    indices: tuple[int, ...]  # answer token indices, left to right
    probs: np.ndarray  # (layers, len(indices))


def check_model(engine: Engine, message: Message, what: str = "its layers") -> None:
    """Refuse in words (`OtherModelsAnswer`) before anything runs when the loaded model did not make `message`:
    its token ids would be read as another vocabulary's (Gemma reading SmolLM2's ids: "Token 3 d", rank 256029)."""
    check_answer_model(message.model, model_record(engine.info), what)


def answer_parts(conv: Conversation, message: Message) -> tuple[Prompt, list[int]]:
    """(the prompt before `message`: chat history or a notebook's text, the answer's token ids), read on the UI
    thread that owns `conv`."""
    if not message.is_assistant or message.parent_id is None:
        raise ValueError("the layer view is for a token of an answer")
    return prompt_for(conv, conv.messages[message.parent_id]), [t.token_id for t in conv.tokens(message)]


async def layer_view(host: EngineHost, conv: Conversation, message: Message, index: int) -> LensView:
    """The layer view and attention of the answer's token `index`, computed on the model's worker."""
    engine = await host.wait_engine()
    check_model(engine, message)
    history, answer = answer_parts(conv, message)
    if not 0 <= index < len(answer):
        raise ValueError(f"the answer has no token {index + 1}")
    prompt = await host.off_ui_thread(history.token_ids, engine.tokenizer)
    ids = prompt + answer
    position = len(prompt) + index
    (capture,) = await asyncio.wrap_future(engine.start_layer_capture(ids, [position], top_k=TOP_K, attention=True))
    top_ids = {t for layer in capture.layers for t, _ in layer.top} | {capture.target_id}
    token_texts, top_texts = await host.off_ui_thread(_texts, engine, ids[:position], top_ids)
    return LensView(
        index=index,
        capture=capture,
        token_texts=token_texts,
        answer_start=len(prompt),
        top_texts=top_texts,
        model_name=engine.info.name,
    )


def _texts(engine: Engine, ids: Sequence[int], top_ids: set[int]) -> tuple[tuple[str, ...], dict[int, str]]:
    """(the text of each of `ids`, id -> text for `top_ids`): off the UI thread, a decode per token."""
    decode = engine.tokenizer.decode
    return tuple(decode([t]) for t in ids), {t: decode([t]) for t in top_ids}


def heatmap_columns(n_answer: int, center: int, width: int = HEATMAP_WIDTH) -> tuple[int, ...]:
    """Up to `width` answer token indices around `center`, left to right."""
    lo = max(0, min(center - width // 2, n_answer - width))
    return tuple(range(lo, min(n_answer, lo + width)))


def nearest_first(indices: tuple[int, ...], center: int, size: int = HEATMAP_CHUNK) -> list[tuple[int, ...]]:
    """`indices` in runs of `size`, the ones nearest `center` first (the heatmap fills in from the selection out)."""
    order = sorted(indices, key=lambda i: (abs(i - center), i))
    return [tuple(sorted(order[k : k + size])) for k in range(0, len(order), size)]


async def heatmap(host: EngineHost, conv: Conversation, message: Message, indices: tuple[int, ...]) -> LensHeatmap:
    """The chosen tokens' per-layer probabilities at the answer tokens `indices`, on the model's worker."""
    engine = await host.wait_engine()
    check_model(engine, message)
    history, answer = answer_parts(conv, message)
    prompt = await host.off_ui_thread(history.token_ids, engine.tokenizer)
    captures = await asyncio.wrap_future(
        engine.start_layer_capture(prompt + answer, [len(prompt) + i for i in indices], top_k=1))
    return LensHeatmap(indices=indices, probs=np.stack([c.target_probs for c in captures], axis=1))
