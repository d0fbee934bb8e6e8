"""Chat actions: send, stop, regenerate, edit and resend, continue, branch from a token.

Qt-free: it changes the state (`Conversation`) and the views follow through
their subscriptions. One generation runs at a time. Tokens arrive in frame
batches (`TokenStream`) and are written to the store at most
`flush_interval_s` apart, so a crash loses at most that last batch.

A write that fails (disk full, a damaged or read-only database) never leaves
an answer "generating…" or the window unable to quit: the generation stops,
its tokens stay in memory and on screen, `save_failed` says why, and saving
is tried again every `SAVE_RETRY_S`, on export and when the window closes.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sqlite3
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from engine import Engine, GenerationRequest, GenerationStats, ModelInfo, TokenEvent, loom, reasoning, tools
from engine import documents

from app.controllers.engine_host import EngineHost, describe_error
from app.state.answer_recipe import model_reasoning_format
from app.state.notebook import Prompt, prompt_for, prompt_ids
from app.controllers.off_thread import to_loop
from app.state.conversation import Conversation, Message
from app.state.conversation_list import Library
from app.state.models.model_match import other_model_notice
from app.state.models.model_record import model_record
from app.state.observable import Signal
from app.state.models.servers import server_samples
from app.state.settings import SettingsState
from app.state.database.store import is_busy
from app.controllers.steering_jobs import SteeringJobs
from app.state.steering_state import SteeringState
from app.controllers.token_stream import TokenStream

log = logging.getLogger(__name__)

TOP_N = 20  # alternatives recorded per token (and per sampler stage)


SAVE_RETRY_S = 10.0  # how often saving is tried again after a write failed
BUSY_RETRY_S = 0.25  # ... and while another connection holds the database's write lock (it is let go soon)
SAVE_ERRORS = (sqlite3.Error, OSError)  # what a failed write raises
# An answer's deferred stage records (Conversation.write_due_stages) are built and written after it ends, in
# slices of this much building with the loop free in between, so input and painting go on.
STAGE_SLICE_S = 0.008
STAGE_WAIT_S = 0.25  # while another answer runs (its model has every core), the slices wait


# (conversation, the message answered, its history) -> (the history, the request's tool fields, their record)
ToolHook = Callable[[Conversation, Message, list[dict[str, Any]]],
                    tuple[list[dict[str, Any]], dict[str, Any], "dict[str, Any] | None"]]


class Busy(RuntimeError):
    """A generation is already running."""


class ChatController:
    def __init__(
        self,
        library: Library,
        settings: SettingsState,
        host: EngineHost,
        *,
        top_n: int = TOP_N,
        flush_interval_s: float = 0.05,
        steering: SteeringState | None = None,
    ):
        self.library = library
        self.settings = settings
        self.host = host
        self.top_n = top_n
        self.flush_interval_s = flush_interval_s
        # The Steering panel's vectors and strengths: the next answer runs under `steering.steering()`.
        self.steering = steering if steering is not None else SteeringState()
        self.steering_jobs = SteeringJobs(host, self.steering)
        self._stream: TokenStream | None = None
        self._generating: tuple[Conversation, Message] | None = None
        self._stop_requested = False
        self.busy_changed = Signal()  # (bool)
        self.error = Signal()  # (str) a generation failed
        self.started = Signal()  # (Message) a generation into it begins
        self.finished = Signal()  # (Message, GenerationStats | None)
        self.save_failed = Signal()  # (str) a write failed: why (what it held is kept in memory)
        self.saved = Signal()  # () everything that had failed to save is saved now
        self.last_stats: GenerationStats | None = None
        self.last_context_used: int | None = None
        self.save_error: str | None = None  # the last write failure, until a retry succeeds
        self._unsaved: dict[int, tuple[Conversation, Message]] = {}  # answers whose rows may lag behind memory
        self._retry: asyncio.TimerHandle | None = None
        self._retry_due = 0.0  # loop time the retry above runs at (qasync's handles do not say)
        self._interrupted_by: str | None = None  # a signal asked the app to quit
        self._save_busy = False  # the last failed write met another connection's write lock (not a real failure)
        self._stage_writers: dict[int, asyncio.Task[None]] = {}  # conversation id -> its records' slices
        self.notice = Signal()  # (str) something the user should know about an answer that goes on anyway
        # Step mode (the loom panel switches it: app/controllers/loom.py): while on, an answer of a local model
        # is submitted with this gate and waits at every distribution for the user's pick (`step_waiting`).
        self.step_gate = loom.StepGate(self._on_step_waiting)
        self.step_waiting = Signal()  # (TokenEvent) the distribution waiting for the pick, on the loop
        self._step_hop: Callable[..., None] | None = None  # the running loop's way in, from the model's thread
        # The chat's tools in its requests (app/tool_calls/requests.py: ToolRequests), set by the Tools panel.
        self.tool_requests: ToolHook | None = None

    def last_answer_seed(self) -> int | None:
        """The seed of the open conversation's latest answer (saved with it, so it survives a restart);
        else the seed of the last generation this session ran."""
        conv = self.library.current
        if conv is not None:
            for message in reversed(conv.path()):
                seed = (message.stats or {}).get("seed") if message.is_assistant else None
                if isinstance(seed, int) and seed >= 0:
                    return seed
        return int(self.last_stats.seed) if self.last_stats is not None else None

    @property
    def busy(self) -> bool:
        return self._generating is not None

    @property
    def generating_message(self) -> Message | None:
        return None if self._generating is None else self._generating[1]

    # -- actions ---------------------------------------------------------------------------

    async def send(self, text: str, attachments: list[documents.Attachment] | tuple[documents.Attachment, ...] = ()) -> Message | None:
        """Add a user message after the visible path, with the files attached to it, and answer it."""
        text = text.strip()
        if not text and not attachments:
            return None
        await self._ready()
        conv = self.library.current or self.library.new()
        path = conv.path()
        user = conv.add_message(path[-1] if path else None, "user", text, attachments=attachments)
        return await self._answer(conv, user)

    async def regenerate(self, message: Message | None = None) -> Message | None:
        """A new sibling of an assistant answer (default: the last one shown)."""
        await self._ready()
        conv = self._conv()
        if message is None:
            path = conv.path()
            if not path:
                return None
            message = path[-1]
        if message.role == "user":  # an unanswered question: answer it
            return await self._answer(conv, message)
        assert message.parent_id is not None
        return await self._answer(conv, conv.messages[message.parent_id])

    async def edit_and_resend(self, user_message: Message, text: str) -> Message | None:
        """Keep the original; add the edited text as its sibling and answer that (a new branch)."""
        text = text.strip()
        if not text or user_message.role != "user":
            return None
        await self._ready()
        conv = self._conv()
        parent = None if user_message.parent_id is None else conv.messages[user_message.parent_id]
        # The edit keeps the original's files: the same stored documents, linked again (not stored twice).
        edited = conv.add_message(parent, "user", text, attachments=user_message.attachments)
        return await self._answer(conv, edited)

    async def continue_answer(self, message: Message) -> Message:
        """Generate more of a cut-off answer: in place when nothing follows it; else as a new version.

        Later turns were written on this answer's text: lengthening it in place would change what they
        answered. So an answer with later turns keeps its text, and its continuation is a new sibling (the
        same tokens, then more) that the chat shows; the later turns stay on the original. Returns the
        message continued into.
        """
        if not message.can_continue:
            raise ValueError("only an answer cut off by the length limit, Stop or a crash can be continued")
        await self._ready()
        conv = self._conv()
        assert message.parent_id is not None
        parent = conv.messages[message.parent_id]
        prefix = list(conv.tokens(message))
        self._tell_other_model(message)
        target = message
        if conv.children(message.id):
            target = conv.add_message(parent, "assistant")
            conv.set_tokens(target, prefix, message.content)
        await self._run(conv, target, parent, prefix, ())
        return target

    async def branch(self, message: Message, index: int, token_id: int) -> Message:
        """Cut `message` before token `index`, force `token_id` there, and generate on (a new sibling)."""
        await self._ready()
        conv = self._conv()
        tokens = conv.tokens(message)
        if not message.is_assistant or not 0 <= index < len(tokens):
            raise ValueError(f"no token {index} in message {message.id}")
        assert message.parent_id is not None
        parent = conv.messages[message.parent_id]
        kept = list(tokens[:index])
        if kept:
            self._tell_other_model(message)
        sibling = conv.add_message(parent, "assistant", branch_index=index)
        conv.set_tokens(sibling, kept, "".join(t.text for t in kept))
        await self._run(conv, sibling, parent, kept, (token_id,))
        return sibling

    async def branch_decoded(self, message: Message, index: int, token_ids: tuple[int, ...]) -> Message:
        """`branch`, its kept tokens decoded again as forced ones before `token_ids`: a branch inside a tool call,
        whose constraint and call tracker must read the call's beginning (they do not see an answer prefix).
        The prompt's KV cache is reused as for any branch; the kept tokens take one forward each."""
        await self._ready()
        conv = self._conv()
        tokens = conv.tokens(message)
        if not message.is_assistant or not 0 <= index < len(tokens) or not token_ids:
            raise ValueError(f"no token {index} in message {message.id}")
        assert message.parent_id is not None
        parent = conv.messages[message.parent_id]
        sibling = conv.add_message(parent, "assistant", branch_index=index)
        await self._run(conv, sibling, parent, [], tuple(t.token_id for t in tokens[:index]) + tuple(token_ids))
        return sibling

    async def answer_after(self, parent: Message) -> Message:
        """A new answer after `parent`, whatever its role: a notebook continues its text after any part."""
        await self._ready()
        return await self._answer(self._conv(), parent)

    def stop(self) -> None:
        """Cancel the running generation before its next token (the tokens so far are kept).

        Pressed while the answer still waits for the model, it ends before it starts.
        """
        if self.busy:
            self._stop_requested = True
        if self._stream is not None:
            self._stream.cancel()

    def interrupt(self, reason: str) -> None:
        """The app must quit (a signal): stop, and mark the answer interrupted rather than stopped."""
        self._interrupted_by = reason
        self.stop()

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop, wait for the last events, and write everything (closing the window). Never raises."""
        self.stop()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.busy and loop.time() < deadline:  # _run's finally writes the last batch, then clears busy
            await asyncio.sleep(0.01)
        if self.busy:
            log.error("the generation did not stop within %g s; closing without its last tokens", timeout_s)
        # Another connection holding the write lock: wait for it here, on the loop, so the last tokens are written.
        if not await self.library.store.wait_writable(cancelled=lambda: loop.time() > deadline):
            log.error("the database stayed locked by another connection; closing may leave the last tokens unsaved")
        self.flush_now()  # the current conversation's flush() writes its due stage records too
        for task in list(self._stage_writers.values()):
            task.cancel()
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None

    def flush_now(self) -> None:
        """Write what is pending, synchronously (Qt quitting cannot wait); a running answer is marked interrupted."""
        generating = self._generating
        if generating is not None:
            conv, message = generating
            self.interrupt(self._interrupted_by or "quit")
            stats = {**(message.stats or {}), "interrupted_by": self._interrupted_by}
            self._save(conv, message, lambda: conv.update_message(message, finish_reason=None, stats=stats))
        current = self.library.current
        if current is not None:
            self._save(current, None, current.flush)
        self.retry_saving()

    # -- saving ----------------------------------------------------------------------------

    def _save(self, conv: Conversation, message: Message | None, write: Callable[[], Any]) -> bool:
        """Run one write; on failure remember what to write again and say why. True if it was written."""
        try:
            write()
            return True
        except SAVE_ERRORS as e:
            if message is not None:
                self._unsaved[message.id] = (conv, message)
            self._save_failed(e)
            return False

    async def _save_waiting(self, conv: Conversation, message: Message, write: Callable[[], Any]) -> bool:
        """`_save`, waiting on the event loop while another connection holds the write lock (until Stop)."""
        while not self._save(conv, message, write):
            if not self._save_busy or self._stop_requested:
                return False
            await asyncio.sleep(BUSY_RETRY_S)
        return True

    def _save_failed(self, error: BaseException) -> None:
        self._save_busy = is_busy(error)
        if self._save_busy:
            # Not a failure: another connection holds the lock for a while. What was not written stays in
            # memory and is written as soon as the lock is free; the store tells the window (status bar).
            log.info("the database is busy; trying again in %g s", BUSY_RETRY_S)
            self.save_error = describe_error(error)
            self._schedule_retry(BUSY_RETRY_S)
            return
        self.save_error = describe_error(error)
        log.error("saving failed: %s", self.save_error)
        self.save_failed.emit(self.save_error)
        self._schedule_retry()

    def _schedule_retry(self, delay_s: float | None = None) -> None:
        delay_s = SAVE_RETRY_S if delay_s is None else delay_s  # read when called: tests shorten it
        try:
            loop = asyncio.get_running_loop()
            if self._retry is not None:
                if self._retry_due - loop.time() <= delay_s:
                    return
                self._retry.cancel()  # a busy database is retried sooner than a failed one
            self._retry = loop.call_later(delay_s, self._retry_tick)
            self._retry_due = loop.time() + delay_s
        except RuntimeError:  # no loop (quitting): the next write or close tries again
            pass

    def _retry_tick(self) -> None:
        self._retry = None
        self.retry_saving()

    def retry_saving(self) -> bool:
        """Write again what could not be written (tokens, text, finish and stats); True when nothing is left."""
        if not self._unsaved and self.save_error is None:
            return True
        if self._save_busy and not self.library.store.can_write_now():
            self._schedule_retry(BUSY_RETRY_S)  # still locked elsewhere: try again soon, without waiting now
            return False
        try:
            for conv, message in list(self._unsaved.values()):
                if conv.deleted:
                    continue
                conv.flush()
                conv.update_message(
                    message, finish_reason=message.finish_reason, stats=message.stats,
                    request=message.request, model=message.model,
                )
            if self.library.current is not None:
                self.library.current.flush()
        except SAVE_ERRORS as e:
            self._save_failed(e)
            return False
        self._unsaved.clear()
        self.save_error = None
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        log.info("saving works again: everything is written")
        self.saved.emit()
        return True

    # -- the generation --------------------------------------------------------------------

    def _conv(self) -> Conversation:
        return self.library.current or self.library.new()

    def _check_idle(self) -> None:
        if self.busy:
            raise Busy("a generation is running; stop it first")
        problem = self.settings.constraint_problem  # never answer under a constraint other than the one shown
        if problem:
            raise ValueError(f"Not sent: {problem}. Fix it, or turn Structured output off.")

    async def _ready(self) -> None:
        """Idle, and the database takes writes: while another connection holds its write lock this waits on
        the event loop (the window stays live and says so), rather than in SQLite's busy wait on the UI thread."""
        self._check_idle()
        store = self.library.store
        if not store.can_write_now():
            await store.wait_writable()
            self._check_idle()  # another action may have started while this one waited

    def _on_step_waiting(self, preview: TokenEvent) -> None:  # the model's worker thread
        if self._step_hop is not None:
            self._step_hop(preview)

    def _tell_other_model(self, message: Message) -> None:
        """Continuing another model's tokens on the loaded one: say so (its token ids may mean other tokens)."""
        engine = self.host.engine
        text = other_model_notice(message.model, model_record(engine.info)) if engine is not None else None
        if text:
            self.notice.emit(text)

    async def _answer(self, conv: Conversation, user: Message) -> Message:
        answer = conv.add_message(user, "assistant")
        await self._run(conv, answer, user, [], ())
        return answer

    async def _run(
        self,
        conv: Conversation,
        message: Message,
        user: Message,
        prefix: list[TokenEvent],
        forced: tuple[int, ...],
    ) -> None:
        """Generate into `message` (an answer to `user`) after its `prefix` tokens: the request, its record on
        the answer, the stream, the answer's end; a failure is said and the partial answer kept."""
        self._begin(conv, message)
        stats: GenerationStats | None = None
        try:
            engine = await self.host.wait_engine()
            request, request_doc = await self._request(engine, conv, user, prefix, forced)
            info = engine.info
            if not await self._record_request(conv, message, request_doc, info):
                return
            stats = await self._stream_answer(conv, message, engine, info, request, len(prefix))
            self._end_answer(conv, message, stats)
        except Exception as e:  # noqa: BLE001 - shown to the user; the partial answer is kept
            log.warning("generation failed: %s", e, exc_info=not isinstance(e, ValueError))
            why = describe_error(e)  # now: `e` is gone once this block ends, and the save may run later
            self._save(conv, message, lambda: conv.update_message(message, finish_reason="error", stats={"error": why}))
            self.error.emit(why)
        finally:
            # Busy must end whatever the writes do, or the window can never close.
            self._stream = None
            self._generating = None
            try:
                if self._save(conv, message, lambda: conv.flush(defer_stages=True)):
                    self._write_stages_later(conv)
            finally:
                conv.set_generating(message, False)
                self.busy_changed.emit(False)
                self.finished.emit(message, stats)

    def _write_stages_later(self, conv: Conversation) -> None:
        """Write the stage records the answer's flushes left out, in slices while the window is idle."""
        if conv.has_due_stages and conv.id not in self._stage_writers:
            task = asyncio.get_running_loop().create_task(self._write_stages(conv))
            self._stage_writers[conv.id] = task
            cid = conv.id

            def forget(_task: "asyncio.Task[None]") -> None:
                self._stage_writers.pop(cid, None)

            task.add_done_callback(forget)

    async def _write_stages(self, conv: Conversation) -> None:
        try:
            while conv.has_due_stages and not conv.deleted:
                if self._generating is not None:
                    await asyncio.sleep(STAGE_WAIT_S)
                    continue
                if not self._save(conv, None, lambda: conv.write_due_stages(STAGE_SLICE_S)):
                    return  # kept due: any later flush() (switching, export, closing, a retry) writes them
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            # The loop is closing (asyncio.run's end, the window's shutdown): what is left is written now, at once.
            self._save(conv, None, conv.flush)
            raise

    def _begin(self, conv: Conversation, message: Message) -> None:
        """A run starts: `message` is the one generating, and busy."""
        self._generating = (conv, message)
        self._stop_requested = False
        conv.set_generating(message, True)
        self.busy_changed.emit(True)
        self.started.emit(message)

    async def _request(
        self, engine: Engine, conv: Conversation, user: Message, prefix: list[TokenEvent], forced: tuple[int, ...],
    ) -> tuple[GenerationRequest, dict[str, Any]]:
        """The run's request, and its record (the settings it ran with) for the answer."""
        options = self.settings.options
        # Earlier answers' reasoning stays out of the prompt the way the model's template wants
        # (the template's code renders: off the UI thread).
        thinking = await self.host.off_ui_thread(model_reasoning_format, engine)
        history = reasoning.prompt_history(conv.history(user), thinking)
        tool_fields: dict[str, Any] = {}
        tool_doc = None
        if self.tool_requests is not None:  # the chat's tools; earlier calls and their results as OpenAI's messages
            history, tool_fields, tool_doc = self.tool_requests(conv, user, history)
        # Counting the prompt renders the model's chat template: its code, never on the UI thread.
        prompt = prompt_for(conv, user, history)  # a notebook's text (no template), or the chat's messages
        max_new = await self.host.off_ui_thread(self._fit_to_context, engine, prompt, len(prefix), options.max_new_tokens,
                                                tool_fields)
        by_server = server_samples(options.server_sampling, engine.info)  # remote models only
        steering = self.steering.steering()  # None when no vector is on: exactly an unsteered answer
        request = GenerationRequest(
            **prompt.request_fields(),
            sampler=options.sampler,
            max_new_tokens=max_new,
            stop=options.stop,
            top_n=self.top_n,
            record_stages=True,
            assistant_prefix=tuple(t.token_id for t in prefix),
            forced_tokens=forced,
            server_sampling=by_server,
            constraint=options.constraint,  # structured output (the grammar stage), None when off
            steering=steering,
            **tool_fields,
        )
        request_doc = {**options.to_dict(), "max_new_tokens": max_new, "top_n": self.top_n, "server_sampling": by_server,
                       "reasoning": thinking.to_dict()}  # how the answer's view reads its thinking
        if tool_doc is not None:  # the tool names it could call and the choice (the call blocks read them)
            request_doc["tools"] = tool_doc
        if steering is not None:  # vectors by name and content hash, strengths, layer range
            request_doc["steering"] = steering.to_dict()
        return request, request_doc

    async def _record_request(
        self, conv: Conversation, message: Message, request_doc: dict[str, Any], info: ModelInfo,
    ) -> bool:
        """Write the request and the model on the answer before any token; False (the answer cancelled) when
        nothing could be written or Stop was pressed meanwhile."""
        model_doc = model_record(info)
        if not await self._save_waiting(conv, message, lambda: conv.update_message(
                message, request=request_doc, model=model_doc, finish_reason=None)):
            # Nothing could be written: generating more would only pile up in memory.
            self._save(conv, message, lambda: conv.update_message(message, finish_reason="cancelled"))
            return False
        if self._stop_requested:  # Stop pressed while waiting for the model
            self._save(conv, message, lambda: conv.update_message(message, finish_reason="cancelled"))
            return False
        return True

    async def _stream_answer(
        self, conv: Conversation, message: Message, engine: Engine, info: ModelInfo, request: GenerationRequest,
        offset: int,
    ) -> GenerationStats:
        """Stream the answer's tokens into `message` (after `offset` prefix tokens), flushed to the database
        every `flush_interval_s` while it takes writes; its stats once it ends."""
        loop = asyncio.get_running_loop()
        write_failed = False
        step = self.step_gate if self.step_gate.stepping and info.runs_locally else None
        if step is not None:
            self._step_hop = to_loop(self.step_waiting.emit)
        self._stream = stream = TokenStream(engine, request, step=step)
        last_flush = loop.time()
        async for batch in stream.batches():
            conv.append_tokens(message, [replace(ev, index=offset + ev.index) for ev in batch])
            if not write_failed and loop.time() - last_flush >= self.flush_interval_s:
                if self.library.store.busy and not self.library.store.can_write_now():
                    last_flush = loop.time()  # still locked elsewhere: ask again later, without waiting at all
                    continue
                # Stage records not built yet are written at the answer's end (Conversation.flush).
                if not self._save(conv, message, lambda: conv.flush(defer_stages=True)):
                    if self._save_busy:
                        # Another connection holds the lock: the tokens wait in memory, the answer goes on.
                        last_flush = loop.time()
                        continue
                    # Saving failed: stop cleanly. What streamed stays in memory and on screen.
                    write_failed = True
                    stream.cancel()
                    continue
                # Token records are long-lived and numerous (~180 tracked objects per token with
                # its alternatives and stages). Freezing what exists keeps the cyclic GC from
                # rescanning them all: its full passes cost ~100 ms at 4,000 tokens otherwise.
                # Frozen objects are still freed by reference counting when dropped.
                gc.freeze()
                last_flush = loop.time()
        stats = stream.stats
        assert stats is not None
        return stats

    def _end_answer(self, conv: Conversation, message: Message, stats: GenerationStats) -> None:
        """The answer's end: its finish reason and stats written, a server's failure mid-answer said."""
        self.last_stats = stats
        self.last_context_used = stats.prompt_tokens + stats.generated_tokens
        saved_stats = {k: v for k, v in stats.to_dict().items() if k not in ("text", "token_ids")}
        finish: str | None = stats.finish_reason
        if self._interrupted_by is not None and finish == "cancelled":
            # The app is quitting on a signal: not the user's Stop. None reads "interrupted", as after a crash.
            finish, saved_stats = None, {**saved_stats, "interrupted_by": self._interrupted_by}
        self._save(conv, message, lambda: conv.update_message(message, finish_reason=finish, stats=saved_stats))
        if finish == "error":  # a server that failed mid-answer: the text so far is kept, and the user told why
            self.error.emit(f"the answer stopped after {stats.generated_tokens} tokens: {stats.error or 'unknown error'}")

    @staticmethod
    def _fit_to_context(engine: Engine, history: "Prompt | list[dict[str, str]]", prefix_len: int, wanted: int,
                        tool_fields: dict[str, Any] | None = None) -> int:
        """Clamp the answer length to what the context has left (the engine refuses overflowing requests); with
        tools, the prompt is counted as the engine renders it, the tools' descriptions included."""
        context = engine.info.context_length
        if not context or not engine.info.runs_locally:
            # A remote tokenizer is HTTP: not on this (the UI) thread. The server refuses an overflow itself.
            return wanted
        ids = None
        if tool_fields and isinstance(history, Prompt) and history.messages is not None:
            ids = tools.prompt_ids_with_tools(engine.tokenizer, GenerationRequest(**history.request_fields(), **tool_fields))
        prompt = len(ids if ids is not None else prompt_ids(engine.tokenizer, history)) + prefix_len
        room = context - prompt
        if room < 1:
            raise ValueError(
                f"the conversation fills the model's context ({prompt} of {context} tokens): "
                "start a new chat or shorten the system prompt"
            )
        return min(wanted, room)
