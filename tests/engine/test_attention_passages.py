"""Where the answer looked (engine.documents.attention) on torch and llama.cpp, with the default model.

A document built here holds one unique fact ("The vault code is 4729.") among filler paragraphs of about the
same length; the prompt asks for the code and the answer is forced to "The vault code is 4729" (SmolLM2-135M
does not reliably state it on its own), so the tokens scored are the fact's digits. Their attention, over the
later half of the layers, falls more on the fact's paragraph than on any other, wherever the paragraph is
placed; and the map's numbers are the layer view's own capture summed by hand.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from engine.capabilities import LayerLens
from engine.documents import Attachment, compose_message
from engine.documents.attention import (AttentionMap, Passage, attention_map, late_layers, passage_mass,
                                        passages_in_prompt, passages_of)

FILLER = [
    "The garden behind the old library has twelve rose bushes, and the gardener waters them every Tuesday "
    "morning before the readers arrive.",
    "The library's reading room was painted green in the spring, and its tall windows face the river that runs "
    "past the town hall.",
    "The café next door sells lemon cake and strong coffee, and on Fridays a pianist plays there until the lamps "
    "are lit.",
    "The town's bus stops outside the library twice an hour, and the last one leaves for the station at half "
    "past ten.",
]
FACT = ("The vault code is 4729. Only the head librarian and the night guard are told it, and it is changed "
        "every winter.")
QUESTION = "What is the vault code?"


def _document(fact_at: int) -> Attachment:
    paragraphs = FILLER[:fact_at] + [FACT] + FILLER[fact_at:]
    text = "\n\n".join(paragraphs) + "\n"
    data = text.encode("utf-8")
    return Attachment("notes.txt", len(data), "text", text, hashlib.sha256(data).hexdigest())


def _forced(backend, fact_at: int) -> tuple[list[int], list[int], list[Passage]]:
    """(prompt + forced answer ids, the positions of the fact's digits, the passages with token ranges)."""
    attachment = _document(fact_at)
    composed = compose_message(QUESTION, [attachment])
    tok = backend.tokenizer
    prompt = list(tok.chat_ids([{"role": "user", "content": composed.text}]))
    answer = tok.encode("The vault code is 4729", add_special_tokens=False)
    ids = prompt + list(answer)
    digits = [len(prompt) + i for i, t in enumerate(answer) if tok.token_text(t).strip() in "4729"
              and tok.token_text(t).strip()]
    return ids, digits, passages_in_prompt(tok, prompt, composed, [attachment])


def test_passages_follow_the_composed_layout(default_torch):
    attachment = _document(2)
    composed = compose_message(QUESTION, [attachment])
    passages = passages_of(composed, [attachment])
    assert [p.text for p in passages] == FILLER[:2] + [FACT] + FILLER[2:]
    assert all(composed.text[p.start:p.end] == p.text for p in passages)
    tok = default_torch.tokenizer
    prompt = list(tok.chat_ids([{"role": "user", "content": composed.text}]))
    placed = passages_in_prompt(tok, prompt, composed, [attachment])
    for p in placed:  # each passage's tokens spell its text (the newlines around it are not its own)
        assert tok.decode(prompt[p.first_token:p.end_token]).strip() == p.text
    assert [p.label for p in placed][2] == "notes.txt §3"
    with pytest.raises(ValueError, match="not in these prompt tokens"):
        passages_in_prompt(tok, prompt[:40], composed, [attachment])


def test_a_long_block_is_cut_into_runs_of_lines():
    rows = "\n".join(f"row {i},value {i * 3}" for i in range(30))
    data = rows.encode()
    table = Attachment("t.csv", len(data), "csv", rows, hashlib.sha256(data).hexdigest())
    passages = passages_of(compose_message("sum it", [table]), [table])
    assert [p.text.count("\n") + 1 for p in passages] == [12, 12, 6]
    assert passages[1].text.startswith("row 12,")


def _check_fact_wins(amap: AttentionMap, fact_at: int) -> None:
    for token in amap.tokens:
        others = [m for i, m in enumerate(token.mass) if i != fact_at]
        assert token.mass[fact_at] > max(others), (token.position, token.mass)
    assert amap.top(1)[0][0].index == fact_at
    assert 0 < sum(amap.share) == pytest.approx(1.0)


@pytest.mark.slow  # seconds on two cores (junit times, 2026-12-04)
def test_torch_fact_token_looks_at_the_fact(default_torch):
    # One placement on torch (a forward here takes seconds on a shared CPU); llama.cpp tries three.
    fact_at = 2
    ids, digits, passages = _forced(default_torch, fact_at)
    layers = late_layers(default_torch.model.config.num_hidden_layers)
    amap = attention_map(default_torch, ids, digits, passages, layers=layers)
    assert len(amap.tokens) == 4 and amap.layers == layers
    _check_fact_wins(amap, fact_at)


@pytest.mark.parametrize("fact_at", [0, 2, 4])
@pytest.mark.slow  # seconds on two cores (junit times, 2026-12-04)
def test_llamacpp_fact_token_looks_at_the_fact(default_llamacpp, fact_at):
    ids, digits, passages = _forced(default_llamacpp, fact_at)
    amap = attention_map(default_llamacpp, ids, digits, passages, layers=late_layers(30))
    _check_fact_wins(amap, fact_at)


@pytest.mark.parametrize("backend_name", ["default_torch", "default_llamacpp"])
@pytest.mark.slow  # seconds on two cores (junit times, 2026-12-04)
def test_map_is_the_layer_views_attention(request, backend_name):
    backend = request.getfixturevalue(backend_name)
    assert isinstance(backend, LayerLens)
    ids, digits, passages = _forced(backend, 2)
    position = digits[0]
    amap = attention_map(backend, ids, [position], passages)  # every layer
    view = backend.layer_capture(ids, [position], attention=True)[0].attention  # (L, H, position)
    by_hand = [view[:, :, p.first_token:p.end_token].sum() / (view.shape[0] * view.shape[1]) for p in passages]
    np.testing.assert_allclose(amap.tokens[0].mass, by_hand, rtol=1e-5, atol=1e-6)
    assert amap.layers == tuple(range(view.shape[0]))
    assert amap.tokens[0].token_id == ids[position]
    # Over every position the per-token mass is 1: the passages' part of it is below.
    assert 0 < sum(amap.tokens[0].mass) < 1
    with pytest.raises(ValueError, match="layers must be among"):
        passage_mass(view, passages, [view.shape[0]])


@pytest.mark.slow  # seconds on two cores (junit times, 2026-12-04)
def test_whole_answer_bar_is_the_tokens_maps_averaged(default_llamacpp, monkeypatch):
    # The bar keeps per-layer masses, so either layer choice equals attention_map of the same tokens (captured
    # in the same chunks: 2 positions a forward here) averaged over the tokens and summed over those layers.
    from engine.documents import whole_answer as whole

    monkeypatch.setattr(whole, "CHUNK", 2)
    ids, digits, passages = _forced(default_llamacpp, 1)
    answer = list(range(digits[0] - 5, len(ids)))  # "The vault code is" and the digits
    bar = whole.answer_attention(default_llamacpp, ids, answer, passages)
    assert bar.positions == tuple(answer) and bar.layer_mass.shape == (len(answer), 30, len(passages))
    for layers in (late_layers(30), None):
        maps = [attention_map(default_llamacpp, ids, answer[i:i + 2], passages, layers=layers)
                for i in range(0, len(answer), 2)]
        joined = AttentionMap(tuple(passages), tuple(t for m in maps for t in m.tokens), maps[0].layers)
        np.testing.assert_allclose(bar.share(layers), joined.share, rtol=1e-9, atol=1e-12)
        # One forward for every position instead: llama.cpp's other batch shape moves the shares by ~1e-3 (up to
        # 1.4e-3 seen on a 2-core EPYC, 2026-12-07), so only closeness is asked of it.
        whole_forward = attention_map(default_llamacpp, ids, answer, passages, layers=layers)
        np.testing.assert_allclose(bar.share(layers), whole_forward.share, atol=3e-3)
    assert max(range(len(passages)), key=lambda i: bar.share(late_layers(30))[i]) == 1  # the fact's paragraph
    assert whole.spaced(list(range(1000)), 128)[::127] == (0, 999) and len(whole.spaced(list(range(1000)))) == 128
    with pytest.raises(ValueError, match="layers must be among"):
        bar.share([30])
