"""One answer's per-token bookkeeping, whoever runs the model: `AnswerRow`.

The decode loop (engine/decode/loop.py) runs one row; the loom's batch
(engine/loom/continuations.py) runs N rows side by side, one forward for all.
Either way a row does the same per token, here and only here (mlx-lm's
`stream_generate` around `generate_step`): its sampler chain chooses from the
step's logits (`choose`), and `take` puts the token into the history the
penalties read, the detokenizer, the banned-string guard and the stop-string
matcher, and says what text it released and whether the answer ends there
(end of sequence, a stop string, the length limit) -- or that a banned string
completed and the row stepped back (`Taken.step_back`: the ids the model
must continue from). `event` builds the token's report when it is shown
(the decode loop builds it while the next forward runs). The row's
`AnswerRecord` keeps its tokens and times, and `stats` says how it went.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from engine.backend import Backend
from engine.capabilities import DeviceRows, SamplesOnDevice
from engine.banned_strings import Ban, BannedStringGuard
from engine.cache_schedule import to_record
from engine.decode.stats import AnswerRecord
from engine.fingerprints.record import token_ids_sha256
from engine.events import FinishReason, GenerationStats, Rewind, StageSnapshot, TokenEvent
from engine.request import GenerationRequest
from engine.lazy_tuple import LazyTuple
from engine.sampling import Pick, SamplerChain, StageStats
from engine.sampling.grammar import GrammarStage, constraint_step, grammar_stage
from engine.sampling.pick import Choice
from engine.sampling.torch_chain import OnDeviceChain, TorchChoice
from engine.stopping import StopStringMatcher
from engine.tokenizer import StreamDetokenizer, TokenizerLike, partial_token_bytes
from engine.tools.constraint import tool_constraint
from engine.tools.kept_prefix import follow_kept, kept_text
from engine.tools.render import ToolPlan
from engine.tools.request_tools import answer_calls, plan_for_request
from engine.tools.tracker import CallTracker
from engine.top_n import reported_view

log = logging.getLogger(__name__)

# At most this many step-backs for banned strings per answer (each costs one forward); past it, a banned
# phrase stays in the text with a warning in the log.
MAX_REWINDS = 256


@dataclass(slots=True)
class Taken:
    """What taking one token did to its row.

    Attributes:
        index: the token's position among the row's generated tokens.
        choice: the sampler's choice (its report is built when the event is).
        logits: the step's logits row the token was chosen from (a server's top-N view is cut from it): numpy,
            or a tensor on the backend's device (`AnswerRow.device`).
        pick: the choice's report when it was built already (step mode showed it).
        text: the text this token releases (held-back stop-string or banned-string text included).
        special: an end-of-sequence token (shown in token views, not in text).
        ends: the row ends with this token (its finish reason is set).
        rewind: the step back this token's event tells of (the first token after one).
        step_back: a banned string completed: the token was not kept, and the model continues from these ids
            (prompt and the tokens kept); no event.
    """

    index: int
    choice: Choice | TorchChoice
    logits: Any
    pick: Pick | None = None
    text: str = ""
    special: bool = False
    ends: bool = False
    rewind: Rewind | None = None
    step_back: list[int] | None = None
    tool_position: str | None = None  # where the token stands in a tool call (engine.tools.tracker)

    @property
    def token_id(self) -> int:
        return self.choice.token_id


class AnswerRow:
    """One answer's state while it is decoded: chain, history, detokenizer, stops, bans, constraint, record.

    Per-run state only (built per answer; never shared between answers).
    """

    def __init__(
        self,
        tok: TokenizerLike,
        request: GenerationRequest,
        prompt: list[int],
        chain: SamplerChain | OnDeviceChain,
        *,
        t0: float,
        grammar: GrammarStage | None = None,
        reported_n: int = 0,
        tools: ToolPlan | None = None,
        device: DeviceRows | None = None,
    ) -> None:
        self.tok, self.request, self.prompt, self.chain, self.grammar = tok, request, prompt, chain, grammar
        # Rows kept on the backend's device and sampled there (SamplesOnDevice); None: numpy rows and chain.
        self.device = device
        self.reported_n = reported_n  # a server's top N: the model view is what it reported (engine/top_n.py)
        self.max_new_tokens = request.max_new_tokens  # the loom's beam rows end where their search ended
        self.record = AnswerRecord(t0)
        # Penalties look at prompt + generated tokens; a preallocated buffer avoids O(n^2) appends.
        self.history = np.empty(len(prompt) + request.max_new_tokens, dtype=np.int64)
        self.history[: len(prompt)] = prompt
        self.n_hist = len(prompt)
        self.detok = StreamDetokenizer(tok, context_ids=prompt)
        self.stopper = StopStringMatcher(request.stop)
        # Banned strings: text that may still become a banned phrase is held back; when one completes, the row
        # steps back to the token it began with (engine/banned_strings.py). The stage state before each held
        # token's pick is kept so a step back restarts mirostat / adaptive-p from where they were.
        self.guard = BannedStringGuard(request.sampler.banned_strings)
        self._bans: dict[int, set[int]] = {}  # position among generated tokens -> tokens banned there
        self._states: dict[int, tuple] = {}
        self._rewind: Rewind | None = None  # told with the next token's event
        self.rewinds_left = MAX_REWINDS
        # Tools: the plan (format, choice) and the tracker that positions each token in a call and ends the
        # answer when one is complete (finish reason "tool_calls"); None without tools.
        self.tools = tools
        self.calls = CallTracker(tools.format) if tools is not None and tools.tools and tools.choice.calls else None
        # A branch or Continue inside a call: the reader starts after the kept part (engine.tools.kept_prefix).
        self.kept_text = kept_text(tok, prompt, request.assistant_prefix) if self.calls is not None else ""
        if self.calls is not None:
            self.calls.follow(self.kept_text)

    @classmethod
    def start(
        cls, backend: Backend, request: GenerationRequest, prompt: list[int], t0: float, seed: int | None = None,
        *, on_device: bool = False,
    ) -> AnswerRow:
        """A row for `request` on `backend` (`seed`: the loom's row seed instead of the request's).

        `on_device`: the caller runs the row's forwards as `row.device` says where it is not None (the decode
        loop); the loom's and the server's batched rows get host rows from their batch runners, so they keep
        the numpy chain.

        The constraint's matcher is made here, before any forward, so a bad constraint costs no model time.
        """
        tok = backend.tokenizer
        tools = plan_for_request(tok, request)
        # With tools the answer is text or a valid call (engine.tools.constraint); the request refuses tools
        # with a constraint of its own.
        constraint = request.constraint or (tool_constraint(tools, tok) if tools is not None else None)
        grammar = grammar_stage(constraint, tok, backend.info)
        if grammar is not None:  # the constraint (the tools' or the request's) starts after the kept part
            follow_kept(grammar.run, request.assistant_prefix, tools=request.constraint is None)
        sampler = request.sampler if seed is None else request.sampler.with_(seed=seed)
        # On the device where the backend keeps its rows there and the device chain takes these settings.
        device = None
        if on_device and isinstance(backend, SamplesOnDevice):
            device = backend.device_rows(sampler, tok, grammar)
        chain = device.chain if device is not None else SamplerChain(sampler, vocab=tok, constraint=grammar)
        return cls(tok, request, prompt, chain, t0=t0, grammar=grammar, reported_n=backend.info.reports_top_n,
                   tools=tools, device=device)

    # --- where the row is ---------------------------------------------------------------

    @property
    def generated(self) -> list[int]:
        return self.record.token_ids

    @property
    def step(self) -> int:
        """The position of the next token among the generated ones."""
        return len(self.record.token_ids)

    @property
    def room_left(self) -> bool:
        return self.step < self.max_new_tokens

    def forced_here(self) -> int | None:
        """The request's forced token at this position (a branch, a file), None where the sampler chooses."""
        forced = self.request.forced_tokens
        return forced[self.step] if self.step < len(forced) else None

    def end(self, finish: FinishReason, error: str | None = None) -> None:
        self.record.end(finish, error)

    # --- one token -------------------------------------------------------------------------

    def choose(self, logits: Any, force: int | None = None) -> Choice | TorchChoice:
        """The sampler's token at this position (or `force`, recorded as forced); its report comes later."""
        if self.guard.active:
            self._states[self.step] = self.chain.state()
        return self._choose(logits, force)

    def choose_instead(self, logits: Any, token: int, before: tuple) -> Choice | TorchChoice:
        """Step mode: the person's `token` instead of the pick, the stages' state put back to `before` it."""
        self.chain.restore(before)
        return self._choose(logits, token)

    def _choose(self, logits: Any, force: int | None) -> Choice | TorchChoice:
        return self.chain.choose(logits, self.history[: self.n_hist], record_stages=self.request.record_stages,
                                 force_token=force, banned=self._bans.get(self.step, ()))

    def take(self, choice: Choice | TorchChoice, logits: Any, pick: Pick | None = None) -> Taken | None:
        """Take the chosen token: history, text, stops, end of sequence, length, banned strings.

        Returns None when the constraint refused it or reached a dead end (the row has ended with an error).
        """
        if self.grammar is not None and self.grammar.run.failure:
            self.end("error", self.grammar.run.failure)
            return None
        step, token = self.step, choice.token_id
        self.record.took(token)
        self.history[self.n_hist] = token
        self.n_hist += 1
        taken = Taken(step, choice, logits, pick, rewind=self._rewind)
        self._rewind = None
        if token in self.tok.eos_token_ids and not self.request.ignore_eos:
            self.end("eos")
            released, _ = self.stopper.feed(self.guard.finish(self.detok.flush()))
            taken.text, taken.special, taken.ends = released + self.stopper.flush(), True, True
            return taken
        piece = self.detok.add(token)
        if self.calls is not None:
            taken.tool_position = self.calls.feed(piece)
        released, ban = self.guard.feed(step, piece)
        if ban is not None:
            if ban.start < len(self.request.forced_tokens) or self.rewinds_left == 0:
                # A forced token cannot be banned, and a model that keeps coming back to its phrases is let be.
                log.warning("banned string %r left in the answer (%s)", ban.phrase,
                            "it began with a forced token" if self.rewinds_left else f"{MAX_REWINDS} step-backs already")
                released = self.guard.give_up()
            else:
                taken.step_back = self._step_back(ban)
                return taken
        for k in [k for k in self._states if k < self.guard.held_from]:
            del self._states[k]
        released, stopped = self.stopper.feed(released)
        last = self.step == self.max_new_tokens
        called = not stopped and self.calls is not None and self.calls.complete
        if stopped:
            self.end("stop")
        elif called or last:
            if called:
                self.end("tool_calls")
            released += self.stopper.feed(self.guard.finish(self.detok.flush()))[0] + self.stopper.flush()
        taken.text, taken.ends = released, stopped or last or called
        return taken

    def _step_back(self, ban: Ban) -> list[int]:
        """Withdraw the tokens from where `ban`'s phrase began and ban its first token there."""
        self.rewinds_left -= 1
        i = ban.start
        withdrawn = self.record.drop_from(i)
        self._bans = {k: v for k, v in self._bans.items() if k <= i}  # later bans belonged to the abandoned text
        self._bans.setdefault(i, set()).add(withdrawn[0])
        self._rewind = Rewind(ban.phrase, len(withdrawn), withdrawn[0], self.tok.token_text(withdrawn[0]))
        self.n_hist = len(self.prompt) + i
        self.chain.restore(self._states[i])
        self.guard.rewind(i)
        self.detok = StreamDetokenizer(self.tok, context_ids=self.prompt + self.generated)
        if self.calls is not None and self.tools is not None:  # follow the call again over the text kept
            self.calls = CallTracker(self.tools.format)
            self.calls.follow(self.kept_text + (self.tok.decode(self.generated) if self.generated else ""))
        return self.prompt + self.generated

    # --- what leaves the row -------------------------------------------------------------

    def event(self, taken: Taken) -> TokenEvent:
        """The token's event, its report built now (step mode built it already)."""
        pick = taken.pick or taken.choice.report(self.request.top_n)
        event = token_event(self.tok, taken.index, pick, taken.text, taken.special, taken.rewind)
        if self.grammar is not None:
            event = constraint_step(event, self.grammar, self.tok)
        if taken.tool_position is not None:
            event = replace(event, tool_position=taken.tool_position)
        return reported_view(event, taken.logits, self.reported_n) if self.reported_n else event

    def preview(self, pick: Pick) -> TokenEvent:
        """Step mode: the event of a token not taken yet (no text released)."""
        return token_event(self.tok, self.step, pick, "")

    def stats(self, *, reused_tokens: int = 0, peak_memory_bytes: int = 0,
              cache_schedule: Sequence[tuple[int, int]] = ()) -> GenerationStats:
        """`cache_schedule`: the pieces the prompt's cache was computed in, where the backend says (exact replays)."""
        grammar = self.grammar
        stats = self.record.stats(
            prompt_tokens=len(self.prompt), text=self.stopper.text, seed=self.chain.seed,
            reused_tokens=reused_tokens, peak_memory_bytes=peak_memory_bytes,
            constraint_logprob=grammar.run.log_mass_kept if grammar is not None else None,
            constraint_status=grammar.run.finish_note(self.record.finish) if grammar is not None else "",
        )
        if self.calls is not None:  # the calls read from the answer (engine.tools)
            calls = answer_calls(self.kept_text + stats.text, self.tools).calls  # a call begun before a branch too
            stats = replace(stats, tool_calls=calls)
            if stats.finish_reason == "tool_calls" and not calls:
                # The call's end was written but no call reads out of the answer (a model writing one with no
                # grammar: a remote server's, or the text before it): the answer is text, said so.
                stats = replace(stats, finish_reason="stop", error=stats.error or
                                "the answer wrote a tool call that could not be read; it is kept as text")
        return replace(stats, prompt_sha256=token_ids_sha256(self.prompt),
                       cache_schedule=tuple((c, k, times) for c, k, times in to_record(cache_schedule)))


def token_event(
    tok: TokenizerLike,
    index: int,
    pick: Pick,
    text: str,
    special: bool = False,
    rewind: Rewind | None = None,
) -> TokenEvent:
    """A chosen token's `TokenEvent` from its report (the pick's alternatives are TokenProb already)."""
    stages: Sequence[StageSnapshot] | None = None
    if isinstance(pick.stages, LazyTuple) and not pick.stages.built:  # built when read, as the pick's records
        stages = LazyTuple(partial(_snapshots, pick.stages))
    elif pick.stages is not None:
        stages = _snapshots(pick.stages)
    token_text = tok.token_text(pick.token_id)
    return TokenEvent(
        index=index,
        token_id=pick.token_id,
        text=text,
        token_text=token_text,
        logprob=pick.logprob,
        sampler_logprob=pick.sampler_logprob,
        rank=pick.rank,
        entropy=pick.entropy,
        top_model=pick.top_model,
        top_sampler=pick.top_sampler,
        stages=stages,
        forced=pick.forced,
        special=special,
        token_bytes=partial_token_bytes(tok, pick.token_id, token_text),
        rewind=rewind,
    )


def _snapshots(stats: Sequence[StageStats]) -> tuple[StageSnapshot, ...]:
    return tuple(StageSnapshot(s.name, s.survivors, s.mass_kept, s.entropy, s.top, removed=s.removed) for s in stats)
