"""CLI flags for every sampler setting, and SamplerSettings' messages for the new ones."""

from __future__ import annotations

import math

import pytest

from engine.cli.main import build_parser, main, sampler_from_args
from engine.cli.sampling_args import parse_logit_bias
from engine.sampling.settings import DEFAULT_DRY_BREAKERS, DEFAULT_SAMPLER, SamplerSettings


def settings(*flags: str) -> SamplerSettings:
    return sampler_from_args(build_parser().parse_args(["generate", "--prompt", "x", *flags]))


def test_every_new_setting_has_a_flag():
    s = settings(
        "--dynatemp-range", "0.5", "--dynatemp-exponent", "2", "--top-n-sigma", "1.5", "--penalty-last-n", "-1",
        "--dry-multiplier", "0.8", "--dry-base", "2", "--dry-allowed-length", "3", "--dry-penalty-last-n", "128",
        "--dry-sequence-breaker", "\\n", "--dry-sequence-breaker", "Narrator:",
        "--mirostat", "2", "--mirostat-tau", "4", "--mirostat-eta", "0.2",
        "--smoothing-factor", "0.3", "--smoothing-curve", "2",
        "--logit-bias", "15=2.5", "--logit-bias", '"hello there"=-1', "--logit-bias", "7=false",
        "--banned-string", "shivers down", "--banned-string", "a tapestry",
    )
    assert (s.dynatemp_range, s.dynatemp_exponent, s.top_n_sigma, s.penalty_last_n) == (0.5, 2.0, 1.5, -1)
    assert (s.dry_multiplier, s.dry_base, s.dry_allowed_length, s.dry_penalty_last_n) == (0.8, 2.0, 3, 128)
    assert s.dry_sequence_breakers == ("\n", "Narrator:")
    assert (s.mirostat, s.mirostat_tau, s.mirostat_eta) == (2, 4.0, 0.2)
    assert (s.smoothing_factor, s.smoothing_curve) == (0.3, 2.0)
    assert s.logit_bias == ((15, 2.5), ("hello there", -1.0), (7, -math.inf))
    assert s.banned_strings == ("shivers down", "a tapestry")
    a = settings("--adaptive-target", "0.4", "--adaptive-decay", "0.5")
    assert (a.adaptive_target, a.adaptive_decay) == (0.4, 0.5)


def test_defaults_are_the_settings_defaults_and_none_clears_the_breakers():
    # llama.cpp's defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no repetition penalty), as the window's.
    assert settings() == DEFAULT_SAMPLER
    assert (settings().temperature, settings().top_k, settings().repetition_penalty) == (0.8, 40, 1.0)
    assert settings().dry_sequence_breakers == DEFAULT_DRY_BREAKERS
    assert settings("--dry-sequence-breaker", "none").dry_sequence_breakers == ()


@pytest.mark.parametrize(
    "value, expected",
    [("15043=-5", (15043, -5.0)), ('"hello"=2', ("hello", 2.0)), ('"a=b"=1', ("a=b", 1.0)),
     ("word=0.5", ("word", 0.5)), ('"\\n"=-inf', ("\n", -math.inf))],
)
def test_logit_bias_forms(value, expected):
    assert parse_logit_bias(value) == expected


@pytest.mark.model
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--logit-bias", "15"], "--logit-bias needs TOKEN_ID+BIAS, TOKEN_ID-BIAS, ID=BIAS or \"text\"=BIAS"),
        (["--logit-bias", "15=lots"], "the bias must be a number, -inf or false, got 'lots'"),
        (["--dry-base", "0.5"], "dry_base must be"),
        (["--dry-multiplier", "-1"], "dry_multiplier must be"),
        (["--mirostat", "3"], "mirostat must be 0 (off), 1 or 2 (the version), got 3"),
        (["--mirostat", "2", "--adaptive-target", "0.3"], "mirostat and adaptive-p cannot both be on"),
        (["--adaptive-decay", "1"], "adaptive_decay must be in [0, 0.99], got 1.0"),
        (["--smoothing-curve", "0.5"], "smoothing_curve must be"),
        (["--dynatemp-range", "-0.1"], "dynatemp_range must be"),
        (["--banned-string", ""], "banned_strings has an empty text"),
        (["--dry-sequence-breaker", "x" * 41], "dry_sequence_breakers must be at most 40 characters"),
    ],
)
def test_bad_values_are_one_clear_line_before_any_model_loads(capsys, flags, message):
    assert main(["generate", "--prompt", "x", *flags]) != 0  # the default model: its checks pass, it never loads
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and message in err, err


@pytest.mark.parametrize(
    "bias, message",
    [
        ({-3: 1.0}, "logit_bias token ids must be >= 0, got -3"),
        ({"": 1.0}, "logit_bias has an empty text as a key"),
        ({5: "big"}, "logit_bias for 5 must be a number, or false / -inf to ban the token, got 'big'"),
        ([[5]], "logit_bias entries must be [token id or text, bias] pairs"),
        ("5=1", "logit_bias must be a mapping {token id or text: bias} or a list of pairs"),
    ],
)
def test_logit_bias_validation(bias, message):
    with pytest.raises(ValueError) as err:
        SamplerSettings(logit_bias=bias)
    assert message in str(err.value)


def test_logit_bias_takes_llamacpp_server_json_and_round_trips():
    s = SamplerSettings(logit_bias={"15": 1.0, "hello": False, 16: -2})  # a key "15" is the id 15, as llama.cpp reads it
    assert s.logit_bias == ((15, 1.0), ("hello", -math.inf), (16, -2.0))
    assert SamplerSettings(logit_bias=[[15, 1.0], ["hello", False]]).logit_bias == ((15, 1.0), ("hello", -math.inf))
    assert SamplerSettings.from_dict(s.to_dict()) == s
