"""Sampler settings as llama.cpp server JSON: pasted setups from llama.cpp and SillyTavern, and ours out and back."""

from __future__ import annotations

import json
import math

import pytest

from engine import SamplerSettings, llamacpp_json, parse_llamacpp_json
from engine.cli.main import build_parser, main, sampler_from_args
from engine.sampling.settings import DEFAULT_ORDER

# What llama.cpp runs with mirostat on, in our stage names (and any stage of ours it has no name for, e.g. a grammar).
MIROSTAT_ORDER = tuple(n for n in DEFAULT_ORDER if n in ("grammar", "logit_bias", "temperature", "mirostat"))
ROUND_TRIPS = [
    SamplerSettings(),
    SamplerSettings(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, repetition_penalty=1.1, seed=7),
    SamplerSettings(dry_multiplier=0.8, dry_base=2.0, dry_allowed_length=3, dry_penalty_last_n=256,
                    dry_sequence_breakers=("\n", "Narrator:"), xtc_probability=0.5, xtc_threshold=0.1,
                    top_n_sigma=1.5, dynatemp_range=0.5, dynatemp_exponent=2.0,
                    logit_bias=((15, 2.5), ("hello there", -1.0), (7, -math.inf)),
                    smoothing_factor=0.3, smoothing_curve=2.0, banned_strings=("shivers down",)),
    SamplerSettings(temperature=0.8, mirostat=2, mirostat_tau=4.0, mirostat_eta=0.2,
                    order=MIROSTAT_ORDER),
    SamplerSettings(adaptive_target=0.4, adaptive_decay=0.5, min_p=0.1),
    SamplerSettings(order=tuple(n for n in DEFAULT_ORDER if n not in ("top_k", "min_p", "temperature", "top_p",
                                                                     "typical_p", "penalties", "dry", "top_n_sigma",
                                                                     "xtc", "adaptive_p", "mirostat"))
                    + ("min_p", "temperature", "top_k", "mirostat")),
]


@pytest.mark.parametrize("settings", ROUND_TRIPS)
def test_export_then_import_gives_the_same_settings(settings):
    text, _notes = llamacpp_json(settings, 300, ("\n\n",))
    back = parse_llamacpp_json(text)
    assert back.sampler == settings
    assert (back.max_new_tokens, back.stop, back.ignored) == (300, ("\n\n",), ())


def test_export_uses_llamacpp_names_and_says_what_llamacpp_lacks():
    s = SamplerSettings(repetition_penalty=1.2, penalty_last_n=128, typical_p=0.9, logit_bias=((3, -math.inf),),
                        smoothing_factor=0.2, banned_strings=("a tapestry",))
    text, notes = llamacpp_json(s)
    d = json.loads(text)  # strict JSON: -inf is written as llama.cpp's `false`
    assert (d["repeat_penalty"], d["repeat_last_n"], d["typical_p"]) == (1.2, 128, 0.9)
    assert d["logit_bias"] == [[3, False]] and d["seed"] == 4294967295
    assert d["samplers"] == ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                             "temperature", "adaptive_p"]
    assert any("smoothing_factor=0.2" in n for n in notes) and any("banned_strings" in n for n in notes)


def test_a_llamacpp_request_reads_with_its_names_and_chain_rules():
    got = parse_llamacpp_json(json.dumps({
        "temperature": 0.9, "repeat_penalty": 1.1, "repeat_last_n": 256, "penalty_present": 0.5, "typ_p": 0.95,
        "samplers": ["top_k", "min-p", "temp", "tfs_z"], "logit_bias": {"15043": -1.5, "Hello": 2},
        "n_predict": 64, "stop": "###", "seed": -1, "cache_prompt": True, "n_probs": 5,
    }))
    s = got.sampler
    assert (s.temperature, s.repetition_penalty, s.penalty_last_n, s.presence_penalty, s.typical_p) == \
        (0.9, 1.1, 256, 0.5, 0.95)
    assert [n for n in s.order if n != "grammar"] == ["logit_bias", "smoothing", "top_k", "min_p", "temperature", "mirostat"]
    assert s.logit_bias == ((15043, -1.5), ("Hello", 2.0)) and s.seed is None
    assert (got.max_new_tokens, got.stop) == (64, ("###",))
    assert got.ignored == ("samplers 'tfs_z' (no such stage here)", "cache_prompt=true", "n_probs=5")
    # llama.cpp: with mirostat on only logit bias, temperature and mirostat run; adaptive-p only when listed.
    m = parse_llamacpp_json('{"mirostat": 2, "top_k": 40}')
    assert m.sampler.order == MIROSTAT_ORDER and "mirostat is on" in m.notes[0]
    a = parse_llamacpp_json('{"adaptive_target": 0.5}')
    assert "adaptive_p" not in a.sampler.order and "does not run" in a.notes[0]
    assert [n for n in parse_llamacpp_json('{"samplers": "kpt"}').sampler.order if n != "grammar"] == [
        "logit_bias", "smoothing", "top_k", "top_p", "temperature", "mirostat"]


def test_a_sillytavern_preset_reads_and_lists_what_has_no_meaning_here():
    preset = {"temp": 1.25, "rep_pen": 1.05, "rep_pen_range": 1024, "freq_pen": 0.1, "presence_pen": 0.2,
              "min_p": 0.02, "nsigma": 1.0, "mirostat_mode": 0, "top_a": 0.2, "tfs": 1, "smoothing_factor": 0.25,
              "smoothing_curve": 1.5, "dynatemp": True, "min_temp": 0.5, "max_temp": 1.5, "dry_multiplier": 0.8,
              "dry_sequence_breakers": "[\"\\n\", \":\", \"\\\"\"]",
              "logit_bias": [{"id": "x", "text": "[42, 43]", "value": -5}, {"id": "y", "text": "Elara", "value": -100}]}
    got = parse_llamacpp_json(json.dumps(preset))
    s = got.sampler
    assert (s.temperature, s.dynatemp_range) == (1.0, 0.5)  # 0.5..1.5 is 1 ± 0.5; temp is replaced
    assert (s.repetition_penalty, s.penalty_last_n, s.frequency_penalty, s.presence_penalty) == (1.05, 1024, 0.1, 0.2)
    assert (s.top_n_sigma, s.smoothing_factor, s.smoothing_curve, s.dry_multiplier) == (1.0, 0.25, 1.5, 0.8)
    assert s.dry_sequence_breakers == ("\n", ":", '"')
    assert s.logit_bias == ((42, -5.0), (43, -5.0), ("Elara", -100.0))
    assert s.order == DEFAULT_ORDER
    assert got.ignored == ("top_a=0.2", "tfs=1") and "dynamic temperature 0.5..1.5" in got.notes[0]


@pytest.mark.parametrize("text, words", [
    ('{"temperature": 0.8,', "this is not JSON: Expecting property name enclosed in double quotes at line 1"),
    ("[1, 2]", "expected a JSON object of settings"),
    ('{"temperature": -1, "top_k": 1.5}', "temperature must be >= 0 (0 = greedy), got -1; top_k must be an integer"),
    ('{"samplers": 3}', "samplers must be a list of stage names"),
    ('{"stop": [1]}', "stop must be a list of texts"),
    ('{"logit_bias": [{"x": 1}]}', "logit_bias entries must be [token id or text, bias] pairs"),
])
def test_bad_input_is_one_message_in_words(text, words):
    with pytest.raises(ValueError) as info:
        parse_llamacpp_json(text)
    assert str(info.value).startswith(words) and "invalid sampler settings" not in str(info.value)


def test_cli_settings_json_is_the_base_and_flags_override(tmp_path, capsys):
    path = tmp_path / "setup.json"
    path.write_text(json.dumps({"temperature": 0.6, "top_k": 20, "dry_multiplier": 0.8, "tfs_z": 1}))
    args = build_parser().parse_args(["generate", "--prompt", "x", "--settings-json", str(path), "--top-k", "5"])
    s = sampler_from_args(args)
    assert (s.temperature, s.top_k, s.dry_multiplier) == (0.6, 5, 0.8)
    assert "not used here: tfs_z=1" in capsys.readouterr().err
    path.write_text('{"temperature": "hot"}')
    assert main(["generate", "--prompt", "x", "--settings-json", str(path)]) == 2
    err = capsys.readouterr().err
    assert "error: --settings-json" in err and "temperature must be a finite number" in err
