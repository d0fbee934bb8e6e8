"""Issue 36 item 16: extreme finite sampler values are refused in words, or sample as they should.

Temperature 1e-45, repetition penalty 1e-308 or a bias of 1e308 ended the answer after one token with
numpy warnings; huge smoothing or dynamic-temperature values gave a cryptic numpy error. Every numeric
field is tried with the extremes a float can hold: the settings either refuse the value with a message
naming the field, or the chain picks a token from a finite distribution with no numpy warning at all.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import fields

import numpy as np
import pytest

from engine.sampling import SamplerChain, SamplerSettings

EXTREMES = (1e-45, 5e-324, 1e-308, 1e-30, 1e-7, 1e7, 1e30, 3.4e38, 1e308, -1e-45, -1e308, -1e30)
FLOAT_FIELDS = [f.name for f in fields(SamplerSettings) if f.type in ("float", float)]
INT_FIELDS = [f.name for f in fields(SamplerSettings) if f.type in ("int", int)]
NO_TOKENIZER = {"dry_sequence_breakers": ()}  # DRY's breakers need a tokenizer; the chain here has none
# Stages that only act when another field switches them on: each field is tried with its stage on.
SWITCH_ON = {
    "dynatemp_exponent": {"dynatemp_range": 0.5},
    "dry_base": {"dry_multiplier": 0.8},
    "dry_allowed_length": {"dry_multiplier": 0.8},
    "dry_penalty_last_n": {"dry_multiplier": 0.8},
    "xtc_threshold": {"xtc_probability": 1.0},
    "mirostat_tau": {"mirostat": 2},
    "mirostat_eta": {"mirostat": 2},
    "adaptive_decay": {"adaptive_target": 0.3},
    "smoothing_curve": {"smoothing_factor": 0.5},
    "penalty_last_n": {"repetition_penalty": 1.2},
}


def _logits(seed: int = 0, v: int = 512) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(v) * 4).astype(np.float32)


def _picks_cleanly(settings: SamplerSettings) -> None:
    chain = SamplerChain(settings.with_(seed=1))
    history = np.array([3, 5, 3, 7, 3, 5, 3, 7, 9], dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any numpy RuntimeWarning (overflow, invalid) fails the test
        with np.errstate(over="raise", invalid="raise", divide="raise", under="ignore"):
            for step in range(4):
                pick = chain.pick(_logits(step), history, top_n=5, record_stages=True)
                assert 0 <= pick.token_id < 512
                assert math.isfinite(pick.logprob) and math.isfinite(pick.entropy)
                assert all(math.isfinite(p.logprob) or p.logprob == -math.inf for p in pick.top_sampler)
                assert pick.sampler_logprob <= 0 and not math.isnan(pick.sampler_logprob)
                for stage in pick.stages or ():
                    assert math.isfinite(stage.entropy) and 0 <= stage.mass_kept <= 1 + 1e-6
                history = np.append(history, pick.token_id)


@pytest.mark.parametrize("name", FLOAT_FIELDS)
@pytest.mark.parametrize("value", EXTREMES)
def test_an_extreme_float_is_refused_in_words_or_samples_cleanly(name, value):
    try:
        settings = SamplerSettings(**{**NO_TOKENIZER, **SWITCH_ON.get(name, {}), name: value})
    except ValueError as e:
        assert name in str(e) and "Traceback" not in str(e)
        return
    _picks_cleanly(settings)


@pytest.mark.parametrize("name", INT_FIELDS)
@pytest.mark.parametrize("value", (2**31, 2**63, 10**30, -(2**63)))
def test_an_extreme_integer_is_refused_in_words_or_samples_cleanly(name, value):
    try:
        settings = SamplerSettings(**{**NO_TOKENIZER, **SWITCH_ON.get(name, {}), name: value})
    except ValueError as e:
        assert name in str(e)
        return
    _picks_cleanly(settings)


@pytest.mark.parametrize("bias", (1e308, -1e308, 1e30, 3.4e38))
def test_an_extreme_logit_bias_is_refused_in_words(bias):
    with pytest.raises(ValueError, match="logit_bias for 5 must be between -1000 and 1000"):
        SamplerSettings(logit_bias={5: bias})


def test_the_issues_values_are_refused_with_what_to_do():
    with pytest.raises(ValueError, match="use 0 for greedy, or at least 0.001"):
        SamplerSettings(temperature=1e-45)
    with pytest.raises(ValueError, match=r"repetition_penalty must be between 0.01 and 100 \(1 = off\)"):
        SamplerSettings(repetition_penalty=1e-308)
    with pytest.raises(ValueError, match="smoothing_factor must be in"):
        SamplerSettings(smoothing_factor=1e30)
    with pytest.raises(ValueError, match="dynatemp_range must be in"):
        SamplerSettings(dynatemp_range=1e308)


def test_the_bounds_still_sample_cleanly():
    """The largest and smallest values allowed do what they say, without warnings."""
    _picks_cleanly(SamplerSettings(temperature=0.001))
    _picks_cleanly(SamplerSettings(temperature=1000))
    _picks_cleanly(SamplerSettings(repetition_penalty=0.01))
    _picks_cleanly(SamplerSettings(repetition_penalty=100))
    _picks_cleanly(SamplerSettings(logit_bias={5: 1000, 6: -1000, 7: False}))
    _picks_cleanly(SamplerSettings(smoothing_factor=100, smoothing_curve=100))
    _picks_cleanly(SamplerSettings(temperature=0.001, dynatemp_range=1000, dynatemp_exponent=100))
    _picks_cleanly(SamplerSettings(dry_multiplier=100, dry_base=100, dry_allowed_length=0, **NO_TOKENIZER))
    _picks_cleanly(SamplerSettings(mirostat=1, mirostat_tau=100, mirostat_eta=1))
