"""Constrained generation (engine/constraints, the grammar stage): specs, vocabularies, answers, oracles.

Oracles are llguidance's own readers of a vocabulary (its llama.cpp and Hugging Face loaders),
llama.cpp's own grammar sampler (`llama_sampler_init_grammar`) and the `jsonschema` validator.
"""

from __future__ import annotations

import ctypes
import json
import math

import numpy as np
import pytest

from engine.constraints import Constraint, ConstraintError, ll_tokenizer, start_run
from engine.decode.loop import generate_events
from engine.events import Done, TokenEvent
from engine.request import GenerationRequest
from engine.sampling import SamplerSettings

pytest.importorskip("llguidance")

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
ASK = ({"role": "user", "content": "Describe a person as JSON."},)


def run(backend, constraint, *, temperature=0.0, seed=0, max_new_tokens=60, **kw):
    req = GenerationRequest(messages=ASK, sampler=SamplerSettings(temperature=temperature, seed=seed, **kw.pop("sampler", {})),
                            max_new_tokens=max_new_tokens, constraint=constraint, **kw)
    events = list(generate_events(backend, req))
    assert isinstance(events[-1], Done)
    return [e for e in events if isinstance(e, TokenEvent)], events[-1].stats


# --- specs: bad input is one clear error, before any model ---------------------------------------


@pytest.mark.parametrize(("kind", "text", "words"), [
    ("json_schema", '{"type": "object", "properties": {', "not valid JSON: Expecting property name"),
    ("json_schema", '{"type": "strng"}', "Invalid type: strng"),
    ("json_schema", "[1, 2]", "a JSON schema is an object"),
    ("regex", "a(b", "unclosed group"),
    ("regex", "[z-a]", "invalid character class range"),
    ("gbnf", 'root ::= "a" missing', "Rule 'missing' not found"),
    ("gbnf", "root ::= [a-z", "line 1"),
    ("lark", "start: foo", 'unknown name: "foo"'),
    ("choice", "[]", "non-empty list"),
    ("choice", "yes or no", "not a JSON list"),
    ("regex", "  ", "empty"),
    ("xml", "<a/>", "unknown constraint kind"),
])
def test_bad_constraint_is_one_clear_error(kind, text, words):
    with pytest.raises(ConstraintError) as e:
        Constraint(kind, text)
    assert words in str(e.value)
    assert "Traceback" not in str(e.value)


def test_constraint_round_trips_and_compiles_each_kind():
    for c in (Constraint.json_schema(PERSON), Constraint.any_json(), Constraint.regex(r"\d+"),
              Constraint.lark('start: "a" | "b"'), Constraint.gbnf('root ::= "x" [0-9]'), Constraint.choice(["red", "blue"])):
        assert c.grammar
        assert Constraint.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    with pytest.raises(ConstraintError, match="must be an engine.constraints.Constraint"):
        GenerationRequest(prompt="x", constraint={"kind": "regex"})


def _takes(c: Constraint, text: str) -> bool:
    from llguidance import LLMatcher

    from engine.constraints.vocabulary import byte_tokenizer

    m = LLMatcher(byte_tokenizer(), c.grammar, log_level=0)
    raw = list(text.encode())
    return m.try_consume_tokens(raw) == len(raw) and bool(m.is_accepting())


def test_json_whitespace_is_bounded_as_llama_cpp_bounds_it_unless_the_schema_says_otherwise():
    # llguidance's default allows any whitespace; a small model at temperature 0 then wrote newlines inside
    # `{` until the token limit. llama.cpp's json-schema-to-grammar allows one space, or 1-2 newlines and 20
    # spaces or tabs, between tokens: so does ours.
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    for c in (Constraint.json_schema(schema), Constraint.any_json()):
        assert _takes(c, '{"a": 1}') and _takes(c, '{\n  "a": 1\n}') and _takes(c, '{\n\n' + " " * 20 + '"a": 1}')
        assert not _takes(c, '{\n    \n      \n  "a": 1}') and not _takes(c, "{" + " " * 21 + '"a": 1}')
    assert "x-guidance" not in Constraint.json_schema(schema).text  # the user's schema is kept as written
    free = Constraint.json_schema({**schema, "x-guidance": {"whitespace_flexible": True}})
    assert _takes(free, "{" + " " * 40 + '"a": 1}')


# --- the vocabulary: our builder agrees with llguidance's own readers ---------------------------


def test_gguf_vocabulary_agrees_with_llguidance_reader(default_llamacpp):
    from llguidance.llamacpp import lltokenizer_from_vocab

    tok = default_llamacpp.tokenizer
    ours = ll_tokenizer(tok)
    ref = lltokenizer_from_vocab(tok._vocab, eos_token=sorted(tok.eos_token_ids))
    assert ours.vocab_size == ref.vocab_size == tok.vocab_size
    ids = range(tok.vocab_size)  # every token: specials, the 256 byte tokens, merges
    assert [ours.decode_bytes([i]) for i in ids] == [ref.decode_bytes([i]) for i in ids]
    assert [ours.is_special_token(i) for i in ids] == [ref.is_special_token(i) for i in ids]
    assert sum(ours.is_special_token(i) for i in ids) > 2  # <|im_start|> & co. are markup, not text
    text = "Héllo wörld 🙂 {\"a\": [1, 2.5e3]}\n\tend"
    assert ours.tokenize_str(text) == tok.encode(text, add_special_tokens=False)


def test_hf_vocabulary_agrees_with_llguidance_hf_and_with_gguf(default_model_folder, default_llamacpp):
    from llguidance.hf import from_tokenizer

    from engine.tokenizer import Tokenizer

    hf = Tokenizer.from_folder(default_model_folder)
    ours = ll_tokenizer(hf)
    ref = from_tokenizer(hf.hf)
    gguf = ll_tokenizer(default_llamacpp.tokenizer)
    n = hf.token_count()
    sample = sorted(set(range(0, 3000)) | set(range(n - 500, n)))  # specials, byte tokens, early and late merges
    assert [ours.decode_bytes([i]) for i in sample] == [ref.decode_bytes([i]) for i in sample]
    assert [ours.decode_bytes([i]) for i in sample] == [gguf.decode_bytes([i]) for i in sample]
    byte_tokens = [i for i in sample if len(hf.token_bytes(i)) == 1 and hf.token_bytes(i)[0] >= 0x80]
    assert len(byte_tokens) >= 64  # the byte-level pieces of multi-byte characters are among them
    assert [ours.is_special_token(i) for i in sample] == [gguf.is_special_token(i) for i in sample]


# --- the oracle for grammars: llama.cpp's own grammar sampler -----------------------------------

GBNF = 'root ::= "{" ws "\\"n\\":" ws [0-9]+ ws "," ws "\\"ok\\":" ws ("true" | "false") ws "}"\nws ::= [ \\t\\n]*'


def _llama_allowed(sampler, n_vocab: int) -> np.ndarray:
    import llama_cpp

    arr = (llama_cpp.llama_token_data * n_vocab)()
    for i in range(n_vocab):
        arr[i].id, arr[i].logit, arr[i].p = i, 0.0, 0.0
    data = llama_cpp.llama_token_data_array(arr, n_vocab, -1, False)
    llama_cpp.llama_sampler_apply(sampler, ctypes.byref(data))
    logits = np.ctypeslib.as_array((ctypes.c_float * (n_vocab * 3)).from_address(ctypes.addressof(arr)))
    return np.isfinite(logits.reshape(n_vocab, 3)[:, 1])  # (id: int32, logit: float, p: float) per token


@pytest.mark.slow
@pytest.mark.parametrize("text", ['{ "n": 42, "ok": true}', '{"n":7,"ok":false }'])
def test_gbnf_allowed_set_equals_llama_cpp_grammar_sampler(default_llamacpp, text):
    """At every step the allowed set equals llama.cpp's; where the grammar forces bytes, llguidance allows
    only their canonical tokens (a subset of llama.cpp's set, which allows any spelling)."""
    import llama_cpp

    tok = default_llamacpp.tokenizer
    v = tok.vocab_size
    sampler = llama_cpp.llama_sampler_init_grammar(tok._vocab, GBNF.encode(), b"root")
    constraint = Constraint.gbnf(GBNF)
    ours = start_run(constraint, tok, v)
    probe = start_run(constraint, tok, v)._mask._m  # a second matcher, to ask for forced bytes
    zeros = np.zeros(v, dtype=np.float32)
    equal_steps = 0
    for t in [*tok.encode(text, add_special_tokens=False), None]:
        theirs = _llama_allowed(sampler, v)
        mine = ours.allowed(zeros)
        special = np.zeros(v, dtype=bool)
        special[list(tok.special_token_ids())] = True  # llama.cpp leaves the end-of-turn to its EOG rule
        if probe.compute_ff_bytes():
            assert not (mine & ~theirs & ~special).any()
            assert mine.any()
        else:
            assert np.array_equal(mine & ~special, theirs & ~special)
            equal_steps += 1
        if t is None:
            break
        llama_cpp.llama_sampler_accept(sampler, t)
        ours.accept(t)
        assert probe.consume_token(t)
        assert ours.failure is None
    assert equal_steps >= 4
    assert ours.is_accepting()
    llama_cpp.llama_sampler_free(sampler)


# --- answers -------------------------------------------------------------------------------------


def test_json_schema_answer_validates_and_reports_each_step(fresh_default_llamacpp):
    jsonschema = pytest.importorskip("jsonschema")
    tokens, stats = run(fresh_default_llamacpp, Constraint.json_schema(PERSON), record_stages=True)
    jsonschema.validate(json.loads(stats.text), PERSON)
    assert stats.finish_reason == "eos" and stats.constraint_status == "complete"
    steps = [t.constraint for t in tokens]
    assert all(s is not None and 0 < s.mass_kept <= 1 and s.allowed >= 1 for s in steps)
    assert tokens[0].stages[0].stage == "grammar"
    assert tokens[0].stages[0].mass_kept == pytest.approx(steps[0].mass_kept, rel=1e-4)
    first = steps[0]  # the model wants to open with ``` or words: the constraint removed them
    assert first.mass_kept < 0.5 and first.disallowed and first.disallowed[0].logprob > math.log(first.mass_kept) - 5
    assert stats.constraint_logprob == pytest.approx(sum(math.log(s.mass_kept) for s in steps), rel=1e-6)
    eos = fresh_default_llamacpp.tokenizer.eos_token_ids  # once the object closed, only the ends are left
    assert tokens[-1].token_id in eos and tokens[-1].constraint.allowed == len(eos)


def test_forced_tokens_are_what_masked_sampling_allows(fresh_default_llamacpp):
    """Where the grammar forces bytes, the fast-forward token is the one token the mask allows, so a
    masked draw gives the same token; with fast-forward off the answer is the same."""
    c = Constraint.regex(r"The answer is (yes|no)\. Because [a-z]{2,8}\.")
    tokens, stats = run(fresh_default_llamacpp, c, temperature=0.0)
    tok = fresh_default_llamacpp.tokenizer
    check = start_run(c, tok, tok.vocab_size)
    zeros = np.zeros(tok.vocab_size, dtype=np.float32)
    forced = 0
    for e in tokens[:-1]:
        ff = check.fast_forward()
        allowed = check.allowed(zeros)
        if ff is not None:
            assert np.flatnonzero(allowed).tolist() == [ff] == [e.token_id]
            assert e.constraint.forced
            forced += 1
        check.accept(e.token_id)
    assert forced >= 3
    off, stats_off = run(fresh_default_llamacpp, Constraint.regex(c.text, fast_forward=False), temperature=0.0)
    assert stats_off.text == stats.text and [e.token_id for e in off] == [e.token_id for e in tokens]


def test_length_limit_inside_grammar_says_so(fresh_default_llamacpp):
    _, stats = run(fresh_default_llamacpp, Constraint.json_schema(PERSON), max_new_tokens=4)
    assert stats.finish_reason == "length"
    assert stats.constraint_status.startswith("stopped at the length limit inside the grammar")


def test_dead_end_stops_with_a_message(fresh_default_llamacpp):
    tok = fresh_default_llamacpp.tokenizer
    digits = [i for i in range(tok.vocab_size) if tok.token_bytes(i)[:1].isdigit()]
    ban = {"logit_bias": [[i, False] for i in digits]}
    order = ("logit_bias", "grammar", "temperature")  # the grammar sees what the bias left
    tokens, stats = run(fresh_default_llamacpp, Constraint.regex(r"[0-9]+"), sampler={**ban, "order": order})
    assert tokens == []
    assert stats.finish_reason == "error" and "dead end" in stats.error and "logit bias" in stats.error
    assert stats.constraint_status == stats.error
    tokens, stats = run(fresh_default_llamacpp, Constraint.regex(r"[0-9]+"), sampler=ban)  # grammar first
    assert tokens == [] and "dead end" in stats.error and "removed every token it allows" in stats.error


def test_choice_with_sampling(fresh_default_llamacpp):
    for seed in range(3):
        _, stats = run(fresh_default_llamacpp, Constraint.choice(["red", "green", "blue"]), temperature=1.0, seed=seed)
        assert stats.text in ("red", "green", "blue")


# --- the CLI --------------------------------------------------------------------------------------


def test_cli_refuses_a_bad_schema_before_loading(tmp_path, capsys):
    from engine.cli.main import main

    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "objec"}')
    assert main(["generate", "--prompt", "x", "--json-schema", str(bad)]) != 0  # refused before the model loads
    err = capsys.readouterr().err
    assert "Invalid type: objec" in err and "bad.json" in err and "tok/s" not in err
    assert main(["generate", "--prompt", "x", "--regex", "ab("]) != 0
    assert "unclosed group at column 3" in capsys.readouterr().err


def test_cli_regex_answer(default_llamacpp, capsys):
    from engine.cli.main import main

    assert main(["generate", "--chat", "--prompt", "Is water wet?", "--regex", "(Yes|No)\\.", "--temperature", "0"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() in ("Yes.", "No.")
    assert "constraint: complete" in out.err


# --- the research API -----------------------------------------------------------------------------


def test_research_allowed_tokens_and_weighted_samples(default_llamacpp):
    from engine.research import LanguageModel

    lm = LanguageModel(default_llamacpp)
    tok = default_llamacpp.tokenizer
    c = Constraint.choice(["red", "green", "blue"])
    mask = lm.allowed_tokens(c)
    assert {tok.decode([int(i)]) for i in np.flatnonzero(mask)} >= {"red", "green", "blue"}
    assert not mask[tok.encode(" yellow", add_special_tokens=False)[0]]
    prompt = tok.chat_ids([{"role": "user", "content": "Name a colour."}])
    lp = lm.next_token_logprobs_sync(prompt)
    assert lm.allowed_tokens(c).sum() == mask.sum()
    for seed in range(3):
        s = lm.sample_constrained(prompt, c, max_tokens=8, seed=seed)
        assert s.complete and tok.decode(list(s.token_ids[:-1])) in ("red", "green", "blue")
        assert s.token_ids[-1] in tok.eos_token_ids
        first = float(np.log(np.exp(lp[mask]).sum()))  # the first step's mass kept, from the model's own log-probs
        assert s.log_weight <= first + 1e-4 and s.log_weight < 0
    with pytest.raises(ValueError, match="does not allow this prefix"):
        lm.allowed_tokens(c, tok.encode("yellow", add_special_tokens=False))
    lm._executor.shutdown(wait=True)  # not lm.close(): that would close the session's shared model too
    getattr(lm.runner, "close", lambda: None)()


@pytest.mark.slow  # ~30 s on two cores with the model's load
def test_torch_model_answers_under_a_schema_through_its_hf_vocabulary(fresh_default_torch):
    """The Hugging Face tokenizer's vocabulary (torch, MLX) drives the mask as llama.cpp's does."""
    jsonschema = pytest.importorskip("jsonschema")
    tokens, stats = run(fresh_default_torch, Constraint.json_schema(PERSON), max_new_tokens=40)
    assert stats.finish_reason == "eos" and stats.constraint_status == "complete", stats
    jsonschema.validate(json.loads(stats.text), PERSON)
    assert all(t.constraint is not None for t in tokens)
