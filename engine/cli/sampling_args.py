"""CLI flags for the sampler stages beyond the classic ones (DRY, top-nσ, dynamic temperature, mirostat,
adaptive-p, smoothing, logit bias, banned strings), named after `SamplerSettings`' fields (llama.cpp
server's names) and checked by `SamplerSettings` itself, so the messages are the same everywhere.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from engine.constraints.spec import Constraint, ConstraintError
from engine.sampling.llamacpp_json import parse_llamacpp_json
from engine.sampling.settings import SamplerSettings

# flag -> (field, type, help); defaults come from SamplerSettings.
_SIMPLE: tuple[tuple[str, str, type, str], ...] = (
    ("--penalty-last-n", "penalty_last_n", int, "how many recent tokens the penalties look at; -1 = all"),
    ("--dynatemp-range", "dynatemp_range", float, "dynamic temperature: vary it by up to this much with the entropy (0 = off)"),
    ("--dynatemp-exponent", "dynatemp_exponent", float, "dynamic temperature: how the entropy maps to it (1 = linear)"),
    ("--top-n-sigma", "top_n_sigma", float, "keep tokens within N standard deviations of the top logit (<= 0 = off)"),
    ("--dry-multiplier", "dry_multiplier", float, "DRY: penalty for extending a repeat (0 = off)"),
    ("--dry-base", "dry_base", float, "DRY: the penalty grows as base ** (repeat length - allowed length)"),
    ("--dry-allowed-length", "dry_allowed_length", int, "DRY: repeats up to this long are free"),
    ("--dry-penalty-last-n", "dry_penalty_last_n", int, "DRY: how many recent tokens to scan; -1 = all, 0 = off"),
    ("--mirostat", "mirostat", int, "mirostat version: 0 = off, 1 or 2"),
    ("--mirostat-tau", "mirostat_tau", float, "mirostat: target surprise in bits"),
    ("--mirostat-eta", "mirostat_eta", float, "mirostat: learning rate"),
    ("--adaptive-target", "adaptive_target", float, "adaptive-p: favour tokens near this probability (< 0 = off)"),
    ("--adaptive-decay", "adaptive_decay", float, "adaptive-p: moving-average decay, 0 to 0.99"),
    ("--smoothing-factor", "smoothing_factor", float, "quadratic sampling: how hard to smooth (0 = off)"),
    ("--smoothing-curve", "smoothing_curve", float, "quadratic sampling: 1 = plain quadratic, more = steeper tail"),
)

_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"'}


def add_sampler_flags(p: argparse.ArgumentParser) -> None:
    """The flags for every SamplerSettings field that has no older flag of its own."""
    d = SamplerSettings()
    for flag, dest, kind, help_ in _SIMPLE:
        p.add_argument(flag, dest=dest, type=kind, default=getattr(d, dest), help=f"{help_} (default: {getattr(d, dest)})")
    p.add_argument("--dry-sequence-breaker", dest="dry_sequence_breakers", action="append", default=None,
                   metavar="TEXT", help='DRY: a text that ends a repeat (repeatable; replaces the default \\n : " *; '
                                        '"none" for no breakers; \\n and \\t are understood)')
    p.add_argument("--logit-bias", dest="logit_bias", action="append", default=[], metavar="ID=BIAS",
                   help='add BIAS to a token\'s logit: ID=BIAS for a token id, "text"=BIAS for every token of the '
                        "text (repeatable; BIAS -inf or false bans)")
    p.add_argument("--banned-string", dest="banned_strings", action="append", default=[], metavar="TEXT",
                   help="a phrase the answer must not contain: the generation steps back and avoids it (repeatable)")
    c = p.add_mutually_exclusive_group()
    c.add_argument("--json-schema", default=None, metavar="FILE",
                   help="the answer must be JSON valid against this JSON Schema file (constrained generation)")
    c.add_argument("--regex", default=None, metavar="PATTERN", help="the whole answer must match this regular expression")
    c.add_argument("--grammar", default=None, metavar="FILE",
                   help="the answer must follow this grammar file: llama.cpp GBNF (root ::= ...) or Lark (start: ...)")
    p.add_argument("--settings-json", default=None, metavar="FILE",
                   help="sampler settings as llama.cpp server JSON (or a SillyTavern preset); a sampling flag "
                        "given with a value other than its default overrides the file")


def sampler_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The fields the flags of `add_sampler_flags` set, as SamplerSettings keyword arguments.

    Raises:
        ValueError: a --logit-bias that is not ID=BIAS or "text"=BIAS.
    """
    out: dict[str, Any] = {dest: getattr(args, dest) for _, dest, _, _ in _SIMPLE}
    breakers = args.dry_sequence_breakers
    if breakers is not None:
        out["dry_sequence_breakers"] = () if breakers == ["none"] else tuple(_unescape(b) for b in breakers)
    out["logit_bias"] = tuple(parse_logit_bias(v) for v in args.logit_bias)
    out["banned_strings"] = tuple(_unescape(b) for b in args.banned_strings)
    return out


def constraint_from_args(args: argparse.Namespace) -> Constraint | None:
    """The constraint --json-schema / --regex / --grammar ask for (checked now, before a model loads), or None.

    Raises:
        ValueError: a file that cannot be read, or a schema, regex or grammar that cannot work (its words).
    """
    if getattr(args, "regex", None) is not None:
        return Constraint.regex(args.regex)
    for flag, kind in (("json_schema", "json_schema"), ("grammar", "gbnf")):
        path = getattr(args, flag, None)
        if path:
            try:
                text = Path(path).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise ValueError(f"--{flag.replace('_', '-')} {path}: cannot read it ({e})") from None
            try:
                return Constraint(kind, text)
            except ConstraintError as e:
                raise ValueError(f"--{flag.replace('_', '-')} {path}: {e}") from None
    return None


def with_settings_json(args: argparse.Namespace, flags: dict[str, Any]) -> dict[str, Any]:
    """`flags` (SamplerSettings keyword arguments from the command line) over the --settings-json file's settings.

    A flag whose value is the settings' default gives way to the file. Fields of the file that are not
    read are named on stderr.

    Raises:
        ValueError: the file cannot be read, or what it holds is refused (its words).
    """
    path = getattr(args, "settings_json", None)
    if not path:
        return flags
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--settings-json {path}: cannot read it ({e})") from None
    try:
        imported = parse_llamacpp_json(text)
    except ValueError as e:
        raise ValueError(f"--settings-json {path}: {e}") from None
    if not getattr(args, "settings_json_noted", False):  # the CLI builds the settings twice (check, then run)
        args.settings_json_noted = True
        for line in imported.notes:
            print(f"note: {line}", file=sys.stderr)
        if imported.ignored:
            print(f"note: --settings-json {path}: not used here: {', '.join(imported.ignored)}", file=sys.stderr)
    defaults, base = SamplerSettings(), imported.sampler
    out: dict[str, Any] = {}
    for name, value in flags.items():
        default = getattr(defaults, name)
        given = tuple(value) if isinstance(value, list) else value
        out[name] = getattr(base, name) if given == default else value
    return out


def parse_logit_bias(value: str) -> tuple[int | str, float]:
    """ID=BIAS or "text"=BIAS (the last '=' separates); BIAS may be -inf or false (ban).

    Raises:
        ValueError: in words the user can act on.
    """
    example = 'e.g. --logit-bias 15043=-5 or --logit-bias \'"hello"=2\''
    key, sep, bias_text = value.rpartition("=")
    if not sep or not key:
        raise ValueError(f"--logit-bias needs ID=BIAS or \"text\"=BIAS ({example}), got {value!r}")
    raw = bias_text.strip().lower()
    if raw in ("false", "-inf", "-infinity"):
        bias = -math.inf
    else:
        try:
            bias = float(raw)
        except ValueError:
            raise ValueError(f"--logit-bias {value!r}: the bias must be a number, -inf or false, got {bias_text!r}") from None
    if len(key) >= 2 and key[0] == key[-1] == '"':
        return _unescape(key[1:-1]), bias
    if key.strip().lstrip("+-").isdigit():
        return int(key), bias
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
