"""Command line: `generate` (one shot, streamed), `chat` (multi-turn REPL), `info`.

Errors a user can act on (bad path, offline hub, invalid values, prompt too
long) are printed as one line on stderr with exit status 2, no traceback.
Every value and path is checked before the model loads (`engine.cli.input`).
Long prompts come from a file or stdin: `--prompt-file PATH`, `--prompt -`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, TextIO

from engine.cli.input import bad_utf8, check_args, runtime_settings_from
from engine.cli.options import EXIT_USAGE, OneLineParser, add_model_args, add_sampling_args, add_tool_args
from engine.cli.sampling_args import resolve_sampling
from engine.cli.research import add_batch_parser, cmd_batch, cmd_beams
from engine.cli.experiments import add_experiment_parsers, cmd_compare, cmd_score
from engine.cli.models import LIBRARY_COMMANDS, add_library_parsers
from engine.cli.lens import add_lens_parser, cmd_lens
from engine.cli.steer import add_steer_parser, add_steering_args, cmd_steer, steering_from_args
from engine.cli.model_diff import add_model_diff_parser, cmd_compare_models
from engine.cli.replay import add_audit_parser, add_replay_parser, cmd_audit, cmd_replay
from engine.cli.serve import add_serve_parser, cmd_serve
from engine.errors import EngineError
from engine.events import Done, TokenEvent
from engine.sampling.settings import SamplerSettings

if TYPE_CHECKING:
    from engine.documents.attachment import Attachment
    from engine.engine import Engine
    from engine.request import GenerationRequest

EXIT_FAILED = 1  # the run started but did not finish (a server failed mid-answer): what arrived was printed
UNTIL_FULL = (-1, -2)  # -n: llama.cpp's "no limit" and "until the context is filled"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="logitlab-cli", description="Logit Lab engine: generate, chat, inspect.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the engine does")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="continue a prompt and stream the text")
    g.add_argument("-p", "--prompt", default=None, help='the text to continue; "-" reads it from standard input')
    g.add_argument("-f", "--file", "--prompt-file", dest="prompt_file", default=None, metavar="FILE",
                   help="read the prompt from a UTF-8 file (for long prompts; its final newline is dropped, as llama.cpp's -f)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--num-beams", type=int, default=1, help="beam search with N beams (deterministic; ignores sampling options)")
    g.add_argument("--num-return-sequences", type=int, default=1, help="with --num-beams: how many beams to print")
    add_attach_arg(g, "the prompt")
    add_model_args(g)
    add_sampling_args(g)
    add_steering_args(g)
    add_tool_args(g)
    c = sub.add_parser("chat", help="interactive multi-turn chat (/help for commands)")
    add_attach_arg(c, "the first message you send")
    add_model_args(c)
    add_sampling_args(c)
    add_steering_args(c)
    add_tool_args(c)
    i = sub.add_parser("info", help="print what the model is")
    add_model_args(i)
    add_batch_parser(sub, add_model_args)
    add_experiment_parsers(sub, add_model_args)
    add_library_parsers(sub)
    add_lens_parser(sub, add_model_args)
    add_steer_parser(sub, add_model_args)
    add_model_diff_parser(sub, add_model_args)
    add_serve_parser(sub, add_model_args)
    add_replay_parser(sub, add_model_args)
    add_audit_parser(sub, add_model_args)
    return parser


def add_attach_arg(parser: argparse.ArgumentParser, where: str) -> None:
    parser.add_argument("--attach", action="append", default=[], metavar="FILE",
                        help=f"attach a text, Markdown, code, CSV/JSON or PDF file to {where} (repeatable; "
                             "docs/documents.md says how it is inserted)")


def print_attachment_tokens(engine: Engine, attachments: Sequence[Attachment]) -> None:
    """One stderr line per attached file: what it costs in the context (its block's tokens, name line and fences
    included), counted by the loaded model's tokenizer."""
    from engine.documents import attachment_block

    for a in attachments:
        tokens = len(engine.tokenizer.encode(attachment_block(a), add_special_tokens=False))
        print(f"[attached {a.name}: {a.size_text()}, {tokens:,} tokens]", file=sys.stderr, flush=True)


def sampler_from_args(args: argparse.Namespace) -> SamplerSettings:
    """The sampler settings the command line, its --settings-json file and the defaults make (also fills in
    `max_new_tokens`, `stop`, `top_n` and `constraint` in `args`)."""
    resolve_sampling(args)
    return args.sampler


def _load(args: argparse.Namespace) -> Engine:
    from engine.engine import Engine

    def progress(message: str, fraction: float | None) -> None:
        suffix = f" {fraction:.0%}" if fraction is not None else ""
        print(f"[{message}{suffix}]", file=sys.stderr, flush=True)

    engine = Engine.load(
        args.model,
        backend=args.backend,
        device=args.device,
        dtype=args.dtype,
        progress=progress,
        trust_remote_code=args.trust_remote_code,
        offload=args.offload,
        **runtime_settings_from(args).load_kwargs(),
    )
    if getattr(args, "chat_template", None):
        from engine.template_choice import use_chat_template

        try:
            use_chat_template(engine.tokenizer, args.chat_template)
        except BaseException:
            engine.close()
            raise
    return engine


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

    from engine.decode import prompt_ids_for
    from engine.errors import ContextLengthError

    prompt = len(prompt_ids_for(engine.tokenizer, request))
    room = engine.info.context_length - prompt
    if room < 1:
        raise ContextLengthError(f"the prompt has {prompt} tokens and fills the model's context of "
                                 f"{engine.info.context_length}; nothing is left to generate")
    return replace(request, max_new_tokens=room)


def cmd_generate(args: argparse.Namespace) -> int:
    from engine.request import GenerationRequest

    sampler = sampler_from_args(args)
    steering = steering_from_args(args)  # the vector files read and checked before the model loads
    if args.num_beams > 1:
        return cmd_beams(args)
    with _load(args) as engine:
        print_attachment_tokens(engine, args.attachments)
        common = dict(sampler=sampler, max_new_tokens=max(args.max_new_tokens, 1), stop=tuple(args.stop), top_n=args.top_n,
                      ignore_eos=args.ignore_eos)
        common["server_sampling"] = args.server_sampling  # remote models only (docs/remote.md)
        common["constraint"] = args.constraint  # --json-schema / --grammar / --regex, or the settings file's
        common["steering"] = steering  # --control-vector ...: refused in words by a model it does not fit
        common.update(tool_fields(args))
        if args.chat or "tools" in common:  # tools need a chat: --tools implies --chat
            messages = ([{"role": "system", "content": args.system}] if args.system else []) + [{"role": "user", "content": args.prompt}]
            request = GenerationRequest(messages=tuple(messages), **common)
        else:
            request = GenerationRequest(prompt=args.prompt, **common)
        request = fit_length(engine, request, args.max_new_tokens)
        events: list[TokenEvent] = []
        done = stream_to(sys.stdout, engine, request, args.show_probs, events)
        if args.show_probs:
            print(done.stats.text)
        else:
            print()
        print_tool_calls(sys.stdout, events, done, request)
        _print_stats(done)
    return EXIT_FAILED if done.stats.finish_reason == "error" else 0


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


def _print_stats(done: Done) -> None:
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


CHAT_HELP = """commands:
  /reset              forget the conversation
  /set NAME VALUE     change a setting, e.g. /set temperature 0.7, /set max_new_tokens 64, /set system Be brief.
  /show               print the current settings
  /probs              toggle per-token probabilities
  /quit               leave (Ctrl-D too); Ctrl-C stops an answer"""


def _coerce(name: str, value: str, current: object) -> int | float | str | tuple[str, ...] | None:
    if current is None or isinstance(current, int) and not isinstance(current, bool):
        if name == "seed" and value.lower() in ("none", "random", "-1"):  # -1: llama.cpp's random seed
            return None
        return int(value)
    if isinstance(current, float):
        return float(value)
    if isinstance(current, tuple):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return value


def cmd_chat(args: argparse.Namespace, stdin: TextIO | None = None) -> int:
    from engine.chat import ChatSession
    from engine.reasoning import prompt_format

    stdin = stdin or sys.stdin
    if hasattr(stdin, "reconfigure"):
        # Undecodable bytes arrive as lone surrogates instead of killing the session; each line is checked below.
        stdin.reconfigure(errors="surrogateescape")
    sampler = sampler_from_args(args)
    max_new, show_probs = args.max_new_tokens, args.show_probs
    steering = steering_from_args(args)  # the vector files read and checked before the model loads
    session = ChatSession(system_prompt=args.system)
    attachments = list(args.attachments)  # read and checked before the load; they go with the first message sent
    with _load(args) as engine:
        print_attachment_tokens(engine, attachments)
        # Earlier answers' reasoning stays out of the next prompt the way this model's template wants.
        session.reasoning = prompt_format(engine.tokenizer, vocabulary=engine.info.runs_locally)
        print(f"{engine.info.name} on {engine.info.backend}/{engine.info.device}. /help for commands.", file=sys.stderr)
        interactive = stdin.isatty()
        while True:
            if interactive:
                print("you> ", end="", flush=True)
            line = stdin.readline()
            if not line:
                break
            text = line.rstrip("\n")
            if where := bad_utf8(text):
                print(f"error: that line is not valid UTF-8 ({where}) and was skipped; the chat goes on", file=sys.stderr)
                continue
            if not text.strip():
                continue
            if text.startswith("/"):
                cmd, _, rest = text[1:].partition(" ")
                if cmd in ("quit", "exit", "q"):
                    break
                if cmd == "help":
                    print(CHAT_HELP)
                elif cmd == "reset":
                    session.reset()
                    print("(conversation cleared)")
                elif cmd == "probs":
                    show_probs = not show_probs
                elif cmd == "show":
                    print(sampler.to_dict(), f"max_new_tokens={max_new}", f"system={session.system_prompt!r}")
                elif cmd == "set":
                    name, _, value = rest.strip().partition(" ")
                    try:
                        if name == "max_new_tokens":
                            if int(value) < 1:
                                raise ValueError(f"max_new_tokens must be at least 1, got {value}")
                            max_new = int(value)
                        elif name == "system":
                            session.system_prompt = value or None
                        elif name in {f.name for f in fields(SamplerSettings)}:
                            sampler = sampler.with_(**{name: _coerce(name, value, getattr(sampler, name))})
                        else:
                            raise ValueError(f"unknown setting {name!r}")
                        print(f"({name} = {value})")
                    except ValueError as e:
                        print(f"error: {e}", file=sys.stderr)
                else:
                    print(f"unknown command /{cmd}; /help lists them", file=sys.stderr)
                continue
            if attachments and not text.startswith("/"):
                from engine.documents import compose_message

                text = compose_message(text, attachments).text
                attachments = []
            turn: dict[str, object] = {"top_n": args.top_n, **tool_fields(args)}
            request = session.request(text, sampler=sampler, max_new_tokens=max(max_new, 1), stop=tuple(args.stop),
                                      server_sampling=args.server_sampling, ignore_eos=args.ignore_eos,
                                      steering=steering, **turn)
            print("assistant> ", end="", flush=True)
            events: list[TokenEvent] = []
            try:
                request = fit_length(engine, request, max_new)
                done = stream_to(sys.stdout, engine, request, show_probs, events)
            except KeyboardInterrupt:
                print("\n(stopped)")
                continue
            except EngineError as e:
                print(f"\nerror: {e}", file=sys.stderr)
                continue
            print()
            print_tool_calls(sys.stdout, events, done, request)
            session.add_turn(text, done.stats.text)
            _print_stats(done)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from engine.cli.info import chat_template_line

    with _load(args) as engine:
        print("\n".join(engine.info.summary_lines()))
        print(chat_template_line(engine.tokenizer))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command in LIBRARY_COMMANDS:  # no model is loaded: the model options' checks do not apply
            return LIBRARY_COMMANDS[args.command](args)
        # Before anything heavy is imported: a typo is answered in a fraction of the model's load time.
        check_args(args)  # the sampler, --settings-json and the constraint too
        if args.command == "chat" and args.constraint is not None:
            raise ValueError("--json-schema, --grammar and --regex apply to `generate` (add --chat for a chat turn)")
        from engine.quiet import quiet_third_party

        quiet_third_party()
        commands = {"generate": cmd_generate, "chat": cmd_chat, "info": cmd_info, "batch": cmd_batch,
                    "score": lambda a: cmd_score(a, _load), "lens": lambda a: cmd_lens(a, _load), "compare": lambda a: cmd_compare(a, _load),
                    "steer": lambda a: cmd_steer(a, _load),
                    "serve": lambda a: cmd_serve(a, _load), "replay": lambda a: cmd_replay(a, _load),
                    "audit": lambda a: cmd_audit(a, _load),
                    "compare-models": lambda a: cmd_compare_models(a, _load)}
        if getattr(args, "mcp", None) is not None:  # --mcp-config: the tool loop (engine/cli/mcp_chat.py)
            from engine.cli.mcp_chat import cmd_with_mcp

            return cmd_with_mcp(args, _load)
        return commands[args.command](args)
    except (EngineError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except RecursionError:  # input nested deeper than the parsers can follow: refused in words, never a traceback
        print("error: the input is nested too deeply to read (a JSON schema, grammar or settings file?)", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`logitlab-cli generate ... | head`): not an error. Point stdout at
        # devnull so the interpreter's final flush does not raise again on exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
