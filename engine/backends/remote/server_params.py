"""Our `SamplerSettings` as a server's request parameters, or a refusal that names what it cannot take.

Every OpenAI-compatible server takes temperature, top_p, the presence and
frequency penalties, seed, stop and (most) a logit bias by token id. The rest
are extensions whose names differ per server (repetition_penalty in
vLLM/SGLang, repeat_penalty in llama.cpp, mirostat_mode in llama-cpp-python).
llama.cpp's own server takes every stage it has, and the stage order
(`samplers`): its fields come from `engine.sampling.llamacpp_json`, which also
says where llama.cpp's chain would not do what the settings say.

A server silently ignores a field it does not know, so we never send one
hoping it works: every setting this kind of server cannot take is named, all
in one refusal, before anything is sent (once per answer; the window turns
those controls off in server-samples mode, `server_sampler_fields`).
"""

from __future__ import annotations

import math

from engine.backends.remote.errors import UnsupportedByServerError
from engine.sampling.custom_stage import custom_stage_words
from engine.sampling.llamacpp_json import llamacpp_fields, stage_active
from engine.sampling.settings import DEFAULT_ORDER, SamplerSettings

_OPENAI = {"temperature": "temperature", "top_p": "top_p", "presence_penalty": "presence_penalty",
           "frequency_penalty": "frequency_penalty"}
_VLLM = _OPENAI | {"top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                   "logit_bias": "logit_bias"}
_LLAMA_CPP_PYTHON = _OPENAI | {"top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repeat_penalty",
                               "mirostat": "mirostat_mode", "mirostat_tau": "mirostat_tau",
                               "mirostat_eta": "mirostat_eta", "logit_bias": "logit_bias"}
# llama.cpp's server: every field it has (see llamacpp_fields), under its own names.
_LLAMA_CPP = _OPENAI | {
    "top_k": "top_k", "min_p": "min_p", "typical_p": "typical_p", "repetition_penalty": "repeat_penalty",
    "penalty_last_n": "repeat_last_n", "dynatemp_range": "dynatemp_range", "dynatemp_exponent": "dynatemp_exponent",
    "top_n_sigma": "top_n_sigma", "xtc_probability": "xtc_probability", "xtc_threshold": "xtc_threshold",
    "dry_multiplier": "dry_multiplier", "dry_base": "dry_base", "dry_allowed_length": "dry_allowed_length",
    "dry_penalty_last_n": "dry_penalty_last_n", "dry_sequence_breakers": "dry_sequence_breakers",
    "mirostat": "mirostat", "mirostat_tau": "mirostat_tau", "mirostat_eta": "mirostat_eta",
    "adaptive_target": "adaptive_target", "adaptive_decay": "adaptive_decay", "logit_bias": "logit_bias",
    "order": "samplers",
}

# server kind -> {our setting: the server's parameter}
PARAMETER_NAMES: dict[str, dict[str, str]] = {
    "vllm": _VLLM,
    "sglang": _VLLM,
    "llama-cpp-python": _LLAMA_CPP_PYTHON,
    "llama.cpp": _LLAMA_CPP,
    "lmstudio": _OPENAI | {"top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repeat_penalty"},
    "ollama": _OPENAI,
    "openai": _OPENAI | {"logit_bias": "logit_bias"},
}
# penalty_last_n a server uses when it has no parameter for it (llama.cpp's default, ours too)
SERVER_DEFAULT_LAST_N = {"llama-cpp-python": 64, "lmstudio": 64}
NEUTRAL = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0,
           "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
# The settings of a stage that has more than one, sent together with the stage's switch.
_COMPANIONS = {"mirostat": ("mirostat_tau", "mirostat_eta")}
# OpenAI's logit bias range, which vLLM and SGLang clamp to; -100 bans a token in practice.
OPENAI_BIAS_LIMIT = 100.0
# llama-cpp-python adds the bias to the logit as a float: this is -inf for every purpose, and JSON can carry it.
_HUGE_NEGATIVE = -1e30


def server_parameters(settings: SamplerSettings, kind: str, seed_supported: bool, we_sample_ok: bool = True) -> dict:
    """Request fields for `settings` on a server of `kind`; raises naming every setting it cannot take.

    `we_sample_ok`: whether our sampler could run on this server instead; the refusal only suggests what works.
    """
    if kind == "llama.cpp":
        out, refused = llamacpp_fields(settings)
    else:
        out, refused = _extension_fields(settings, kind)
    if settings.seed is not None:
        if seed_supported:
            out["seed"] = settings.seed
        else:
            refused.append(f"seed={settings.seed} (this server ignored seeds when probed)")
    if refused:
        fix = ("reset them to their neutral values or use we-sample mode" if we_sample_ok else
               "reset them to their neutral values (this server cannot do we-sample mode, so it must sample itself)")
        raise UnsupportedByServerError(
            f"a {kind} server cannot take these sampler settings: {', '.join(refused)}; {fix}"
        )
    return out


def _extension_fields(settings: SamplerSettings, kind: str) -> tuple[dict, list[str]]:
    """The fields of an OpenAI-style server that has some extensions (`PARAMETER_NAMES[kind]`)."""
    names = PARAMETER_NAMES.get(kind, _OPENAI)
    out: dict = {}
    refused: list[str] = [custom_stage_words(settings)] if settings.custom_stages else []
    for field, neutral in NEUTRAL.items():
        value = getattr(settings, field)
        if field in names:
            # Always sent, neutral or not: servers have their own defaults (llama.cpp: top_k 40, top_p 0.95,
            # min_p 0.05, repeat_penalty 1.1), and an omitted field would silently turn those on.
            out[names[field]] = value
        elif value != neutral:
            refused.append(f"{field}={value}")
    for stage, field in _SWITCHES.items():
        if field in names:
            # A stage left out of the order is off: sent at its neutral value.
            value = getattr(settings, field) if stage in settings.order else getattr(_OFF, field)
            out[names[field]] = value
            out |= {names[c]: getattr(settings, c) for c in _COMPANIONS.get(field, ())}
        elif stage_active(stage, settings):
            refused.append(f"{field}={getattr(settings, field)!r}")
    if kind == "llama-cpp-python" and stage_active("mirostat", settings):
        # Its mirostat replaces top-k, typical-p, top-p, min-p and temperature (llama_cpp.Llama._init_sampler).
        others = [n for n in settings.order if stage_active(n, settings) and n not in ("logit_bias", "penalties", "mirostat")]
        if others:
            refused.append(f"mirostat with {', '.join(n.replace('_', '-') for n in others)} (with mirostat on, a "
                           "llama-cpp-python server runs only the logit bias, the penalties and mirostat)")
    if settings.dynatemp_range > 0:
        refused.append(f"dynatemp_range={settings.dynatemp_range}")
    if settings.banned_strings:
        refused.append(f"banned_strings={list(settings.banned_strings)!r}")
    if settings.logit_bias:
        if "logit_bias" in names:
            out |= _logit_bias(settings, kind, refused)
        else:
            refused.append(f"logit_bias={_bias_words(settings)}")
    penalties_on = stage_active("penalties", settings)
    if penalties_on and settings.penalty_last_n != 64:
        if "penalty_last_n" in names:
            out[names["penalty_last_n"]] = settings.penalty_last_n
        elif SERVER_DEFAULT_LAST_N.get(kind) != settings.penalty_last_n:
            refused.append(f"penalty_last_n={settings.penalty_last_n}")
    active = [s for s in settings.order if stage_active(s, settings)]
    default_active = [s for s in DEFAULT_ORDER if s in active]
    if len(active) > 1 and active != default_active:
        refused.append(f"order={'>'.join(settings.order)} (the server applies its own order)")
    return out, refused


# Stages that one field switches on, beyond NEUTRAL's, and that field.
_OFF = SamplerSettings()
_SWITCHES = {"xtc": "xtc_probability", "dry": "dry_multiplier", "top_n_sigma": "top_n_sigma",
             "smoothing": "smoothing_factor", "mirostat": "mirostat", "adaptive_p": "adaptive_target"}


def _logit_bias(settings: SamplerSettings, kind: str, refused: list[str]) -> dict:
    """The logit bias as this server takes it: `{"token id": bias}`; texts only where the server tokenizes them."""
    if "logit_bias" not in settings.order:
        return {}  # the stage is left out of the chain: nothing to send
    ids = {str(k): b for k, b in settings.logit_bias if isinstance(k, int)}
    texts = {k: b for k, b in settings.logit_bias if isinstance(k, str)}
    if kind == "llama-cpp-python":
        # It reads the keys as token ids, or (logit_bias_type "tokens") all as texts it tokenizes: not both.
        if ids and texts:
            refused.append(f"logit_bias mixing token ids and texts ({_bias_words(settings)}; a llama-cpp-python "
                           "server takes either ids or texts in one request)")
            return {}
        biases = {k: (_HUGE_NEGATIVE if b == -math.inf else b) for k, b in (ids or texts).items()}
        return {"logit_bias": biases} | ({"logit_bias_type": "tokens"} if texts else {})
    if texts:
        refused.append(f"logit_bias by text ({', '.join(repr(t) for t in texts)}: a {kind} server takes token ids "
                       "only; give the ids, which the inspector shows)")
        return {}
    out = {}
    for k, b in ids.items():
        if b == -math.inf:
            b = -OPENAI_BIAS_LIMIT  # a ban, as OpenAI documents it
        elif abs(b) > OPENAI_BIAS_LIMIT:
            refused.append(f"logit_bias {k}={b:g} (a {kind} server takes biases in [-100, 100])")
            continue
        out[k] = b
    return {"logit_bias": out}


def _bias_words(s: SamplerSettings) -> str:
    return ", ".join(f"{k!r}={b:g}" for k, b in s.logit_bias)
