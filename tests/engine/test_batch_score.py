"""Batched scoring: `LanguageModel.score` / `score_pairs`, `score_items` (the CLI's), `score --file X.jsonl`,
and a score trace read back as events."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from engine.backends.llamacpp import LlamaCppBackend  # noqa: E402
from engine.cli import main as cli_main  # noqa: E402
from engine.experiments import read_trace, score, score_run, write_trace  # noqa: E402
from engine.experiments.batch_score import ScoreItem, read_items, score_items  # noqa: E402
from engine.research.lm import LanguageModel  # noqa: E402

# Same numbers: the batch runs on a context of another size than the per-text one, which may round
# differently; float32 log-softmax over the vocabulary keeps that well under this.
LOGPROB_TOLERANCE = 1e-4

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Grüße aus Köln — 東京は晴れ 🙂",
    "ab",  # one token after the first (byte-level): the shortest text there is to score
    "Numbers: 3.14159, 2.71828 and 1.41421 are famous.",
    "The quick brown fox jumps over the lazy cat.",  # shares a prefix with the first
]


@pytest.fixture(scope="module")
def lm(tiny_gguf):
    model = LanguageModel(LlamaCppBackend(tiny_gguf, spec="tiny", display_name="tiny"))
    yield model
    model.close()


def assert_same_scores(batch, single) -> None:
    assert batch.token_ids == single.token_ids and batch.context == single.context
    assert len(batch.tokens) == len(single.tokens)
    for a, b in zip(batch.tokens, single.tokens):
        assert (a.index, a.token_id, a.rank) == (b.index, b.token_id, b.rank)
        assert abs(a.logprob - b.logprob) <= LOGPROB_TOLERANCE
        assert abs(a.entropy - b.entropy) <= LOGPROB_TOLERANCE
    assert abs(batch.total_logprob - single.total_logprob) <= LOGPROB_TOLERANCE * len(batch.tokens)


def test_lm_score_equals_the_per_text_score_on_one_context(lm, monkeypatch):
    singles = [score(lm.backend, t, top_n=5) for t in TEXTS]  # what Engine.score runs, a context per text

    def no_new_context(n_tokens):
        raise AssertionError("batched scoring built a scoring context per text")

    monkeypatch.setattr(lm.backend, "position_runner", no_new_context)
    before = lm.runner.forward_calls
    results = lm.score(TEXTS, top_n=5)
    assert len(results) == len(TEXTS)
    for batch, single in zip(results, singles):
        assert_same_scores(batch, single)
    assert lm.runner.forward_calls - before == sum(r.forward_calls for r in results) == len(TEXTS)


def test_score_pairs_scores_only_the_continuation_and_agrees_with_next_token_logprobs(lm):
    context, continuation = "The capital of France is", " Paris, of course."
    (result,) = lm.score_pairs([(context, continuation)])
    ctx_ids = lm.tokenizer.encode(context, add_special_tokens=False)
    cont_ids = lm.tokenizer.encode(continuation, add_special_tokens=False)
    assert list(result.token_ids) == ctx_ids + cont_ids and result.context == len(ctx_ids)
    assert [t.token_id for t in result.tokens] == cont_ids
    # An independent path: the research API's next-token log-probs (batch runner's last-position logits).
    expected = sum(float(lm.next_token_logprobs_sync(ctx_ids + cont_ids[:i])[tok]) for i, tok in enumerate(cont_ids))
    assert abs(result.total_logprob - expected) <= LOGPROB_TOLERANCE * len(cont_ids)
    for i, t in enumerate(result.tokens):  # rank: tokens more likely than this one (near-ties either way)
        row = lm.next_token_logprobs_sync(ctx_ids + cont_ids[:i])
        assert (row > t.logprob + LOGPROB_TOLERANCE).sum() <= t.rank <= (row > t.logprob - LOGPROB_TOLERANCE).sum()


def test_bad_batches_are_refused_in_words(lm):
    with pytest.raises(TypeError, match="list of texts"):
        lm.score("one text")
    with pytest.raises(ValueError, match="empty"):
        lm.score(["fine", ""])
    with pytest.raises(ValueError, match="pair 1 must be"):
        lm.score_pairs([("a", "b"), ("only one",)])
    with pytest.raises(ValueError, match="continuation"):
        lm.score_pairs([("context", "")])
    too_long = "x" * (lm.context_length + 10)  # byte-level: a token per character
    with pytest.raises(ValueError, match="item 1: .*context length"):
        lm.score(["fine", too_long])
    assert lm.score([]) == []


def test_score_items_builds_one_scoring_context_for_the_batch(tiny_gguf):
    backend = LlamaCppBackend(tiny_gguf, spec="tiny", display_name="tiny")
    try:
        singles = [score(backend, t, top_n=3) for t in TEXTS]
        made = []
        real = backend.position_runner
        backend.position_runner = lambda n: made.append(n) or real(n)
        items = [*TEXTS[:2], ScoreItem(context="Hello", continuation=" world")]
        results = score_items(backend, items, top_n=3)
        assert made == [max(len(r.token_ids) for r in results)]
        for batch, single in zip(results[:2], singles[:2]):
            assert_same_scores(batch, single)
        assert [t.token_id for t in results[2].tokens] == backend.tokenizer.encode(" world", add_special_tokens=False)
    finally:
        backend.close()


def test_a_score_trace_reads_back_as_events(lm, tmp_path):
    result = lm.score([TEXTS[0]], top_n=3)[0]
    path = tmp_path / "score.jsonl"
    write_trace(path, score_run(result, model=None, text=TEXTS[0]))
    (run,) = read_trace(path)
    events = run.events()  # KeyError 'text' before
    assert [(e.index, e.token_id, e.rank) for e in events] == [(e.index, e.token_id, e.rank) for e in result.events()]
    assert np.allclose([e.logprob for e in events], [e.logprob for e in result.events()])
    assert [t.top for t in run.scored_tokens()] == [t.top for t in result.tokens]
    run.header["kind"] = "lens"
    with pytest.raises(ValueError, match="kind 'lens'"):
        run.events()


def test_cli_scores_a_jsonl_file_one_run_per_item(tiny_gguf, tmp_path, capsys):
    src = tmp_path / "texts.jsonl"
    src.write_text('"The quick brown fox."\n\n{"id": "b", "text": "Grüße"}\n'
                   '{"context": "Hello", "continuation": " world"}\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert cli_main(["score", "--file", str(src), "--output", str(out), "--model", str(tiny_gguf)]) == 0
    runs = read_trace(out)
    assert [r.header["item"] for r in runs] == [0, 1, 2]
    assert runs[1].header["id"] == "b" and runs[2].header["continuation"] == " world"
    assert all(r.header["kind"] == "score" and r.end["scored_tokens"] == len(r.events()) for r in runs)
    assert "[3 items" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "holds no texts"),
        ('{"text": "ok"}\nnot json\n', "line 2 is not JSON"),
        ('{"txt": "typo"}\n', "unknown key"),
        ('{"text": 5}\n', "must be a string"),
        ('{"text": ""}\n', "empty"),
        ('[1, 2]\n', "JSON string or an object"),
        ('{"id": 1}\n', 'neither "text" nor "continuation"'),
        ('{"text": "a", "continuation": "b"}\n', "not both"),
        ("[" * 100_000 + "\n", "line 1"),
    ],
)
def test_hostile_batch_files_get_one_line_naming_the_line(tmp_path, content, message):
    path = tmp_path / "in.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_items(path)


def test_hostile_batch_files_through_the_cli_exit_before_loading(tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"text": "ok"}\n\xff\xfe\n')
    assert cli_main(["score", "--file", str(path), "--model", str(tmp_path / "absent.gguf")]) == 2
    err = capsys.readouterr().err
    assert "not UTF-8" in err and "Traceback" not in err


def test_cli_refuses_to_write_the_trace_over_the_file_being_scored(tmp_path, capsys):
    src = tmp_path / "texts.jsonl"
    src.write_text('"The quick brown fox."\n', encoding="utf-8")
    assert cli_main(["score", "--file", str(src), "--output", str(src), "--model", str(tmp_path / "absent.gguf")]) == 2
    assert "destroy the texts" in capsys.readouterr().err
    assert src.read_text(encoding="utf-8") == '"The quick brown fox."\n'  # nothing lost
