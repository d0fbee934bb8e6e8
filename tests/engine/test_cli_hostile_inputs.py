"""Hostile inputs to `logitlab-cli steer train`, `score --file` and the control-vector flags (issue 43 item 11).

Each runs the real CLI in-process on a tiny GGUF written here (tests/tiny_gguf.py: a context of 256 tokens,
a byte-level vocabulary) and expects one `error:` line, no traceback and exit status 2, with the model never
loaded where the check can be made before it (`refuse_model_load`). The inputs are real: a 10 MB prompt, a
file of 100,000 pairs, a control vector holding 3e38.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cli_checks import one_error_line, refuse_model_load, run_cli
from tiny_gguf import write_tiny_llama_gguf

pytest.importorskip("llama_cpp")

LAYERS = 3
HUGE = "word " * 2_000_000  # 10 MB of text: millions of tokens, against a context of 256


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("hostile-cli") / "tiny.gguf", layers=LAYERS)


def _pairs_jsonl(path: Path, pairs: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"positive": p, "negative": n}) + "\n" for p, n in pairs), encoding="utf-8")
    return path


# --- steer train ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_steer_train_refuses_a_10mb_prompt_before_the_model_loads(tiny, tmp_path, monkeypatch, capsys):
    pos, neg = tmp_path / "pos.txt", tmp_path / "neg.txt"
    pos.write_text(f"yes indeed\n{HUGE}\n", encoding="utf-8")
    neg.write_text("no never\nnot at all\n", encoding="utf-8")
    out = tmp_path / "v.gguf"
    refuse_model_load(monkeypatch)
    code = run_cli(["steer", "train", "-m", str(tiny), "--positive-file", str(pos), "--negative-file", str(neg),
                    "-o", str(out)])
    line = one_error_line(capsys)
    assert code == 2 and not out.exists()
    assert "pair 2 of 'pos-neg'" in line and "positive prompt has" in line
    assert "more than the model's context of 256" in line


def test_training_itself_refuses_a_prompt_longer_than_the_loaded_context(tiny, tmp_path):
    """The check the CLI makes before loading is training's own: the window's path meets it too."""
    from engine.engine import Engine
    from engine.steering import PairSet, SteeringError

    long = "ab " * 400  # ~800 tokens of the byte-level vocabulary, past the context of 256
    with Engine.load(str(tiny), n_threads=1) as engine:
        with pytest.raises(SteeringError, match=r"pair 1 of 'mine': its negative prompt has [\d,]+ tokens, [\d,]+ more"):
            engine.train_steering_vector(PairSet("mine", pairs=(("short", long),)))


def test_steer_train_refuses_identical_positive_and_negative_prompts_naming_the_pairs(tiny, tmp_path, monkeypatch,
                                                                                      capsys):
    pairs = _pairs_jsonl(tmp_path / "same.jsonl", [("happy", "sad"), ("the same", "the same"), ("x", "x")])
    out = tmp_path / "v.gguf"
    refuse_model_load(monkeypatch)
    code = run_cli(["steer", "train", "-m", str(tiny), "--pairs-file", str(pairs), "-o", str(out)])
    line = one_error_line(capsys)
    assert code == 2 and not out.exists()
    assert "pairs 2, 3 have the same positive and negative prompt in 'same'" in line


def test_training_refuses_pairs_that_are_the_same_tokens(tiny):
    """Token-level too (a window's pairs, a persona set with one persona twice): never an all-zero vector."""
    from engine.engine import Engine
    from engine.steering import PairSet, SteeringError

    twins = PairSet("twins", personas=("a happy person", "a happy person"), suffixes=("I", "The weather"))
    with Engine.load(str(tiny), n_threads=1) as engine:
        with pytest.raises(SteeringError, match="pairs 1, 2 have the same positive and negative prompt"):
            engine.train_steering_vector(twins)


@pytest.mark.slow
def test_steer_train_refuses_100000_pairs_and_trains_a_limited_set_with_progress(tiny, tmp_path, monkeypatch,
                                                                                 capsys):
    pairs = _pairs_jsonl(tmp_path / "many.jsonl", [(f"yes {i}", f"no {i}") for i in range(100_000)])
    out = tmp_path / "v.gguf"
    with monkeypatch.context() as m:
        refuse_model_load(m)
        code = run_cli(["steer", "train", "-m", str(tiny), "--pairs-file", str(pairs), "-o", str(out)])
        line = one_error_line(capsys)
    assert code == 2 and not out.exists()
    assert "'many' has 100,000 pairs" in line and "at most 2,048" in line and "--limit N" in line
    assert run_cli(["steer", "train", "-m", str(tiny), "-t", "1", "--pairs-file", str(pairs), "--limit", "40",
                    "-o", str(out), "--method", "mean"]) == 0
    err = capsys.readouterr().err
    assert "[steer train: 80 of 80 prompts read]" in err and "40 pairs, mean" in err and out.is_file()


# --- score --file X.jsonl ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_score_jsonl_refuses_a_10mb_item_before_the_model_loads(tiny, tmp_path, monkeypatch, capsys):
    src = tmp_path / "items.jsonl"
    src.write_text(json.dumps("the cat sat") + "\n" + json.dumps({"id": "big", "text": HUGE}) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    refuse_model_load(monkeypatch)
    code = run_cli(["score", "--file", str(src), "--output", str(out), "--model", str(tiny)])
    line = one_error_line(capsys)
    assert code == 2 and not out.exists()
    assert "item 1: the text has" in line and "model's context length is 256" in line and "too many" in line


def test_score_txt_and_jsonl_share_one_length_check(tiny, tmp_path, monkeypatch, capsys):
    """The same words for one long text whether it comes as a .txt or as a .jsonl's only item."""
    long = "ab " * 400
    txt, jsonl = tmp_path / "long.txt", tmp_path / "long.jsonl"
    txt.write_text(long, encoding="utf-8")
    jsonl.write_text(json.dumps(long) + "\n", encoding="utf-8")
    refuse_model_load(monkeypatch)
    lines = []
    for path in (txt, jsonl):
        assert run_cli(["score", "--file", str(path), "--model", str(tiny)]) == 2
        lines.append(one_error_line(capsys))
    assert lines[0] == lines[1] and "model's context length is 256" in lines[0]


def test_score_jsonl_writes_each_item_as_it_is_scored_with_progress(tiny, tmp_path, monkeypatch, capsys):
    """Item k starts with items 0..k-1 already in the output file (a spy on the real scorer, which it calls)."""
    from engine.experiments import batch_score

    n = 30
    src = tmp_path / "items.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": f"the cat {i} sat on the mat"}) + "\n" for i in range(n)),
                   encoding="utf-8")
    out = tmp_path / "out.jsonl"
    seen: list[int] = []
    real_init = batch_score._Scorer.__init__

    def spy(self, *a, **k):
        written = out.read_text(encoding="utf-8").splitlines() if out.exists() else []
        seen.append(sum(1 for line in written if json.loads(line).get("type") == "header"))
        real_init(self, *a, **k)

    monkeypatch.setattr(batch_score._Scorer, "__init__", spy)
    assert run_cli(["score", "--file", str(src), "--output", str(out), "--model", str(tiny), "-t", "1"]) == 0
    assert seen == list(range(n))  # before item k is scored, k items are on disk
    headers = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [h["id"] for h in headers if h.get("type") == "header"] == list(range(n))
    err = capsys.readouterr().err
    assert f"[scored {n} of {n} items]" in err and f"[{n} items," in err and "Traceback" not in err


# --- control vectors -----------------------------------------------------------------------------------------------


def _vector_file(path: Path, value: float, width: int = 64) -> Path:
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "controlvector")
    w.add_string("controlvector.model_hint", "llama")
    w.add_int32("controlvector.layer_count", LAYERS - 1)
    for layer in range(1, LAYERS):
        row = np.full(width, 0.01, dtype=np.float32)
        if layer == 2:
            row[5] = value
        w.add_tensor(f"direction.{layer}", row)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_3e38_control_vector_is_refused_naming_the_file_and_layer(tiny, tmp_path, monkeypatch, capsys):
    evil = _vector_file(tmp_path / "evil.gguf", 3e38)
    refuse_model_load(monkeypatch)
    code = run_cli(["generate", "-m", str(tiny), "-p", "the cat", "-n", "4", "--control-vector", str(evil)])
    line = one_error_line(capsys)
    assert code == 2
    assert "evil.gguf: direction.2 holds a value of 3e+38" in line


def test_a_vector_built_in_memory_with_a_huge_value_is_refused_naming_it():
    from engine.steering import SteeringError, SteeringVector

    rows = np.zeros((LAYERS, 64), dtype=np.float32)
    rows[1, 3] = -2e30
    with pytest.raises(SteeringError, match=r"'big' \(made here\) holds a value of 2e\+30 at layer 1"):
        SteeringVector("big", rows, source="made here")


# --- counting a huge text from its start ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_huge_text_is_judged_from_its_start_and_nothing_that_fits_is_refused():
    """`clearly_over`'s count is a lower bound of the exact one (the default model's vocabulary), so it refuses
    only what the exact count would, and it reads a small part of a text far past the context."""
    from engine.backends.llamacpp.vocab_only import vocabulary_of
    from engine.cli.token_count import SMALL_BYTES, clearly_over
    from engine.sources import resolve_spec

    rng = np.random.default_rng(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "Grüße", "naïve", "1234", "--", "  ", "\n", "日本語", "🙂"]
    text = " ".join(rng.choice(words, size=120_000))
    assert len(text.encode()) > SMALL_BYTES
    with vocabulary_of(resolve_spec(None).path) as tok:
        exact = len(tok.encode(text, add_special_tokens=False))
        assert clearly_over(tok, text, exact) is None  # fits exactly: left to the exact count
        over = clearly_over(tok, text, exact // 3)
        assert over is not None and exact // 3 < over.tokens <= exact and over.read_bytes < len(text.encode())
        assert abs(over.estimate - exact) < exact * 0.1


@pytest.mark.slow
def test_the_ids_made_before_the_load_are_the_loaded_models(monkeypatch):
    """`score --file` reuses the check's token ids (100,000 items are tokenized once): they must be the same."""
    from engine.cli.experiments import refuse_before_load
    from engine.cli.main import build_parser
    from engine.engine import Engine
    from engine.experiments.batch_score import ScoreItem, item_ids

    items = [ScoreItem(text="The cat sat."), ScoreItem(text="Grüße 🙂 <|im_start|>x"),
             ScoreItem(context="Hello", continuation=" world"), ScoreItem(continuation="  two  spaces")]
    args = build_parser().parse_args(["score", "--text", "x"])
    made = refuse_before_load(args, items)
    with Engine.load(None, n_threads=1) as engine:
        assert made == [tuple(item_ids(engine.tokenizer, it)) for it in items]
