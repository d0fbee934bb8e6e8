"""Sampler settings as llama.cpp server JSON, both ways: a setup pasted from llama.cpp or SillyTavern, and ours out.

llama.cpp's server takes one JSON object per request (`/completion`,
`/v1/completions`) whose sampling fields are ours under its names
(`repeat_penalty`, `repeat_last_n`, `typical_p`, `samplers`, ...);
SillyTavern's text-completion presets use a few more (`temp`, `rep_pen`,
`rep_pen_range`, `freq_pen`, `presence_pen`, `mirostat_mode`, `nsigma`,
`dynatemp` with `min_temp` / `max_temp`). Reading such a setup never drops a
field without saying so: every field that has no meaning here is listed, with
its value, in `ImportedSettings.ignored`.

The stage order travels as llama.cpp's `samplers` list ("penalties", "dry",
"top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature",
"adaptive_p"). llama.cpp's chain has rules ours does not (`common/sampling.cpp`
`common_sampler_init`): logit bias always runs first; mirostat, when on,
replaces every sampler but temperature; adaptive-p runs only when `samplers`
names it, and then last. Import follows those rules (so the imported order
does here what it did there) and says so in `notes`; `llamacpp_fields` names
every way a setting of ours cannot be said to llama.cpp.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from typing import Any

from engine.sampling.custom_stage import custom_stage_words, refuse_custom_stages
from engine.sampling.registry import STAGES
from engine.sampling.registry import stage_active as stage_active
from engine.sampling.settings import DEFAULT_ORDER, SamplerSettings

# llama.cpp's sampler names (`common_sampler_type_to_str`) <-> our stage names (engine.sampling.registry).
TO_LLAMACPP_STAGE = {row.name: row.llamacpp_sampler for row in STAGES if row.llamacpp_sampler is not None}
# What llama.cpp also accepts in `samplers` (`common_sampler_types_from_names`: kebab-case, no dash, aliases,
# and one character each when `samplers` is a string).
_STAGE_ALIASES = {
    **{v: k for k, v in TO_LLAMACPP_STAGE.items()},
    **{v.replace("_", "-"): k for k, v in TO_LLAMACPP_STAGE.items()},
    **{v.replace("_", ""): k for k, v in TO_LLAMACPP_STAGE.items()},
    **{alias: row.name for row in STAGES for alias in row.sampler_aliases},
}
_STAGE_CHARS = {row.llamacpp_char: row.name for row in STAGES if row.llamacpp_char is not None}

# field name in a pasted setup -> our SamplerSettings field (our own names are read too): llama.cpp's keys, and
# the other spellings of llama.cpp's CLI and SillyTavern.
_FIELD_ALIASES = {
    **{key: f for row in STAGES for f, key in row.llamacpp.items() if key != f},
    **{alias: f for row in STAGES for alias, f in row.json_aliases.items()},
}
_SAMPLER_FIELDS = frozenset(f.name for f in fields(SamplerSettings))
# Whole-number fields (a JSON 40.0 is read as 40): the stage fields whose default is an int.
_INTEGER_FIELDS = frozenset(
    f for row in STAGES for f in row.fields if type(getattr(SamplerSettings, f, None)) is int
)
# Fields llama.cpp's server does not know: exported under text-generation-webui's / our names, so the JSON
# comes back here whole, and named in the export's notes (llama.cpp would ignore them).
NOT_LLAMACPP = (*(f for row in STAGES for f in row.not_llamacpp), "banned_strings")
LLAMACPP_DEFAULT_SEED = 4294967295  # LLAMA_DEFAULT_SEED: "a random seed"


@dataclass(frozen=True)
class ImportedSettings:
    """A pasted llama.cpp / SillyTavern setup, read.

    Attributes:
        sampler: the settings (validated).
        max_new_tokens: `n_predict` / `max_tokens`, when the setup gave a positive one.
        stop: the setup's stop strings, when it gave any.
        ignored: every field that was not read, in words with its value ("tfs=1.0").
        notes: what was read differently from the field's face value, and why.
    """

    sampler: SamplerSettings
    max_new_tokens: int | None = None
    stop: tuple[str, ...] | None = None
    ignored: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def parse_llamacpp_json(source: str | dict[str, Any]) -> ImportedSettings:
    """Read llama.cpp server (or SillyTavern) sampling JSON: a text or an already parsed object.

    Raises:
        ValueError: one message a user can act on: not JSON (with the line and column), not an object,
            or values our settings refuse (every problem named).
    """
    if isinstance(source, str):
        try:
            data = json.loads(source)
        except json.JSONDecodeError as e:
            raise ValueError(f"this is not JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    else:
        data = source
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object of settings like {{\"temperature\": 0.8, \"top_k\": 40}}, "
                         f"got {type(data).__name__}")
    values: dict[str, Any] = {}
    ignored: list[str] = []
    notes: list[str] = []
    problems: list[str] = []
    max_new_tokens: int | None = None
    stop: tuple[str, ...] | None = None
    samplers: list[str] | None = None
    rest = dict(data)
    _read_dynatemp(rest, values, notes)
    for key, value in rest.items():
        name = _FIELD_ALIASES.get(key, key)
        if name in _SAMPLER_FIELDS:
            values[name] = _field_value(name, value, notes)
        elif key == "samplers":
            samplers = _read_samplers(value, ignored, problems)
        elif key in ("n_predict", "max_tokens", "max_new_tokens"):
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                max_new_tokens = value
            else:
                ignored.append(f"{key}={value!r} (no limit: the answer length stays as it is)")
        elif key == "stop":
            stop = _read_stop(value, problems)
        else:
            ignored.append(f"{key}={_short(value)}")
    if values.get("seed") in (-1, LLAMACPP_DEFAULT_SEED):
        values["seed"] = None  # llama.cpp's "a random seed each time"
    if "order" not in values:
        values["order"] = _order(samplers, values, notes)
    elif samplers is not None:  # our own stage names (a `SamplerSettings.to_dict()`) beside llama.cpp's
        ignored.append("samplers (the order field, in our own stage names, was given too and is used)")
    if problems:
        raise ValueError("; ".join(problems))
    try:
        sampler = SamplerSettings(**values)
    except (TypeError, ValueError) as e:
        raise ValueError(str(e).removeprefix("invalid sampler settings: ")) from None
    return ImportedSettings(sampler, max_new_tokens, stop, tuple(ignored), tuple(notes))


def _read_dynatemp(rest: dict[str, Any], values: dict[str, Any], notes: list[str]) -> None:
    """SillyTavern's dynamic temperature (`dynatemp` on, `min_temp`..`max_temp`) as llama.cpp's centre ± range."""
    if "min_temp" not in rest and "max_temp" not in rest:
        return
    on = rest.pop("dynatemp", False)
    low, high = rest.pop("min_temp", None), rest.pop("max_temp", None)
    if on is True and isinstance(low, (int, float)) and isinstance(high, (int, float)) and high >= low:
        values["temperature"] = (low + high) / 2
        values["dynatemp_range"] = (high - low) / 2
        rest.pop("temp", None)
        rest.pop("temperature", None)
        notes.append(f"dynamic temperature {low}..{high} is temperature {values['temperature']:g} "
                     f"± dynatemp_range {values['dynatemp_range']:g}")
    elif on is True:
        rest["dynatemp"] = on  # listed as ignored, with the reason in the value
        rest["min_temp..max_temp"] = f"{low!r}..{high!r} is not a range"


def _field_value(name: str, value: Any, notes: list[str]) -> Any:
    if name == "dry_sequence_breakers" and isinstance(value, str):
        try:  # SillyTavern keeps them as a JSON list inside a string
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, list):
            return parsed
    if name in _INTEGER_FIELDS and isinstance(value, float) and value.is_integer():
        return int(value)
    if name == "logit_bias" and isinstance(value, list) and value and all(isinstance(e, dict) for e in value):
        return _bias_entries(value)
    if name == "banned_strings" and isinstance(value, str):
        return [line for line in value.splitlines() if line]
    return value


def _bias_entries(entries: list[dict[str, Any]]) -> list[Any]:
    """Logit bias entries as objects: llama.cpp's own report (`{"token": 15, "bias": -1}`) and SillyTavern's
    (`{"text": "word" or "[15, 16]", "value": -1}`), as [key, bias] pairs; anything else is left for the
    settings to refuse in words."""
    out: list[Any] = []
    for e in entries:
        key = e.get("token", e.get("text"))
        bias = e.get("bias", e.get("value"))
        if isinstance(key, str) and key.startswith("[") and key.endswith("]"):
            try:  # SillyTavern: token ids in brackets
                ids = json.loads(key)
            except json.JSONDecodeError:
                ids = None
            if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
                out += [[i, bias] for i in ids]
                continue
        out.append([key, bias] if key is not None and bias is not None else e)
    return out


def _read_samplers(value: Any, ignored: list[str], problems: list[str]) -> list[str] | None:
    if isinstance(value, str):  # llama.cpp: one character per sampler ("edskypmxt")
        names = [_STAGE_CHARS.get(c) for c in value]
        unknown = [c for c, n in zip(value, names) if n is None]
        if unknown:
            ignored.append(f"samplers {', '.join(repr(c) for c in unknown)} (no such stage here)")
        return [n for n in names if n is not None]
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        problems.append(f'samplers must be a list of stage names like ["top_k", "temperature"], got {_short(value)}')
        return None
    out: list[str] = []
    for raw in value:
        name = _STAGE_ALIASES.get(raw.lower())
        if name is None:
            ignored.append(f"samplers {raw!r} (no such stage here)")
        elif name not in out:
            out.append(name)
    return out


def _read_stop(value: Any, problems: list[str]) -> tuple[str, ...] | None:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        problems.append(f"stop must be a list of texts, got {_short(value)}")
        return None
    return tuple(s for s in value if s) or None


def _order(samplers: list[str] | None, values: dict[str, Any], notes: list[str]) -> tuple[str, ...]:
    """Our stage order for what llama.cpp would run with `samplers` and these values.

    Stages llama.cpp does not list (logit bias, smoothing, mirostat) are put at their places in our
    default order; at their neutral values they do nothing, so the order does what llama.cpp's does.
    """
    mirostat = values.get("mirostat", 0)
    if mirostat in (1, 2):
        if samplers is not None or any(values.get(f) not in (None, d) for f, d in _FILTER_NEUTRAL.items()):
            notes.append("mirostat is on: llama.cpp then runs only logit bias, temperature and mirostat, "
                         "so the other stages are left out of the order")
        return tuple(n for n in DEFAULT_ORDER if n == "temperature" or n in _OUTSIDE_SAMPLERS)
    target = values.get("adaptive_target", -1)
    adaptive_on = isinstance(target, (int, float)) and not isinstance(target, bool) and target >= 0
    listed = samplers is not None and "adaptive_p" in samplers
    if adaptive_on and not listed:
        notes.append("adaptive_target is set but samplers does not name adaptive_p: llama.cpp then does not run "
                     "it, so adaptive-p is left out of the order")
    if samplers is None:
        return tuple(n for n in DEFAULT_ORDER if n != "adaptive_p" or not adaptive_on)
    if listed and samplers[-1] != "adaptive_p":
        notes.append("adaptive-p picks the token in llama.cpp, so it runs last whatever its place in samplers")
    order = [n for n in samplers if n != "adaptive_p"]
    for extra in _NOT_LISTED:  # at its place in our default order: before the first later stage listed
        later = [i for i, n in enumerate(order) if DEFAULT_ORDER.index(n) > DEFAULT_ORDER.index(extra)]
        order.insert(later[0] if later else len(order), extra)
    if listed:
        order.append("adaptive_p")
    return tuple(order)


# Our stages that llama.cpp's `samplers` does not name (logit bias, smoothing, mirostat, ...), and those of them
# llama.cpp has and runs outside that list (what its mirostat leaves on besides temperature).
_NOT_LISTED = tuple(n for n in DEFAULT_ORDER if n not in TO_LLAMACPP_STAGE)
_OUTSIDE_SAMPLERS = frozenset(row.name for row in STAGES if row.llamacpp_outside)
# Fields whose non-neutral value mirostat (in llama.cpp) silently overrides.
# Fields whose non-neutral value mirostat (in llama.cpp) silently overrides: the switches of the samplers it
# replaces (all but temperature, and adaptive-p, which mirostat excludes).
_FILTER_NEUTRAL = {f: getattr(SamplerSettings, f) for row in STAGES
                   if row.llamacpp_sampler is not None and row.name not in ("temperature", "adaptive_p")
                   for f in row.switches}


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# --- ours -> llama.cpp -------------------------------------------------------------------------------------------


def llamacpp_fields(s: SamplerSettings) -> tuple[dict[str, Any], list[str]]:
    """`s` as llama.cpp server request fields, and every way llama.cpp would not do what `s` says, in words.

    Every field llama.cpp has is given, neutral or not: a server started with other defaults
    (`llama-server --top-k 40`) would otherwise apply them. A stage left out of `s.order` is sent at its
    neutral value (llama.cpp runs what `samplers` names, but logit bias and mirostat are not samplers there).
    """
    run = set(s.order)
    problems: list[str] = [custom_stage_words(s)] if s.custom_stages else []
    out: dict[str, Any] = {}
    for row in STAGES:
        # A stage llama.cpp runs outside `samplers` (logit bias, mirostat) is off there only at its neutral value.
        off = row.llamacpp_sampler is None and row.name not in run
        for f, key in row.llamacpp.items():
            out[key] = _llamacpp_value(f, getattr(_NEUTRAL if off and f in row.switches else s, f))
    active = [n for n in s.order if stage_active(n, s)]
    # adaptive-p last (llama.cpp runs it last wherever it is listed; listed at a negative target it only draws).
    out["samplers"] = [TO_LLAMACPP_STAGE[n] for n in s.order if n in TO_LLAMACPP_STAGE and n != "adaptive_p"]
    if "adaptive_p" in run:
        out["samplers"].append("adaptive_p")
    if "logit_bias" in active and active[0] != "logit_bias":
        problems.append(f"order: logit bias after {active[0].replace('_', '-')} (llama.cpp applies logit bias first)")
    for picker in ("mirostat", "adaptive_p"):
        if picker in active and active[-1] != picker:
            problems.append(f"order: {picker.replace('_', '-')} before {active[-1].replace('_', '-')} "
                            f"(in llama.cpp {picker.replace('_', '-')} picks the token, after every other stage)")
    if "mirostat" in active:
        others = [n for n in active if n not in ("logit_bias", "temperature", "mirostat")]
        if others:
            problems.append(f"mirostat with {', '.join(n.replace('_', '-') for n in others)} (with mirostat on, "
                            "llama.cpp runs only logit bias, temperature and mirostat)")
        if s.dynatemp_range > 0:
            problems.append("mirostat with dynatemp_range (with mirostat on, llama.cpp's temperature is fixed)")
    for row in STAGES:
        if row.not_llamacpp and row.name in active:
            f = row.not_llamacpp[0]
            problems.append(f"{f}={getattr(s, f)!r} (llama.cpp has no {row.name.replace('_', ' ')})")
    if s.banned_strings:
        problems.append(f"banned_strings={s.banned_strings!r} (llama.cpp has no banned strings)")
    return out, problems


_NEUTRAL = SamplerSettings()


def _llamacpp_value(field: str, value: Any) -> Any:
    """A settings value as llama.cpp's JSON has it: lists for tuples, a ban in the logit bias as `false`."""
    if field == "logit_bias":
        return [[k, False if b == -math.inf else b] for k, b in value]
    return list(value) if isinstance(value, tuple) else value


def llamacpp_json(s: SamplerSettings, max_new_tokens: int | None = None,
                  stop: tuple[str, ...] | list[str] = ()) -> tuple[str, list[str]]:
    """`s` as llama.cpp server JSON text (to paste into a request, or back here), and notes in words.

    The notes say what llama.cpp would do differently (`llamacpp_fields`); the fields llama.cpp does not
    know (smoothing, banned strings) are written anyway under their usual names, so the JSON reads back whole.
    """
    refuse_custom_stages(s.custom_stages, "into llama.cpp JSON")  # code: said in words, never dropped
    out, notes = llamacpp_fields(s)
    out["seed"] = LLAMACPP_DEFAULT_SEED if s.seed is None else s.seed
    for row in STAGES:  # what llama.cpp does not know, under our names, so the JSON reads back whole
        if row.not_llamacpp and row.name in s.order and row.active(s):
            out |= {f: getattr(s, f) for f in row.not_llamacpp}
    if s.banned_strings:
        out["banned_strings"] = list(s.banned_strings)
    if max_new_tokens is not None:
        out["n_predict"] = max_new_tokens
    if stop:
        out["stop"] = list(stop)
    return json.dumps(out, indent=2, ensure_ascii=False), notes
