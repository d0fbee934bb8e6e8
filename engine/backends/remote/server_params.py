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
from engine.sampling.llamacpp_json import llamacpp_fields
from engine.sampling.registry import LLAMA_CPP_SERVER, SERVER_KINDS, STAGES, stage_active
from engine.sampling.settings import DEFAULT_ORDER, SamplerSettings


def _parameter_names() -> dict[str, dict[str, str]]:
    """server kind -> {our setting: the server's parameter}, from the stage registry's rows."""
    names: dict[str, dict[str, str]] = {kind: {} for kind in SERVER_KINDS}
    for row in STAGES:
        for field, kinds in row.server.items():
            for kind, param in kinds.items():
                names[kind][field] = param
    # llama.cpp's server: every field it has (see llamacpp_fields), under its own names, and the stage order.
    names[LLAMA_CPP_SERVER] = {f: key for row in STAGES for f, key in row.llamacpp.items()} | {"order": "samplers"}
    return names


# server kind -> {our setting: the server's parameter}
PARAMETER_NAMES: dict[str, dict[str, str]] = _parameter_names()
_OPENAI = PARAMETER_NAMES["ollama"]  # the plain OpenAI API: what a server of a kind we do not know is sent
_OFF = SamplerSettings()  # every stage at its neutral value
# penalty_last_n a server uses when it has no parameter for it (llama.cpp's default, ours too)
SERVER_DEFAULT_LAST_N = {"llama-cpp-python": 64, "lmstudio": 64}
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
    for row in STAGES:
        if row.server_rule == "fields":
            for field in row.server:
                value = getattr(settings, field)
                if field in names:
                    # Always sent, neutral or not: servers have their own defaults (llama.cpp: top_k 40, top_p 0.95,
                    # min_p 0.05, repeat_penalty 1.1), and an omitted field would silently turn those on.
                    out[names[field]] = value
                elif value != getattr(_OFF, field):
                    refused.append(f"{field}={value}")
        elif row.server_rule == "switch":
            switch = row.switches[0]
            if switch in names:
                # A stage left out of the order is off: sent at its neutral value, with the stage's other settings.
                out[names[switch]] = getattr(settings if row.name in settings.order else _OFF, switch)
                out |= {names[f]: getattr(settings, f) for f in row.fields if f != switch and f in names}
            elif row.active(settings):
                refused.append(f"{switch}={getattr(settings, switch)!r}")
    if kind == "llama-cpp-python" and stage_active("mirostat", settings):
        # Its mirostat replaces top-k, typical-p, top-p, min-p and temperature (llama_cpp.Llama._init_sampler).
        others = [n for n in settings.order if stage_active(n, settings) and n not in ("logit_bias", "penalties", "mirostat")]
        if others:
            refused.append(f"mirostat with {', '.join(n.replace('_', '-') for n in others)} (with mirostat on, a "
                           "llama-cpp-python server runs only the logit bias, the penalties and mirostat)")
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
