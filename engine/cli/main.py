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
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TextIO

from engine.cli.input import bad_utf8, check_args, runtime_settings_from
from engine.cli.options import EXIT_USAGE, OneLineParser, add_model_args, add_sampling_args, add_tool_args
from engine.cli.sampling_args import sampler_from_args
from engine.cli.answer_output import fit_length, print_stats, print_tool_calls, stream_to, tool_fields
from engine.cli.research import add_batch_parser, cmd_batch, cmd_beams
from engine.cli.experiments import add_experiment_parsers, cmd_compare, cmd_score
from engine.cli.models import LIBRARY_COMMANDS, add_library_parsers
from engine.cli.lens import add_lens_parser, cmd_lens
from engine.cli.steer import add_steer_parser, add_steering_args, cmd_steer, steering_from_args
from engine.cli.model_diff import add_model_diff_parser, cmd_compare_models
from engine.cli.replay import add_audit_parser, add_replay_parser, cmd_audit, cmd_replay
from engine.cli.serve import add_serve_parser, cmd_serve
from engine.errors import EngineError
from engine.events import TokenEvent
from engine.sampling.settings import SamplerSettings

if TYPE_CHECKING:
    from engine.chat import ChatSession
    from engine.documents.attachment import Attachment
    from engine.engine import Engine
    from engine.request import GenerationRequest

EXIT_FAILED = 1  # the run started but did not finish (a server failed mid-answer): what arrived was printed


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
        from engine.templates.choice import use_chat_template

        try:
            use_chat_template(engine.tokenizer, args.chat_template)
        except BaseException:
            engine.close()
            raise
    return engine


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
        print_stats(done)
    return EXIT_FAILED if done.stats.finish_reason == "error" else 0


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


@dataclass
class _ChatState:
    """What the chat's commands change between turns: the sampler, the answer length, the probabilities shown,
    the conversation, and the attachments still to send (they go with the first message)."""

    session: ChatSession
    sampler: SamplerSettings
    max_new: int
    show_probs: bool
    attachments: list[Attachment]


def cmd_chat(args: argparse.Namespace, stdin: TextIO | None = None) -> int:
    from engine.chat import ChatSession
    from engine.reasoning import prompt_format

    stdin = stdin or sys.stdin
    if hasattr(stdin, "reconfigure"):
        # Undecodable bytes arrive as lone surrogates instead of killing the session; each line is checked below.
        stdin.reconfigure(errors="surrogateescape")
    sampler = sampler_from_args(args)
    steering = steering_from_args(args)  # the vector files read and checked before the model loads
    # The attachments are read and checked before the load; they go with the first message sent.
    state = _ChatState(ChatSession(system_prompt=args.system), sampler, args.max_new_tokens, args.show_probs,
                       list(args.attachments))
    with _load(args) as engine:
        print_attachment_tokens(engine, state.attachments)
        # Earlier answers' reasoning stays out of the next prompt the way this model's template wants.
        state.session.reasoning = prompt_format(engine.tokenizer, vocabulary=engine.info.runs_locally)
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
                if _chat_command(text[1:], state):
                    break
                continue
            _chat_turn(engine, args, state, text, steering)
    return 0


def _chat_command(command: str, state: _ChatState) -> bool:
    """Run one /command of the chat; True when it ends the chat."""
    cmd, _, rest = command.partition(" ")
    if cmd in ("quit", "exit", "q"):
        return True
    if cmd == "help":
        print(CHAT_HELP)
    elif cmd == "reset":
        state.session.reset()
        print("(conversation cleared)")
    elif cmd == "probs":
        state.show_probs = not state.show_probs
    elif cmd == "show":
        print(state.sampler.to_dict(), f"max_new_tokens={state.max_new}", f"system={state.session.system_prompt!r}")
    elif cmd == "set":
        _chat_set(rest.strip(), state)
    else:
        print(f"unknown command /{cmd}; /help lists them", file=sys.stderr)
    return False


def _chat_set(text: str, state: _ChatState) -> None:
    """/set NAME VALUE: the answer length, the system prompt or a sampler setting; a bad value is one line."""
    name, _, value = text.partition(" ")
    try:
        if name == "max_new_tokens":
            if int(value) < 1:
                raise ValueError(f"max_new_tokens must be at least 1, got {value}")
            state.max_new = int(value)
        elif name == "system":
            state.session.system_prompt = value or None
        elif name in {f.name for f in fields(SamplerSettings)}:
            state.sampler = state.sampler.with_(**{name: _coerce(name, value, getattr(state.sampler, name))})
        else:
            raise ValueError(f"unknown setting {name!r}")
        print(f"({name} = {value})")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)


def _chat_turn(engine: Engine, args: argparse.Namespace, state: _ChatState, text: str,
               steering: Any) -> None:
    """One message and its answer, streamed; Ctrl-C or an engine error ends the answer, not the chat."""
    if state.attachments:
        from engine.documents import compose_message

        text = compose_message(text, state.attachments).text
        state.attachments = []
    turn: dict[str, object] = {"top_n": args.top_n, **tool_fields(args)}
    request = state.session.request(text, sampler=state.sampler, max_new_tokens=max(state.max_new, 1),
                                    stop=tuple(args.stop), server_sampling=args.server_sampling,
                                    ignore_eos=args.ignore_eos, steering=steering, **turn)
    print("assistant> ", end="", flush=True)
    events: list[TokenEvent] = []
    try:
        request = fit_length(engine, request, state.max_new)
        done = stream_to(sys.stdout, engine, request, state.show_probs, events)
    except KeyboardInterrupt:
        print("\n(stopped)")
        return
    except EngineError as e:
        print(f"\nerror: {e}", file=sys.stderr)
        return
    print()
    print_tool_calls(sys.stdout, events, done, request)
    state.session.add_turn(text, done.stats.text)
    print_stats(done)


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
