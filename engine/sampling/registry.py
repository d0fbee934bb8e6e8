"""Every sampler stage, one row each: what the chain, the llama.cpp JSON, the server parameters and the panel read.

A row (`StageRow`) says everything about a stage that is not its arithmetic:
its name, the `SamplerSettings` fields it reads, its factory (settings -> the
stage function, or None at its neutral value), whether it is on, what the
chain's fast paths may assume about it, its llama.cpp names (the JSON keys,
the `samplers` entry and its one-letter code, and the aliases SillyTavern and
llama.cpp accept), the parameter each OpenAI-style server kind takes for its
fields, and the panel's control for each field (label, range, step, tip).
The arithmetic lives in the stage's own module (`stages.py`, `shaping.py`,
`dry.py`, `adaptive.py`, `grammar.py`).

The row's shape is `engine.sampling.stage_row`. Readers: `engine.sampling.chain` (factories, fast-path flags),
`engine.sampling.llamacpp_json` (keys, samplers, aliases, `stage_active`),
`engine.backends.remote.server_params` (server parameter names and how each
stage is checked), and the window, whose only source of labels, ranges, steps
and on/off rules this is (the sampling panel's controls and stage help, its
folding sections' "on" by `switched_on_by`, the controls server-samples mode
turns off, an experiment column's editor), so a new stage is its module, its
fields in `SamplerSettings` (with their validation) and one row here;
tests/engine/test_stage_registry.py and tests/app/test_window_reads_the_registry.py
check that every reader covers every row.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

import numpy as np

from engine.sampling.adaptive import AdaptiveP, Mirostat, Mirostat2
from engine.sampling.dry import DryPenalties, breaker_sequences, dry_stage, make_dry_penalties
from engine.sampling.shaping import make_logit_bias, make_smoothing, make_temperature_ext, make_top_n_sigma
from engine.sampling.stages import (
    Stage,
    StageContext,
    make_min_p,
    make_penalties,
    make_temperature,
    make_top_k,
    make_top_p,
    make_typical_p,
    make_xtc,
)
from engine.sampling.stage_row import LLAMA_CPP_SERVER, SERVER_KINDS, BuildContext, Control, StageRow

if TYPE_CHECKING:
    from engine.sampling.settings import SamplerSettings

__all__ = ["ARGMAX_PRESERVING", "CONTROLS", "LLAMA_CPP_SERVER", "ON_SURVIVORS", "SERVER_KINDS", "STAGES", "STAGE_ROWS",
           "BuildContext", "Control", "StageRow", "stage_active", "stage_row", "switched_on_by"]

_VLLM_LIKE = ("vllm", "sglang")
_EXTENDED = ("vllm", "sglang", "llama-cpp-python", "lmstudio")  # top_k, min_p and a repetition penalty


def _on(name: str, *kinds: str) -> dict[str, str]:
    """{server kind: parameter name} for the kinds that call a setting `name`."""
    return {kind: name for kind in kinds}


# --- factories that need more than one call --------------------------------------------------------------------


def _grammar(s: SamplerSettings, ctx: BuildContext) -> Stage | None:
    return ctx.constraint  # a request's constraint (engine.sampling.grammar); None without one


def _penalties(s: SamplerSettings, ctx: BuildContext) -> Stage | None:
    off = s.penalty_last_n == 0 or (s.repetition_penalty == 1 and s.presence_penalty == 0 and s.frequency_penalty == 0)
    return None if off else make_penalties(s.repetition_penalty, s.presence_penalty, s.frequency_penalty, s.penalty_last_n)


def _temperature(s: SamplerSettings, ctx: BuildContext) -> Stage | None:
    # 0 = greedy (argmax in `pick`), 1 = identity: neither needs a stage.
    if s.temperature == 0 or (s.temperature == 1 and s.dynatemp_range == 0):
        return None
    if s.dynatemp_range > 0:
        return make_temperature_ext(s.temperature, s.dynatemp_range, s.dynatemp_exponent)
    return make_temperature(s.temperature)


def _logit_bias(s: SamplerSettings, ctx: BuildContext) -> Stage | None:
    return make_logit_bias(*logit_bias_tokens(s, ctx)) if s.logit_bias else None


def logit_bias_tokens(s: SamplerSettings, ctx: BuildContext) -> tuple[list[int], list[float]]:
    """(token ids, biases) of the settings' logit bias, by llama.cpp server's rule: a text biases every token
    of its tokenization (no special tokens); an id may come more than once (its biases add up)."""
    ids: list[int] = []
    biases: list[float] = []
    for key, bias in s.logit_bias:
        if isinstance(key, str):
            toks = ctx.needs_vocab(f"the logit bias for the text {key!r}").encode(key, add_special_tokens=False)
            if not toks:
                raise ValueError(f"the logit bias text {key!r} has no tokens in this model's vocabulary")
        else:
            toks = [key]
        ids += toks
        biases += [bias] * len(toks)
    return ids, biases


def _dry(s: SamplerSettings, ctx: BuildContext) -> Stage | None:
    if not (s.dry_multiplier > 0 and s.dry_penalty_last_n != 0):
        return None
    return dry_stage(dry_penalties(s, ctx))


def dry_penalties(s: SamplerSettings, ctx: BuildContext) -> DryPenalties:
    """DRY's (token ids, penalties) for a history (engine.sampling.dry.make_dry_penalties); its breakers are
    found in the vocabulary on the first call, when the vocabulary's size is known."""
    vocab = ctx.needs_vocab("DRY's sequence breakers") if s.dry_sequence_breakers else None
    built: list[DryPenalties] = []

    def penalties(history: np.ndarray, n_vocab: int) -> tuple[np.ndarray, np.ndarray] | None:
        if not built:
            breakers = breaker_sequences(vocab, s.dry_sequence_breakers, n_vocab) if vocab is not None else {}
            built.append(make_dry_penalties(s.dry_multiplier, s.dry_base, s.dry_allowed_length,
                                            s.dry_penalty_last_n, breakers))
        return built[0](history, n_vocab)

    return penalties


def _mirostat(s: SamplerSettings, ctx: BuildContext) -> Stage | None:
    if s.mirostat == 0:
        return None
    return Mirostat(s.mirostat_tau, s.mirostat_eta) if s.mirostat == 1 else Mirostat2(s.mirostat_tau, s.mirostat_eta)


C = Control
STAGES: tuple[StageRow, ...] = (
    StageRow(
        "grammar", (), _grammar, lambda s: False,
        help="A constraint (JSON schema, regex, grammar) removes every token that cannot continue a valid answer; "
             "runs only when the answer has one",
        llamacpp_outside=True, server_rule="own",
    ),
    StageRow(
        "logit_bias", ("logit_bias",), _logit_bias, lambda s: bool(s.logit_bias), switches=("logit_bias",),
        help="Add a fixed bias to chosen tokens' logits (by token id or text); -inf bans a token",
        llamacpp={"logit_bias": "logit_bias"}, llamacpp_outside=True,
        server={"logit_bias": _on("logit_bias", *_VLLM_LIKE, "llama-cpp-python", "openai")}, server_rule="own",
        controls=(C("logit_bias", "Logit bias", 'Added to a token\'s logit, one per line: 15043 = -5 for a token id, '
                    '"hello" = 2 for every token of a text, ban (or -inf) to forbid it', lines=True),),
    ),
    StageRow(
        "penalties", ("repetition_penalty", "presence_penalty", "frequency_penalty", "penalty_last_n"), _penalties,
        lambda s: s.repetition_penalty != 1 or s.presence_penalty != 0 or s.frequency_penalty != 0,
        switches=("repetition_penalty", "presence_penalty", "frequency_penalty"),
        help="Repetition, presence and frequency penalties on recently used tokens",
        llamacpp={"repetition_penalty": "repeat_penalty", "penalty_last_n": "repeat_last_n",
                  "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty"},
        llamacpp_sampler="penalties", llamacpp_char="e",
        json_aliases={"penalty_repeat": "repetition_penalty", "rep_pen": "repetition_penalty",
                      "rep_pen_range": "penalty_last_n", "penalty_present": "presence_penalty",
                      "presence_pen": "presence_penalty", "penalty_freq": "frequency_penalty",
                      "freq_pen": "frequency_penalty"},
        # penalty_last_n: server_params' own rule (servers without the parameter have defaults of their own).
        server={"repetition_penalty": {**_on("repetition_penalty", *_VLLM_LIKE),
                                       **_on("repeat_penalty", "llama-cpp-python", "lmstudio")},
                "presence_penalty": _on("presence_penalty", *SERVER_KINDS),
                "frequency_penalty": _on("frequency_penalty", *SERVER_KINDS)},
        server_defaults=("penalty_last_n",),
        controls=(
            C("repetition_penalty", "Repetition", "Divides the logits of recent tokens; 1 = off", 0.05, 3.0, 0.01, 2, 2.0,
              cli=("--repeat-penalty", "--repetition-penalty"), cli_help="penalize repeated tokens; 1 = off"),
            C("presence_penalty", "Presence", "Subtracted once from every recent token's logit; 0 = off", -2.0, 2.0, 0.05, 2,
              cli=("--presence-penalty",), cli_help="presence penalty; 0 = off"),
            C("frequency_penalty", "Frequency", "Subtracted per occurrence of a recent token; 0 = off", -2.0, 2.0, 0.05, 2,
              cli=("--frequency-penalty",), cli_help="frequency penalty; 0 = off"),
            C("penalty_last_n", "Look back", "How many recent tokens the penalties see", -1, 32768, 1, 0, 1024, "all",
              cli=("--repeat-last-n", "--penalty-last-n"),
              cli_help="how many recent tokens the penalties look at; -1 = all"),
        ),
    ),
    StageRow(
        "dry", ("dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers"),
        _dry, lambda s: s.dry_multiplier > 0 and s.dry_penalty_last_n != 0, switches=("dry_multiplier",),
        help="DRY: penalise tokens that would extend a phrase already repeated in the text",
        llamacpp={f: f for f in ("dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
                                 "dry_sequence_breakers")},
        llamacpp_sampler="dry", llamacpp_char="d",
        server={"dry_multiplier": {}}, server_rule="switch",
        controls=(
            C("dry_multiplier", "DRY strength", "DRY: penalises a token that would extend a phrase already in the text; "
              "off = 0", 0.0, 5.0, 0.05, 2, 2.0, "off",
              cli=("--dry-multiplier",), cli_help="DRY: penalty for extending a repeat; 0 = off"),
            C("dry_base", "DRY base", "DRY: the penalty grows as base ^ (repeat length − allowed length)", 1.0, 4.0, 0.05, 2,
              cli=("--dry-base",), cli_help="DRY: the penalty grows as base ** (repeat length - allowed length)"),
            C("dry_allowed_length", "DRY allowed", "DRY: repeats up to this many tokens are free", 0, 100, 1, 0, 20,
              cli=("--dry-allowed-length",), cli_help="DRY: repeats up to this long are free"),
            C("dry_penalty_last_n", "DRY look back", "DRY: how many recent tokens are searched for repeats; all = the "
              "whole text, 0 = off", -1, 32768, 1, 0, 4096, "all",
              cli=("--dry-penalty-last-n",), cli_help="DRY: how many recent tokens to scan; -1 = all, 0 = off"),
            C("dry_sequence_breakers", "DRY breakers", "DRY: a repeat never runs across these texts, one per line (\\n = "
              "a newline); empty = none", lines=True),
        ),
    ),
    StageRow(
        "top_n_sigma", ("top_n_sigma",), lambda s, c: make_top_n_sigma(s.top_n_sigma) if s.top_n_sigma > 0 else None,
        lambda s: s.top_n_sigma > 0, switches=("top_n_sigma",),
        help="Keep tokens whose logit is within n standard deviations of the top logit",
        argmax_preserving=True, on_survivors=True,
        llamacpp={"top_n_sigma": "top_n_sigma"}, llamacpp_sampler="top_n_sigma", llamacpp_char="s",
        json_aliases={"nsigma": "top_n_sigma"},
        server={"top_n_sigma": {}}, server_rule="switch",
        controls=(C("top_n_sigma", "Top-nσ", "Keep tokens whose logit is within n standard deviations of the top "
                    "logit; off ≤ 0", 0.0, 10.0, 0.05, 2, 5.0, "off",
              cli=("--top-nsigma", "--top-n-sigma"),
              cli_help="keep tokens within N standard deviations of the top logit; <= 0 = off"),),
    ),
    StageRow(
        "smoothing", ("smoothing_factor", "smoothing_curve"),
        lambda s, c: make_smoothing(s.smoothing_factor, s.smoothing_curve) if s.smoothing_factor > 0 else None,
        lambda s: s.smoothing_factor > 0, switches=("smoothing_factor",),
        help="Quadratic sampling: flatten the top and cut the tail around the most likely token",
        on_survivors=True, not_llamacpp=("smoothing_factor", "smoothing_curve"),
        server={"smoothing_factor": {}}, server_rule="switch",
        controls=(
            C("smoothing_factor", "Smoothing", "Quadratic sampling: flattens the top and cuts the tail around the most "
              "likely token (text-generation-webui); off = 0", 0.0, 10.0, 0.01, 2, 3.0, "off",
              cli=("--smoothing-factor",), cli_help="quadratic sampling: how hard to smooth; 0 = off"),
            C("smoothing_curve", "Smoothing curve", "Quadratic sampling: 1 = plain quadratic, more = a steeper tail",
              1.0, 10.0, 0.05, 2, 5.0,
              cli=("--smoothing-curve",), cli_help="quadratic sampling: 1 = plain quadratic, more = steeper tail"),
        ),
    ),
    StageRow(
        "top_k", ("top_k",), lambda s, c: make_top_k(s.top_k) if s.top_k > 0 else None, lambda s: s.top_k > 0,
        switches=("top_k",), help="Keep only the k most likely tokens", argmax_preserving=True, on_survivors=True,
        llamacpp={"top_k": "top_k"}, llamacpp_sampler="top_k", llamacpp_char="k",
        server={"top_k": _on("top_k", *_EXTENDED)},
        controls=(C("top_k", "Top-k", "Keep the k most likely tokens; off = keep all", 0, 100000, 1, 0, 200, "off",
              cli=("--top-k",), cli_help="keep the K most likely tokens; 0 = off"),),
    ),
    StageRow(
        "typical_p", ("typical_p",), lambda s, c: make_typical_p(s.typical_p) if s.typical_p < 1 else None,
        lambda s: s.typical_p < 1, switches=("typical_p",),
        help="Keep tokens whose surprisal is closest to the distribution's entropy (locally typical)",
        on_survivors=True,  # not argmax-preserving: it may drop the most likely token
        llamacpp={"typical_p": "typical_p"}, llamacpp_sampler="typ_p", llamacpp_char="y",
        sampler_aliases=("typical_p", "typical-p", "typ"), json_aliases={"typ_p": "typical_p"},
        server={"typical_p": {}},
        controls=(C("typical_p", "Typical-p", "Locally typical sampling mass; 1 = off", 0.01, 1.0, 0.01, 2,
              cli=("--typical", "--typical-p"), cli_help="locally typical sampling; 1 = off"),),
    ),
    StageRow(
        "top_p", ("top_p",), lambda s, c: make_top_p(s.top_p) if s.top_p < 1 else None, lambda s: s.top_p < 1,
        switches=("top_p",), help="Keep the smallest set of tokens whose probability adds up to p (nucleus)",
        argmax_preserving=True, on_survivors=True,
        llamacpp={"top_p": "top_p"}, llamacpp_sampler="top_p", llamacpp_char="p", sampler_aliases=("nucleus",),
        server={"top_p": _on("top_p", *SERVER_KINDS)},
        controls=(C("top_p", "Top-p", "Keep the most likely tokens up to this total probability; 1 = off",
                    0.01, 1.0, 0.01, 2,
              cli=("--top-p",), cli_help="keep the most likely tokens up to this probability mass; 1 = off"),),
    ),
    StageRow(
        "min_p", ("min_p",), lambda s, c: make_min_p(s.min_p) if s.min_p > 0 else None, lambda s: s.min_p > 0,
        switches=("min_p",), help="Drop tokens less likely than min-p × the top token's probability",
        argmax_preserving=True, on_survivors=True,
        llamacpp={"min_p": "min_p"}, llamacpp_sampler="min_p", llamacpp_char="m",
        server={"min_p": _on("min_p", *_EXTENDED)},
        controls=(C("min_p", "Min-p", "Drop tokens below min-p × the top probability; off = 0", 0.0, 1.0, 0.01, 2,
                    None, "off",
              cli=("--min-p",), cli_help="drop tokens below this share of the top token's probability; 0 = off"),),
    ),
    StageRow(
        "xtc", ("xtc_probability", "xtc_threshold"),
        lambda s, c: make_xtc(s.xtc_probability, s.xtc_threshold) if s.xtc_probability > 0 else None,
        lambda s: s.xtc_probability > 0, switches=("xtc_probability",),
        help="Exclude Top Choices: sometimes remove all but the least likely of the very likely tokens",
        on_survivors=True,
        llamacpp={"xtc_probability": "xtc_probability", "xtc_threshold": "xtc_threshold"},
        llamacpp_sampler="xtc", llamacpp_char="x",
        server={"xtc_probability": {}}, server_rule="switch",
        controls=(
            C("xtc_probability", "XTC chance", "How often XTC removes the top choices; off = 0", 0.0, 1.0, 0.01, 2,
              None, "off",
              cli=("--xtc-probability",), cli_help="XTC: chance to remove the top choices; 0 = off"),
            C("xtc_threshold", "XTC threshold", "Tokens above this probability count as top choices", 0.01, 0.5, 0.01, 2,
              cli=("--xtc-threshold",), cli_help="XTC: tokens above this probability count as top choices"),
        ),
    ),
    StageRow(
        "temperature", ("temperature", "dynatemp_range", "dynatemp_exponent"), _temperature,
        lambda s: s.temperature != 1 or s.dynatemp_range > 0, switches=("temperature", "dynatemp_range"),
        help="Divide the logits by the temperature (0 = always the most likely token); with a dynamic range, "
             "the temperature follows the entropy",
        argmax_preserving=True, on_survivors=True,
        llamacpp={"temperature": "temperature", "dynatemp_range": "dynatemp_range",
                  "dynatemp_exponent": "dynatemp_exponent"},
        llamacpp_sampler="temperature", llamacpp_char="t", sampler_aliases=("temp",), json_aliases={"temp": "temperature"},
        server={"temperature": _on("temperature", *SERVER_KINDS), "dynatemp_range": {}},
        controls=(
            C("temperature", "Temperature", "Divides the logits; 0 = greedy (always the most likely token)",
              0.0, 5.0, 0.05, 2, 2.0, "0 (greedy)",
              cli=("--temp", "--temperature"), cli_help="temperature; 0 = greedy"),
            C("dynatemp_range", "Dyn. range", "Dynamic temperature: the temperature varies by up to ± this with the "
              "distribution's entropy (confident → cooler); off = 0", 0.0, 5.0, 0.05, 2, 2.0, "off",
              cli=("--dynatemp-range",), cli_help="dynamic temperature: vary it by up to this much; 0 = off"),
            C("dynatemp_exponent", "Dyn. exponent", "Dynamic temperature: how entropy maps to temperature; 1 = linear",
              0.05, 10.0, 0.05, 2, 4.0,
              cli=("--dynatemp-exp", "--dynatemp-exponent"),
              cli_help="dynamic temperature: how the entropy maps to it; 1 = linear"),
        ),
    ),
    StageRow(
        "mirostat", ("mirostat", "mirostat_tau", "mirostat_eta"), _mirostat, lambda s: s.mirostat != 0,
        switches=("mirostat",),
        help="Mirostat: truncate so each pick's surprise tracks a target (tau), learning as it goes",
        llamacpp={"mirostat": "mirostat", "mirostat_tau": "mirostat_tau", "mirostat_eta": "mirostat_eta"},
        llamacpp_outside=True,
        json_aliases={"mirostat_mode": "mirostat"},
        server={"mirostat": _on("mirostat_mode", "llama-cpp-python"),
                "mirostat_tau": _on("mirostat_tau", "llama-cpp-python"),
                "mirostat_eta": _on("mirostat_eta", "llama-cpp-python")},
        server_rule="switch",
        controls=(
            C("mirostat", "Mirostat", "Mirostat: steers each pick toward a target surprise (1 or 2 = its version); "
              "off = 0", 0, 2, 1, 0, None, "off",
              cli=("--mirostat",), cli_help="mirostat version: 0 = off, 1 or 2"),
            C("mirostat_tau", "Mirostat τ", "Mirostat: the target surprise in bits (higher = more varied text)",
              0.1, 20.0, 0.1, 1, 10.0,
              cli=("--mirostat-ent", "--mirostat-tau"), cli_help="mirostat: target surprise in bits"),
            C("mirostat_eta", "Mirostat η", "Mirostat: how fast it corrects toward the target (learning rate)",
              0.01, 1.0, 0.01, 2,
              cli=("--mirostat-lr", "--mirostat-eta"), cli_help="mirostat: learning rate"),
        ),
    ),
    StageRow(
        "adaptive_p", ("adaptive_target", "adaptive_decay"),
        lambda s, c: AdaptiveP(s.adaptive_target, s.adaptive_decay) if s.adaptive_target >= 0 else None,
        lambda s: s.adaptive_target >= 0, switches=("adaptive_target",),
        help="Adaptive-p: favour tokens near a target probability, adapting to the recent picks",
        llamacpp={"adaptive_target": "adaptive_target", "adaptive_decay": "adaptive_decay"},
        llamacpp_sampler="adaptive_p", llamacpp_char="a",
        server={"adaptive_target": {}}, server_rule="switch",
        controls=(
            C("adaptive_target", "Adaptive target", "Adaptive-p: favours tokens near this probability, adapting to the "
              "recent picks; off below 0", -0.01, 1.0, 0.01, 2, None, "off",
              cli=("--adaptive-target",), cli_help="adaptive-p: favour tokens near this probability; < 0 = off"),
            C("adaptive_decay", "Adaptive decay", "Adaptive-p: how long it remembers recent picks (≈ 1 / (1 − decay) "
              "tokens)", 0.0, 0.99, 0.01, 2,
              cli=("--adaptive-decay",), cli_help="adaptive-p: moving-average decay, 0 to 0.99"),
        ),
    ),
)
del C

STAGE_ROWS: Mapping[str, StageRow] = {row.name: row for row in STAGES}
# Stages that never change which token has the highest score (these filters keep the top token and its ties;
# temperature is monotone), and stages that look only at the scores (they may run on a filter's survivors).
ARGMAX_PRESERVING = frozenset(row.name for row in STAGES if row.argmax_preserving)
ON_SURVIVORS = frozenset(row.name for row in STAGES if row.on_survivors)
CONTROLS: Mapping[str, Control] = {c.field: c for row in STAGES for c in row.controls}


def stage_row(name: str) -> StageRow | None:
    """The row of the built-in stage `name` (None for a custom stage's name)."""
    return STAGE_ROWS.get(name)


def stage_active(stage: str, s: SamplerSettings) -> bool:
    """Whether `stage` changes anything with these settings (it is not at its neutral value)."""
    row = STAGE_ROWS.get(stage)
    return row is not None and row.active(s)


def switched_on_by(fields: Collection[str], s: SamplerSettings) -> bool:
    """Whether `fields` turn a stage on in `s`: some stage with a switch among them is on when its switches not
    among them are at their neutral values. A panel section that holds some of a stage's switches reads this (the
    dynamic temperature is on by its range, not by the temperature the panel shows elsewhere); one that holds them
    all says exactly what the row's `active` says."""
    neutral = type(s)()
    for row in STAGES:
        if not any(f in fields for f in row.switches):
            continue
        others = {f: getattr(neutral, f) for f in row.switches if f not in fields}
        if row.active(s.with_(**others) if others else s):
            return True
    return False
