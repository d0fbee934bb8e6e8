"""CLI flags for every sampler setting, under llama.cpp's names (`--temp`, `--repeat-penalty`, `-s`, `-l`, ...)
with our older long names kept as aliases, and the value the flags, --settings-json and the defaults make.

Every sampler flag defaults to None ("not given"): the settings are `engine.DEFAULT_SAMPLER` (llama.cpp's
defaults: the engine's single source, shared with the window), then what a --settings-json file says, then what
was typed, so a flag typed with the default's value still overrides the file. `SamplerSettings` checks
the result itself, so the messages are the same everywhere.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.cli.text_files import read_text_file
from engine.constraints.spec import Constraint, ConstraintError
from engine.errors import UsageError
from engine.json_depth import json_depth
from engine.sampling.llamacpp_json import LLAMACPP_DEFAULT_SEED, parse_llamacpp_json
from engine.sampling.registry import CONTROLS
from engine.sampling.settings import DEFAULT_SAMPLER, STAGE_NAMES, SamplerSettings

DEFAULT_MAX_NEW_TOKENS = 256
DEFAULT_TOP_N = 5  # alternatives shown per token
MAX_TOKEN_ID = 2**31 - 1  # llama_token is int32; a larger id can be no model's token
MAX_SETTINGS_FILE_BYTES = 1 << 20
MAX_JSON_DEPTH = 64  # a settings object is a few levels deep; Python's parser recurses once per level

# (flags, SamplerSettings field, type, help), from the stage registry's controls (engine.sampling.registry). The
# first flag is llama.cpp's name, the others aliases; a whole-number control takes an int.
SAMPLER_FLAGS: tuple[tuple[tuple[str, ...], str, type, str], ...] = tuple(
    (c.cli, c.field, int if c.decimals == 0 else float, c.cli_help) for c in CONTROLS.values() if c.cli
)

_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"'}
# llama.cpp's TOKEN_ID(+/-)BIAS: 15043+1, 15043-1, 15043-inf
_LLAMACPP_BIAS = re.compile(r"\s*(\d+)\s*([+-])\s*(\S.*)")


def add_sampler_flags(p: argparse.ArgumentParser) -> None:
    """Every sampler flag, the answer length and stop strings, the constraint flags and --settings-json."""
    d = DEFAULT_SAMPLER  # the engine's defaults (llama.cpp's), shared with the window
    p.add_argument("-n", "--predict", "--n-predict", "--max-new-tokens", dest="max_new_tokens", type=int, default=None,
                   metavar="N", help=f"tokens to generate at most; -1 = until the context is full "
                                     f"(default: {DEFAULT_MAX_NEW_TOKENS})")
    for flags, dest, kind, help_ in SAMPLER_FLAGS:
        p.add_argument(*flags, dest=dest, type=kind, default=None, metavar="N", help=f"{help_} (default: {getattr(d, dest)})")
    order = p.add_mutually_exclusive_group()
    order.add_argument("--samplers", default=None, metavar="NAMES",
                       help="sampler stage order, llama.cpp's names separated by ';' "
                            "(e.g. 'penalties;top_k;top_p;min_p;temperature')")
    order.add_argument("--sampler-seq", "--sampling-seq", dest="sampler_seq", default=None, metavar="CHARS",
                       help="sampler stage order as llama.cpp's letters, e.g. edskypmxt")
    order.add_argument("--order", default=None, metavar="NAMES",
                       help=f"sampler stage order in our names, comma-separated from: {','.join(STAGE_NAMES)}")
    p.add_argument("-s", "--seed", type=int, default=None, help="random seed; -1 = a random one (default)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-text token (run to -n)")
    p.add_argument("-r", "--reverse-prompt", "--stop", dest="stop", action="append", default=[], metavar="TEXT",
                   help="stop when the answer would contain TEXT (repeatable); the text is not printed")
    p.add_argument("--dry-sequence-breaker", dest="dry_sequence_breakers", action="append", default=None,
                   metavar="TEXT", help='DRY: a text that ends a repeat (repeatable; replaces the default \\n : " *; '
                                        '"none" for no breakers; \\n and \\t are understood)')
    p.add_argument("-l", "--logit-bias", dest="logit_bias", action="append", default=[], metavar="TOKEN_ID(+/-)BIAS",
                   help="add BIAS to a token's logit, as llama.cpp: 15043+1, 15043-1, 15043-inf bans it; also "
                        'ID=BIAS, and "text"=BIAS for every token of the text (repeatable)')
    p.add_argument("--banned-string", dest="banned_strings", action="append", default=[], metavar="TEXT",
                   help="a phrase the answer must not contain: the generation steps back and avoids it (repeatable)")
    c = p.add_mutually_exclusive_group()
    c.add_argument("-j", "--json-schema", default=None, metavar="SCHEMA",
                   help="the answer must be JSON valid against this JSON Schema, given as text, e.g. '{\"type\": \"object\"}'")
    c.add_argument("-jf", "--json-schema-file", default=None, metavar="FILE", help="as --json-schema, read from a file")
    c.add_argument("--grammar", default=None, metavar="GRAMMAR",
                   help="the answer must follow this grammar, given as text: llama.cpp GBNF (root ::= ...) or Lark (start: ...)")
    c.add_argument("--grammar-file", default=None, metavar="FILE", help="as --grammar, read from a file")
    c.add_argument("--regex", default=None, metavar="PATTERN", help="the whole answer must match this regular expression")
    p.add_argument("--settings-json", default=None, metavar="FILE",
                   help="sampler settings as llama.cpp server JSON (or a SillyTavern preset): n_predict, stop, "
                        "ignore_eos, n_probs, grammar and json_schema become the options of the same meaning; "
                        "flags typed here override the file")


@dataclass(frozen=True)
class FromSettingsJson:
    """What a --settings-json file holds, beyond the sampler settings: values of the CLI's own options."""

    base: SamplerSettings
    max_new_tokens: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    top_n: int | None = None
    constraint: Constraint | None = None


def resolve_sampling(args: argparse.Namespace) -> None:
    """Set `args.sampler`, and fill `max_new_tokens`, `stop`, `ignore_eos`, `top_n` and `constraint` in `args`
    from the flags, the --settings-json file and the defaults. Idempotent (the file is read and noted once).

    Raises:
        UsageError: any value or file that cannot be used, in one line.
    """
    if getattr(args, "sampler", None) is not None:
        return
    from_file = _read_settings_json(args.settings_json) if getattr(args, "settings_json", None) else None
    base = from_file.base if from_file else DEFAULT_SAMPLER
    given = _given_fields(args, base)
    try:
        args.sampler = base.with_(**given)
    except (TypeError, ValueError) as e:
        raise UsageError(str(e)) from None
    if args.max_new_tokens is None:
        args.max_new_tokens = (from_file and from_file.max_new_tokens) or DEFAULT_MAX_NEW_TOKENS
    if not args.stop and from_file:
        args.stop = list(from_file.stop)
    if from_file and from_file.ignore_eos:
        args.ignore_eos = True
    if hasattr(args, "top_n") and args.top_n is None:
        args.top_n = from_file.top_n if from_file and from_file.top_n is not None else DEFAULT_TOP_N
    args.constraint = constraint_from_args(args)
    if args.constraint is None and from_file is not None:
        args.constraint = from_file.constraint


def _given_fields(args: argparse.Namespace, base: SamplerSettings) -> dict[str, Any]:
    """The SamplerSettings fields the command line set (nothing for a flag not typed)."""
    out: dict[str, Any] = {dest: getattr(args, dest) for _, dest, _, _ in SAMPLER_FLAGS if getattr(args, dest) is not None}
    if args.seed is not None:
        out["seed"] = None if args.seed in (-1, LLAMACPP_DEFAULT_SEED) else args.seed  # llama.cpp's "random"
    breakers = args.dry_sequence_breakers
    if breakers is not None:
        out["dry_sequence_breakers"] = () if breakers == ["none"] else tuple(_unescape(b) for b in breakers)
    if args.logit_bias:
        out["logit_bias"] = tuple(parse_logit_bias(v) for v in args.logit_bias)
    if args.banned_strings:
        out["banned_strings"] = tuple(_unescape(b) for b in args.banned_strings)
    order = _order_from_args(args, {**{"mirostat": base.mirostat, "adaptive_target": base.adaptive_target}, **out})
    if order is not None:
        out["order"] = order
    return out


def _order_from_args(args: argparse.Namespace, values: dict[str, Any]) -> tuple[str, ...] | None:
    if args.order is not None:
        return tuple(s.strip() for s in args.order.split(",") if s.strip())
    if args.samplers is not None:
        option, samplers = "--samplers", [s.strip() for s in re.split(r"[;,]", args.samplers) if s.strip()]
    elif args.sampler_seq is not None:
        option, samplers = "--sampler-seq", args.sampler_seq.strip()
    else:
        return None
    # llama.cpp's own rules for its names and for mirostat / adaptive-p (engine.sampling.llamacpp_json).
    try:
        imported = parse_llamacpp_json({"samplers": samplers, "mirostat": values["mirostat"],
                                        "adaptive_target": values["adaptive_target"]})
    except ValueError as e:
        raise UsageError(f"{option} {getattr(args, option[2:].replace('-', '_'))!r}: {e}") from None
    if imported.ignored:
        raise UsageError(f"{option}: unknown stages: {'; '.join(imported.ignored)}; llama.cpp's names are "
                         "penalties, dry, top_n_sigma, top_k, typ_p, top_p, min_p, xtc, temperature, adaptive_p")
    for note in imported.notes:
        print(f"note: {option}: {note}", file=sys.stderr)
    return imported.sampler.order


def constraint_from_args(args: argparse.Namespace) -> Constraint | None:
    """The constraint -j/--json-schema, -jf/--json-schema-file, --grammar, --grammar-file or --regex asks for
    (checked now, before a model loads), or None.

    --json-schema and --grammar take the text itself, as llama.cpp's do. An older command line that gave
    them a file's path still works: a value that is no schema or grammar but names a file is read, with a note.

    Raises:
        UsageError: a file that cannot be read, or a schema, regex or grammar that cannot work (its words).
    """
    if getattr(args, "regex", None) is not None:
        return _constraint("--regex", "regex", args.regex)
    for option, kind in (("json_schema", "json_schema"), ("grammar", "gbnf")):
        flag = "--" + option.replace("_", "-")
        text = getattr(args, option, None)
        path = getattr(args, option + "_file", None)
        if path is not None:
            return _constraint(f"{flag}-file {path}", kind, read_text_file(path, f"{flag}-file"))
        if text is not None:
            if _looks_like_a_path(text, kind):
                print(f"note: {flag} takes the {'schema' if kind == 'json_schema' else 'grammar'} itself, as llama.cpp's "
                      f"does; read it from the file {text} (use {flag}-file for a file)", file=sys.stderr)
                return _constraint(f"{flag} {text}", kind, read_text_file(text, flag))
            return _constraint(flag, kind, text)
    return None


def _looks_like_a_path(text: str, kind: str) -> bool:
    if "\n" in text or not text.strip() or len(text) > 4096:
        return False
    if kind == "json_schema":
        try:
            json.loads(text)
            return False
        except (ValueError, RecursionError):
            pass
    elif "::=" in text:
        return False
    try:
        return Path(text).expanduser().is_file()
    except OSError:
        return False


def _constraint(where: str, kind: str, text: str) -> Constraint:
    try:
        return Constraint.regex(text) if kind == "regex" else Constraint(kind, text)
    except ConstraintError as e:
        raise UsageError(f"{where}: {e}") from None
    except RecursionError:
        raise UsageError(f"{where}: nested too deeply to read") from None


# Fields of llama.cpp's server JSON that are options of the CLI rather than sampler settings.
_CLI_FIELDS = ("ignore_eos", "n_probs", "grammar", "json_schema")


def _read_settings_json(path: str) -> FromSettingsJson:
    """A --settings-json file: its sampler settings, and the fields the CLI has options for.

    Notes about how fields were read, and every field not used, go to stderr (the ignored ones on one line).
    """
    where = f"--settings-json {path}"
    p = Path(path).expanduser()
    if p.is_file() and p.stat().st_size > MAX_SETTINGS_FILE_BYTES:
        raise UsageError(f"{where}: larger than 1 MiB; it should hold one JSON object of settings")
    text = read_text_file(path, "--settings-json")
    data = _load_json(text, where)
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected a JSON object of settings like {{\"temperature\": 0.8, \"top_k\": 40}}, "
                         f"got {type(data).__name__}")
    cli = {k: data.pop(k) for k in _CLI_FIELDS if k in data}
    try:
        imported = parse_llamacpp_json(data)
    except (TypeError, ValueError) as e:
        raise UsageError(f"{where}: {e}") from None
    ignored = list(imported.ignored)
    ignore_eos = cli.get("ignore_eos") is True
    if "ignore_eos" in cli and not isinstance(cli["ignore_eos"], bool):
        ignored.append(f"ignore_eos={cli['ignore_eos']!r} (not true or false)")
    top_n = cli.get("n_probs")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0):
        ignored.append(f"n_probs={top_n!r} (not a count)")
        top_n = None
    constraint = None
    if cli.get("json_schema") not in (None, {}):  # llama.cpp's default {} means none
        schema = cli["json_schema"]
        constraint = _constraint(f"{where}: json_schema", "json_schema", schema if isinstance(schema, str) else json.dumps(schema))
    elif isinstance(cli.get("grammar"), str) and cli["grammar"].strip():
        constraint = _constraint(f"{where}: grammar", "gbnf", cli["grammar"])
    for line in imported.notes:
        print(f"note: {where}: {line}", file=sys.stderr)
    if ignored:
        print(f"note: {where}: not used here: {', '.join(ignored)}", file=sys.stderr)
    return FromSettingsJson(imported.sampler, imported.max_new_tokens, imported.stop or (), ignore_eos, top_n, constraint)


def _load_json(text: str, where: str) -> Any:
    if json_depth(text) > MAX_JSON_DEPTH:
        raise UsageError(f"{where}: nested more than {MAX_JSON_DEPTH} levels deep; settings are a flat JSON object")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{where}: this is not JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    except RecursionError:
        raise UsageError(f"{where}: nested too deeply to read; settings are a flat JSON object") from None




def parse_logit_bias(value: str) -> tuple[int | str, float]:
    """llama.cpp's TOKEN_ID+BIAS / TOKEN_ID-BIAS (15043+1, 15043-inf), or ID=BIAS, or "text"=BIAS (the last '='
    separates); BIAS may be -inf or false (ban).

    Raises:
        UsageError: in words the user can act on.
    """
    example = "e.g. --logit-bias 15043+1, 15043-inf (ban), 15043=-5 or '\"hello\"=2'"
    key, sep, bias_text = value.rpartition("=")
    if not sep:
        m = _LLAMACPP_BIAS.fullmatch(value)
        if m is None:
            raise UsageError(f"--logit-bias needs TOKEN_ID+BIAS, TOKEN_ID-BIAS, ID=BIAS or \"text\"=BIAS ({example}), "
                             f"got {value!r}")
        key, sign, bias_text = m.groups()
        bias_text = ("-" if sign == "-" else "") + bias_text.strip()
    elif not key:
        raise UsageError(f"--logit-bias needs TOKEN_ID+BIAS, ID=BIAS or \"text\"=BIAS ({example}), got {value!r}")
    raw = bias_text.strip().lower()
    if raw in ("false", "-inf", "-infinity"):
        bias = -math.inf
    else:
        try:
            bias = float(raw)
        except ValueError:
            raise UsageError(f"--logit-bias {value!r}: the bias must be a number, -inf or false, got {bias_text!r}") from None
        if not math.isfinite(bias):
            raise UsageError(f"--logit-bias {value!r}: the bias must be a finite number, or -inf or false to ban the token")
    if len(key) >= 2 and key[0] == key[-1] == '"':
        return _unescape(key[1:-1]), bias
    if key.strip().lstrip("+-").isdigit():
        token = int(key)
        if not 0 <= token <= MAX_TOKEN_ID:
            raise UsageError(f"--logit-bias {value!r}: token id {key.strip()} is not a token id of any model "
                             f"(0 to {MAX_TOKEN_ID:,}); quote a text to bias its tokens: '\"{key.strip()}\"={bias_text}'")
        return token, bias
    return _unescape(key), bias  # unquoted text: the shell ate the quotes


def _unescape(text: str) -> str:
    """\\n, \\t, \\\\ and \\" as the characters they name (a shell cannot easily pass a newline)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in _ESCAPES:
            out.append(_ESCAPES[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def sampler_from_args(args: argparse.Namespace) -> SamplerSettings:
    """The sampler settings the command line, its --settings-json file and the defaults make (also fills in
    `max_new_tokens`, `stop`, `top_n` and `constraint` in `args`)."""
    resolve_sampling(args)
    return args.sampler
