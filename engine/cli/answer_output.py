"""How the CLI prints an answer: streamed as it comes (or one token a line with --show-probs), its calls with
what the model decided, one line of statistics on stderr; and the answer's length fitted to the context for
-n -1/-2. `generate`, `chat` and the tool loop (`engine.cli.mcp_chat`) print alike through these."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from engine.cli.input import UNTIL_FULL
from engine.events import Done, TokenEvent

if TYPE_CHECKING:
    from engine.engine import Engine
    from engine.request import GenerationRequest


def format_token_line(event: TokenEvent) -> str:
    """One token for --show-probs; its rank counts from 1 (the model's most likely token), as everywhere."""
    alts = ", ".join(f"{a.text!r} {a.prob:.3f}" for a in event.top_model if a.token_id != event.token_id)
    return f"{event.token_text!r:>16} p={event.prob:.3f} rank={event.rank + 1} H={event.entropy:.2f} | {alts}"


def stream_to(out: TextIO, engine: Engine, request: GenerationRequest, show_probs: bool,
              keep: list[TokenEvent] | None = None) -> Done:
    """Print a generation as it streams; return its Done (its token events added to `keep` when given)."""
    for event in engine.generate(request):
        if isinstance(event, Done):
            return event
        if keep is not None:
            keep.append(event)
        if show_probs:
            print(format_token_line(event), file=out, flush=True)
        else:
            out.write(event.text)
            out.flush()
    raise AssertionError("unreachable")


def fit_length(engine: Engine, request: GenerationRequest, max_new_tokens: int) -> GenerationRequest:
    """`request` with its answer length: `max_new_tokens`, or with -n -1 (llama.cpp's "no limit") every
    token the context has room for after the prompt."""
    if max_new_tokens not in UNTIL_FULL:
        return request
    from dataclasses import replace

    from engine.decode.loop import prompt_ids_for
    from engine.errors import ContextLengthError

    prompt = len(prompt_ids_for(engine.tokenizer, request))
    room = engine.info.context_length - prompt
    if room < 1:
        raise ContextLengthError(f"the prompt has {prompt} tokens and fills the model's context of "
                                 f"{engine.info.context_length}; nothing is left to generate")
    return replace(request, max_new_tokens=room)


TOOLS_TOP_N = 20  # alternatives kept per token with --tools, so the tool names' distribution can be read


def tool_fields(args: argparse.Namespace) -> dict[str, object]:
    """The request's tools, tool choice and alternatives kept, from --tools/--tool-choice (none without them)."""
    if getattr(args, "tool_specs", None) is None:
        return {}
    return {"tools": args.tool_specs, "tool_choice": args.tool_choice_spec, "top_n": max(args.top_n, TOOLS_TOP_N)}


def print_tool_calls(out: TextIO, events: Sequence[TokenEvent], done: Done, request: GenerationRequest) -> None:
    """Each call the answer made, with what the model decided (engine.tools.confidence), a few lines each."""
    if not request.tools:
        return
    from engine.tools.confidence import call_confidence

    choice = request.tool_choice_spec
    allowed = [choice.name] if choice.mode == "named" else [t.name for t in request.tools]
    calls = done.stats.tool_calls
    if not calls:
        print(f"[no tool call in this answer ({done.stats.finish_reason})]" if choice.calls
              else "[tool_choice none: no calls read]", file=sys.stderr)
        return
    for confidence in call_confidence(events, calls, allowed):
        print(confidence.describe(), file=out, flush=True)


def print_stats(done: Done) -> None:
    s = done.stats
    seed = f"seed {s.seed}" if s.seed >= 0 else "no seed (the server sampled without one)"
    print(
        f"[{s.generated_tokens} tokens, {s.finish_reason}; first token {s.time_to_first_token_s * 1000:.0f} ms, "
        f"{s.decode_tokens_per_s:.1f} tok/s; prompt {s.prompt_tokens} ({s.reused_tokens} reused); {seed}]",
        file=sys.stderr,
    )
    if s.finish_reason == "error":
        print(f"error: the answer stopped after {s.generated_tokens} tokens (kept above): {s.error}", file=sys.stderr)
    elif s.error:
        print(f"note: {s.error}", file=sys.stderr)  # e.g. what a server said with an empty answer
    if s.constraint_status and s.constraint_status != s.error:
        cost = f"; it cost {s.constraint_logprob:.2f} nats of log-probability" if s.constraint_logprob is not None else ""
        print(f"constraint: {s.constraint_status}{cost}", file=sys.stderr)
