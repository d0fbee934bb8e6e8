"""Every request a client sends the window's server becomes a conversation, written live as it is answered.

The server (engine.serve) calls an `ExchangeSink` on its own thread: `on_start` when a request was read,
`on_token` per token of each choice, `on_end` with the whole exchange. `ServedConversations` is that sink.
Each call crosses to the event loop through a `FrameHop` (app/controllers/token_stream.py), so a fast model's tokens
arrive a frame's worth at a time, in order with the start and the end; everything below runs on the loop.

A served conversation is an ordinary conversation (so the heatmap, the inspector, branching, the loom and
Replay work on it) with `served` set: the client's address, the time, the answer's id, the endpoint and the
settings the client sent.

- Chat: the client's leading system message(s) become the system prompt; its other messages are user
  and assistant messages in order (a system message later in the list has no place of its own in a chat of
  the window, so it is kept as a user message whose `request` says `{"served_role": "system"}`; the
  client's earlier assistant turns carry no token records, their finish reason is "client"). Each choice
  is an assistant answer after the last message, with every token, its top-N and its stage records.
- Completions: a notebook (app/state/notebook.py) whose first part is the prompt and each choice an answer to it.

Writes follow the chat's rhythm (tokens at most every `flush_interval_s`); a write that fails keeps the
tokens in memory and tries again with the next batch, then at the end.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from engine import ModelInfo, TokenEvent
from engine import reasoning

from app.state.conversation import Conversation, Message
from app.state.conversation_list import Library
from app.state.models.model_record import model_record
from app.state.observable import Signal
from app.controllers.token_stream import FRAME_S, FrameHop

if TYPE_CHECKING:  # the server's names load its web stack: only for the type checker here
    from engine import ServedExchange

log = logging.getLogger(__name__)

SAVE_ERRORS = (sqlite3.Error, OSError)
TITLE_SNIPPET = 40  # characters of the client's last message in a served conversation's title
CLIENT_FINISH = "client"  # finish reason of an assistant turn the client sent (not generated here)


def served_record(exchange: "ServedExchange") -> dict[str, Any]:
    """What a conversation keeps of the request that made it (`Conversation.served`); the body's messages and
    prompt are the conversation's messages, so they are left out of this copy."""
    body = {k: v for k, v in dict(exchange.body or {}).items() if k not in ("messages", "prompt")}
    return {
        "id": exchange.id, "endpoint": exchange.endpoint, "client": exchange.client, "model": exchange.model,
        "started_at": exchange.started_at, "proxied": exchange.proxied, "upstream": exchange.upstream,
        "n": exchange.n, "stream": exchange.stream, "body": body,
    }


def served_title(exchange: "ServedExchange", when: float | None = None) -> str:
    """"127.0.0.1:50312 at 21:40:07: What is 2+2?": the client, the time, and the start of its last message."""
    text = ""
    if exchange.messages:
        users = [m["content"] for m in exchange.messages if m.get("role") == "user"] or \
                [m["content"] for m in exchange.messages]
        text = users[-1] if users else ""
    elif exchange.prompt:
        text = exchange.prompt
    text = " ".join(str(text).split())
    if len(text) > TITLE_SNIPPET:
        text = text[: TITLE_SNIPPET - 1].rstrip() + "…"
    at = time.strftime("%H:%M:%S", time.localtime(when if when is not None else exchange.started_at))
    who = exchange.client or "a client"
    return f"{who} at {at}: {text}" if text else f"{who} at {at}"


@dataclass
class Live:
    """A served exchange being written: its conversation and one answer per choice."""

    exchange_id: str
    conv: Conversation
    answers: list[Message]


class ServedConversations:
    """The window's `ExchangeSink`: served requests as conversations in `library`, live.

    `model`: the loaded model's facts (None in proxy mode, where the upstream's name is recorded);
    `reasoning_format`: how that model writes reasoning (saved with each answer, as the chat does).
    """

    def __init__(self, library: Library, loop: asyncio.AbstractEventLoop | None = None,
                 model: ModelInfo | None = None, reasoning_format: reasoning.ReasoningFormat | None = None,
                 flush_interval_s: float = 0.05, frame_s: float = FRAME_S):
        self.library = library
        self.model = model
        self.reasoning_format = reasoning_format or reasoning.ReasoningFormat()
        self.flush_interval_s = flush_interval_s
        self._loop = loop or asyncio.get_running_loop()
        self._hop: FrameHop[tuple[str, tuple[Any, ...]]] = FrameHop(self._loop, self._deliver, frame_s)
        self._live: dict[str, Live] = {}
        self._last_flush = 0.0
        self._closed = False
        self.started = Signal()  # (Conversation) a served request's conversation was made
        self.ended = Signal()  # (Conversation) its answers are complete (or stopped, or failed)
        self.problem = Signal()  # (str) a served request could not be recorded, in words
        self.recorded = 0  # requests recorded since this sink was made

    # -- the server's thread -------------------------------------------------------------------

    def on_start(self, exchange: "ServedExchange") -> None:
        self._put("start", exchange)

    def on_token(self, exchange_id: str, choice: int, event: TokenEvent) -> None:
        self._put("token", exchange_id, choice, event)

    def on_end(self, exchange: "ServedExchange") -> None:
        self._put("end", exchange)

    def _put(self, kind: str, *args: Any) -> None:
        if self._closed:
            return
        try:
            self._hop.put((kind, args))
        except RuntimeError:  # the window's loop is closed: nobody is left to show it
            self._closed = True

    # -- the event loop ------------------------------------------------------------------------

    def live_id(self, conv: Conversation | None) -> str | None:
        """The id of the served answer streaming into `conv` (what `RunningServer.stop_request` takes), else None."""
        if conv is None:
            return None
        return next((live.exchange_id for live in self._live.values() if live.conv is conv), None)

    @property
    def live_count(self) -> int:
        return len(self._live)

    def drain(self, reason: str = "the window closed") -> None:
        """Now, on the loop: apply what has arrived; an exchange still under way is written as interrupted.
        Called when serving stops for good (the window closes); later calls from the server are dropped."""
        self._deliver(self._hop.take_now())
        self._closed = True
        for live in list(self._live.values()):
            for answer in live.answers:
                self._finish(live, answer, None, {**(answer.stats or {}), "interrupted_by": reason})
            self._end(live)

    def _deliver(self, batch: list[tuple[str, tuple[Any, ...]]]) -> None:
        if self.library.store.closed:
            return
        for kind, args in batch:
            try:
                if kind == "start":
                    self._start(args[0])
                elif kind == "token":
                    self._token(*args)
                else:
                    self._finish_exchange(args[0])
            except Exception:  # noqa: BLE001 - one bad record must not stop the others (nor the server)
                log.exception("recording a served %s failed", kind)
        if self._loop.time() - self._last_flush >= self.flush_interval_s:
            self._flush_all()

    def _start(self, exchange: "ServedExchange") -> None:
        try:
            live = self._make(exchange)
        except SAVE_ERRORS as e:
            log.warning("a served request could not be recorded: %s", e)
            self.problem.emit(f"a request from {exchange.client or 'a client'} could not be recorded: {e}")
            return
        self._live[exchange.id] = live
        self.recorded += 1
        self.started.emit(live.conv)

    def _make(self, exchange: "ServedExchange") -> Live:
        chat = exchange.messages is not None  # chat, Responses and Messages: a conversation; completions: a text
        messages = list(exchange.messages or ())
        lead: list[str] = []
        while chat and messages and messages[0].get("role") == "system":
            lead.append(messages.pop(0).get("content", ""))
        conv = self.library.add_unopened(served_title(exchange), "\n\n".join(lead), "chat" if chat else "notebook",
                                         served_record(exchange))
        parent: Message | None = None
        with self.library.store.transaction():
            if chat:
                for m in messages:
                    role = m.get("role", "user")
                    if role == "assistant":
                        parent = conv.add_message(parent, "assistant", m.get("content", ""))
                        conv.update_message(parent, finish_reason=CLIENT_FINISH)
                    else:
                        extra = {"request": {"served_role": "system"}} if role == "system" else {}
                        parent = conv.add_message(parent, "user", m.get("content", ""), **extra)
            else:
                parent = conv.add_message(None, "user", self._prompt_text(exchange))
            request_doc = self._request_doc(exchange)
            model_doc = self._model_doc(exchange)
            answers = [conv.add_message(parent, "assistant", request=request_doc, model=model_doc)
                       for _ in range(max(1, exchange.n))]
            # The first choice is the one shown (add_message made each new one active in turn).
            if len(answers) > 1:
                conv.show(answers[0])
        for answer in answers:
            conv.set_generating(answer, True)
        return Live(exchange.id, conv, answers)

    def _prompt_text(self, exchange: "ServedExchange") -> str:
        if exchange.prompt is not None:
            return str(exchange.prompt)
        ids = list(exchange.prompt_ids or ())
        return f"(a prompt of {len(ids)} token ids: {ids[:32]}{'…' if len(ids) > 32 else ''})"

    def _request_doc(self, exchange: "ServedExchange") -> dict[str, Any]:
        """What the answers were generated with, in the chat's own shape (Replay and Compare read it)."""
        doc: dict[str, Any] = {"reasoning": self.reasoning_format.to_dict(), "served": True}
        if exchange.sampler is not None:
            try:
                doc["sampler"] = exchange.sampler.to_dict()
            except (TypeError, ValueError) as e:  # settings our JSON cannot carry: the answer still shows
                log.info("a served answer's settings are not recorded: %s", e)
        req = exchange.request
        if req is not None:
            doc.update(max_new_tokens=req.max_new_tokens, stop=list(req.stop), top_n=req.top_n,
                       server_sampling=req.server_sampling,
                       constraint=req.constraint.to_dict() if req.constraint is not None else None)
        return doc

    def _model_doc(self, exchange: "ServedExchange") -> dict[str, Any]:
        if exchange.proxied or self.model is None:
            return {"name": exchange.model, "spec": exchange.upstream or "", "backend": "remote"}
        return model_record(self.model)

    def _token(self, exchange_id: str, choice: int, event: TokenEvent) -> None:
        live = self._live.get(exchange_id)
        if live is None or not 0 <= choice < len(live.answers):
            return
        answer = live.answers[choice]
        if live.conv.deleted:
            return
        index = len(live.conv.tokens(answer))
        live.conv.append_tokens(answer, [event if event.index == index else replace(event, index=index)])

    def _finish_exchange(self, exchange: "ServedExchange") -> None:
        live = self._live.get(exchange.id)
        if live is None:  # its conversation could not be made: nothing to finish
            return
        how = "stopped in the window" if exchange.stopped else "the client went away" if exchange.disconnected \
            else None
        for i, answer in enumerate(live.answers):
            choice = exchange.choices[i] if i < len(exchange.choices) else None
            stats = choice.stats if choice is not None else None
            if stats is None:  # it never ran: stopped or left while it waited for the model, or refused by it
                if exchange.error or not how:
                    self._finish(live, answer, "error", {"error": exchange.error or "the answer never ran"})
                else:
                    self._finish(live, answer, "cancelled", {"served_end": f"{how} before the model ran"})
                continue
            saved = {k: v for k, v in stats.to_dict().items() if k not in ("text", "token_ids")}
            if how:
                saved["served_end"] = how
            finish = stats.finish_reason
            if exchange.error and finish != "error":
                finish, saved["error"] = "error", exchange.error
            self._finish(live, answer, finish, saved)
        self._end(live)

    def _finish(self, live: Live, answer: Message, finish: str | None, stats: dict[str, Any]) -> None:
        conv = live.conv
        if not conv.deleted:
            self._save(lambda: conv.update_message(answer, finish_reason=finish, stats=stats))
        conv.set_generating(answer, False)

    def _end(self, live: Live) -> None:
        self._live.pop(live.exchange_id, None)
        conv = live.conv
        if self._save(conv.flush):
            # Written whole: the library need not keep it in memory unless it is open (a server answers many).
            self.library.release(conv.id)
        self.ended.emit(conv)

    def _flush_all(self) -> None:
        self._last_flush = self._loop.time()
        for live in list(self._live.values()):
            if live.conv.has_unsaved_tokens:
                self._save(live.conv.flush)

    def _save(self, write: Callable[[], Any]) -> bool:
        try:
            write()
            return True
        except SAVE_ERRORS as e:  # kept in memory; the next batch or the end tries again
            log.warning("writing a served conversation failed: %s", e)
            return False
