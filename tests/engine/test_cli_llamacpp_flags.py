"""The CLI as a llama.cpp user types it: llama.cpp's names and short flags, --grammar / --json-schema as text,
--settings-json's n_predict / stop / ignore_eos / n_probs, no prefix abbreviations, and the flags reaching the
request. Nothing here loads a model: where a command runs, a recording engine stands in for it.
"""

from __future__ import annotations

import json
import math
import sys

import pytest

from engine import cli
from engine.cli.input import check_args
from engine.cli.answer_output import format_token_line
from engine.cli.main import build_parser, sampler_from_args
from engine.events import Done, GenerationStats, TokenEvent, TokenProb
from engine.sampling.settings import DEFAULT_SAMPLER, SamplerSettings
from cli_checks import one_error_line, refuse_model_load, run_cli as run


@pytest.fixture(autouse=True)
def no_model_needed(monkeypatch):
    """The model spec is not looked up (the default model need not be installed) and no model loads."""
    monkeypatch.setattr("engine.cli.input.planned_backend", lambda args: "llamacpp")

    refuse_model_load(monkeypatch, "a model was loaded")


def parsed(*argv: str):
    args = build_parser().parse_args(["generate", *argv])
    check_args(args)
    return args


def test_llamacpp_short_flags_and_names():
    a = parsed("-p", "hello", "-n", "7", "-c", "512", "-t", "2", "-tb", "3", "-ngl", "0", "-b", "64",
               "-s", "11", "--temp", "0.4", "--top-k", "30", "--top-p", "0.9", "--min-p", "0.05", "--typical", "0.8",
               "--repeat-penalty", "1.2", "--repeat-last-n", "32", "--top-nsigma", "1.5", "--dynatemp-exp", "2",
               "--mirostat-lr", "0.2", "--mirostat-ent", "4", "-sys", "be brief", "-r", "END", "--ignore-eos")
    assert (a.prompt, a.max_new_tokens, a.n_ctx, a.n_threads, a.n_threads_batch, a.n_gpu_layers, a.n_batch) == \
        ("hello", 7, 512, 2, 3, 0, 64)
    s = a.sampler
    assert (s.seed, s.temperature, s.top_k, s.top_p, s.min_p, s.typical_p) == (11, 0.4, 30, 0.9, 0.05, 0.8)
    assert (s.repetition_penalty, s.penalty_last_n, s.top_n_sigma, s.dynatemp_exponent) == (1.2, 32, 1.5, 2.0)
    assert (s.mirostat_eta, s.mirostat_tau) == (0.2, 4.0)
    assert (a.system, a.stop, a.ignore_eos) == ("be brief", ["END"], True)


def test_our_older_long_names_still_work():
    a = parsed("--prompt", "x", "--max-new-tokens", "9", "--temperature", "0.3", "--repetition-penalty", "1.3",
               "--penalty-last-n", "16", "--n-ctx", "256", "--threads", "1", "--n-gpu-layers", "0", "--n-batch", "32",
               "--system", "s", "--stop", "Q:", "--seed", "5", "--order", "top_k,temperature")
    assert (a.max_new_tokens, a.n_ctx, a.n_threads, a.n_gpu_layers, a.n_batch, a.system, a.stop) == \
        (9, 256, 1, 0, 32, "s", ["Q:"])
    s = a.sampler
    assert (s.temperature, s.repetition_penalty, s.penalty_last_n, s.seed, s.order) == \
        (0.3, 1.3, 16, 5, ("top_k", "temperature"))


def test_prompt_file_short_flag_drops_the_final_newline(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("line one\nline two\n", encoding="utf-8")
    assert parsed("-f", str(f)).prompt == "line one\nline two"
    assert parsed("--file", str(f)).prompt == "line one\nline two"


@pytest.mark.parametrize("flag", ["--temperat", "--max-new", "--repeat-pen", "--grammar-f"])
def test_prefixes_are_not_guessed(flag, capsys):
    assert run(["generate", "-p", "x", flag, "1"]) == 2
    assert "unrecognized arguments" in one_error_line(capsys)


def test_seed_minus_one_is_a_random_seed_as_in_llamacpp():
    assert parsed("-p", "x", "--seed", "-1").sampler.seed is None
    assert parsed("-p", "x", "-s", "4294967295").sampler.seed is None  # LLAMA_DEFAULT_SEED
    assert parsed("-p", "x", "-s", "3").sampler.seed == 3


def test_logit_bias_in_llamacpps_syntax():
    a = parsed("-p", "x", "-l", "15043+1", "--logit-bias", "15043-1.5", "-l", "2-inf", "-l", "7=-2", "-l", '"hi"=3')
    assert a.sampler.logit_bias == ((15043, 1.0), (15043, -1.5), (2, -math.inf), (7, -2.0), ("hi", 3.0))


def test_samplers_take_llamacpps_names():
    order = parsed("-p", "x", "--samplers", "temperature;top_k;typ_p").sampler.order
    assert [n for n in order if n in ("top_k", "typical_p", "temperature", "min_p")] == ["temperature", "top_k", "typical_p"]
    assert "min_p" in parsed("-p", "x", "--sampler-seq", "kmt").sampler.order


def test_grammar_and_json_schema_take_the_text_and_files_have_their_own_flags(tmp_path, capsys):
    a = parsed("-p", "x", "--grammar", 'root ::= "yes" | "no"')
    assert a.constraint.kind == "gbnf" and "yes" in a.constraint.text
    a = parsed("-p", "x", "-j", '{"type": "object"}')
    assert a.constraint.kind == "json_schema"
    g = tmp_path / "g.gbnf"
    g.write_text('root ::= "a"\n', encoding="utf-8")
    assert parsed("-p", "x", "--grammar-file", str(g)).constraint.kind == "gbnf"
    s = tmp_path / "s.json"
    s.write_text('{"type": "string"}', encoding="utf-8")
    assert parsed("-p", "x", "-jf", str(s)).constraint.kind == "json_schema"
    # An older command line that gave --json-schema a path still runs, and is told the new name.
    assert parsed("-p", "x", "--json-schema", str(s)).constraint.kind == "json_schema"
    assert "--json-schema-file" in capsys.readouterr().err
    assert run(["generate", "-p", "x", "-jf", str(tmp_path / "missing.json")]) == 2
    assert "--json-schema-file" in one_error_line(capsys)


def test_settings_json_fields_the_cli_has_become_its_options(tmp_path, capsys):
    path = tmp_path / "llama.json"
    path.write_text(json.dumps({"temperature": 0.5, "n_predict": 7, "stop": ["END", "\n\n"], "ignore_eos": True,
                                "n_probs": 3, "tfs_z": 1, "cache_prompt": True, "grammar": 'root ::= "ok"'}))
    a = parsed("-p", "x", "--settings-json", str(path))
    assert (a.sampler.temperature, a.max_new_tokens, a.stop, a.ignore_eos, a.top_n) == (0.5, 7, ["END", "\n\n"], True, 3)
    assert a.constraint is not None and a.constraint.kind == "gbnf"
    notes = [ln for ln in capsys.readouterr().err.splitlines() if ln]
    assert len(notes) == 1 and "not used here" in notes[0] and "tfs_z=1" in notes[0] and "cache_prompt" in notes[0]
    # What is typed wins over the file, even a value equal to the default.
    b = parsed("-p", "x", "--settings-json", str(path), "-n", "3", "--stop", "Q", "--temp", "1")
    assert (b.max_new_tokens, b.stop, b.sampler.temperature) == (3, ["Q"], SamplerSettings().temperature)


def test_defaults_are_the_engines():
    a = parsed("-p", "x")
    assert a.sampler == DEFAULT_SAMPLER and a.max_new_tokens == 256 and a.top_n == 5 and not a.ignore_eos


class RecordingEngine:
    """Stands in for a loaded model: records the request and answers with nothing."""

    def __init__(self, context_length: int = 100):
        self.requests = []
        self.info = type("Info", (), {"context_length": context_length})()
        self.tokenizer = type("Tok", (), {"encode": staticmethod(lambda text, **_: [1] * len(text.split()))})()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def generate(self, request):
        self.requests.append(request)
        yield Done(GenerationStats("length", 1, 0, 0, 0.0, 0.0, 0.0, 0, 1, "", ()))


def test_the_flags_reach_the_request(monkeypatch, tmp_path):
    engine = RecordingEngine(context_length=100)
    monkeypatch.setattr(sys.modules["engine.cli.main"], "_load", lambda args: engine)
    assert cli.main(["generate", "-p", "four words of prompt", "-n", "5", "--ignore-eos", "-r", "STOP",
                     "--grammar", 'root ::= "a"', "--temp", "0"]) == 0
    r = engine.requests[-1]
    assert (r.max_new_tokens, r.ignore_eos, r.stop, r.sampler.temperature, r.constraint.kind) == \
        (5, True, ("STOP",), 0.0, "gbnf")
    # -n -1: llama.cpp's "no limit" is as many tokens as the context has room for after the prompt.
    assert cli.main(["generate", "-p", "four words of prompt", "-n", "-1"]) == 0
    assert engine.requests[-1].max_new_tokens == 100 - 4


def test_show_probs_ranks_count_from_one_as_score_does():
    top = (TokenProb(5, "a", math.log(0.6)), TokenProb(6, "b", math.log(0.3)))
    event = TokenEvent(index=0, token_id=5, text="a", token_text="a", logprob=math.log(0.6), sampler_logprob=0.0,
                       rank=0, entropy=0.9, top_model=top, top_sampler=top)
    assert "rank=1 " in format_token_line(event)
    generate = build_parser()._subparsers._group_actions[0].choices["generate"]
    assert "rank 1 is the model's most likely token" in " ".join(generate.format_help().split())
