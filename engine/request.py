"""A generation request: what to continue, how to sample, when to stop, what to report."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.constraints.spec import Constraint, ConstraintError
from engine.errors import TokenIdError
from engine.sampling.settings import SamplerSettings
from engine.steering.errors import SteeringError
from engine.steering.settings import Steering
from engine.tools.spec import ToolChoice, ToolSpec, ToolSpecError, check_message, parse_tool_choice, parse_tools

# {"role": "system"|"user"|"assistant"|"tool", "content": str}; an assistant message may carry OpenAI's
# "tool_calls", a tool message its "tool_call_id" (engine.tools.spec.check_message).
Message = dict[str, Any]

_WHAT = {
    "messages": 'e.g. [{"role": "user", "content": "Hi"}]',
    "prompt_ids": "token ids, e.g. [1, 2, 3]",
    "stop": 'texts, e.g. ["\\n\\n"]',
    "assistant_prefix": "token ids",
    "forced_tokens": "token ids",
}


@dataclass(frozen=True)
class GenerationRequest:
    """Exactly one of `prompt` (raw text), `messages` (chat) or `prompt_ids` is given.

    `assistant_prefix` are tokens of an answer already under way (continue a
    cut-off answer, or the kept part of a branch): they join the prompt and
    get no events. `forced_tokens` are emitted first instead of being
    sampled, with full inspection (branching from an alternative).
    """

    prompt: str | None = None
    messages: tuple[Message, ...] | None = None
    prompt_ids: tuple[int, ...] | None = None
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    top_n: int = 20
    record_stages: bool = False
    assistant_prefix: tuple[int, ...] = ()
    forced_tokens: tuple[int, ...] = ()
    ignore_eos: bool = False  # run to max_new_tokens (benchmarks, probing past the end)
    # Remote models only: True = the server samples (streaming, its top-N per token); False = we sample
    # from the server's top-N one step at a time. Other backends refuse True.
    server_sampling: bool = False
    # The answer must match this (JSON schema, regex, grammar, choice): the sampler's `grammar` stage masks
    # what it does not allow (engine.constraints). Checked when the constraint is made, before any model runs.
    constraint: Constraint | None = None
    # Control vectors added to the residual stream (engine.steering); None or an inactive Steering: none. A model
    # without the capability (a server) refuses an active one in words before anything runs.
    steering: Steering | None = None
    # An exact replay: compute the prompt's cache in these (computed, kept) pieces, as the original's was
    # (engine/cache_schedule.py; its fingerprint's `cache_schedule`). Used where the backend records its
    # schedule and the pieces describe exactly this prompt; otherwise the prompt is computed as usual.
    cache_schedule: tuple[tuple[int, int], ...] | None = None
    # Functions the model may call (OpenAI's tool shape, or engine.tools.ToolSpec), and which: "none", "auto",
    # "required", or one tool by name. Checked here in words; engine.tools renders them, constrains the
    # answer to text or a valid call and parses the calls (docs/tools.md).
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice | str | dict[str, Any] = "auto"

    def __post_init__(self) -> None:
        given = [x is not None for x in (self.prompt, self.messages, self.prompt_ids)]
        if sum(given) != 1:
            raise ValueError("give exactly one of prompt, messages or prompt_ids")
        if self.prompt is not None and not isinstance(self.prompt, str):
            raise TypeError(f"prompt must be text (str), got {type(self.prompt).__name__}")
        if not isinstance(self.sampler, SamplerSettings):
            hint = " (build it with SamplerSettings(**settings) or SamplerSettings.from_dict(settings))" \
                if isinstance(self.sampler, Mapping) else ""
            raise TypeError(f"sampler must be an engine.SamplerSettings, got {type(self.sampler).__name__}{hint}")
        for name in ("messages", "prompt_ids", "stop", "assistant_prefix", "forced_tokens"):
            value = getattr(self, name)
            if value is None:
                continue
            # A text or a mapping would be split into characters or keys by tuple(): say what is wanted instead.
            if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
                raise TypeError(f"{name} must be a list, got {type(value).__name__}: {_WHAT[name]}")
            if not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        for name in ("prompt_ids", "assistant_prefix", "forced_tokens"):
            for t in getattr(self, name) or ():
                if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                    raise TypeError(f"{name} must hold token ids (whole numbers, 0 or more), got {t!r}")
                if t < 0:
                    raise TokenIdError(f"{name} holds token id {int(t)}; token ids are 0 or more")
        if any(not isinstance(x, str) or not x for x in self.stop):
            raise TypeError(f"stop must be a list of non-empty texts, got {list(self.stop)!r}")
        for name in ("record_stages", "ignore_eos"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if self.cache_schedule is not None:
            try:
                pieces = tuple((int(c), int(k)) for c, k in self.cache_schedule)
            except (TypeError, ValueError):
                raise TypeError("cache_schedule must be (computed, kept) pairs of whole numbers") from None
            object.__setattr__(self, "cache_schedule", pieces)
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise ConstraintError(f"constraint must be an engine.constraints.Constraint, got {type(self.constraint).__name__}")
        if self.steering is not None and not isinstance(self.steering, Steering):
            raise SteeringError(f"steering must be an engine.steering.Steering, got {type(self.steering).__name__}")
        if not isinstance(self.server_sampling, bool):
            raise ValueError(f"server_sampling must be True or False, got {self.server_sampling!r}")
        if isinstance(self.top_n, bool) or not isinstance(self.top_n, int) or not 0 <= self.top_n <= 1000:
            raise ValueError(f"top_n must be an integer in [0, 1000], got {self.top_n!r}")
        if self.messages is not None:
            object.__setattr__(self, "messages", tuple(check_message(m) for m in self.messages))
        object.__setattr__(self, "tools", parse_tools(self.tools))
        object.__setattr__(self, "tool_choice", parse_tool_choice(self.tool_choice, self.tools))
        if self.tools and self.prompt_ids is not None or self.tools and self.prompt is not None:
            raise ToolSpecError("tools need a chat (messages): a raw prompt has no template to offer them in")
        if self.tools and self.tool_choice_spec.calls and self.constraint is not None:
            raise ToolSpecError("tools and a constraint on the answer (response_format) cannot be combined: with tools "
                                "the answer is constrained to text or a valid call; drop one of them, or set "
                                'tool_choice to "none"')

    @property
    def tool_choice_spec(self) -> ToolChoice:
        """`tool_choice` as checked (a ToolChoice after construction)."""
        choice = self.tool_choice
        return choice if isinstance(choice, ToolChoice) else parse_tool_choice(choice, self.tools)


def with_messages(messages: Sequence[Message], **kwargs: Any) -> GenerationRequest:  # kwargs: its other fields
    return GenerationRequest(messages=tuple(dict(m) for m in messages), **kwargs)
