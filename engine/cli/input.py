"""What the user typed on the command line, checked before any model loads.

A model takes seconds to load; a typo must not cost that, and must never end
in a traceback. Every check here raises `UsageError` with one line naming the
option and what to do, and none of them imports torch or touches a model file
beyond reading its name. Text comes in as the user's bytes: arguments that are
not valid UTF-8 (Python hands them over as lone surrogates), prompt files and
stdin are decoded strictly, so a bad byte is reported where it is.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from engine.backends.select import checks_torch_device, device_refusal, offload_refusal
from engine.cli.text_files import bad_utf8, read_stdin, read_text_file
from engine.devices import check_device_name
from engine.errors import UsageError
from engine.runtime_settings import RuntimeSettings
from engine.sampling.settings import SamplerSettings

if TYPE_CHECKING:
    from engine.tools.spec import ToolSpec

STDIN = "-"
INT32_MAX = 2**31 - 1
UNTIL_FULL = (-1, -2)  # -n: llama.cpp's "no limit" and "until the context is filled"
# Every whole-number option of the commands (dest -> lowest, highest), checked before a model loads, so a
# value no run could use (2**31 tokens, a million beams) is one line instead of a crash or a huge allocation.
# The runtime settings' ranges (threads, context, GPU layers, batch) are RuntimeSettings' own, shared with
# the window. Sampler values are SamplerSettings' to check.
COUNT_RANGES: dict[str, tuple[int, int]] = {
    "max_new_tokens": (1, INT32_MAX),
    "top_n": (0, 1000),  # GenerationRequest's range
    "num_beams": (1, 256),
    "num_return_sequences": (1, 256),
    "batch_size": (1, 4096),
    "position": (1, INT32_MAX),
}


def option_name(dest: str) -> str:
    return "--" + dest.replace("_", "-")




def check_utf8_args(args: argparse.Namespace) -> None:
    """UsageError for the first string option that is not valid UTF-8 (the tokenizer could not take it)."""
    for dest, value in vars(args).items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and (where := bad_utf8(item)):
                raise UsageError(f"{option_name(dest)} is not valid UTF-8 ({where}); check the terminal's encoding")








def _strip_final_newline(text: str) -> str:
    # A file or a pipe ends its last line with a newline that nobody means as part of the prompt.
    return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text


def resolve_text(value: str | None, file: str | None, option: str, stdin: BinaryIO | None = None,
                 allow_stdin: bool = True) -> str | None:
    """The text given inline, as `-` (stdin) or in a file; at most one of `value` and `file` is set."""
    if value is not None and file is not None:
        raise UsageError(f"give either {option} or {option}-file, not both")
    if file is not None:
        if file == STDIN:
            value = STDIN
        else:
            return _strip_final_newline(read_text_file(file, f"{option}-file"))
    if value == STDIN:
        if not allow_stdin:
            raise UsageError(f"{option}: chat reads its turns from standard input; put the text in a file "
                             f"and pass {option}-file PATH")
        return _strip_final_newline(read_stdin(stdin, option))
    return value


def check_output_file(path: str, option: str = "--output", not_same_as: str | None = None) -> None:
    """`path` can be created or overwritten as a file: its folder exists and is writable, it is not a folder."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise UsageError(f"{option} {path}: is a folder; name a file to write, e.g. {Path(path) / 'out.jsonl'}")
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"{option} {path}: the folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"{option} {path}: not writable here (permissions)")
    if not_same_as is not None and p.exists() and p.resolve() == Path(not_same_as).expanduser().resolve():
        raise UsageError(f"{option} {path}: is the input file; writing it would destroy the prompts")


def check_count(args: argparse.Namespace, dest: str, minimum: int, why: str = "", maximum: int | None = None) -> None:
    value = getattr(args, dest, None)
    if value is None:
        return
    if value < minimum:
        raise UsageError(f"{option_name(dest)} must be at least {minimum}, got {value}{why}")
    if maximum is not None and value > maximum:
        raise UsageError(f"{option_name(dest)} must be at most {maximum:,}, got {value:,}{why}")


def check_counts(args: argparse.Namespace) -> None:
    """Every whole-number option in COUNT_RANGES that `args` has, within its range."""
    for dest, (low, high) in COUNT_RANGES.items():
        if dest == "max_new_tokens" and getattr(args, "command", "") in ("generate", "chat") \
                and getattr(args, dest, None) in UNTIL_FULL:
            continue  # llama.cpp's -n -1: as many as the context has room for, decided once the prompt is known
        check_count(args, dest, low, maximum=high)


def check_offload(args: argparse.Namespace, backend: str | None) -> None:
    text = getattr(args, "offload", None)
    if text is None:
        return
    if (why := offload_refusal(backend)) is not None:
        raise UsageError(f"--{why}")
    if text.strip().lower() != "auto":
        from engine.offload.policy import parse_offload

        try:
            parse_offload(text)
        except ValueError as e:
            raise UsageError(f"--offload {text!r}: {e}") from None


def planned_backend(args: argparse.Namespace) -> str | None:
    """The backend `--model`/`--backend` will load with, found without loading (None when it cannot tell)."""
    from engine.backends.select import choose_backend, opens_nothing
    from engine.errors import ModelNotFoundError
    from engine.sources import resolve_spec

    if opens_nothing(args.backend):  # the mock: no model to resolve
        return args.backend
    try:
        kind = resolve_spec(args.model).kind
    except ModelNotFoundError as e:
        if args.model is None:  # the default model is missing: its own message says how to get it
            raise
        raise UsageError(f"--model: {e}") from None
    except Exception:  # noqa: BLE001 - e.g. the default model is not installed: load says how to get it
        kind = None
    try:
        return choose_backend(args.backend, kind)
    except ValueError as e:
        raise UsageError(f"--backend {args.backend}: {e}") from None


def check_device(args: argparse.Namespace, backend: str | None) -> None:
    if getattr(args, "device", None) is None:
        return
    args.device = check_device_name(args.device)
    if (why := device_refusal(backend)) is not None:
        raise UsageError(why)
    if args.device != "cpu" and checks_torch_device(backend):
        import torch  # the torch backend imports it next anyway

        from engine.devices import require_available

        require_available(torch.device(args.device))


def runtime_settings_from(args: argparse.Namespace) -> RuntimeSettings:
    """--threads, --threads-batch, --n-ctx, --n-gpu-layers, --batch-size as the engine's load settings."""
    values = {name: getattr(args, name, None) for name in RuntimeSettings.names()}
    try:
        return RuntimeSettings(**values)
    except ValueError as e:
        raise UsageError(str(e)) from None


def sampler_or_error(**values: Any) -> SamplerSettings:  # SamplerSettings' fields, checked by it
    try:
        return SamplerSettings(**values)
    except ValueError as e:
        raise UsageError(str(e)) from None


def check_args(args: argparse.Namespace, stdin: BinaryIO | None = None) -> None:
    """Check every value and path in `args`, reading prompt/system files and stdin into `args` in place, and
    resolving the sampler settings (`args.sampler`, engine.cli.sampling_args) and the chat template.

    Raises UsageError on the first problem; nothing here loads a model.
    """
    check_utf8_args(args)
    command = args.command
    prompt_from_stdin = False
    if hasattr(args, "attach"):  # generate, chat: each file read and checked now, before the model loads
        args.attachments = read_attachments(args.attach)
    if command == "generate":
        prompt_from_stdin = args.prompt == STDIN or args.prompt_file == STDIN
        args.prompt = resolve_text(args.prompt, args.prompt_file, "--prompt", stdin)
        if args.prompt is None and not args.attachments:
            raise UsageError("give a prompt: -p/--prompt TEXT, --prompt - (standard input) or -f/--file PATH")
        if args.attachments:
            from engine.documents import compose_message

            args.prompt = compose_message(args.prompt or "", args.attachments).text
    if hasattr(args, "system_file"):
        # chat reads its turns from stdin, and stdin can be read only once.
        args.system = resolve_text(args.system, args.system_file, "--system-prompt", stdin,
                                   allow_stdin=command != "chat" and not prompt_from_stdin)
    if hasattr(args, "settings_json"):  # generate, chat: the sampler flags, their settings file, the constraint
        from engine.cli.sampling_args import resolve_sampling

        resolve_sampling(args)
    if hasattr(args, "tools"):  # generate, chat: the tools file read and its schemas checked now
        check_tools(args)
    check_counts(args)
    if command == "generate" and args.num_beams > 1 and args.max_new_tokens in UNTIL_FULL:
        raise UsageError("-n -1 (until the context is full) is for sampling; with --num-beams give a number of tokens")
    if command == "generate" and args.num_return_sequences > args.num_beams:
        raise UsageError(f"--num-return-sequences ({args.num_return_sequences}) cannot exceed "
                         f"--num-beams ({args.num_beams})")
    if command == "lens":
        check_count(args, "top_k", 1, maximum=1000)
    if any(s == "" for s in getattr(args, "stop", None) or []):
        raise UsageError("--stop needs a non-empty string (an empty one would stop before the first token)")
    if command in ("batch", "compare") and args.seed in (-1, 4294967295):
        args.seed = None  # llama.cpp's "a random seed", as -s -1 in generate and chat
    if command in ("batch", "compare") and args.seed is not None:
        sampler_or_error(seed=args.seed)
    if command == "batch":
        args.prompts = read_prompts(args.input)
        check_output_file(args.output, "--output", not_same_as=args.input)
        sampler_or_error(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    if command in ("score", "compare", "lens") and getattr(args, "output", None) not in (None, STDIN):
        check_output_file(args.output, "--output")
    if command == "score":
        args.items = score_batch_items(args)  # --file X.jsonl: one text per line (engine/experiments/batch_score.py)
        args.text = score_text(args) if args.items is None else None
    if command == "lens" and args.position is not None and not args.chat:
        # A prompt has at most one token per UTF-8 byte, plus the few (BOS) a tokenizer puts in front: a
        # position past that is out for any model (nearer ones are checked once the prompt is tokenized).
        most = len(args.prompt.encode("utf-8")) + 4
        if args.position > most:
            raise UsageError(f"--position {args.position} is past the prompt's last token: {args.prompt!r} has at "
                             f"most {most} tokens (1 is the first predicted token; the default is the next after it)")
    resolve_chat_template(args)
    settings = runtime_settings_from(args)
    backend = planned_backend(args)
    check_device(args, backend)
    check_offload(args, backend)
    check_length_fits(args, settings)


def score_batch_items(args: argparse.Namespace) -> list | None:
    """`score --file X.jsonl`: its items, read and checked now (UsageError naming the line); None for one text."""
    from engine.experiments.batch_score import is_batch_file, read_items

    path, out = getattr(args, "file", None), getattr(args, "output", None)
    if path not in (None, STDIN) and out not in (None, STDIN) and Path(out).expanduser().exists() \
            and Path(out).expanduser().resolve() == Path(path).expanduser().resolve():
        raise UsageError(f"--output {out}: is the file being scored (--file); writing it would destroy the texts")
    if not is_batch_file(path):
        return None
    try:
        return read_items(args.file)
    except ValueError as e:
        raise UsageError(f"--file {e}") from None


def score_text(args: argparse.Namespace) -> str:
    """`score --text` or `--file` (its final newline dropped, as -f/--prompt-file's); UsageError when empty."""
    text = args.text if args.text is not None else _strip_final_newline(read_text_file(args.file, "--file"))
    if not text.strip():
        raise UsageError("the text to score is empty" + (f" (--file {args.file})" if args.text is None else ""))
    return text


def resolve_chat_template(args: argparse.Namespace) -> None:
    """--chat-template NAME|TEMPLATE|FILE or --chat-template-file FILE, read and tried on a sample chat now, so a
    missing file or a broken template is one line before the model loads; `args.chat_template` becomes the
    choice to use (a built-in's name, or the template's text)."""
    choice = getattr(args, "chat_template", None)
    path = getattr(args, "chat_template_file", None)
    if choice is None and path is None:
        return
    if choice is not None and path is not None:
        raise UsageError("give either --chat-template or --chat-template-file, not both")
    from engine.templates.choice import BUILTIN_TEMPLATES, ChatTemplateError, check_template, resolve_template

    option = "--chat-template-file" if path is not None else "--chat-template"
    if path is not None:
        text = read_text_file(path, option)
    else:
        assert choice is not None  # one of the two is given (checked above)
        looks_like_path = "{{" not in choice and "{%" not in choice and choice.strip().lower() not in BUILTIN_TEMPLATES
        if looks_like_path and ("/" in choice or "\\" in choice or Path(choice).suffix in (".jinja", ".j2", ".txt")):
            text = read_text_file(choice, option)  # "no such file" in one line, not "not a built-in"
        else:
            try:
                text, name = resolve_template(choice)
            except ChatTemplateError as e:
                raise UsageError(f"{option}: {e}") from None
            if name:
                return  # a built-in: used by name, so the model says "ChatML (built-in)"
    try:
        check_template(text)
    except ChatTemplateError as e:
        raise UsageError(f"{option}: {e}") from None
    args.chat_template = text
    args.chat_template_file = None


def check_length_fits(args: argparse.Namespace, settings: RuntimeSettings) -> None:
    """--max-new-tokens (-n) that no context can hold: longer than -c, or than a GGUF file's own context."""
    max_new = getattr(args, "max_new_tokens", None)
    if max_new is None or max_new < 1:
        return
    if settings.n_ctx is not None:
        if max_new >= settings.n_ctx:
            raise UsageError(f"-n/--max-new-tokens {max_new:,} does not fit a context of {settings.n_ctx:,} tokens "
                             "(-c/--ctx-size) with the prompt; ask for fewer tokens or a larger context")
        return
    trained = _gguf_context_length(args)
    if trained and max_new >= trained:
        raise UsageError(f"-n/--max-new-tokens {max_new:,} does not fit the model's context of {trained:,} tokens "
                         "with the prompt; ask for fewer (-n -1: as many as fit)")


def _gguf_context_length(args: argparse.Namespace) -> int:
    """The context length a GGUF model's header states (0 when the model is no GGUF file or it cannot tell)."""
    from engine.sources import resolve_spec

    try:
        path = resolve_spec(args.model).path
        if path is None or not str(path).endswith(".gguf") or not Path(path).is_file():
            return 0
        from engine.backends.llamacpp.gguf_header import read_header

        return max(0, int(read_header(Path(path)).context_length or 0))
    except Exception:  # noqa: BLE001 - an unreadable file is the load's to report, in its words
        return 0


def read_attachments(paths: list[str]) -> list:
    """`--attach FILE ...`: each file as an engine.documents.Attachment, in order; UsageError naming the first
    that cannot be attached (engine/documents/read.py's checks)."""
    from engine.documents import DocumentError, read_attachment

    out = []
    for path in paths:
        try:
            out.append(read_attachment(path))
        except DocumentError as e:
            raise UsageError(f"--attach {e}") from None
    return out


def read_tools_file(path: str) -> tuple[ToolSpec, ...]:
    """`--tools FILE`: its tools as ToolSpecs, checked by engine.tools.spec (UsageError naming the field)."""
    import json

    from engine.tools.spec import ToolSpecError, parse_tools

    text = read_text_file(path, "--tools")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--tools {path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if isinstance(data, dict) and "tools" in data:  # a request body's shape, {"tools": [...]}
        data = data["tools"]
    if not isinstance(data, list):
        raise UsageError(f"--tools {path}: must hold a JSON list of tools "
                         '([{"type": "function", "function": {"name": ..., "parameters": {...}}}]), '
                         f"got {type(data).__name__}")
    if not data:
        raise UsageError(f"--tools {path}: the list of tools is empty")
    try:
        return parse_tools(data)
    except ToolSpecError as e:
        raise UsageError(f"--tools {path}: {e}") from None


def check_tools(args: argparse.Namespace) -> None:
    """--tools and --tool-choice: `args.tool_specs` (the checked tools) and `args.tool_choice_spec` set, or None
    and None without --tools; what cannot go with tools refused in words."""
    args.tool_specs, args.tool_choice_spec = None, None
    if getattr(args, "mcp_config", None) is not None:  # tools from MCP servers: engine/cli/mcp_args.py
        from engine.cli.mcp_args import check_mcp_args

        return check_mcp_args(args)
    args.mcp = None
    if args.tools is None:
        if args.tool_choice is not None:
            raise UsageError("--tool-choice needs --tools FILE (the tools to choose from)")
        return
    from engine.tools.spec import ToolSpecError, parse_tool_choice

    specs = read_tools_file(args.tools)
    try:
        choice = parse_tool_choice(args.tool_choice or "auto", specs)
    except ToolSpecError as e:
        raise UsageError(f"--tool-choice {args.tool_choice}: {e}") from None
    if choice.calls and getattr(args, "constraint", None) is not None:
        raise UsageError("--tools cannot be combined with --json-schema, --grammar or --regex: with tools the "
                         "answer is kept to text or a valid call (or give --tool-choice none)")
    if getattr(args, "num_beams", 1) > 1:
        raise UsageError("--tools is for sampling; beam search (--num-beams) does not read tool calls")
    args.tool_specs, args.tool_choice_spec = specs, choice


def read_prompts(path: str) -> list[str]:
    """`batch --input`: one prompt per non-empty line."""
    text = read_text_file(path, "--input")
    prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise UsageError(f"--input {path}: has no prompts (one per line)")
    return prompts
