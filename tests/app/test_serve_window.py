"""Model ▸ Serve… (issue 34): the window serves the loaded model, and every served answer is a conversation.

The served exchanges are real: the default model on llama.cpp (the session's copy), the real server on
127.0.0.1 on its own thread, a real HTTP client (httpx) on another thread, and the window's own qasync loop
running all the while. The Serve dialog's refusals and the database migration need no model.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sqlite3
import threading
from dataclasses import dataclass, field

import httpx
import pytest
from PySide6.QtCore import Qt

from engine import Engine
from engine.backends.mock import MockBackend

from app.controllers.engine_host import EngineHost
from app.state.answer_recipe import recipe_for
from app.lifecycle import _StopWorkOnClose
from app.controllers.serve import ServeSettings
from app.state.database.store import SCHEMA, Store
from app.widgets.chat.sidebar import ID_ROLE
from qt_helpers import answered, close_window, make_window, run_task

MODEL_WAIT_MS = 60_000


@dataclass
class Client:
    """One streamed chat completion, read on its own thread, as an OpenAI client reads it."""

    url: str
    body: dict
    chunks: list[dict] = field(default_factory=list)
    done_marker: bool = False
    error: BaseException | None = None
    finished: threading.Event = field(default_factory=threading.Event)

    def start(self) -> "Client":
        threading.Thread(target=self._run, name="test-openai-client", daemon=True).start()
        return self

    def _run(self) -> None:
        try:
            with httpx.stream("POST", f"{self.url}/chat/completions", json={**self.body, "stream": True},
                              timeout=120) as response:
                assert response.status_code == 200, response.read()
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        self.done_marker = True
                        break
                    self.chunks.append(json.loads(data))
        except BaseException as e:  # noqa: BLE001 - the test reads it
            self.error = e
        finally:
            self.finished.set()

    @property
    def tokens(self) -> list[dict]:
        return [lp for c in self.chunks for ch in c["choices"]
                for lp in ((ch.get("logprobs") or {}).get("content") or [])]

    @property
    def text(self) -> str:
        return "".join(ch["delta"].get("content") or "" for c in self.chunks for ch in c["choices"])

    @property
    def finish_reasons(self) -> list[str]:
        return [ch["finish_reason"] for c in self.chunks for ch in c["choices"] if ch.get("finish_reason")]


@pytest.fixture
def served_window(qtbot, qloop, store, fresh_default_llamacpp, monkeypatch):
    """The window on the session's default model (llama.cpp); "mock" loads the mock model (a model switch)."""
    monkeypatch.setattr(fresh_default_llamacpp, "close", lambda: None)  # the session's copy outlives this window

    def factory(spec, backend, progress):
        if spec == "mock":
            return Engine.from_backend(MockBackend(delay_s=0.01))
        return Engine.from_backend(fresh_default_llamacpp)

    host = EngineHost(factory)
    assert run_task(qtbot, host.load("default", "llamacpp"), MODEL_WAIT_MS)
    w = make_window(qtbot, store, host, max_new_tokens=8)
    yield w
    if not w._shutdown_done:
        close_window(qtbot, w)
    host.close()


def _long_answer(w, max_tokens: int) -> dict:
    """A request whose answer runs to `max_tokens` (the model's end-of-turn tokens are banned)."""
    eos_ids = w.host.engine.tokenizer.eos_token_ids
    return {"model": w.host.info.name, "messages": [{"role": "system", "content": "You count."},
                                         {"role": "user", "content": "Count from 1 to 500, one number a line."}],
            "max_tokens": max_tokens, "temperature": 0.7, "seed": 11, "logprobs": True, "top_logprobs": 5,
            "logit_bias": {str(i): -100 for i in eos_ids}}


def _start_serving(qtbot, w) -> str:
    run_task(qtbot, w.serving.start(ServeSettings(port=0)), MODEL_WAIT_MS)
    return w.serving.state.url


def _served_conversations(w) -> list:
    """The conversations served requests make, in order, as the controller announces them."""
    seen: list = []
    w.serving.started.connect(seen.append)
    return seen


@pytest.mark.slow
def test_a_served_request_streams_into_a_conversation_while_the_windows_chat_waits_its_turn(qtbot, served_window):
    w = served_window
    started = _served_conversations(w)
    # Started from the dialog, as a person would: the default address, any free port.
    dialog = w.open_serve_dialog()
    assert dialog.host_edit.text() == "127.0.0.1"
    dialog.port_box.setValue(0)
    qtbot.mouseClick(dialog.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.serving.running, timeout=MODEL_WAIT_MS)
    url = w.serving.state.url
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", url)
    assert dialog.url_edit.text() == url and dialog.url_row.isVisible() and dialog.stop_button.isEnabled()
    assert w.status.serve_label.text() == f"Serving on {url}" and w.status.serve_label.isVisible()
    dialog.close()

    own_chat = w.library.current
    client = Client(url, _long_answer(w, 80)).start()
    # Live: the conversation is there, its answer growing, before the client has its last chunk.
    qtbot.waitUntil(lambda: bool(started) and len(started[0].tokens(started[0].path()[-1])) >= 2,
                    timeout=MODEL_WAIT_MS)
    conv = started[0]
    answer = conv.path()[-1]
    assert answer.generating and not client.finished.is_set()
    assert w.library.current is own_chat  # a client's request never takes the window's chat away
    assert conv.system_prompt == "You count." and [m.role for m in conv.path()] == ["user", "assistant"]

    # The window's own chat meanwhile: it waits for the model (one worker per model) and then answers.
    w.settings.apply_preset("Greedy")
    chat = w.on_send("Say hi.")
    qtbot.waitUntil(lambda: w.controller.busy, timeout=5000)
    mine = w.library.current.path()[-1]
    qtbot.waitUntil(lambda: w.chat.chat_view.widget_for(mine.id) is not None, timeout=5000)
    footer = w.chat.chat_view.widget_for(mine.id).footer.text()  # what the person sees under the chat's answer
    waiting_seen = not client.finished.is_set() and not w.library.current.tokens(mine) and \
        "waiting for the model" in footer
    qtbot.waitUntil(chat.done, timeout=MODEL_WAIT_MS)
    assert chat.exception() is None and answered(w)
    assert waiting_seen, "the chat's answer should have waited while the served one streamed"
    assert mine.finish_reason in ("eos", "length") and w.library.current.tokens(mine)

    qtbot.waitUntil(client.finished.is_set, timeout=MODEL_WAIT_MS)  # the loop runs on meanwhile
    assert client.error is None and client.done_marker
    qtbot.waitUntil(lambda: not answer.generating, timeout=10_000)
    # What the client received is what the conversation holds: ids, text, log-probs, alternatives.
    tokens = [t for t in conv.tokens(answer) if not t.special]
    got = client.tokens
    assert len(got) == len(tokens) == 80
    assert [g["id"] for g in got] == [t.token_id for t in tokens]
    assert [g["token"] for g in got] == [t.token_text for t in tokens]
    assert [g["logprob"] for g in got] == pytest.approx([t.logprob for t in tokens])
    assert [[a["id"] for a in g["top_logprobs"]] for g in got] == \
        [[p.token_id for p in t.top_model if not p.is_rest][:5] for t in tokens]
    assert client.text == answer.content and client.finish_reasons == ["length"]
    assert answer.finish_reason == "length" and answer.stats["seed"] == 11
    assert all(t.stages for t in tokens)  # each token's sampler stages, as in a chat

    # Stored: marked as served, the client and time in the title, the mark in the chats list.
    row = w.store.conversation(conv.id)
    assert row.served["client"].startswith("127.0.0.1:") and row.served["endpoint"] == "chat.completions"
    assert conv.title.startswith(row.served["client"] + " at ")
    items = lambda: [w.sidebar.list.item(i) for i in range(w.sidebar.list.count())]  # noqa: E731
    qtbot.waitUntil(lambda: any(it.data(ID_ROLE) == conv.id for it in items()))
    item = next(it for it in items() if it.data(ID_ROLE) == conv.id)
    assert not item.icon().isNull() and "served to 127.0.0.1:" in item.toolTip()

    # Opened, the inspector shows a served token's alternatives as for any answer.
    conv = w.library.open(conv.id)  # read back from the database: written whole, it was not kept in memory
    answer = conv.messages[answer.id]
    assert [(t.token_id, t.logprob) for t in conv.tokens(answer) if not t.special] == \
        [(t.token_id, t.logprob) for t in tokens]
    assert w.served_bar.isVisible() and "Served to 127.0.0.1:" in w.served_bar.label.text()
    assert not w.served_bar.stop_button.isVisible()  # nothing streams into it any more
    w.selection.set(answer.id, 3)
    assert w.inspector.table.selected_token() == tokens[3].token_id
    assert w.inspector.table.topLevelItemCount() >= 5
    # Replay reads it as any answer (the client's messages, its settings and seed) ...
    recipe = recipe_for(conv, answer)
    assert list(recipe.messages) == _long_answer(w, 80)["messages"]
    assert recipe.sampler.seed == 11 and recipe.sampler.temperature == 0.7 and recipe.max_new_tokens == 80
    # ... and branching from one of its tokens' alternatives answers on from there.
    alt = next(p for p in tokens[3].top_model if not p.is_rest and p.token_id != tokens[3].token_id)
    assert w.inspector.table.select_token(alt.token_id)
    qtbot.mouseClick(w.inspector.branch_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: answered(w) and conv.path()[-1] is not answer, timeout=MODEL_WAIT_MS)
    branch = conv.path()[-1]
    assert [t.token_id for t in conv.tokens(branch)[:4]] == [t.token_id for t in tokens[:3]] + [alt.token_id]


@pytest.mark.slow
def test_stop_in_the_window_ends_the_clients_stream_with_a_last_chunk(qtbot, served_window):
    w = served_window
    started = _served_conversations(w)
    url = _start_serving(qtbot, w)
    client = Client(url, _long_answer(w, 2000)).start()
    qtbot.waitUntil(lambda: bool(started) and len(started[0].tokens(started[0].path()[-1])) >= 3,
                    timeout=MODEL_WAIT_MS)
    conv = started[0]
    w.library.open(conv.id)
    bar = w.served_bar
    assert bar.isVisible() and bar.stop_button.isVisible() and "answering" in bar.label.text()
    qtbot.mouseClick(bar.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(client.finished.is_set, timeout=MODEL_WAIT_MS)
    assert client.error is None
    assert client.done_marker and client.finish_reasons == ["stop"]  # a proper last chunk, then [DONE]
    answer = conv.path()[-1]
    qtbot.waitUntil(lambda: not answer.generating, timeout=10_000)
    assert answer.finish_reason == "cancelled" and answer.stats["served_end"] == "stopped in the window"
    assert 3 <= len(client.tokens) < 2000
    assert [t.token_id for t in conv.tokens(answer)] == [g["id"] for g in client.tokens]
    qtbot.waitUntil(lambda: not bar.stop_button.isVisible())


@pytest.mark.slow
def test_another_model_or_closing_the_window_stops_serving_and_frees_the_port(qtbot, served_window):
    w = served_window
    url = _start_serving(qtbot, w)
    started = _served_conversations(w)
    # A whole (not streamed) completions request with two choices: a notebook with two answers to its prompt.
    reply = httpx.post(f"{url}/completions", json={"model": w.host.info.name, "prompt": "Once upon a time",
                                                   "max_tokens": 5, "n": 2, "seed": 3}, timeout=60).json()
    qtbot.waitUntil(lambda: bool(started) and not any(m.generating for m in started[0].messages.values()),
                    timeout=MODEL_WAIT_MS)
    conv = started[0]
    prompt, *answers = sorted(conv.messages.values(), key=lambda m: m.id)
    assert conv.mode == "notebook" and prompt.content == "Once upon a time" and prompt.role == "user"
    assert [a.content for a in answers] == [c["text"] for c in reply["choices"]]
    assert all(a.parent_id == prompt.id and len(conv.tokens(a)) == 5 for a in answers)
    assert conv.path()[-1] is answers[0]  # the first choice is the one shown, the other one ‹ › away

    assert run_task(qtbot, w.host.load("mock", "mock"), MODEL_WAIT_MS)
    qtbot.waitUntil(lambda: not w.serving.running and not w.status.serve_label.isVisible(), timeout=15_000)
    assert "another model" in w.serving.state.message
    assert _port_closed(url)

    url = _start_serving(qtbot, w)  # now serving the mock model
    server = w.serving.server
    started = _served_conversations(w)
    # Closing as the app closes (app/lifecycle.py's close-event filter cancels the model's work) while one
    # client streams and another waits for its turn: both streams end properly, the port is freed.
    w.installEventFilter(_StopWorkOnClose(w.host, w))
    streaming = Client(url, _long_answer(w, 3000)).start()
    qtbot.waitUntil(lambda: bool(started) and len(started[0].tokens(started[0].path()[-1])) >= 3,
                    timeout=MODEL_WAIT_MS)
    waiting = Client(url, _long_answer(w, 3000)).start()
    qtbot.waitUntil(lambda: len(started) == 2, timeout=MODEL_WAIT_MS)  # read, waiting for the model
    close_window(qtbot, w)
    qtbot.waitUntil(lambda: streaming.finished.is_set() and waiting.finished.is_set(), timeout=MODEL_WAIT_MS)
    assert streaming.error is None and streaming.done_marker and streaming.finish_reasons == ["stop"]
    assert waiting.error is None and waiting.done_marker and not waiting.tokens
    assert not server.running and _port_closed(url)  # its thread ended, its port is free
    qtbot.waitUntil(lambda: not [t for t in threading.enumerate() if t.name.startswith("logitlab-serve")])
    # What was served before the close is written: both answers marked stopped, the streamed one's tokens kept.
    rows = [r for r in w.store.conversations() if r.served]
    assert len(rows) == 3
    last = {r.served["id"]: [m for m in w.store.messages(r.id) if m.role == "assistant"][-1] for r in rows}
    assert [last[c.chunks[0]["id"]].finish_reason for c in (streaming, waiting)] == ["cancelled", "cancelled"]
    assert w.store.token_count(last[streaming.chunks[0]["id"]].id) >= len(streaming.tokens) >= 3


def _port_closed(url: str) -> bool:
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except OSError:
        return True


def test_the_serve_dialog_asks_for_a_key_before_serving_beyond_this_machine(qtbot, window):
    dialog = window.open_serve_dialog()
    assert window.open_serve_dialog() is dialog  # one at a time
    dialog.host_edit.setText("0.0.0.0")
    assert "Required here" in dialog.key_hint.text()
    assert dialog.start() is None
    assert "API key" in dialog.message.text() and not window.serving.running
    dialog.host_edit.setText("127.0.0.1")
    dialog.upstream_edit.setText("not a url")
    assert dialog.start() is None and "base URL" in dialog.message.text()
    dialog.close()


def test_the_upstream_top_n_is_asked_only_with_an_upstream_and_remembered(qtbot, window):
    dialog = window.open_serve_dialog()
    assert not dialog.upstream_top_box.isEnabled()  # nothing to ask without an upstream
    assert dialog.settings().upstream_top_n is None and dialog.upstream_top_box.text() == "What clients ask"
    dialog.upstream_edit.setText("http://127.0.0.1:9/v1")
    assert dialog.upstream_top_box.isEnabled()
    dialog.upstream_top_box.setValue(5)
    assert dialog.settings().upstream_top_n == 5
    dialog.upstream_top_box.setValue(0)
    assert dialog.settings().upstream_top_n == 0  # the chosen tokens' log-probs, no alternatives
    dialog.close()
    assert ServeSettings(upstream="http://127.0.0.1:9/v1", upstream_top_n=21).problem().startswith(
        "the alternatives asked of the upstream are a whole number from 0 to 20")
    # Remembered with the address (as a start remembers it), and read back into the next dialog.
    window.store.put_setting("serve_settings", ServeSettings(upstream="http://127.0.0.1:9/v1",
                                                             upstream_top_n=7).remembered())
    assert window.serving.saved_settings().upstream_top_n == 7
    again = window.open_serve_dialog()
    assert again.upstream_top_box.value() == 7 and again.upstream_top_box.isEnabled()
    again.close()


def test_a_version_2_database_opens_and_keeps_served_records(tmp_path):
    path = tmp_path / "v2.sqlite3"
    conn = sqlite3.connect(path)
    for statement in filter(str.strip, SCHEMA.split(";")):
        conn.execute(statement.replace(",\n    served_json TEXT", ""))
    assert "served_json" not in {r[1] for r in conn.execute("PRAGMA table_info(conversations)")}
    conn.execute("INSERT INTO conversations(title, created, updated) VALUES ('old chat', 1, 1)")
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    store = Store(path)
    try:
        (old,) = store.conversations()
        assert old.title == "old chat" and old.served is None
        made = store.create_conversation("served", served={"client": "127.0.0.1:1", "id": "chatcmpl-1"})
        assert store.conversation(made.id).served == {"client": "127.0.0.1:1", "id": "chatcmpl-1"}
        store._conn.execute("UPDATE conversations SET served_json = '[1' WHERE id = ?", (made.id,))
        assert store.conversation(made.id).served is None  # unreadable: shown as a chat, not an error
    finally:
        store.close()


@pytest.mark.slow
def test_proxy_mode_records_what_the_upstream_answered(qtbot, served_window):
    from engine import start_server

    w = served_window
    upstream = start_server(w.host.engine, "127.0.0.1", 0)  # another OpenAI-compatible server (our own)
    try:
        started = _served_conversations(w)
        run_task(qtbot, w.serving.start(ServeSettings(port=0, upstream=upstream.url)), MODEL_WAIT_MS)
        assert w.serving.state.what == f"upstream {upstream.url}"
        client = Client(w.serving.state.url, _long_answer(w, 12)).start()
        qtbot.waitUntil(client.finished.is_set, timeout=MODEL_WAIT_MS)
        assert client.error is None and client.done_marker
        qtbot.waitUntil(lambda: bool(started) and not started[0].path()[-1].generating, timeout=10_000)
        conv = started[0]
        answer = conv.path()[-1]
        assert conv.served["proxied"] and conv.served["upstream"] == upstream.url
        assert answer.model["backend"] == "remote" and answer.content == client.text
        assert [t.token_text for t in conv.tokens(answer) if not t.special] == [g["token"] for g in client.tokens]
        # Loading another model leaves a proxy serving: it forwards to another server, not to the loaded model.
        assert run_task(qtbot, w.host.load("mock", "mock"), MODEL_WAIT_MS)
        qtbot.wait(200)
        assert w.serving.running
    finally:
        run_task(qtbot, w.serving.stop())
        upstream.stop()


@pytest.mark.slow
def test_proxy_mode_asks_the_upstream_for_the_top_n_the_dialog_says(qtbot, served_window):
    from engine import start_server

    w = served_window
    upstream = start_server(w.host.engine, "127.0.0.1", 0)
    try:
        started = _served_conversations(w)
        body = {k: v for k, v in _long_answer(w, 6).items() if k not in ("logprobs", "top_logprobs")}
        run_task(qtbot, w.serving.start(ServeSettings(port=0, upstream=upstream.url, upstream_top_n=3)),
                 MODEL_WAIT_MS)
        client = Client(w.serving.state.url, body).start()  # asks no log-probs
        qtbot.waitUntil(client.finished.is_set, timeout=MODEL_WAIT_MS)
        assert client.error is None and client.done_marker
        assert all(c["choices"][0].get("logprobs") is None for c in client.chunks if c["choices"])
        qtbot.waitUntil(lambda: bool(started) and not started[0].path()[-1].generating, timeout=10_000)
        conv = started[0]
        tokens = [t for t in conv.tokens(conv.path()[-1]) if not t.special]
        assert tokens and all(len([p for p in t.top_model if not p.is_rest]) == 3 for t in tokens)
    finally:
        run_task(qtbot, w.serving.stop())
        upstream.stop()


@pytest.mark.slow
def test_closing_while_serving_starts_leaves_no_server_behind(qtbot, window):
    starting = asyncio.ensure_future(window.serving.start(ServeSettings(port=0)))
    qtbot.waitUntil(lambda: window.serving.state.starting or starting.done(), timeout=5000)
    assert window.serving.state.starting
    close_window(qtbot, window)  # the window's shutdown waits for the start, then stops what it started
    qtbot.waitUntil(starting.done, timeout=15_000)
    assert not window.serving.running and not window.serving.state.running
    qtbot.waitUntil(lambda: not [t for t in threading.enumerate() if t.name.startswith("logitlab-serve-")])


@pytest.mark.slow
def test_answers_through_responses_and_messages_are_chats_in_the_window(qtbot, served_window):
    w = served_window
    started = _served_conversations(w)
    url = _start_serving(qtbot, w)
    replies: list[httpx.Response] = []

    def ask() -> None:  # the two other doors, as an agent harness knocks on them
        replies.append(httpx.post(f"{url}/responses", timeout=120, json={
            "input": "Name a colour.", "instructions": "Answer in one word.", "max_output_tokens": 6,
            "temperature": 0.7}))
        replies.append(httpx.post(f"{url}/messages", timeout=120, json={
            "system": "Answer in one word.", "max_tokens": 6, "temperature": 0.7,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Name a colour."}]}]}))

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    qtbot.waitUntil(lambda: len(replies) == 2 and len(started) == 2 and
                    not any(c.path()[-1].generating for c in started), timeout=MODEL_WAIT_MS)
    assert [r.status_code for r in replies] == [200, 200]
    texts = [replies[0].json()["output"][0]["content"][0]["text"], replies[1].json()["content"][0]["text"]]
    for conv, endpoint, text in zip(started, ("responses", "messages"), texts):
        # A conversation like a served chat's: the system prompt, the client's turn, the answer with its tokens,
        # their alternatives and the sampler's stages (temperature's).
        assert conv.served["endpoint"] == endpoint and conv.system_prompt == "Answer in one word."
        assert [m.role for m in conv.path()] == ["user", "assistant"] and conv.path()[0].content == "Name a colour."
        answer = conv.path()[-1]
        tokens = [t for t in conv.tokens(answer) if not t.special]
        assert answer.content == text and tokens and all(len(t.top_model) >= 5 and t.stages for t in tokens)
    run_task(qtbot, w.serving.stop())
