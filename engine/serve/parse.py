"""A client's JSON body -> what the engine runs: a `GenerationRequest` with our `SamplerSettings`, checked.

Field names are OpenAI's (`/v1/chat/completions`, `/v1/completions`) plus llama.cpp server's extras under
llama.cpp's own names (`top_k`, `min_p`, `repeat_penalty`, `dry_*`, `xtc_*`, `mirostat*`, `samplers`,
`grammar`, `json_schema`, `n_probs`, `post_sampling_probs`, `n_predict`, `ignore_eos`). The sampler fields
are read by the project's one llama.cpp mapping (`engine.sampling.llamacpp_json.parse_llamacpp_json`), so a
name means here what it means in a pasted llama.cpp setup.

Completions also take `echo` with `logprobs` (the prompt's own log-probs, OpenAI's legacy shape), vLLM's
`prompt_logprobs`, `max_tokens: 0` (score only) and a list of prompts (`parse_requests`: one `ServedRequest`
per prompt); engine.serve.scoring answers them.

Chat takes `tools`, `tool_choice`, `parallel_tool_calls` and tool history (engine.serve.tool_calls).

Nothing is ignored in silence: an unknown field, or one we know but cannot honour (`functions`, `suffix`, image
parts, more alternatives than `MAX_TOP_LOGPROBS`), is a 400 that names it. Blocking (it tokenizes the prompt
and compiles a constraint): run it off the event loop.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from engine.backends.remote.server_params import PARAMETER_NAMES
from engine.constraints import Constraint, ConstraintError
from engine.decode.loop import prompt_ids_for
from engine.errors import EngineError
from engine.request import GenerationRequest, Message
from engine.sampling.dry import breaker_sequences
from engine.sampling.llamacpp_json import parse_llamacpp_json
from engine.sampling.settings import SamplerSettings
from engine.serve import fields as f
from engine.serve.errors import ApiError, bad_field, refused
from engine.serve.tool_calls import (check_tool_results, is_tool_message, plan_or_400, read_tool_fields,
                                     read_tool_message)
from engine.tokenizer import vocabulary_size
from engine.tools.render import ToolPlan
from engine.serve.limits import (MAX_DRY_BREAKER_CHARS, MAX_DRY_BREAKERS, MAX_MESSAGES, MAX_N, MAX_PROMPTS,
                                 MAX_STOP_CHARS, MAX_STOPS, MAX_TOP_LOGPROBS)

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
COMPLETION_KEYS = COMMON_KEYS | {"prompt", "logprobs", "echo", "suffix", "best_of", "prompt_logprobs"}
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
    aliases: tuple[str, ...] = ()  # other names the model answers to (`serve --alias`), llama.cpp server's -a


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
    echo: bool = False  # completions: the prompt comes back before the answer (with its log-probs if asked)
    prompt_logprobs: int | None = None  # vLLM's: the prompt's log-probs with this many alternatives each
    max_tokens: int = 1  # the answer's length as asked; 0: the prompt is only scored (`generation` is not run)
    prompt_index: int = 0  # which of the request's prompts this is (choices are numbered prompt * n + i)
    tools: ToolPlan | None = None  # chat with tools or tool history: how calls are written and read (tool_calls)

    @property
    def sampler(self) -> SamplerSettings:
        return self.generation.sampler


def parse_request(endpoint: Endpoint, body: dict[str, Any], ctx: ParseContext) -> ServedRequest:
    """Check `body` for `endpoint` and build the request (one prompt); raises ApiError (400/404) in words."""
    read = parse_requests(endpoint, body, ctx)
    if len(read) > 1:
        raise refused("prompt", "several prompts in one request are answered by parse_requests")
    return read[0]


def parse_requests(endpoint: Endpoint, body: dict[str, Any], ctx: ParseContext) -> list[ServedRequest]:
    """Check `body` for `endpoint` and build one request per prompt (chat: one); raises ApiError (400/404)."""
    allowed = CHAT_KEYS if endpoint == "chat.completions" else COMPLETION_KEYS
    unknown = sorted(k for k in body if k not in allowed and k not in SAMPLER_KEYS)
    if unknown:
        raise ApiError(400, f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}: this "
                            "server does not know it, and does not ignore what it does not know (docs/serve.md "
                            "lists the fields it takes)", param=unknown[0], code="unknown_parameter")
    f.finite_numbers(body, set(body))
    model = check_model(body, ctx.model, ctx.aliases)
    n = f.whole(body, "n", 1, MAX_N, 1) or 1
    stream = f.flag(body, "stream")
    include_usage = _include_usage(body, stream)
    f.flag(body, "cache_prompt", True)  # a hint llama.cpp clients send: the prompt's cache is always reused here
    f.text(body, "user")  # an end-user id for the client's own records: kept in the served exchange's body
    stop = _stops(body)
    echo, prompt_top = False, None
    prompts: list[tuple[str | None, tuple[int, ...] | None]]
    if endpoint == "chat.completions":
        tools, tool_choice = read_tool_fields(body)
        messages: tuple[Message, ...] | None = _messages(body)
        prompts = [(None, None)]
        top = _chat_logprobs(body)
        max_tokens = _max_tokens(body, ("max_completion_tokens", "max_tokens", "n_predict"))
    else:
        _refuse_completion_extras(body)
        messages = None
        prompts = _prompts(body)
        top = f.whole(body, "logprobs", 0, MAX_TOP_LOGPROBS)
        echo = f.flag(body, "echo")
        prompt_top = f.whole(body, "prompt_logprobs", 0, MAX_TOP_LOGPROBS)
        max_tokens = _max_tokens(body, ("max_tokens", "n_predict"), lowest=0)
        if stream and (echo or prompt_top is not None or len(prompts) > 1 or max_tokens == 0):
            what = ("echo" if echo else "prompt_logprobs" if prompt_top is not None
                    else "several prompts" if len(prompts) > 1 else "max_tokens 0")
            raise refused("stream", f"stream with {what} is not supported here: send it without stream (the "
                                    "whole answer comes at once)")
    n_probs = f.whole(body, "n_probs", 0, MAX_TOP_LOGPROBS)
    if n_probs is not None:
        top = max(top or 0, n_probs)
    post_sampling = f.flag(body, "post_sampling_probs")
    sampler = read_sampler(body)
    _look_up_dry_breakers(sampler, ctx)
    constraint = _constraint(body)
    ignore_eos = f.flag(body, "ignore_eos")
    top_n = max(ctx.top_n, top or 0)
    common: dict[str, Any] = dict(sampler=sampler, stop=stop, top_n=top_n, record_stages=ctx.record_stages, constraint=constraint,
                  ignore_eos=ignore_eos)
    if messages is not None:
        common.update(tools=tools, tool_choice=tool_choice)
    read: list[ServedRequest] = []
    for index, (prompt, given_ids) in enumerate(prompts):
        where = "messages" if messages is not None else "prompt" if len(prompts) == 1 else f"prompt[{index}]"
        try:
            if messages is not None:
                probe = GenerationRequest(messages=messages, **common)
            elif given_ids is not None:
                probe = GenerationRequest(prompt_ids=given_ids, **common)
            else:
                probe = GenerationRequest(prompt=prompt, **common)
            ids = tuple(prompt_ids_for(ctx.tokenizer, probe))
            plan = plan_or_400(ctx.tokenizer, probe) if messages is not None else None
        except ApiError:
            raise
        except (EngineError, TypeError, ValueError) as e:
            raise ApiError(400, f"{where}: {e}" if len(prompts) > 1 else str(e), param=where) from None
        max_new = _fit(len(ids), max_tokens, ctx.context_length, where if len(prompts) > 1 else "messages")
        # A local model continues the ids read here (its template is not rendered twice); a model on a server gets
        # what the client sent, so the server can apply its own template.
        # With tools the engine gets the messages: its decode loop makes the tools' plan and grammar from them.
        if (ctx.runs_locally or messages is None and prompt is None) and not probe.tools:
            generation = dataclasses.replace(probe, messages=None, prompt=None, prompt_ids=ids, max_new_tokens=max_new)
        else:
            generation = dataclasses.replace(probe, max_new_tokens=max_new)
        read.append(ServedRequest(endpoint, model, generation, messages, prompt, ids, n, stream, include_usage, top,
                                  post_sampling, echo=echo, prompt_logprobs=prompt_top,
                                  max_tokens=max_new if max_tokens != 0 else 0, prompt_index=index, tools=plan))
    return read


def check_model(body: dict[str, Any], served: str, aliases: tuple[str, ...] = ()) -> str:
    """The model the client named (the served one when it named none, or one of its `aliases`: the name as the
    client gave it, as llama.cpp's server answers with its alias); 404 for any other."""
    name = f.text(body, "model")
    if name is None or name == "" or name == served:
        return served
    if name in aliases:
        return name
    also = f" (or {', '.join(map(repr, aliases))})" if aliases else ""
    shown = repr(name)
    shown = shown[:60] + "..." if len(shown) > 60 else shown
    raise ApiError(404, f"the model {shown} does not exist here; this server serves {served!r}{also} (GET "
                        "/v1/models; `logitlab-cli serve --alias NAME` makes it answer to another name)",
                   param="model", code="model_not_found")


def read_sampler(body: dict[str, Any]) -> SamplerSettings:
    """The sampler fields of `body` as our settings, through the project's llama.cpp mapping."""
    given = {k: v for k, v in body.items() if k in SAMPLER_KEYS and v is not None}
    _dry_breakers(given.get("dry_sequence_breakers"))
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


def _dry_breakers(value: Any) -> None:
    """Each breaker costs a scan of the vocabulary before the first token: at most MAX_DRY_BREAKERS of them
    (the sampler settings refuse more too; this says it in the field's words, before anything is built)."""
    if isinstance(value, str) and value.startswith("["):
        return  # SillyTavern's JSON list in a string: read (and checked) by the llama.cpp mapping
    if not isinstance(value, list):
        return  # absent, or not a list: the mapping says what it wants
    if len(value) > MAX_DRY_BREAKERS or any(isinstance(b, str) and len(b) > MAX_DRY_BREAKER_CHARS for b in value):
        raise bad_field("dry_sequence_breakers", f"dry_sequence_breakers takes at most {MAX_DRY_BREAKERS} strings of "
                                                 f"at most {MAX_DRY_BREAKER_CHARS} characters, got {len(value):,} "
                                                 "strings")


def _look_up_dry_breakers(sampler: SamplerSettings, ctx: ParseContext) -> None:
    """Find DRY's breakers in the vocabulary here, on the server's thread: the chain looks them up at its first
    pick, on the model's thread, from a cache per tokenizer and breaker set that this fills, so the model never
    waits for it and a client that leaves meanwhile costs the model nothing (a cache miss, e.g. a model whose
    logits are padded past the tokenizer, only does the lookup there as before)."""
    if not (ctx.runs_locally and sampler.dry_multiplier > 0 and sampler.dry_penalty_last_n != 0
            and sampler.dry_sequence_breakers):
        return
    n_vocab = vocabulary_size(ctx.tokenizer)
    if n_vocab:
        breaker_sequences(ctx.tokenizer, sampler.dry_sequence_breakers, n_vocab)


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


def _refuse_completion_extras(body: dict[str, Any]) -> None:
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
        if is_tool_message(m):  # a tool result, or an assistant message with calls (engine.serve.tool_calls)
            out.append(read_tool_message(m, where, _content))
            continue
        if not isinstance(role, str) or role not in _ROLES:  # a list or object is no role (and unhashable)
            what = ("the function role is OpenAI's deprecated form: send tool messages with tool_call_id"
                    if role == "function" else "roles are system, developer, user, assistant and tool")
            shown = repr(role)
            raise refused(f"{where}.role", f"{where} has role {shown[:40]}{'...' if len(shown) > 40 else ''}: {what}")
        extra = sorted(set(m) - {"role", "content", "name"})
        if extra:
            raise refused(where, f"{where} has {', '.join(map(repr, extra))}, which this server does not support")
        out.append({"role": _ROLES[role], "content": _content(m.get("content"), where)})
    check_tool_results(out)
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


def _prompts(body: dict[str, Any]) -> list[tuple[str | None, tuple[int, ...] | None]]:
    """The prompts: a text, token ids, or a list of at most MAX_PROMPTS of them (each (text, None) or (None, ids))."""
    value = body.get("prompt")
    one = _one_prompt(value, "prompt")
    if one is not None:
        return [one]
    if isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
        if len(value) > MAX_PROMPTS:
            raise bad_field("prompt", f"prompt has {len(value):,} prompts; this server takes at most {MAX_PROMPTS} in "
                                      "one request (send the rest in another)")
        read = [_one_prompt(p, f"prompt[{i}]") for i, p in enumerate(value)]
        for i, r in enumerate(read):
            if r is None:
                raise bad_field(f"prompt[{i}]", f"prompt[{i}] must be a string or a non-empty list of token ids")
        return [r for r in read if r is not None]
    raise bad_field("prompt", "prompt must be a string, a non-empty list of token ids, or a list of those")


def _one_prompt(value: Any, where: str) -> tuple[str | None, tuple[int, ...] | None] | None:
    if isinstance(value, str):
        return value, None
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return None, tuple(value)
    return None


def _max_tokens(body: dict[str, Any], names: tuple[str, ...], lowest: int = 1) -> int | None:
    """The first of `names` given; every one given is checked (a bad `n_predict` beside `max_tokens` is a 400).
    `lowest` 0: `max_tokens: 0` only scores the prompt (completions; OpenAI's name only, as vLLM takes it)."""
    read: list[int | None] = []
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if name == "n_predict" and type(value) in (int, float) and value in (-1, -2):
            read.append(None)  # llama.cpp: no limit (until the context is full)
        else:
            read.append(f.whole(body, name, lowest if name == "max_tokens" else 1, 2**31 - 1))
    return read[0] if read else None


def _fit(prompt_len: int, max_tokens: int | None, context: int, where: str = "messages") -> int:
    """The answer's length: as asked, or what the context has room for; 400 when it does not fit. `max_tokens`
    0 (score the prompt only) needs the prompt within the context, and gives 1 (the request is not run)."""
    if not context:
        return (max_tokens or 256) if max_tokens != 0 else 1
    room = context - prompt_len
    if max_tokens == 0 and room >= 0:
        return 1
    if room < 1:
        said = f"{where}: the prompt" if where != "messages" else "the prompt"
        raise ApiError(400, f"{said} has {prompt_len:,} tokens and fills the model's context of {context:,}",
                       param=where, code="context_length_exceeded")
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
