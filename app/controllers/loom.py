"""The loom's runs: N continuations from a token, auto-expanding likely forks, and step mode (Qt-free).

Like `ChatController` for the chat and `ExperimentController` for the
experiments, it changes the state (`Conversation`) and the views follow. The
children of a run are new sibling answers of the question (the store keeps
them as it keeps any branch, so the tree of `app/state/loom_tree.py` shows
them and they survive a restart): each inherits the kept tokens, then gets
its own tokens, request (with a "loom" entry saying how it was made) and
stats (with its seed).

The engine side (`Engine.start_loom_rows`, engine.loom) runs the N children
as one batch where the model can, on the model's worker thread; their events
reach the event loop a frame at a time through the chat's `FrameHop`. One loom run at a time, and never during a
chat answer (they share the model).

Step mode is the chat's step gate (`ChatController.step_gate`): switched on
here, the chat submits its next answers with it (`Engine.submit(..., step=)`),
and the decode loop waits for the user's pick after every distribution.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from engine import Done, Engine, GenerationRequest, TokenEvent, loom, reasoning

from app.controllers.chat import TOP_N, Busy, ChatController
from app.controllers.engine_host import describe_error
from app.state.answer_recipe import model_reasoning_format
from app.state.notebook import prompt_for
from app.state.conversation import Conversation, Message
from app.state.models.model_match import other_model_notice
from app.state.models.model_record import model_record
from app.state.observable import Signal
from app.state.models.servers import server_samples
from app.state.database.store import DatabaseBusy
from app.controllers.token_stream import FrameHop

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExpandSettings:
    """What auto-expand opens: forks whose entropy (nats) reaches `entropy`, or, with `min_p` set, forks where
    at least two alternatives reach `min_p` of the likeliest; `depth` levels of children below the start,
    `budget` new tokens in all, `children` per fork, `tokens` per child."""

    entropy: float = 1.5
    min_p: float | None = None
    depth: int = 2
    budget: int = 512
    children: int = 3
    tokens: int = 24

    def __post_init__(self) -> None:
        loom.check_children(self.children)
        problems = []
        if not self.entropy >= 0:
            problems.append(f"the entropy threshold must be 0 or more nats, got {self.entropy}")
        if self.min_p is not None and not 0 < self.min_p <= 1:
            problems.append(f"min-p must be in (0, 1], got {self.min_p}")
        for name, low in (("depth", 1), ("budget", 1), ("tokens", 1)):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < low:
                problems.append(f"{name} must be a whole number of at least {low}, got {getattr(self, name)!r}")
        if problems:
            raise ValueError("; ".join(problems))

    def opens(self, ev: TokenEvent) -> bool:
        """Whether the distribution `ev` was drawn from is a fork worth opening."""
        if self.min_p is None:
            return ev.entropy >= self.entropy
        probs = [p.prob for p in ev.top_model if not p.is_rest]
        return len(probs) >= 2 and sum(p >= self.min_p * probs[0] for p in probs) >= 2


class LoomController:
    def __init__(self, chat: ChatController):
        self.chat = chat
        self.library, self.settings, self.host = chat.library, chat.settings, chat.host
        self.busy_changed = Signal()  # (bool)
        self.progress = Signal()  # (done tokens, budget tokens) during a run
        self.children_added = Signal()  # (list[Message]) a run's children exist (they fill as tokens arrive)
        self.error = Signal()  # (str)
        self.notice = Signal()  # (str) something the user should know about a run that goes on anyway
        self.step_waiting = chat.step_waiting  # (TokenEvent) step mode: the distribution waiting for the user's pick
        self.stepping_changed = Signal()  # (bool)
        self.gate = chat.step_gate  # the chat's answers go through it while step mode is on
        self._cancel: threading.Event | None = None  # the run under way's; None when idle

    @property
    def busy(self) -> bool:
        return self._cancel is not None

    def stop(self) -> None:
        """Stop the loom run before its next step; what was made is kept."""
        if self._cancel is not None:
            self._cancel.set()

    # -- N continuations ------------------------------------------------------------------------

    async def continuations(self, message: Message, index: int, n: int, mode: str = "sample",
                            max_new_tokens: int | None = None) -> list[Message]:
        """N new answers that keep `message`'s tokens before `index` and each go on from there."""
        self._begin()
        try:
            return await self._continue(message, index, n, mode, max_new_tokens, self._cancel)  # type: ignore[arg-type]  # _begin() set it
        except Exception as e:
            self._fail(e)
            return []
        finally:
            self._end()

    async def auto_expand(self, message: Message, index: int, how: ExpandSettings) -> list[Message]:
        """Open every fork at or after `index` on `message` (and below, on the new children) that `how` finds
        likely enough, breadth first, until `how.depth` levels or `how.budget` tokens; Stop ends it."""
        self._begin()
        made: list[Message] = []
        cancel = self._cancel
        assert cancel is not None
        try:
            conv = self._conv()
            spent = 0
            self.progress.emit(0, how.budget)
            queue: deque[tuple[Message, int, int]] = deque([(message, index, 0)])
            opened: set[tuple[int, ...]] = set()  # the prefixes already forked in this run
            while queue and not cancel.is_set() and spent + how.children * how.tokens <= how.budget:
                answer, start, level = queue.popleft()
                tokens = conv.tokens(answer)
                at = next((i for i in range(start, len(tokens)) if how.opens(tokens[i])
                           and tuple(t.token_id for t in tokens[:i]) not in opened), None)
                if at is None:
                    continue
                opened.add(tuple(t.token_id for t in tokens[:at]))
                children = await self._continue(answer, at, how.children, "sample", how.tokens, cancel)
                made += children
                spent += sum(len(conv.tokens(c)) - at for c in children)
                self.progress.emit(min(spent, how.budget), how.budget)
                queue.append((answer, at + 1, level))  # further forks on the same answer, same level
                if level + 1 < how.depth:
                    queue.extend((c, at + 1, level + 1) for c in children)
            return made
        except Exception as e:
            self._fail(e)
            return made
        finally:
            self._end()

    async def _continue(self, message: Message, index: int, n: int, mode: str, max_new: int | None,
                        cancel: threading.Event) -> list[Message]:
        loom.check_children(n)
        conv = self._conv()
        tokens = conv.tokens(message)
        if not message.is_assistant or not 0 <= index <= len(tokens):
            raise ValueError(f"no token {index} in this answer to continue from")
        if index and tokens[index - 1].special:
            raise ValueError("the answer ends there (end of text): continue from an earlier token")
        if self.settings.constraint_problem:  # never under a constraint other than the one the panel shows
            raise ValueError(f"Not sent: {self.settings.constraint_problem}. Fix it, or turn Structured output off.")
        engine = await self.host.wait_engine()
        options = self.settings.options
        by_server = server_samples(options.server_sampling, engine.info)
        if by_server and mode != "sample":
            raise ValueError("the N most likely need forced tokens, which the server's own sampler cannot do: "
                             "untick “The server samples” in the Sampling panel")
        question = conv.messages[message.parent_id]  # type: ignore[index]  # an answer has a parent
        kept = list(tokens[:index])
        wanted = max_new or options.max_new_tokens
        # Earlier answers' reasoning stays out of the prompt as the chat leaves it out (renders: off the UI thread).
        thinking = await self.host.off_ui_thread(model_reasoning_format, engine)
        history = reasoning.prompt_history(conv.history(question), thinking)
        prompt = prompt_for(conv, question, history)  # a notebook's text (no template), or the chat's messages
        max_new_tokens = await self.host.off_ui_thread(self.chat._fit_to_context, engine, prompt, len(kept), wanted)
        request = GenerationRequest(
            **prompt.request_fields(), sampler=options.sampler, max_new_tokens=max_new_tokens, stop=options.stop,
            top_n=TOP_N, record_stages=True, assistant_prefix=tuple(t.token_id for t in kept), server_sampling=by_server,
            constraint=options.constraint,  # each child is held to it (the engine refuses it for the N most likely)
        )
        base = {**options.to_dict(), "max_new_tokens": max_new_tokens, "top_n": TOP_N, "server_sampling": by_server,
                "reasoning": thinking.to_dict()}
        model = model_record(engine.info)
        other = other_model_notice(message.model, model) if kept else None  # app/state/models/model_match.py
        if other:
            self.notice.emit(other)
        children = await self._add_children(conv, question, message, n, index, model, base, mode, cancel)
        if not children:
            return []  # stopped while another connection held the database's write lock
        for child in children:
            conv.set_tokens(child, kept, "".join(t.text for t in kept))
            conv.set_generating(child, True)
        self._save(conv, children, conv.flush)
        self.children_added.emit(children)
        try:
            await self._stream(engine, conv, children, request, n, mode, cancel, index)
        finally:
            for child in children:
                if child.finish_reason is None:
                    self._save(conv, [child], lambda c=child: conv.update_message(c, finish_reason="cancelled"))
                conv.set_generating(child, False)
            self._save(conv, children, conv.flush)
        return children

    async def _add_children(self, conv: Conversation, question: Message, message: Message, n: int, index: int,
                            model: dict[str, Any], base: dict[str, Any], mode: str,
                            cancel: threading.Event) -> list[Message]:
        """The run's N new answers, written in one transaction. While another connection holds the write lock
        this waits on the event loop (the store's busy_changed has the status bar say so) until it is free or
        Stop; [] if stopped first."""
        store = self.library.store
        # The answer the user looks at under this question: auto-expand continues children it never showed,
        # and showing each in turn switched the chat to version 7 of 21 while it ran.
        on_screen = conv.active_child(question.id) if question in conv.path() else None
        keep = on_screen if on_screen is not None and on_screen.is_assistant else message
        while True:
            if not await store.wait_writable(cancelled=cancel.is_set):
                return []
            try:
                with store.transaction():  # holding the lock from here: none of the writes below can meet it
                    children = [
                        conv.add_message(question, "assistant", branch_index=index, model=model,
                                         request={**base, "loom": {"mode": mode, "n": n, "row": row}})
                        for row in range(n)
                    ]
                    conv.show(keep)  # keep the answer the user looks at on screen
                return children
            except DatabaseBusy:  # taken again between the check and the write: wait once more
                continue

    def _save(self, conv: Conversation, children: list[Message], write: Any) -> None:
        """One write of a run's children; while the database is busy (or failing) the chat controller keeps
        what was not written and writes it again from the event loop (`ChatController.retry_saving`)."""
        self.chat._save(conv, children[0] if children else None, write)

    async def _stream(self, engine: Engine, conv: Conversation, children: list[Message], request: GenerationRequest,
                      n: int, mode: str, cancel: threading.Event, offset: int) -> None:
        """Run the children on the model's thread; their events reach the loop in order, a frame's worth at a time
        (the chat's FrameHop), then the rows' end (None) or the error that ended them."""
        inbox: asyncio.Queue[list[loom.RowEvent | BaseException | None]] = asyncio.Queue()
        hop: FrameHop[loom.RowEvent | BaseException | None] = FrameHop(asyncio.get_running_loop(), inbox.put_nowait)
        rows = engine.start_loom_rows(request, n, hop.put, mode=mode, cancel=cancel)
        # Runs on the worker thread after its last event (or at once, if the rows already ended): the end follows them.
        rows.add_done_callback(lambda f: hop.put(None if f.cancelled() or f.exception() is None else f.exception()))
        while True:
            items = await inbox.get()
            ended = items[-1] is None or isinstance(items[-1], BaseException)
            events = [ev for ev in items if isinstance(ev, loom.RowEvent)]
            self._take(conv, children, events, offset)
            if isinstance(items[-1], BaseException):
                raise items[-1]
            if ended:
                return

    def _take(self, conv: Conversation, children: list[Message], item: list[loom.RowEvent], offset: int) -> None:
        """One frame's row events into the children: tokens appended, a finished row's stats and end written."""
        by_row: dict[int, list[TokenEvent]] = {}
        for ev in item:
            child = children[ev.row]
            if isinstance(ev.event, Done):
                if by_row.get(ev.row):
                    conv.append_tokens(child, by_row.pop(ev.row))
                stats = {k: v for k, v in ev.event.stats.to_dict().items() if k not in ("text", "token_ids")}
                finish = ev.event.stats.finish_reason
                self._save(conv, [child], lambda c=child, f=finish, st=stats: conv.update_message(
                    c, finish_reason=f, stats=st))
            else:
                by_row.setdefault(ev.row, []).append(replace(ev.event, index=offset + ev.event.index))
        for row, events in by_row.items():
            conv.append_tokens(children[row], events)
        self._save(conv, children, conv.flush)  # a busy database: the tokens wait in memory, the run goes on

    # -- step mode ------------------------------------------------------------------------------

    @property
    def stepping(self) -> bool:
        return self.gate.stepping

    def set_stepping(self, on: bool) -> None:
        """Step mode on: the chat's next answers pause after every distribution. Off: a waiting answer goes on."""
        if on != self.gate.stepping:
            self.gate.set_stepping(on)
            self.stepping_changed.emit(on)

    def pick(self, token_id: int | None) -> None:
        """Answer the waiting distribution: a token id, or None for the sampler's own pick."""
        self.gate.pick(token_id)

    # -- plumbing -------------------------------------------------------------------------------

    def _conv(self) -> Conversation:
        conv = self.library.current
        if conv is None:
            raise ValueError("open a conversation with an answer first")
        return conv

    def _begin(self) -> None:
        if self.busy:
            raise Busy("a loom run is under way; stop it first")
        if self.chat.busy:
            raise Busy("an answer is being written; stop it first")
        self._cancel = threading.Event()
        self.busy_changed.emit(True)

    def _end(self) -> None:
        self._cancel = None
        self.busy_changed.emit(False)

    def _fail(self, e: Exception) -> None:
        log.warning("loom run failed: %s", e, exc_info=not isinstance(e, ValueError))
        self.error.emit(describe_error(e))
