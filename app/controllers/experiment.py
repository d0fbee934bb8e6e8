"""The sampling experiments' runs (Compare, Replay, Score), owned apart from the windows that draw them.

Qt-free, like `ChatController` for the chat: a window asks the controller for
a run, subscribes to the run's signals and draws what they announce; it never
talks to the engine itself. Each run is its own object holding its own state
(tokens so far, stats, result), so the long-lived controller keeps nothing of
any one run but the set of runs under way (to stop them all).

Runs use the model that is loaded; a replay first checks that it is the model
that made the answer, and refuses otherwise (`OtherModelError`), since
another model's logits cannot reproduce the draws.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from engine import Constraint, Engine, EngineError, GenerationRequest, GenerationStats, SamplerSettings, TokenEvent
from engine import experiments, reasoning, steering as steer

from app.controllers.engine_host import EngineHost, describe_error
from app.state.answer_recipe import (
    TOP_N, AnswerRecipe, add_answer, answer_parent, model_dict, model_reasoning_format, other_model, recipe_for,
)
from app.state.notebook import Prompt
from app.state.conversation import Conversation, Message
from app.state.conversation_list import Library
from app.state.observable import Signal
from app.state.steering_state import SteeringState
from app.controllers.token_stream import TokenStream

log = logging.getLogger(__name__)

SCORE_TOP_N = 10  # alternatives kept per scored token
Anchor = tuple[Conversation, Message]  # a conversation and the user message an experiment answers


class OtherModelError(EngineError):
    """The loaded model is not the one that made the answer being replayed."""

    def __init__(self, reason: str, model: dict[str, Any]):
        super().__init__(reason)
        self.model = model  # the model that made the answer (MODEL_FIELDS)


@dataclass
class ColumnResult:
    """One generation of an experiment: what it ran with and what came out (filled in as it runs)."""

    settings: SamplerSettings  # with the seed it ran with
    max_new_tokens: int
    stop: tuple[str, ...]
    events: list[TokenEvent] = field(default_factory=list)
    stats: GenerationStats | None = None  # set when it ended (stopped runs too)
    summary: experiments.ColumnStats | None = None
    model: dict[str, Any] | None = None  # the model that ran it (MODEL_FIELDS)
    constraint: Constraint | None = None  # the structured output it was held to
    reasoning_format: reasoning.ReasoningFormat | None = None  # how earlier reasoning was left out of its prompt
    steering: steer.Steering | None = None  # the control vectors it ran under (None: none)

    @property
    def token_ids(self) -> list[int]:
        return [e.token_id for e in self.events]

    def finish(self, stats: GenerationStats | None) -> None:
        self.stats = stats
        self.summary = experiments.column_stats(
            self.events, stats.finish_reason if stats else "cancelled", stats.decode_tokens_per_s if stats else 0.0)


class ExperimentRun:
    """One run: a task, a way to stop it, and `finished` (always emitted once; `error` says if it failed)."""

    def __init__(self) -> None:
        self.task: asyncio.Task | None = None
        self.error: str | None = None
        self.finished = Signal()  # () done, stopped or failed (see `error`)
        self._stream: TokenStream | None = None
        self._cancelled = False
        self._ended = False  # set before `finished`, so its subscribers already see the run as over

    @property
    def running(self) -> bool:
        return self.task is not None and not self._ended and not self.task.done()

    def cancel(self) -> None:
        """Stop before the next token; what was made so far is kept."""
        self._cancelled = True
        if self._stream is not None:
            self._stream.cancel()

    def abandon(self) -> None:
        """Cancel, and end the task now even where it waits (for a model to load, say): its window closed."""
        self.cancel()
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def start(self, host: EngineHost) -> None:
        """Run on `host`'s model, as a task (`task`) of the running event loop."""
        self.task = asyncio.ensure_future(self._guarded(host))

    async def _run(self, host: EngineHost) -> None:
        """The run itself (each kind of run writes its own)."""
        raise NotImplementedError

    async def _guarded(self, host: EngineHost) -> None:
        try:
            await self._run(host)
        except Exception as e:  # noqa: BLE001 - shown in the window; what arrived is kept
            log.warning("%s failed: %s", type(self).__name__, e, exc_info=not isinstance(e, (ValueError, EngineError)))
            self.error = describe_error(e)
        finally:
            self._stream = None
            self._ended = True
            self.finished.emit()

    async def _generate(self, engine: Engine, request: GenerationRequest, column: ColumnResult,
                        offset: int = 0) -> AsyncIterator[list[TokenEvent]]:
        """Stream `request` into `column` (indices after `offset` tokens); yields each batch as it lands."""
        self._stream = stream = TokenStream(engine, request)
        async for batch in stream.batches():
            if offset:
                batch = [replace(e, index=offset + e.index) for e in batch]
            column.events.extend(batch)
            yield batch
        self._stream = None
        column.finish(stream.stats)


class CompareRun(ExperimentRun):
    """Columns generated one after another on the loaded model (the prompt is computed once, then reused)."""

    def __init__(self, messages: tuple[dict[str, str], ...] | Prompt, settings: list[SamplerSettings],
                 max_new_tokens: int, stop: tuple[str, ...], top_n: int, constraint: Constraint | None = None,
                 steering: steer.Steering | None = None):
        super().__init__()
        self.messages = messages
        self.steering = steering if steering is not None and steering.active else None  # every column's
        self.top_n = top_n
        self.constraint = constraint
        self.columns = [ColumnResult(s, max_new_tokens, stop, constraint=constraint, steering=self.steering)
                        for s in settings]
        self.divergence: int | None = None  # first position where the finished columns differ
        self.column_started = Signal()  # (index)
        self.tokens = Signal()  # (index, list[TokenEvent])
        self.column_finished = Signal()  # (index)

    @property
    def done(self) -> list[ColumnResult]:
        """The columns that ran to their end (or were stopped)."""
        return [c for c in self.columns if c.stats is not None]

    async def _run(self, host: EngineHost) -> None:
        engine = await host.wait_engine()
        model = model_dict(engine)
        fields: dict[str, Any]
        thinking = None
        if isinstance(self.messages, Prompt):  # a notebook's compare continues its raw text
            fields = self.messages.request_fields()
        else:  # a chat's: earlier answers' reasoning left out as the chat leaves it out (renders: off the UI thread)
            thinking = await host.off_ui_thread(model_reasoning_format, engine)
            fields = {"messages": tuple(reasoning.prompt_history(self.messages, thinking))}
        for i, col in enumerate(self.columns):
            if self._cancelled:
                break
            col.model, col.reasoning_format = model, thinking
            self.column_started.emit(i)
            request = GenerationRequest(**fields, sampler=col.settings, max_new_tokens=col.max_new_tokens,
                                        stop=col.stop, top_n=self.top_n, record_stages=True, constraint=col.constraint,
                                        steering=col.steering)
            async for batch in self._generate(engine, request, col):
                self.tokens.emit(i, batch)
            self.column_finished.emit(i)
            if col.stats is not None and col.stats.finish_reason == "cancelled":
                break
        self.divergence = experiments.first_divergence([c.token_ids for c in self.done])


RECORDED: Any = object()  # ReplayRun's steering: the answer's own (as recorded)


def _described(steering: steer.Steering | None) -> str:
    return steering.describe() if steering is not None else "no steering"


def _key(steering: steer.Steering | None) -> object:
    return steering.key() if steering is not None else None


class ReplayRun(ExperimentRun):
    """An answer generated again from its recipe (its seed; maybe one setting changed), and the token diff."""

    def __init__(self, recipe: AnswerRecipe, original_ids: list[int], settings: SamplerSettings,
                 original: list[TokenEvent] | None = None, original_stats: dict[str, Any] | None = None,
                 steering: "steer.Steering | None | object" = RECORDED):
        super().__init__()
        self.recipe = recipe
        self.original_ids = original_ids
        # The answer's own tokens and record: the verdict compares log-probs bit for bit and fingerprints.
        self.original = original or []
        self.original_fingerprint = experiments.fingerprint_of(original_stats or {})
        self.verdict: experiments.ReplayVerdict | None = None
        # The replay's tokens start with the prefix a branch kept from its original.
        self.result = ColumnResult(settings, recipe.max_new_tokens, recipe.stop, events=list(recipe.prefix),
                                   constraint=recipe.constraint)
        self.changed = experiments.changed_fields(recipe.sampler, settings)  # {field: (old, new)}
        # Steering is a knob too: RECORDED keeps the answer's own; None or a strength of 0 runs without.
        chosen = recipe.steering if steering is RECORDED else steering
        self.steering = chosen if isinstance(chosen, steer.Steering) and chosen.active else None
        self.result.steering = self.steering
        if _key(self.steering) != _key(recipe.steering):
            self.changed["steering"] = (_described(recipe.steering), _described(self.steering))
        self.diff: experiments.TokenDiff | None = None
        self.other_model: dict[str, Any] | None = None  # set when refused: the model that made the answer
        self.tokens = Signal()  # (list[TokenEvent]) indexed as in the answer

    async def _run(self, host: EngineHost) -> None:
        engine = await host.wait_engine()
        if self._cancelled:
            return
        reason = other_model(self.recipe.model, engine.info)
        if reason is not None:
            assert self.recipe.model is not None
            self.other_model = self.recipe.model
            raise OtherModelError(reason, self.recipe.model)
        self.result.model = model_dict(engine)
        # The prompt's cache computed in the pieces the answer's was (its start may have come from an earlier
        # turn's cache): on llama.cpp's CPU the pieces change the numbers, and a replay is to repeat them.
        request = experiments.as_recorded(replace(self.recipe, steering=self.steering).request(self.result.settings),
                                          self.original_fingerprint)
        async for batch in self._generate(engine, request, self.result,
                                          offset=len(self.recipe.prefix)):
            self.tokens.emit(batch)
        self.diff = experiments.token_diff(self.original_ids, self.result.token_ids)
        fp = self.result.stats.fingerprint if self.result.stats is not None else None
        self.verdict = experiments.replay_verdict(self.original, self.result.events, self.original_fingerprint, fp)


class ScoreRun(ExperimentRun):
    """A text read teacher-forced by the loaded model, on its worker thread."""

    def __init__(self, text: str, top_n: int):
        super().__init__()
        self.text = text
        self.top_n = top_n
        self.result: experiments.ScoreResult | None = None
        self.context_text = ""  # the start of the text that only serves as context (nothing predicts it)
        self._stop = threading.Event()  # read by the worker thread between positions

    def cancel(self) -> None:
        super().cancel()
        self._stop.set()

    async def _run(self, host: EngineHost) -> None:
        engine = await host.wait_engine()
        result = await asyncio.wrap_future(engine.start_score(self.text, top_n=self.top_n, cancel=self._stop))
        # The context's text: a decode of its tokens, off the UI thread.
        context_text = await host.off_ui_thread(engine.tokenizer.decode, list(result.token_ids[: result.context]))
        self.result, self.context_text = result, context_text


class ExperimentController:
    """Starts experiment runs on the host's model and turns their results into answers in the chat."""

    def __init__(self, host: EngineHost, library: Library | None = None, *, top_n: int = TOP_N,
                 steering: SteeringState | None = None):
        self.host = host
        self.steering = steering  # the Steering panel's vectors: a steered answer's replay finds them here
        self.library = library  # where Compare puts a column taken into the chat as a new conversation
        self.top_n = top_n
        self._runs: set[ExperimentRun] = set()  # under way, to stop them all

    @property
    def runs(self) -> frozenset[ExperimentRun]:
        return frozenset(self._runs)

    def _own(self, run: ExperimentRun) -> None:
        self._runs.add(run)
        run.finished.connect(lambda: self._runs.discard(run))
        run.start(self.host)

    def stop_all(self) -> None:
        for run in list(self._runs):
            run.cancel()

    # -- runs ------------------------------------------------------------------------------

    def compare(self, messages: tuple[dict[str, str], ...] | Prompt, settings: list[SamplerSettings], *,
                max_new_tokens: int, stop: tuple[str, ...] = (), constraint: Constraint | None = None,
                steering: steer.Steering | None = None) -> CompareRun:
        """Generate one column per settings (each with its seed filled in), one after another.

        `constraint`: the structured output every column is held to (the Sampling panel's), None for none.
        """
        if not messages:
            raise ValueError("write a prompt first")
        run = CompareRun(messages, settings, max_new_tokens, tuple(stop), self.top_n, constraint, steering)
        self._own(run)
        return run

    def replay(self, conv: Conversation, message: Message, settings: SamplerSettings | None = None,
               steering: "steer.Steering | None | object" = RECORDED) -> ReplayRun:
        """Generate `message` again with its stored seed and settings (or `settings`) and its steering (or
        `steering`; None: without); ValueError if it cannot be."""
        recipe = recipe_for(conv, message, self.find_vector)
        original = conv.tokens(message)
        run = ReplayRun(recipe, [t.token_id for t in original], settings or recipe.sampler, original, message.stats,
                        steering)
        self._own(run)
        return run

    def find_vector(self, digest: str) -> steer.SteeringVector | None:
        """A steering vector by content hash, from the Steering panel's (None: not at hand)."""
        return self.steering.find(digest) if self.steering is not None else None

    def score(self, text: str, *, top_n: int = SCORE_TOP_N) -> ScoreRun:
        if not text.strip():
            raise ValueError("Write or open a text to score first.")
        run = ScoreRun(text, top_n)
        self._own(run)
        return run

    # -- the model that made an answer -----------------------------------------------------

    def model_mismatch(self, recipe: AnswerRecipe) -> str | None:
        """Why the loaded model cannot replay `recipe`'s answer (None: it can, or nothing is loaded yet)."""
        info = self.host.info if self.host.engine is not None else None
        return other_model(recipe.model, info) if info is not None else None

    async def load_model_of(self, recipe: AnswerRecipe) -> None:
        """Load the model that made `recipe`'s answer (the chat switches to it too).

        Raises ValueError saying why when it cannot be loaded, RuntimeError while another load is under way.
        """
        if not recipe.model or not recipe.model.get("spec"):
            raise ValueError("this answer does not record which model made it")
        # Shielded: a replay window closing while the model loads must not cancel the load the chat shares.
        if not await asyncio.shield(self.host.load(recipe.model["spec"], recipe.model.get("backend") or "auto")):
            raise ValueError(describe_error(self.host.last_error) if self.host.last_error else "loading failed")

    # -- into the chat ---------------------------------------------------------------------

    def take_into_chat(self, column: ColumnResult, anchor: Anchor | None, prompt: str) -> tuple[Anchor, Message]:
        """A compare column becomes a new answer to `anchor`'s question (or to `prompt` in a new chat).

        Returns the (conversation, question) it now answers and the new answer; the conversation is opened.
        """
        if column.stats is None:
            raise ValueError("this column has not run yet")
        if self.library is None:
            raise ValueError("there is no chat to take the answer into")
        if anchor is None:
            conv = self.library.new()
            anchor = (conv, conv.add_message(None, "user", prompt.strip()))
        conv, user = anchor
        if self.library.current is not conv:  # opening gives the library's own object for it
            conv = self.library.open(conv.id)  # the conversation it makes current
            user = conv.messages[user.id]
        answer = add_answer(conv, user, column.events, stats=column.stats, sampler=column.settings,
                            max_new_tokens=column.max_new_tokens, stop=column.stop, model=column.model,
                            constraint=column.constraint, reasoning_format=column.reasoning_format,
                            steering=column.steering)
        return (conv, user), answer

    def keep_replay(self, run: ReplayRun, conv: Conversation, message: Message) -> Message:
        """The replay of `message` becomes a new version of it (a sibling in the conversation)."""
        result = run.result
        if result.stats is None:
            raise ValueError("the replay has not finished")
        return add_answer(conv, answer_parent(conv, message), result.events, stats=result.stats,
                          sampler=result.settings, max_new_tokens=result.max_new_tokens, stop=result.stop,
                          model=result.model, branch_index=message.branch_index, constraint=result.constraint,
                          reasoning_format=reasoning.ReasoningFormat.from_dict((message.request or {}).get("reasoning")),
                          steering=result.steering)
