"""Qt-free glue between the chat state and the engine's sampling experiments.

What a stored answer was generated with (prompt, settings, seed), turning an
experiment's tokens into a new answer in the conversation (a branch), and an
answer's JSONL trace.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from engine import Engine, GenerationRequest, GenerationStats, SamplerSettings, TokenEvent
from engine import experiments

from app.state.conversation import Conversation, Message

TOP_N = 20  # alternatives recorded per token, as in the chat
STATS_SKIP = ("text", "token_ids")
MODEL_FIELDS = ("name", "spec", "architecture", "parameters", "dtype", "context_length", "backend", "device")


@dataclass(frozen=True)
class AnswerRecipe:
    """Everything needed to generate an answer again: prompt, kept prefix, forced token, settings."""

    messages: tuple[dict[str, str], ...]
    prefix: tuple[TokenEvent, ...]  # tokens a branch kept from its original
    forced: tuple[int, ...]  # the alternative a branch forced after them
    sampler: SamplerSettings  # with the run's seed filled in
    max_new_tokens: int
    stop: tuple[str, ...]

    def request(self, sampler: SamplerSettings | None = None) -> GenerationRequest:
        return GenerationRequest(
            messages=self.messages,
            sampler=sampler or self.sampler,
            max_new_tokens=self.max_new_tokens,
            stop=self.stop,
            top_n=TOP_N,
            record_stages=True,
            assistant_prefix=tuple(t.token_id for t in self.prefix),
            forced_tokens=self.forced,
        )


def answer_parent(conv: Conversation, message: Message) -> Message:
    if not message.is_assistant or message.parent_id is None:
        raise ValueError("choose an answer (an assistant message) to replay")
    return conv.messages[message.parent_id]


def recipe_for(conv: Conversation, message: Message) -> AnswerRecipe:
    """How `message` was generated, from what it stored; ValueError when it cannot be replayed."""
    user = answer_parent(conv, message)
    req, stats = message.request or {}, message.stats or {}
    if "sampler" not in req or stats.get("seed") is None:
        raise ValueError("this answer did not store its settings and seed (it failed or was stopped before the model ran)")
    sampler = SamplerSettings.from_dict(req["sampler"]).with_(seed=int(stats["seed"]))
    tokens = conv.tokens(message)
    prefix: tuple[TokenEvent, ...] = ()
    forced: tuple[int, ...] = ()
    if message.branch_index is not None and message.branch_index < len(tokens):
        prefix = tuple(tokens[: message.branch_index])
        forced = (tokens[message.branch_index].token_id,)
    return AnswerRecipe(
        messages=tuple(conv.history(user)),
        prefix=prefix,
        forced=forced,
        sampler=sampler,
        max_new_tokens=int(req.get("max_new_tokens", 256)),
        stop=tuple(req.get("stop", ())),
    )


def add_answer(
    conv: Conversation,
    user: Message,
    events: list[TokenEvent],
    *,
    stats: GenerationStats | None,
    sampler: SamplerSettings,
    max_new_tokens: int,
    stop: tuple[str, ...],
    model: dict[str, Any] | None,
    branch_index: int | None = None,
) -> Message:
    """A new answer to `user` holding `events` (made active: the chat shows it, the old one stays a branch)."""
    answer = conv.add_message(user, "assistant", branch_index=branch_index)
    events = [replace(e, index=i) for i, e in enumerate(events)]
    conv.set_tokens(answer, events, "".join(e.text for e in events))
    conv.update_message(
        answer,
        request={"sampler": sampler.to_dict(), "max_new_tokens": max_new_tokens, "stop": list(stop), "top_n": TOP_N},
        model=model,
        finish_reason=stats.finish_reason if stats else "length",
        stats={k: v for k, v in stats.to_dict().items() if k not in STATS_SKIP} if stats else None,
    )
    conv.flush()
    return answer


def model_dict(engine: Engine) -> dict[str, Any]:
    info = engine.info
    return {k: getattr(info, k) for k in MODEL_FIELDS}


def trace_lines(conv: Conversation, message: Message, engine: Engine | None) -> list[dict[str, Any]]:
    """The JSONL trace of one stored answer (prompt ids when a model is loaded to tokenize the prompt)."""
    user = answer_parent(conv, message)
    history = conv.history(user)
    prompt_ids = engine.tokenizer.chat_ids(history, add_generation_prompt=True) if engine is not None else None
    req, stats = message.request or {}, message.stats or {}
    return experiments.generation_run(
        model=message.model,
        prompt_ids=prompt_ids,
        settings=req.get("sampler"),
        seed=stats.get("seed"),
        events=conv.tokens(message),
        end={**stats, "finish_reason": message.finish_reason},
        messages=history,
        max_new_tokens=req.get("max_new_tokens"),
        branch_index=message.branch_index,
    )
