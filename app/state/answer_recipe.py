"""Qt-free glue between the chat state and the engine's sampling experiments.

What a stored answer was generated with (prompt, settings, seed, model),
whether the loaded model is the one that made it, turning an experiment's
tokens into a new answer in the conversation (a branch), and an answer's
JSONL trace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from engine import Constraint, Engine, GenerationRequest, GenerationStats, ModelInfo, SamplerSettings, TokenEvent
from engine import experiments, reasoning, steering as steer

from app.state.notebook import Prompt, is_notebook, prompt_for
from app.state.conversation import Conversation, Message
from app.state.models.model_record import model_record

TOP_N = 20  # alternatives recorded per token, as in the chat
STATS_SKIP = ("text", "token_ids")
# What must match for a replay to reproduce an answer: the weights (spec, name, revision) and the
# code that runs them (backend, dtype). Device and context length do not change the draws' inputs enough
# to refuse; another backend or dtype computes other logits, which change a draw near a tie.
SAME_MODEL_FIELDS = ("spec", "name", "revision", "backend", "dtype")


@dataclass(frozen=True)
class AnswerRecipe:
    """Everything needed to generate an answer again: prompt, kept prefix, forced token, settings."""

    messages: tuple[dict[str, str], ...]  # a chat's (empty for a notebook)
    prefix: tuple[TokenEvent, ...]  # tokens a branch kept from its original
    forced: tuple[int, ...]  # the alternative a branch forced after them
    sampler: SamplerSettings  # with the run's seed filled in
    max_new_tokens: int
    stop: tuple[str, ...]
    model: dict[str, Any] | None = None  # the model that made the answer (MODEL_FIELDS), None if unrecorded
    text: str | None = None  # a notebook's text before the answer: a raw prompt, no template (app/state/notebook.py)
    constraint: Constraint | None = None  # the structured output it was held to (the grammar stage)
    steering: steer.Steering | None = None  # the control vectors it was steered by (None: none)

    def request(self, sampler: SamplerSettings | None = None) -> GenerationRequest:
        return GenerationRequest(
            **Prompt(self.messages, self.text).request_fields(),
            sampler=sampler or self.sampler,
            max_new_tokens=self.max_new_tokens,
            stop=self.stop,
            top_n=TOP_N,
            record_stages=True,
            assistant_prefix=tuple(t.token_id for t in self.prefix),
            forced_tokens=self.forced,
            constraint=self.constraint,
            steering=self.steering,
        )


def model_reasoning_format(engine: Engine) -> reasoning.ReasoningFormat:
    """How the loaded model writes reasoning (renders its template: call it off the UI thread).

    A server's vocabulary is not asked (that is HTTP). The chat, Compare and the context count all use it.
    """
    return reasoning.prompt_format(engine.tokenizer, vocabulary=engine.info.runs_locally)


def stored_constraint(request: dict[str, Any] | None) -> Constraint | None:
    """The structured-output constraint an answer's request document saved; ValueError when it cannot be read."""
    doc = (request or {}).get("constraint")
    if not doc:
        return None
    try:
        return Constraint.from_dict(doc)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"this answer's structured-output constraint cannot be read ({e})") from None


def stored_steering(request: dict[str, Any] | None, vectors: Callable[[str], Any] | None) -> steer.Steering | None:
    """The steering an answer's request document recorded, its vectors found by content hash in `vectors`
    (the Steering panel's `find`); None when it had none. ValueError in words when a vector is not available."""
    doc = (request or {}).get("steering")
    if not doc:
        return None
    if vectors is None:
        raise ValueError("this answer was steered, and its steering vectors are not at hand here: replay it from "
                         "the window, whose Steering panel keeps them")
    found = steer.Steering.from_dict(doc, vectors)  # SteeringError (a ValueError) names a vector not loaded
    return found if found.active else None


def answer_parent(conv: Conversation, message: Message) -> Message:
    if not message.is_assistant or message.parent_id is None:
        raise ValueError("choose an answer (an assistant message) to replay")
    return conv.messages[message.parent_id]


def prompt_history(conv: Conversation, message: Message) -> list[dict[str, str]]:
    """The messages `message` was generated from: earlier reasoning left out as it was then (`engine.reasoning`)."""
    fmt = reasoning.ReasoningFormat.from_dict((message.request or {}).get("reasoning"))
    return reasoning.prompt_history(conv.history(answer_parent(conv, message)), fmt)


def recipe_for(conv: Conversation, message: Message, vectors: Callable[[str], Any] | None = None) -> AnswerRecipe:
    """How `message` was generated, from what it stored; ValueError when it cannot be replayed.

    `vectors` finds a steering vector by content hash (`SteeringState.find`), for a steered answer."""
    history = prompt_history(conv, message)  # ValueError first when `message` is no answer
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
    recipe = AnswerRecipe(
        messages=tuple(history),
        prefix=prefix,
        forced=forced,
        sampler=sampler,
        max_new_tokens=int(req.get("max_new_tokens", 256)),
        stop=tuple(req.get("stop", ())),
        model=message.model,
        constraint=stored_constraint(req),
        steering=stored_steering(req, vectors),
    )
    if is_notebook(conv):  # its prompt is the text before the answer, as generated
        recipe = replace(recipe, messages=(), text=prompt_for(conv, answer_parent(conv, message)).text)
    return recipe


def describe_model(model: dict[str, Any] | ModelInfo | None) -> str:
    """A model as a person reads it: its name, then the backend and dtype that ran it."""
    doc = model.to_dict() if isinstance(model, ModelInfo) else (model or {})
    how = ", ".join(str(doc[k]) for k in ("backend", "dtype") if doc.get(k))
    return f"{doc.get('name') or doc.get('spec') or 'an unnamed model'}" + (f" ({how})" if how else "")


def other_model(recorded: dict[str, Any] | None, loaded: ModelInfo) -> str | None:
    """Why `loaded` cannot replay an answer `recorded` made, in words; None when it is the same model.

    A field either side did not record (older answers have no revision) does not count as a difference.
    An answer that recorded no model at all cannot be checked: None.
    """
    if not recorded:
        return None
    now = loaded.to_dict()
    differ = [k for k in SAME_MODEL_FIELDS if recorded.get(k) and now.get(k) and recorded[k] != now[k]]
    if not differ:
        return None
    made, there = describe_model(recorded), describe_model(loaded)
    if made == there:  # the same name, backend and dtype: say what else differs (another file, another commit)
        made += f" [{', '.join(f'{k} {recorded[k]}' for k in differ)}]"
        there += f" [{', '.join(f'{k} {now[k]}' for k in differ)}]"
    return (
        f"This answer was made by {made}, but {there} is loaded: a replay on another model "
        f"cannot reproduce it. Load {recorded.get('name') or recorded.get('spec')} to replay it."
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
    constraint: Constraint | None = None,
    reasoning_format: reasoning.ReasoningFormat | None = None,
    steering: steer.Steering | None = None,
) -> Message:
    """A new answer to `user` holding `events` (made active: the chat shows it, the old one stays a branch).

    `constraint` and `reasoning_format` go into its request document as the chat saves them, so a replay
    holds it to the same structured output and leaves earlier reasoning out the same way.
    """
    request: dict[str, Any] = {"sampler": sampler.to_dict(), "max_new_tokens": max_new_tokens, "stop": list(stop),
                               "top_n": TOP_N, "constraint": constraint.to_dict() if constraint is not None else None}
    if reasoning_format is not None:
        request["reasoning"] = reasoning_format.to_dict()
    if steering is not None and steering.active:  # as the chat records it: vectors by name and hash, strengths
        request["steering"] = steering.to_dict()
    answer = conv.add_message(user, "assistant", branch_index=branch_index)
    events = [replace(e, index=i) for i, e in enumerate(events)]
    conv.set_tokens(answer, events, "".join(e.text for e in events))
    conv.update_message(
        answer,
        request=request,
        model=model,
        finish_reason=stats.finish_reason if stats else "length",
        stats={k: v for k, v in stats.to_dict().items() if k not in STATS_SKIP} if stats else None,
    )
    conv.flush()
    return answer


def model_dict(engine: Engine) -> dict[str, Any]:
    return model_record(engine.info)


def trace_lines(conv: Conversation, message: Message, engine: Engine | None) -> list[dict[str, Any]]:
    """The JSONL trace of one stored answer (prompt ids when a model is loaded to tokenize the prompt)."""
    history = prompt_history(conv, message)
    prompt = prompt_for(conv, answer_parent(conv, message), history)  # a notebook's raw text, else the chat
    prompt_ids = prompt.token_ids(engine.tokenizer) if engine is not None else None
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
        # What `logitlab-cli replay` needs to run it as it ran: its stop strings and structured output.
        stop=list(req.get("stop") or []),
        **({"constraint": req["constraint"]} if req.get("constraint") else {}),
        branch_index=message.branch_index,
        # The steering it ran under (vectors by name and content hash, strengths, layer range), as recorded.
        **({"steering": req["steering"]} if req.get("steering") else {}),
    )
