"""The passage panel (where the answer looked): highlights from a token's attention, the layers picked, the caveat.

A UI test on a made-up capture (layers 0-1 looking at the first passage, 2-3 at the second), so the numbers
it must show are known; the real capture and its passages are tested in tests/engine/test_attention_passages.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.documents import CAVEAT, Passage

from app.widgets.inspection.passage_jobs import PassageView
from app.widgets.inspection.passage_panel import ALL, PassagePanel


def _view() -> PassageView:
    passages = (Passage("a" * 64, "notes.txt", 0, 0, 10, "The garden <b>", 2, 10),
                Passage("a" * 64, "notes.txt", 1, 12, 30, "The vault code is 4729.", 10, 20))
    attention = np.zeros((4, 2, 30), dtype=np.float32)
    attention[:2, :, 0] = 0.2  # the prompt's start: outside every passage
    attention[:2, :, 2:10] = 0.1  # early layers: the first passage (0.8 of each row)
    attention[2:, :, 10:20] = 0.06  # late layers: the second (0.6), the rest on the answer
    attention[2:, :, 25:30] = 0.08
    attention[:2, :, 10:20] = 0.0
    return PassageView(3, attention, passages)


@pytest.mark.parametrize("layers, top, share", [(None, "§2", 1.0), (ALL, "§1", 0.8 / 1.4)])
def test_panel_highlights_the_passage_looked_at(qtbot, layers, top, share):
    panel = PassagePanel()
    qtbot.addWidget(panel)
    panel.set_view(_view())
    if layers is not None:
        panel.layer_box.setCurrentIndex(panel.layer_box.findData(layers))
    shares = panel.shares()
    assert max(shares) == pytest.approx(share, rel=1e-5)
    assert sum(shares) == pytest.approx(1.0)
    assert f"looked mostly at <b>notes.txt {top}</b>" in panel.summary.text()
    assert "Token 4" in panel.summary.text()
    assert CAVEAT in panel.caveat.text().lower()
    assert "The garden &lt;b&gt;" in panel.text.toHtml()  # a passage's text is escaped, not markup


def test_panel_without_attachments_says_so(qtbot):
    panel = PassagePanel()
    qtbot.addWidget(panel)
    panel.set_view(None)
    assert panel.shares() == ()
    assert "No attached file" in panel.summary.text()


def test_prompt_passages_finds_each_attached_message(default_model_folder):
    import hashlib

    from engine import documents
    from engine.tokenizer import Tokenizer

    from app.state.conversation import Message
    from app.widgets.inspection.passage_jobs import prompt_passages

    text = "First paragraph about roses.\n\nThe vault code is 4729.\n"
    data = text.encode()
    attachment = documents.Attachment("notes.txt", len(data), "text", text, hashlib.sha256(data).hexdigest())
    asked = Message(1, None, "user", "What is the code?", 0.0, attachments=[attachment])
    elsewhere = Message(3, 2, "user", "And again?", 0.0, attachments=[attachment])  # not in this prompt
    tok = Tokenizer.from_folder(default_model_folder)
    prompt = tok.chat_ids([{"role": "user", "content": asked.model_text()}])
    passages = prompt_passages(tok, prompt, [asked, elsewhere])
    assert [p.label for p in passages] == ["notes.txt §1", "notes.txt §2"]
    assert [tok.decode(prompt[p.first_token:p.end_token]).strip() for p in passages] == [
        "First paragraph about roses.", "The vault code is 4729."]


def test_whole_answer_bar_is_asked_for_and_follows_the_layers(qtbot):
    from engine.documents import AnswerAttention

    panel = PassagePanel()
    qtbot.addWidget(panel)
    assert not panel.whole_button.isEnabled()  # no token, no passages: nothing to read
    view = _view()
    panel.set_view(view)
    with qtbot.waitSignal(panel.whole_answer_requested, timeout=1000):
        panel.whole_button.click()
    assert not panel.whole_button.isEnabled() and "Reading" in panel.answer_bar.text()
    # Two tokens read of a 5-token answer; per token and layer each passage's mass (late layers: §2, all: §1).
    layer_mass = np.array([[[0.6, 0.0], [0.6, 0.0], [0.0, 0.2], [0.0, 0.2]],
                           [[0.4, 0.0], [0.4, 0.0], [0.0, 0.4], [0.0, 0.4]]])
    panel.set_answer(AnswerAttention(view.passages, (12, 16), layer_mass, 5))
    assert panel.whole_button.isEnabled() and not panel.answer_bar.isHidden()
    assert panel.answer_shares() == pytest.approx((0.0, 1.0))  # the later half: layers 2-3
    text = panel.answer_bar.text()
    assert "2 of its 5 tokens" in text and text.index("§2") < text.index("§1")  # the most attended first
    panel.layer_box.setCurrentIndex(panel.layer_box.findData(ALL))
    assert panel.answer_shares() == pytest.approx((0.5 / 0.8, 0.3 / 0.8))
    assert panel.answer_bar.text().index("§1") < panel.answer_bar.text().index("§2")
    panel.set_answer(None, "Not read: the model has no layer view")
    assert panel.answer_shares() == () and "Not read" in panel.answer_bar.text()
