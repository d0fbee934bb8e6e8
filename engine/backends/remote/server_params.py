"""Our `SamplerSettings` as a server's request parameters, or a refusal that names what it cannot take.

Every OpenAI-compatible server takes temperature, top_p, the presence and
frequency penalties, seed and stop. The rest are extensions whose names
differ per server (repetition_penalty in vLLM/SGLang, repeat_penalty in
llama.cpp). A server silently ignores a field it does not know, so we never
send one hoping it works: a setting without a known name on this kind of
server is refused before anything is sent.
"""

from __future__ import annotations

from engine.backends.remote.errors import UnsupportedByServerError
from engine.sampling.settings import DEFAULT_ORDER, SamplerSettings

_OPENAI = {"temperature": "temperature", "top_p": "top_p", "presence_penalty": "presence_penalty",
           "frequency_penalty": "frequency_penalty"}
_VLLM = _OPENAI | {"top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repetition_penalty"}
_LLAMA_CPP_PYTHON = _OPENAI | {"top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repeat_penalty"}
_LLAMA_CPP = _LLAMA_CPP_PYTHON | {"typical_p": "typical_p", "penalty_last_n": "repeat_last_n"}

# server kind -> {our setting: the server's parameter}
PARAMETER_NAMES: dict[str, dict[str, str]] = {
    "vllm": _VLLM,
    "sglang": _VLLM,
    "llama-cpp-python": _LLAMA_CPP_PYTHON,
    "llama.cpp": _LLAMA_CPP,
    "lmstudio": _OPENAI | {"top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repeat_penalty"},
    "ollama": _OPENAI,
    "openai": _OPENAI,
}
# penalty_last_n a server uses when it has no parameter for it (llama.cpp's default, ours too)
SERVER_DEFAULT_LAST_N = {"llama-cpp-python": 64, "lmstudio": 64}
NEUTRAL = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0,
           "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def server_parameters(settings: SamplerSettings, kind: str, seed_supported: bool, we_sample_ok: bool = True) -> dict:
    """Request fields for `settings` on a server of `kind`; raises naming every setting it cannot take.

    `we_sample_ok`: whether our sampler could run on this server instead; the refusal only suggests what works.
    """
    names = PARAMETER_NAMES.get(kind, _OPENAI)
    out: dict = {}
    refused: list[str] = []
    for field, neutral in NEUTRAL.items():
        value = getattr(settings, field)
        if field in names:
            # Always sent, neutral or not: servers have their own defaults (llama.cpp: top_k 40, top_p 0.95,
            # min_p 0.05, repeat_penalty 1.1), and an omitted field would silently turn those on.
            out[names[field]] = value
        elif value != neutral:
            refused.append(f"{field}={value}")
    if settings.xtc_probability > 0:
        refused.append(f"xtc_probability={settings.xtc_probability}")
    refused += [f"{_UNMAPPED_STAGES[stage]}={getattr(settings, _UNMAPPED_STAGES[stage])!r}"
                for stage in _UNMAPPED_STAGES if _stage_active(stage, settings)]
    penalties_on = settings.repetition_penalty != 1 or settings.presence_penalty != 0 or settings.frequency_penalty != 0
    if penalties_on and settings.penalty_last_n != 64:
        if "penalty_last_n" in names:
            out[names["penalty_last_n"]] = settings.penalty_last_n
        elif SERVER_DEFAULT_LAST_N.get(kind) != settings.penalty_last_n:
            refused.append(f"penalty_last_n={settings.penalty_last_n}")
    active = [s for s in settings.order if _stage_active(s, settings)]
    default_active = [s for s in DEFAULT_ORDER if s in active]
    if len(active) > 1 and active != default_active:
        refused.append(f"order={'>'.join(settings.order)} (the server applies its own order)")
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


# Stages no server parameter maps to yet, and the field that switches each on (its default is off).
_UNMAPPED_STAGES = {"logit_bias": "logit_bias", "dry": "dry_multiplier", "top_n_sigma": "top_n_sigma",
                    "smoothing": "smoothing_factor", "mirostat": "mirostat", "adaptive_p": "adaptive_target"}


def _stage_active(stage: str, s: SamplerSettings) -> bool:
    if stage == "penalties":
        return s.repetition_penalty != 1 or s.presence_penalty != 0 or s.frequency_penalty != 0
    if stage == "xtc":
        return s.xtc_probability > 0
    if stage in NEUTRAL:
        return getattr(s, stage) != NEUTRAL[stage]
    field = _UNMAPPED_STAGES.get(stage, stage)
    if not hasattr(s, field):
        return False
    return getattr(s, field) != getattr(SamplerSettings(), field)
