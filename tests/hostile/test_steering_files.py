"""Hostile steering inputs (issue 33 item 7): control-vector files, pair files and strengths that must be refused
with one clear line, before anything is applied, losing nothing.

Every bad file is made here: a corrupt or truncated GGUF, NaN and infinite directions, a model file instead of
a vector, F16 or 2-D directions, a `direction.0`, a vector for another width or layer count; empty, uneven and
undecodable pair files; a strength that is not a number on the command line.
"""

from __future__ import annotations

import numpy as np
import pytest

from cli_checks import one_error_line, refuse_model_load, run_cli
from engine.steering import (
    ResidualShape,
    Steering,
    SteeringError,
    SteeringVector,
    load_vector,
    read_pair_files,
    read_pairs_jsonl,
    save_vector,
)
from tiny_gguf import write_tiny_llama_gguf


def vector(n_layer: int = 4, n_embd: int = 8, seed: int = 0) -> SteeringVector:
    rows = np.random.default_rng(seed).standard_normal((n_layer, n_embd)).astype(np.float32)
    rows[0] = 0
    return SteeringVector("v", rows, model_hint="llama")


def write_cvec(path, tensors: dict[str, np.ndarray], *, arch: str = "controlvector", layer_count: int | None = None):
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch)
    w.add_string("controlvector.model_hint", "llama")
    if layer_count is not None:
        w.add_int32("controlvector.layer_count", layer_count)
    for name, data in tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def refused(path, *words: str) -> str:
    with pytest.raises(SteeringError) as e:
        load_vector(path)
    message = str(e.value)
    assert "\n" not in message and path.name in message
    for w in words:
        assert w in message, message
    return message


def test_a_saved_vector_reads_back_as_llama_cpp_lays_it_out(tmp_path):
    v = vector()
    path = save_vector(v, tmp_path / "v.gguf")
    back = load_vector(path)
    assert back.digest == v.digest and back.model_hint == "llama" and back.name == "v"
    from gguf import GGUFReader

    reader = GGUFReader(str(path))  # what llama.cpp's loader reads: direction.1..n-1, F32, one row each
    assert reader.fields["general.architecture"].contents() == "controlvector"
    assert reader.fields["controlvector.layer_count"].contents() == 3
    names = sorted(t.name for t in reader.tensors)
    assert names == ["direction.1", "direction.2", "direction.3"]
    assert np.array_equal(np.array(next(t for t in reader.tensors if t.name == "direction.2").data), v.directions[2])
    assert not list(tmp_path.glob(".*.tmp"))  # written whole, no temporary left behind


def test_a_file_with_only_some_layers_keeps_its_declared_layer_count(tmp_path):
    # repeng and others may write a few layers; layer_count says the model's size (llama.cpp: n_layer - 1).
    path = write_cvec(tmp_path / "some.gguf", {"direction.5": np.ones(8, np.float32)}, layer_count=29)
    v = load_vector(path)
    assert (v.n_layer, v.layers()) == (30, (5,))


def test_corrupt_and_truncated_files(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    refused(junk, "not a readable GGUF")
    text = tmp_path / "notes.gguf"
    text.write_text("this is not a control vector")
    refused(text, "not a readable GGUF")
    good = save_vector(vector(n_layer=6, n_embd=64), tmp_path / "good.gguf")
    data = good.read_bytes()
    for cut in (len(data) // 3, len(data) - 7, 20):
        short = tmp_path / f"cut{cut}.gguf"
        short.write_bytes(data[:cut])
        refused(short)
    refused(tmp_path / "missing.gguf", "no such control-vector file")


def test_nan_and_infinite_directions(tmp_path):
    for bad in (np.nan, np.inf, -np.inf):
        row = np.ones(8, np.float32)
        row[3] = bad
        path = write_cvec(tmp_path / f"bad{bad}.gguf", {"direction.1": np.ones(8, np.float32), "direction.2": row})
        refused(path, "direction.2 holds NaN or infinite values")


def test_files_that_are_not_control_vectors(tmp_path):
    model = write_tiny_llama_gguf(tmp_path / "model.gguf")
    refused(model, "'llama' model file", "not a control vector")
    refused(write_cvec(tmp_path / "f16.gguf", {"direction.1": np.ones(8, np.float16)}), "F16", "F32")
    refused(write_cvec(tmp_path / "square.gguf", {"direction.1": np.ones((4, 8), np.float32)}), "not one row")
    refused(write_cvec(tmp_path / "zero.gguf", {"direction.0": np.ones(8, np.float32)}), "direction.0")
    refused(write_cvec(tmp_path / "other.gguf", {"token_embd.weight": np.ones(8, np.float32)}), "only direction.N")
    refused(write_cvec(tmp_path / "ragged.gguf", {"direction.1": np.ones(8, np.float32),
                                                  "direction.2": np.ones(9, np.float32)}), "different widths")
    refused(write_cvec(tmp_path / "empty.gguf", {}), "no direction tensors")
    refused(write_cvec(tmp_path / "huge.gguf", {"direction.99999999": np.ones(8, np.float32)}))


def test_a_vector_for_another_model_is_refused_before_it_is_applied(tiny_torch, tmp_path):
    """Other width, other layer count: one line naming both shapes; the backend's steering and cache stay."""
    shape = tiny_torch.residual_shape()
    good = Steering.of((vector(shape.n_layer, shape.n_embd), 1.0))
    tiny_torch.set_steering(good)
    ids = tiny_torch.tokenizer.encode("keep me")
    tiny_torch.forward(ids)
    for n_layer, n_embd in ((shape.n_layer, 32), (shape.n_layer + 1, shape.n_embd)):
        path = save_vector(vector(n_layer, n_embd), tmp_path / f"{n_layer}x{n_embd}" / "stranger.gguf")
        steering = Steering.of((load_vector(path), 1.0))
        with pytest.raises(SteeringError) as e:
            tiny_torch.set_steering(steering)
        assert str(e.value) == (f"steering vector 'stranger' was made for a model with {n_layer} layers of width "
                                f"{n_embd} (llama); this model has {ResidualShape(shape.n_layer, shape.n_embd, 'llama').describe()}")
        assert tiny_torch.current_steering() == good and list(tiny_torch.cached_tokens()) == ids


def test_pair_files(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    other = tmp_path / "neg.txt"
    other.write_text("sad\n")
    with pytest.raises(SteeringError, match="empty.txt is empty: it needs one prompt a line"):
        read_pair_files(empty, other)
    pos = tmp_path / "pos.txt"
    pos.write_text("happy\nglad\n")
    with pytest.raises(SteeringError, match="pos.txt has 2 prompts and neg.txt 1"):
        read_pair_files(pos, other)
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"ok\n\xff\xfe broken\n")
    with pytest.raises(SteeringError, match="not UTF-8"):
        read_pair_files(binary, pos)
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text('{"positive": "a", "negative": "b"}\nnot json\n')
    with pytest.raises(SteeringError, match="line 2 is not JSON"):
        read_pairs_jsonl(jsonl)
    jsonl.write_text('{"positive": "a"}\n')
    with pytest.raises(SteeringError, match='line 1 needs non-empty "positive" and "negative"'):
        read_pairs_jsonl(jsonl)
    jsonl.write_text("\n\n")
    with pytest.raises(SteeringError, match="holds no pairs"):
        read_pairs_jsonl(jsonl)
    jsonl.write_text('{"positive": "a\\nb", "negative": "c"}\n')
    assert read_pairs_jsonl(jsonl).pairs == (("a\nb", "c"),)


@pytest.mark.parametrize("argv, words", [
    (["--control-vector-scaled", "{v}", "abc"], "the scale 'abc' is not a number"),
    (["--control-vector-scaled", "{v}", "nan"], "must be a finite number"),
    (["--control-vector-scaled", "{v}:x1"], "the scale 'x1' is not a number"),
    (["--control-vector", "{bad}"], "holds NaN or infinite values"),
    (["--control-vector", "{missing}"], "no such control-vector file"),
    (["--control-vector-layer-range", "1", "5"], "needs a --control-vector"),
    (["--control-vector", "{v}", "--num-beams", "2"], "do not apply to --num-beams"),
])
def test_cli_refuses_bad_steering_before_loading_a_model(tmp_path, monkeypatch, capsys, argv, words):
    refuse_model_load(monkeypatch)
    v = save_vector(vector(), tmp_path / "v.gguf")
    row = np.ones(8, np.float32)
    row[0] = np.nan
    bad = write_cvec(tmp_path / "bad.gguf", {"direction.1": row})
    args = [a.format(v=v, bad=bad, missing=tmp_path / "missing.gguf") for a in argv]
    assert run_cli(["generate", "-p", "hi", *args]) == 2
    assert words in one_error_line(capsys)


def test_cli_train_refuses_empty_pair_files_before_loading(tmp_path, monkeypatch, capsys):
    refuse_model_load(monkeypatch)
    pos, neg = tmp_path / "p.txt", tmp_path / "n.txt"
    pos.write_text("")
    neg.write_text("sad\n")
    assert run_cli(["steer", "train", "--positive-file", str(pos), "--negative-file", str(neg),
                    "-o", str(tmp_path / "v.gguf")]) == 2
    assert "p.txt is empty" in one_error_line(capsys)
    assert run_cli(["steer", "train", "--pairs", "nope", "-o", str(tmp_path / "v.gguf")]) == 2
    assert "no built-in pair set 'nope'" in one_error_line(capsys)
    assert not (tmp_path / "v.gguf").exists()
