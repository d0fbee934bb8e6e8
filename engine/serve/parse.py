"""A client's JSON body -> what the engine runs: a `GenerationRequest` with our `SamplerSettings`, checked.

Field names are OpenAI's (`/v1/chat/completions`, `/v1/completions`) plus llama.cpp server's extras under
llama.cpp's own names (`top_k`, `min_p`, `repeat_penalty`, `dry_*`, `xtc_*`, `mirostat*`, `samplers`,
`grammar`, `json_schema`, `n_probs`, `post_sampling_probs`, `n_predict`, `ignore_eos`). The sampler fields
are read by the project's one llama.cpp mapping (`engine.sampling.llamacpp_json.parse_llamacpp_json`), so a
name means here what it means in a pasted llama.cpp setup.

Nothing is ignored in silence: an unknown field, or one we know but cannot honour (`tools`, `echo`, image
parts, more alternatives than `MAX_TOP_LOGPROBS`), is a 400 that names it. Blocking (it tokenizes the prompt
and compiles a constraint): run it off the event loop.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from engine.backends.remote.server_params import PARAMETER_NAMES
from engine.constraints import Constraint, ConstraintError
from engine.decode import prompt_ids_for
from engine.errors import EngineError
from engine.request import GenerationRequest, Message
from engine.sampling.llamacpp_json import parse_llamacpp_json
from engine.sampling.settings import SamplerSettings
from engine.serve import fields as f
from engine.serve.errors import ApiError, bad_field, refused
from engine.serve.limits import MAX_MESSAGES, MAX_N, MAX_STOP_CHARS, MAX_STOPS, MAX_TOP_LOGPROBS

Endpoint = Literal["chat.completions", "completions"]

# Sampler fields: OpenAI's, llama.cpp server's (the names our llama.cpp mapping sends), and ours.
SAMPLER_KEYS = frozenset(
    {"temperature", "top_p", "presence_penalty", "frequency_penalty", "seed", "logit_bias"}
    | set(PARAMETER_NAMES["llama.cpp"].values())
    | {fl.name for fl in dataclasses.fields(SamplerSettings) if fl.name != "custom_stages"}
)
COMMON_KEYS = frozenset({"model", "n", "stop", "stream", "stream_options", "user", "max_tokens", "grammar",
                         "json_schema", "n_probs", "post_sampling_probs", "n_predict", "ignore_eos", "cache_prompt"})
CHAT_KEYS = COMMON_KEYS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "response_format",
                           "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call"}
COMPLETION_KEYS = COMMON_KEYS | {"prompt", "logprobs", "echo", "suffix", "best_of"}
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass(frozen=True)
class ParseContext:
    """What parsing needs to know about the served model and what the server records."""

    model: str  # the served model's name (`GET /v1/models`)
    context_length: int  # 0: unknown
    tokenizer: Any  # engine.tokenizer.Tokenizer (thread-safe encode)
    runs_locally: bool  # False: a model on a server: the engine gets the messages, not their ids
    top_n: int = 20  # alternatives recorded per token for the record (the window), whatever the client asked
    record_stages: bool = True  # the sampler's stage records, for the record


@dataclass(frozen=True)
class ServedRequest:
    """One client request, read: what the engine runs and how the answer is written back."""

    endpoint: Endpoint
    model: str
    generation: GenerationRequest
    messages: tuple[Message, ...] | None  # chat: the client's messages (text parts joined)
    prompt: str | None  # completions: a text prompt
    prompt_ids: tuple[int, ...]  # the tokens the model continues
    n: int
    stream: bool
    include_usage: bool
    top_logprobs: int | None  # None: no log-probs in the answer; 0: only the chosen token's
    post_sampling_probs: bool  # llama.cpp: report the sampler's probabilities instead of the model's

    @property
    def sampler(self) -> SamplerSettings:
        return self.generation.sampler


def parse_request(endpoint: Endpoint, body: dict[str, Any], ctx: ParseContext) -> ServedRequest:
    """Check `body` for `endpoint` and build the request; raises ApiError (400/404) in words."""
    allowed = CHAT_KEYS if endpoint == "chat.completions" else COMPLETION_KEYS
    unknown = sorted(k for k in body if k not in allowed and k not in SAMPLER_KEYS)
    if unknown:
        raise ApiError(400, f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}: this "
                            "server does not know it, and does not ignore what it does not know (docs/serve.md "
                            "lists the fields it takes)", param=unknown[0], code="unknown_parameter")
    f.finite_numbers(body, set(body))
    model = check_model(body, ctx.model)
    n = f.whole(body, "n", 1, MAX_N, 1) or 1
    stream = f.flag(body, "stream")
    include_usage = _include_usage(body, stream)
    f.flag(body, "cache_prompt", True)  # a hint llama.cpp clients send: the prompt's cache is always reused here
    f.text(body, "user")  # an end-user id for the client's own records: kept in the served exchange's body
    stop = _stops(body)
    if endpoint == "chat.completions":
        _refuse_tools(body)
        messages: tuple[Message, ...] | None = _messages(body)
        prompt, given_ids = None, None
        top = _chat_logprobs(body)
        max_tokens = _max_tokens(body, ("max_completion_tokens", "max_tokens", "n_predict"))
    else:
        _refuse_completion_extras(body)
        messages = None
        prompt, given_ids = _prompt(body)
        top = f.whole(body, "logprobs", 0, MAX_TOP_LOGPROBS)
        max_tokens = _max_tokens(body, ("max_tokens", "n_predict"))
    n_probs = f.whole(body, "n_probs", 0, MAX_TOP_LOGPROBS)
    if n_probs is not None:
        top = max(top or 0, n_probs)
    post_sampling = f.flag(body, "post_sampling_probs")
    sampler = read_sampler(body)
    constraint = _constraint(body)
    ignore_eos = f.flag(body, "ignore_eos")
    top_n = max(ctx.top_n, top or 0)
    common: dict[str, Any] = dict(sampler=sampler, stop=stop, top_n=top_n, record_stages=ctx.record_stages, constraint=constraint,
                  ignore_eos=ignore_eos)
    try:
        if messages is not None:
            probe = GenerationRequest(messages=messages, **common)
        elif given_ids is not None:
            probe = GenerationRequest(prompt_ids=given_ids, **common)
        else:
            probe = GenerationRequest(prompt=prompt, **common)
        ids = tuple(prompt_ids_for(ctx.tokenizer, probe))
    except (EngineError, TypeError, ValueError) as e:
        raise ApiError(400, str(e), param="messages" if messages is not None else "prompt") from None
    max_new = _fit(len(ids), max_tokens, ctx.context_length)
    # A local model continues the ids read here (its template is not rendered twice); a model on a server gets
    # what the client sent, so the server can apply its own template.
    if ctx.runs_locally or messages is None and prompt is None:
        generation = dataclasses.replace(probe, messages=None, prompt=None, prompt_ids=ids, max_new_tokens=max_new)
    else:
        generation = dataclasses.replace(probe, max_new_tokens=max_new)
    return ServedRequest(endpoint, model, generation, messages, prompt, ids, n, stream, include_usage, top,
                         post_sampling)


def check_model(body: dict[str, Any], served: str) -> str:
    """The model the client named (the served one when it named none); 404 for any other."""
    name = f.text(body, "model")
    if name is None or name == "" or name == served:
        return served
    raise ApiError(404, f"the model {name!r} does not exist here; this server serves {served!r} (GET /v1/models)",
                   param="model", code="model_not_found")


def read_sampler(body: dict[str, Any]) -> SamplerSettings:
    """The sampler fields of `body` as our settings, through the project's llama.cpp mapping."""
    given = {k: v for k, v in body.items() if k in SAMPLER_KEYS and v is not None}
    if "logit_bias" in given and not isinstance(given["logit_bias"], (dict, list)):
        raise bad_field("logit_bias", f'logit_bias must be an object {{"token id": bias}}, got {given["logit_bias"]!r}')
    try:
        read = parse_llamacpp_json(given)
    except ValueError as e:
        raise ApiError(400, f"sampler settings: {e}", code="invalid_value") from None
    if read.ignored:
        raise refused(read.ignored[0].split("=")[0].split(" ")[0], "sampler settings this server cannot honour: "
                      + "; ".join(read.ignored))
    return read.sampler


def _include_usage(body: dict[str, Any], stream: bool) -> bool:
    options = f.obj(body, "stream_options")
    if options is None:
        return False
    if not stream:
        raise bad_field("stream_options", "stream_options is only allowed with stream: true")
    extra = sorted(set(options) - {"include_usage"})
    if extra:
        raise refused("stream_options", f"stream_options {', '.join(map(repr, extra))} is not supported here "
                                        "(only include_usage)")
    return f.flag(options, "include_usage")


def _stops(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_field("stop", f"stop must be a string or a list of strings, got {type(value).__name__}")
    if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops):
        raise bad_field("stop", f"stop takes at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters")
    return tuple(s for s in stops if s)


def _refuse_tools(body: dict[str, Any]) -> None:
    for name in ("tools", "functions"):
        if body.get(name):
            raise refused(name, f"{name} (tool and function calling) is not supported by this server; send the "
                                "request without them")
    for name in ("tool_choice", "function_call"):
        if body.get(name) not in (None, "none", "auto"):
            raise refused(name, f"{name} {body[name]!r} needs tool calling, which this server does not do")
    f.flag(body, "parallel_tool_calls")


def _refuse_completion_extras(body: dict[str, Any]) -> None:
    if f.flag(body, "echo"):
        raise refused("echo", "echo (the prompt's own log-probs in the answer) is not supported by this server; "
                              "`logitlab-cli score` scores a text")
    if f.text(body, "suffix"):
        raise refused("suffix", "suffix (fill in the middle) is not supported by this server")
    if (f.whole(body, "best_of", 1, MAX_N) or 1) > 1:
        raise refused("best_of", "best_of is not supported by this server; use n to get several answers")


def _messages(body: dict[str, Any]) -> tuple[Message, ...]:
    value = body.get("messages")
    if not isinstance(value, list) or not value:
        raise bad_field("messages", 'messages must be a non-empty list like [{"role": "user", "content": "Hi"}]')
    if len(value) > MAX_MESSAGES:
        raise bad_field("messages", f"messages has {len(value):,} entries; this server takes at most {MAX_MESSAGES:,}")
    out: list[Message] = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_field(where, f"{where} must be an object with a role and content")
        role = m.get("role")
        if role not in _ROLES:
            what = "tool results need tool calling, which this server does not do" if role in ("tool", "function") \
                else "roles are system, developer, user and assistant"
            raise refused(f"{where}.role", f"{where} has role {role!r}: {what}")
        extra = sorted(set(m) - {"role", "content", "name"})
        if extra:
            raise refused(where, f"{where} has {', '.join(map(repr, extra))}, which this server does not support")
        out.append({"role": _ROLES[role], "content": _content(m.get("content"), where)})
    return tuple(out)


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise refused(f"{where}.content[{j}]", f"{where}.content[{j}] is {kind!r}: this server reads text "
                                                       "parts only (no images or audio)")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_field(f"{where}.content", f"{where}.content must be a string or a list of text parts")


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    wanted = f.flag(body, "logprobs")
    top = f.whole(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not wanted:
        raise bad_field("top_logprobs", "top_logprobs needs logprobs: true")
    return (top or 0) if wanted else None


def _prompt(body: dict[str, Any]) -> tuple[str | None, tuple[int, ...] | None]:
    value = body.get("prompt")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # a batch of one prompt
    if isinstance(value, str):
        return value, None
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return None, tuple(value)
    if isinstance(value, list) and len(value) > 1 and all(isinstance(p, (str, list)) for p in value):
        raise refused("prompt", "a batch of several prompts is not supported here: send one request per prompt "
                                "(n gives several answers to one)")
    raise bad_field("prompt", "prompt must be a string or a non-empty list of token ids")


def _max_tokens(body: dict[str, Any], names: tuple[str, ...]) -> int | None:
    for name in names:
        if body.get(name) is not None:
            if name == "n_predict" and body[name] in (-1, -2):
                return None  # llama.cpp: no limit (until the context is full)
            return f.whole(body, name, 1, 2**31 - 1)
    return None


def _fit(prompt_len: int, max_tokens: int | None, context: int) -> int:
    """The answer's length: as asked, or what the context has room for; 400 when it does not fit."""
    if not context:
        return max_tokens or 256
    room = context - prompt_len
    if room < 1:
        raise ApiError(400, f"the prompt has {prompt_len:,} tokens and fills the model's context of {context:,}",
                       param="messages", code="context_length_exceeded")
    if max_tokens is None:
        return room
    if max_tokens > room:
        raise ApiError(400, f"the prompt has {prompt_len:,} tokens and max_tokens is {max_tokens:,}: "
                            f"{prompt_len + max_tokens:,} in all, past the model's context of {context:,}",
                       param="max_tokens", code="context_length_exceeded")
    return max_tokens


def _constraint(body: dict[str, Any]) -> Constraint | None:
    """response_format (OpenAI), grammar and json_schema (llama.cpp) as our constraint; at most one."""
    given = [k for k in ("response_format", "grammar", "json_schema") if body.get(k) is not None]
    fmt = f.obj(body, "response_format")
    if fmt is not None and fmt.get("type") == "text":
        given.remove("response_format")
    if len(given) > 1:
        raise bad_field(given[1], f"give one of {', '.join(given)}, not several")
    if not given:
        return None
    name = given[0]
    try:
        if name == "grammar":
            grammar = f.text(body, "grammar")
            return Constraint.gbnf(grammar) if grammar else None
        if name == "json_schema":
            schema = body["json_schema"]
            if not isinstance(schema, dict):
                raise bad_field("json_schema", "json_schema must be a JSON schema object")
            return Constraint.json_schema(schema) if schema else Constraint.any_json()
        assert fmt is not None
        kind = fmt.get("type")
        if kind == "json_object":
            schema = fmt.get("schema")  # llama-cpp-python's spelling of a schema
            return Constraint.json_schema(schema) if isinstance(schema, dict) and schema else Constraint.any_json()
        if kind == "json_schema":
            spec = fmt.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise bad_field("response_format", 'response_format json_schema needs {"json_schema": {"name": ..., '
                                                   '"schema": {...}}}')
            return Constraint.json_schema(schema) if schema else Constraint.any_json()
        raise bad_field("response_format", f"response_format type {kind!r} is not known; use text, json_object or "
                                           "json_schema")
    except ConstraintError as e:
        raise ApiError(400, f"{name}: {e}", param=name, code="invalid_value") from None
    except RecursionError:
        raise ApiError(400, f"{name} is nested too deeply to compile", param=name, code="invalid_value") from None
