"""Tokens that hold part of a character (emoji, CJK) show their bytes and the character they complete,
in the token view, its tooltip and the inspector; their bytes survive the database; old records still load."""

from __future__ import annotations

import json

from engine import TokenEvent, TokenProb

from app.state.database.records import alternatives_json, token_from_row, token_row, token_to_json
from app.widgets.fmt import byte_label, completed_character, token_tooltip
from qt_helpers import close_window, make_window

# "😀 hi" as SmolLM2's byte-level BPE splits it: three partial tokens, then a whole one.
PIECES = [(10813, b"\xf0\x9f"), (242, b"\x98"), (218, b"\x80"), (15876, None)]


def _events() -> list[TokenEvent]:
    out = []
    for i, (tid, raw) in enumerate(PIECES):
        text = "\ufffd" if raw is not None else " hi"
        alts = (TokenProb(tid, text, -0.1, raw), TokenProb(99, "<0xF0>" if raw else " ho", -2.5, None))
        shown = "😀" if i == 2 else (" hi" if raw is None else "")
        out.append(
            TokenEvent(
                index=i, token_id=tid, text=shown, token_text=text, logprob=-0.1, sampler_logprob=-0.05,
                rank=0, entropy=0.4, top_model=alts, top_sampler=alts, token_bytes=raw,
            )
        )
    return out


def test_byte_labels_and_the_character_a_piece_completes():
    events = _events()
    assert byte_label(b"\xf0\x9f") == "<F0><9F>"
    assert byte_label(b" \xe6\x97") == " <E6><97>"
    assert byte_label("é".encode()) == "é"
    for i in range(3):
        assert completed_character(events, i) == "😀"
    assert completed_character(events, 3) is None  # whole text
    assert completed_character(events[:2], 0) is None  # cut before the character was complete
    tip = token_tooltip(events[1], character=completed_character(events, 1))
    assert "&lt;98&gt;" in tip and "😀" in tip and "\ufffd" not in tip.split("<table")[0]


def test_records_keep_token_bytes_and_old_records_still_load():
    events = _events()
    for ev in events:
        assert token_from_row(token_row(1, ev)[1:]) == ev
    # A record written before bytes were kept: three elements per alternative, no "b".
    old = token_row(1, events[0])[1:]
    doc = json.loads(old[-1])
    doc.pop("b")
    doc["m"] = [row[:3] for row in doc["m"]]
    doc["s"] = [row[:3] for row in doc["s"]]
    loaded = token_from_row((*old[:-1], json.dumps(doc)))
    assert loaded.token_bytes is None and loaded.top_model[0].token_bytes is None
    assert loaded.token_text == "\ufffd" and loaded.top_model[0].logprob == events[0].top_model[0].logprob
    # Export writes the bytes as hex (JSON has no bytes).
    assert token_to_json(events[0])["token_bytes"] == "f09f"
    assert json.loads(alternatives_json(events[3])).get("b") is None


def test_token_view_and_inspector_show_bytes_not_replacement_characters(qtbot, window, store, host):
    conv = window.library.current
    user = conv.add_message(None, "user", "a face please")
    answer = conv.add_message(user, "assistant")
    conv.set_tokens(answer, _events(), "😀 hi")
    conv.update_message(answer, finish_reason="eos")
    conv.flush()
    # Restart: the records come back from the database.
    close_window(qtbot, window)
    window = make_window(qtbot, store, host)
    answer = window.library.current.path()[-1]
    assert window.library.current.tokens(answer)[0].token_bytes == b"\xf0\x9f"

    window.view_options.set_heatmap(True)
    body = window.chat.chat_view.widget_for(answer.id).body
    assert body.mode == "tokens"
    shown = body.visible_text()
    assert shown == "<F0><9F><98><80>😀 hi" and "\ufffd" not in shown  # bytes, then the character they make
    utf16 = lambda text: len(text.encode("utf-16-le")) // 2  # noqa: E731 - document positions count UTF-16 units
    # A zero-width space between tokens (where lines may break); inside one a word joiner and a no-break space.
    z, j = "\u200b", "\u2060"
    assert body.document().toRawText() == f"<F0><9F>{z}<98>{z}<80>{j}😀{z}\u00a0hi"
    assert body.token_span(2) == (utf16(f"<F0><9F>{z}<98>"), utf16(f"<F0><9F>{z}<98>{z}<80>{j}😀"))  # the character is token 2's

    window.selection.set(answer.id, 1)
    header = window.inspector.token_label.text()
    assert "&lt;98&gt;" in header and "😀" in header and "\ufffd" not in header
    first_column = [window.inspector.table.topLevelItem(r).text(0) for r in range(window.inspector.table.topLevelItemCount())]
    assert first_column[0] == "▶ <98>"
    close_window(qtbot, window)
