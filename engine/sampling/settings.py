"""Sampler settings: one frozen value object, validated on construction.

The settings say *what* the chain does; `engine.sampling.chain` says *how*.
Keeping them apart lets the app store, diff and show settings without numpy.
Field names are llama.cpp server's wherever llama.cpp has the sampler, so a
settings JSON from llama.cpp or SillyTavern carries over.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from engine.sampling.custom_stage import (
    CustomStage,
    CustomStageError,
    StageHook,
    custom_stage_problems,
    refuse_custom_stages,
)

# Every stage the chain knows, in the default order: llama.cpp's
# (`common_params_sampling.samplers`: penalties; dry; top_n_sigma; top_k;
# typ_p; top_p; min_p; xtc; temperature), with logit bias first (llama.cpp
# applies it before the chain), smoothing beside the other reshapers' early
# place in text-generation-webui, and the two adaptive truncations, mirostat
# and adaptive-p, last (in llama.cpp they pick the token). Filters run on the
# model's own distribution and temperature reshapes only the survivors, so
# what a filter cut is what the model said, not an artefact of the
# temperature. The order is a parameter.
STAGE_NAMES: tuple[str, ...] = (
    "grammar",  # a constraint's mask (JSON schema, regex, grammar); runs only when a request has a constraint
    "logit_bias",
    "penalties",
    "dry",
    "top_n_sigma",
    "smoothing",
    "top_k",
    "typical_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
    "mirostat",
    "adaptive_p",
)
DEFAULT_ORDER: tuple[str, ...] = STAGE_NAMES
# The default order before DRY & co. existed, and before the grammar stage; a saved order equal to
# either is read as today's default.
_LEGACY_DEFAULT_ORDER = ("penalties", "top_k", "top_p", "min_p", "typical_p", "xtc", "temperature")

DEFAULT_DRY_BREAKERS: tuple[str, ...] = ("\n", ":", '"', "*")  # llama.cpp's
DRY_BREAKER_MAX_CHARS = 40  # llama.cpp truncates longer breakers; we refuse them instead
# llama.cpp sets no count; each breaker costs a scan of the vocabulary before the first token (issue 43: 1,000 of
# them held the model a minute), and real lists are a handful (llama.cpp's default is 4, SillyTavern's ~6).
DRY_MAX_BREAKERS = 64

LogitBias = tuple[tuple[int | str, float], ...]

# Bounds on values that are finite but would push the float32 arithmetic past its range (a logit divided by
# temperature 1e-45 is infinite, a bias of 1e308 is infinite in float32, 2 ** (2 * mirostat_tau) overflows):
# llama.cpp takes them as given and samples from NaNs; we refuse them in words. Each bound is far beyond
# any setting that still changes what is sampled (a bias of 1000 nats already decides alone).
MIN_TEMPERATURE = 1e-3  # below it (and above 0) a temperature acts as greedy; 0 says greedy exactly
MAX_TEMPERATURE = 1000.0
MAX_LOGIT_BIAS = 1000.0
PENALTY_RANGE = (0.01, 100.0)  # repetition penalty; 1 = off
MAX_SHAPE = 100.0  # smoothing factor and curve, dynatemp exponent, DRY multiplier and base
MAX_MIROSTAT_TAU = 100.0  # bits of surprise; a vocabulary of 262k tokens has at most 18


@dataclass(frozen=True)
class SamplerSettings:
    """How the next token is chosen from the model's logits.

    A value that switches a stage off is its neutral value: temperature 1
    (dynatemp_range 0), top_k 0, top_p 1, min_p 0, typical_p 1, penalties
    1/0/0, xtc_probability 0, top_n_sigma <= 0, dry_multiplier 0, mirostat 0,
    adaptive_target < 0, smoothing_factor 0, no logit_bias, no banned_strings.
    `temperature == 0` means greedy (argmax after the other stages).

    `logit_bias` takes what llama.cpp's server takes: a mapping
    `{token id or text: bias}` or a list of `[token id or text, bias]` pairs;
    a text biases every token of its tokenization, a key that is an integer
    (also as a string, "42") is a token id, and a bias of `False` or -inf bans
    the token. It is stored as a tuple of (key, bias) pairs.
    """

    temperature: float = 1.0
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64  # how many recent tokens the penalties look at; -1 = all
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1  # how many recent tokens DRY scans; -1 = all (llama.cpp server: the context)
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_DRY_BREAKERS
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    adaptive_target: float = -1.0
    adaptive_decay: float = 0.9
    smoothing_factor: float = 0.0
    smoothing_curve: float = 1.0
    logit_bias: LogitBias = ()
    banned_strings: tuple[str, ...] = ()
    seed: int | None = None
    order: tuple[str, ...] = field(default=DEFAULT_ORDER)
    # Stages of your own (engine.sampling.custom_stage), each run where its name stands in `order`. Python
    # code: `to_dict` (files, presets, the database) and llama.cpp JSON refuse them in words.
    custom_stages: tuple[CustomStage, ...] = ()

    def __post_init__(self) -> None:
        # Lists from JSON / argparse become tuples so the value stays hashable.
        if isinstance(self.order, list):  # a string stays one: `validate` says it must be a list of names
            object.__setattr__(self, "order", tuple(self.order))
        for name in ("dry_sequence_breakers", "banned_strings", "custom_stages"):
            value = getattr(self, name)
            if isinstance(value, (list, tuple)):
                object.__setattr__(self, name, tuple(value))
        errors: list[str] = []
        object.__setattr__(self, "logit_bias", normalize_logit_bias(self.logit_bias, errors))
        errors += validate(self)
        if errors:
            raise ValueError("invalid sampler settings: " + "; ".join(errors))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def with_(self, **changes: Any) -> "SamplerSettings":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def with_stage(
        self, name: str, fn: StageHook, *, after: str | None = None, before: str | None = None
    ) -> "SamplerSettings":
        """A copy with a custom stage `fn(logprobs, history) -> logprobs` run under `name`.

        It goes right after the stage `after`, or right before `before`, in the order (neither: last).
        A stage that is off where it stands (top_k 0) keeps its place, so `after="top_k"` is still a place.
        """
        if after is not None and before is not None:
            raise ValueError("give after= or before=, not both")
        anchor = after if after is not None else before
        order = list(self.order)
        if anchor is None:
            at = len(order)
        elif anchor in order:
            at = order.index(anchor) + (1 if after is not None else 0)
        else:
            raise ValueError(f"cannot put the custom stage {name!r} {'after' if after is not None else 'before'} "
                             f"{anchor!r}: it is not in the order {order}")
        order.insert(at, name)
        return replace(self, order=tuple(order), custom_stages=(*self.custom_stages, CustomStage(name, fn)))

    def without_custom_stages(self) -> "SamplerSettings":
        """A copy without the custom stages (and their names out of the order): what can be saved or exported."""
        custom = {c.name for c in self.custom_stages}
        return replace(self, order=tuple(n for n in self.order if n not in custom), custom_stages=())

    def custom_stage(self, name: str) -> CustomStage | None:
        """The custom stage called `name`, or None."""
        return next((c for c in self.custom_stages if c.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON-ready values. CustomStageError when the settings hold a custom stage (code)."""
        refuse_custom_stages(self.custom_stages, "into saved settings (a file, a preset, a trace, the database)")
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "custom_stages"}
        d["order"] = list(self.order)
        d["dry_sequence_breakers"] = list(self.dry_sequence_breakers)
        d["banned_strings"] = list(self.banned_strings)
        # Pairs, not a mapping: a mapping's keys are all strings in JSON, and "42" would lose whether it
        # was the token id 42 or the text "42" (llama.cpp reads such a key as the id, as we do).
        d["logit_bias"] = [[k, b] for k, b in self.logit_bias]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SamplerSettings":
        if "custom_stages" in d:
            raise CustomStageError("custom_stages cannot come from saved settings: a custom stage is Python code; "
                                   "add it in Python with settings.with_stage(name, fn, after=...)")
        known = {f.name for f in fields(cls)} - {"custom_stages"}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown sampler settings: {', '.join(sorted(unknown))}")
        d = dict(d)
        if tuple(d.get("order", ())) in (_LEGACY_DEFAULT_ORDER, STAGE_NAMES[1:]):
            d["order"] = DEFAULT_ORDER  # saved before the new stages existed: today's default, with them
        return cls(**d)


def normalize_logit_bias(value: Any, errors: list[str]) -> LogitBias:
    """`value` (a mapping or pairs, as llama.cpp's server takes) as a tuple of (token id | text, bias).

    A key that reads as an integer is a token id; a bias of False is -inf (ban). Problems go to `errors`.
    """
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = []
        for item in value:
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                errors.append(f"logit_bias entries must be [token id or text, bias] pairs, got {item!r}")
                return ()
            items.append((item[0], item[1]))
    else:
        errors.append(f"logit_bias must be a mapping {{token id or text: bias}} or a list of pairs, got {value!r}")
        return ()
    out: list[tuple[int | str, float]] = []
    for key, bias in items:
        if isinstance(key, str) and key.strip().lstrip("+-").isdigit():
            key = int(key)
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            errors.append(f"logit_bias keys must be token ids or texts, got {key!r}")
            continue
        if isinstance(key, int) and key < 0:
            errors.append(f"logit_bias token ids must be >= 0, got {key}")
            continue
        if isinstance(key, str) and not key:
            errors.append("logit_bias has an empty text as a key; give the text to bias, or a token id")
            continue
        if bias is False:
            bias = -math.inf
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or math.isnan(bias) or bias == math.inf:
            errors.append(f"logit_bias for {key!r} must be a number, or false / -inf to ban the token, got {bias!r}")
            continue
        if bias != -math.inf and abs(bias) > MAX_LOGIT_BIAS:
            errors.append(f"logit_bias for {key!r} must be between -{MAX_LOGIT_BIAS:g} and {MAX_LOGIT_BIAS:g} "
                          f"(or false / -inf to ban the token), got {bias!r}")
            continue
        out.append((key, float(bias)))
    return tuple(out)


def _finite(name: str, v: Any, errors: list[str]) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        errors.append(f"{name} must be a finite number, got {v!r}")
        return False
    return True


def _integer(name: str, v: Any, errors: list[str]) -> bool:
    if isinstance(v, bool) or not isinstance(v, int):
        errors.append(f"{name} must be an integer, got {v!r}")
        return False
    return True


def _strings(name: str, v: Any, errors: list[str], what: str) -> bool:
    if not isinstance(v, tuple) or not all(isinstance(s, str) for s in v):
        shown = repr(v)  # a hostile list may be long: the message shows its start
        errors.append(f"{name} must be a list of texts ({what}), got {shown[:80]}{'...' if len(shown) > 80 else ''}")
        return False
    if any(not s for s in v):
        errors.append(f"{name} has an empty text; remove it ({what})")
        return False
    return True


def validate(s: SamplerSettings) -> list[str]:
    """Every problem with `s`, as messages a user can act on (empty if fine)."""
    e: list[str] = []
    for check in (_check_shaping, _check_penalties, _check_dry, _check_targets, _check_smoothing_and_seed,
                  _check_order):
        check(s, e)
    return e


def _check_shaping(s: SamplerSettings, e: list[str]) -> None:
    """Temperature, its dynamic range, and the truncation stages (top-k, top-p, min-p, typical-p, top-n-sigma)."""
    if _finite("temperature", s.temperature, e) and s.temperature < 0:
        e.append(f"temperature must be >= 0 (0 = greedy), got {s.temperature}")
    elif isinstance(s.temperature, (int, float)) and 0 < s.temperature < MIN_TEMPERATURE:
        e.append(f"temperature {s.temperature:g} is so close to 0 that it only overflows the arithmetic; "
                 f"use 0 for greedy, or at least {MIN_TEMPERATURE:g}")
    elif isinstance(s.temperature, (int, float)) and s.temperature > MAX_TEMPERATURE:
        e.append(f"temperature must be at most {MAX_TEMPERATURE:g} (past it every token is equally likely), "
                 f"got {s.temperature:g}")
    if _finite("dynatemp_range", s.dynatemp_range, e) and not 0 <= s.dynatemp_range <= MAX_TEMPERATURE:
        e.append(f"dynatemp_range must be in [0, {MAX_TEMPERATURE:g}] (0 = off), got {s.dynatemp_range:g}")
    if _finite("dynatemp_exponent", s.dynatemp_exponent, e) and not 0 < s.dynatemp_exponent <= MAX_SHAPE:
        e.append(f"dynatemp_exponent must be in (0, {MAX_SHAPE:g}] (1 = linear), got {s.dynatemp_exponent:g}")
    if _integer("top_k", s.top_k, e) and s.top_k < 0:
        e.append(f"top_k must be >= 0 (0 = off), got {s.top_k}")
    if _finite("top_p", s.top_p, e) and not 0 < s.top_p <= 1:
        e.append(f"top_p must be in (0, 1], got {s.top_p}")
    if _finite("min_p", s.min_p, e) and not 0 <= s.min_p <= 1:
        e.append(f"min_p must be in [0, 1], got {s.min_p}")
    if _finite("typical_p", s.typical_p, e) and not 0 < s.typical_p <= 1:
        e.append(f"typical_p must be in (0, 1], got {s.typical_p}")
    if _finite("top_n_sigma", s.top_n_sigma, e) and s.top_n_sigma > MAX_TEMPERATURE:  # <= 0 is off, as in llama.cpp
        e.append(f"top_n_sigma must be at most {MAX_TEMPERATURE:g} (past it every token is kept; <= 0 is off), "
                 f"got {s.top_n_sigma:g}")


def _check_penalties(s: SamplerSettings, e: list[str]) -> None:
    """The repetition, presence and frequency penalties and the window they look back over."""
    if _finite("repetition_penalty", s.repetition_penalty, e) and not PENALTY_RANGE[0] <= s.repetition_penalty <= PENALTY_RANGE[1]:
        e.append(f"repetition_penalty must be between {PENALTY_RANGE[0]:g} and {PENALTY_RANGE[1]:g} (1 = off), "
                 f"got {s.repetition_penalty:g}")
    if _finite("presence_penalty", s.presence_penalty, e) and not -2 <= s.presence_penalty <= 2:
        e.append(f"presence_penalty must be in [-2, 2], got {s.presence_penalty}")
    if _finite("frequency_penalty", s.frequency_penalty, e) and not -2 <= s.frequency_penalty <= 2:
        e.append(f"frequency_penalty must be in [-2, 2], got {s.frequency_penalty}")
    if _integer("penalty_last_n", s.penalty_last_n, e) and s.penalty_last_n < -1:
        e.append(f"penalty_last_n must be >= -1 (-1 = whole history), got {s.penalty_last_n}")


def _check_dry(s: SamplerSettings, e: list[str]) -> None:
    """DRY's strength, base, allowed length, window and sequence breakers."""
    if _finite("dry_multiplier", s.dry_multiplier, e) and not 0 <= s.dry_multiplier <= MAX_SHAPE:
        e.append(f"dry_multiplier must be in [0, {MAX_SHAPE:g}] (0 = off), got {s.dry_multiplier:g}")
    if _finite("dry_base", s.dry_base, e) and not 1 <= s.dry_base <= MAX_SHAPE:
        e.append(f"dry_base must be in [1, {MAX_SHAPE:g}] (the penalty grows as base ** repeat length), got {s.dry_base:g}")
    if _integer("dry_allowed_length", s.dry_allowed_length, e) and s.dry_allowed_length < 0:
        e.append(f"dry_allowed_length must be >= 0, got {s.dry_allowed_length}")
    if _integer("dry_penalty_last_n", s.dry_penalty_last_n, e) and s.dry_penalty_last_n < -1:
        e.append(f"dry_penalty_last_n must be >= -1 (-1 = whole history, 0 = off), got {s.dry_penalty_last_n}")
    if _strings("dry_sequence_breakers", s.dry_sequence_breakers, e, "texts that end a repeat, e.g. newline, ':'"):
        long = [b for b in s.dry_sequence_breakers if len(b) > DRY_BREAKER_MAX_CHARS]
        if len(s.dry_sequence_breakers) > DRY_MAX_BREAKERS:
            e.append(f"dry_sequence_breakers takes at most {DRY_MAX_BREAKERS} texts, got "
                     f"{len(s.dry_sequence_breakers):,}")
        elif long:
            e.append(f"dry_sequence_breakers must be at most {DRY_BREAKER_MAX_CHARS} characters each; shorten {long[0]!r}")


def _check_targets(s: SamplerSettings, e: list[str]) -> None:
    """XTC, mirostat and adaptive-p (the stages that aim at a probability or a surprise), and their clash."""
    if _finite("xtc_probability", s.xtc_probability, e) and not 0 <= s.xtc_probability <= 1:
        e.append(f"xtc_probability must be in [0, 1], got {s.xtc_probability}")
    if _finite("xtc_threshold", s.xtc_threshold, e) and not 0 < s.xtc_threshold <= 0.5:
        e.append(f"xtc_threshold must be in (0, 0.5], got {s.xtc_threshold}")
    if _integer("mirostat", s.mirostat, e) and s.mirostat not in (0, 1, 2):
        e.append(f"mirostat must be 0 (off), 1 or 2 (the version), got {s.mirostat}")
    if _finite("mirostat_tau", s.mirostat_tau, e) and not 0 < s.mirostat_tau <= MAX_MIROSTAT_TAU:
        e.append(f"mirostat_tau (the target surprise, in bits) must be in (0, {MAX_MIROSTAT_TAU:g}], got {s.mirostat_tau:g}")
    if _finite("mirostat_eta", s.mirostat_eta, e) and not 0 < s.mirostat_eta <= 1:
        e.append(f"mirostat_eta (the learning rate) must be in (0, 1], got {s.mirostat_eta}")
    if _finite("adaptive_target", s.adaptive_target, e) and s.adaptive_target > 1:
        e.append(f"adaptive_target must be in [0, 1], or negative for off, got {s.adaptive_target}")
    if _finite("adaptive_decay", s.adaptive_decay, e) and not 0 <= s.adaptive_decay <= 0.99:
        e.append(f"adaptive_decay must be in [0, 0.99], got {s.adaptive_decay}")
    if isinstance(s.mirostat, int) and s.mirostat and isinstance(s.adaptive_target, (int, float)) and s.adaptive_target >= 0:
        e.append("mirostat and adaptive-p cannot both be on (each steers the picks toward its own target, and "
                 "llama.cpp runs only mirostat then); turn one off: mirostat 0 or adaptive_target -1")


def _check_smoothing_and_seed(s: SamplerSettings, e: list[str]) -> None:
    """Quadratic smoothing, banned strings and the seed."""
    if _finite("smoothing_factor", s.smoothing_factor, e) and not 0 <= s.smoothing_factor <= MAX_SHAPE:
        e.append(f"smoothing_factor must be in [0, {MAX_SHAPE:g}] (0 = off), got {s.smoothing_factor:g}")
    if _finite("smoothing_curve", s.smoothing_curve, e) and not 1 <= s.smoothing_curve <= MAX_SHAPE:
        e.append(f"smoothing_curve must be in [1, {MAX_SHAPE:g}] (1 = plain quadratic), got {s.smoothing_curve:g}")
    _strings("banned_strings", s.banned_strings, e, "phrases the answer must not contain")
    if s.seed is not None and _integer("seed", s.seed, e) and not 0 <= s.seed < 2**63:
        e.append(f"seed must be in [0, 2**63), got {s.seed}")


def _check_order(s: SamplerSettings, e: list[str]) -> None:
    """The stage order: known stages (built in or custom), each once."""
    if not isinstance(s.order, tuple) or not all(isinstance(n, str) for n in s.order):
        e.append(f'order must be a list of stage names, e.g. ["top_k", "temperature"], got {s.order!r}')
        return
    e += custom_stage_problems(s.custom_stages, STAGE_NAMES, s.order)
    custom = {c.name for c in s.custom_stages if isinstance(c, CustomStage)} if isinstance(s.custom_stages, tuple) else set()
    unknown = [n for n in s.order if n not in STAGE_NAMES and n not in custom]
    if unknown:
        e.append(f"unknown sampler stages {unknown}; known: {', '.join(STAGE_NAMES)}"
                 + (f", and the custom {', '.join(sorted(custom))}" if custom else ""))
    if len(set(s.order)) != len(s.order):
        e.append(f"sampler stage order names a stage twice: {list(s.order)}")


# The settings an answer uses unless told otherwise, in the window (its default preset) and the CLI: llama.cpp's
# own (common/common.h `common_params_sampling`: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no
# repetition penalty). `SamplerSettings()` itself is every stage off: the model's distribution as it is.
DEFAULT_SAMPLER = SamplerSettings(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
