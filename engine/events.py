"""What leaves the decode thread: small, frozen Python values, never tensors.

A generation yields one `TokenEvent` per token and ends with one `Done`
carrying `GenerationStats`. These are what the CLI prints, what the app
draws and stores, and what tests assert on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Literal

from engine.lazy_tuple import LazyTuple
from engine.tools.calls import ToolCall

if TYPE_CHECKING:
    from engine.fingerprints.record import Fingerprint

# "tool_calls": the answer ended on a completed tool call (engine.tools; the calls are on the stats).
FinishReason = Literal["eos", "stop", "length", "cancelled", "error", "tool_calls"]

# `TokenProb.token_id` of the "rest" entry: every token the source did not report, as one entry. A server
# gives only its top N log-probs per step; the model view lists them as the server gave them and adds this
# entry with the probability left over (1 - their sum), so nothing on screen is renormalised.
REST_TOKEN_ID = -2
REST_TEXT = "(the rest)"


@dataclass(frozen=True, slots=True)
class TokenProb:
    """One candidate token and its log-probability under some distribution."""

    token_id: int
    text: str
    logprob: float
    # The token's raw bytes when they are not whole UTF-8 characters (`text` then shows U+FFFD):
    # a byte-level or byte-fallback piece of an emoji or CJK character. None: `text` is exact.
    token_bytes: bytes | None = None

    @property
    def prob(self) -> float:
        return math.exp(self.logprob)

    @property
    def is_rest(self) -> bool:
        """This entry is the probability of every unreported token together, not one token (no branching)."""
        return self.token_id == REST_TOKEN_ID


def rest_entry(reported_mass: float) -> TokenProb | None:
    """The "rest" entry for alternatives that hold `reported_mass` of the probability; None when they hold it all."""
    left = 1.0 - reported_mass
    return TokenProb(REST_TOKEN_ID, REST_TEXT, math.log(left)) if left > 1e-9 else None


@dataclass(frozen=True, slots=True)
class StageSnapshot:
    """The distribution after one sampler stage (see `engine.sampling.pick.StageStats`)."""

    stage: str
    survivors: int
    mass_kept: float
    entropy: float
    top: tuple[TokenProb, ...]
    note: str = ""  # what the view should say about where this came from, e.g. "top 20 from server"
    removed: tuple[int, ...] = ()  # shown candidates this stage removed (engine.sampling.pick.StageStats)


@dataclass(frozen=True, slots=True)
class ConstraintStep:
    """What the answer's constraint (JSON schema, regex, grammar) did at one step.

    `mass_kept` is the allowed tokens' share of the model's probability (of the
    distribution entering the `grammar` stage); `disallowed` are the most likely
    tokens it removed, with their log-probs under that distribution. `forced`: the
    constraint left a single token (a fast-forward or the only one allowed), so
    nothing was chosen. `note` says how the mask was made when it matters.
    """

    allowed: int
    mass_kept: float
    disallowed: tuple[TokenProb, ...]
    forced: bool
    note: str = ""


@dataclass(frozen=True, slots=True)
class Rewind:
    """The decode loop stepped back because the answer would have contained a banned string.

    Carried by the first `TokenEvent` after the step back, whose `index` is
    where the withdrawn tokens began: the events yielded before it with an
    index >= its own are void (none of their text was released). The token
    the phrase began with is banned at that position from then on.
    """

    phrase: str  # the banned string the withdrawn tokens would have written
    withdrawn: int  # how many tokens were taken back
    banned_token_id: int
    banned_token_text: str

    def describe(self) -> str:
        return f"banned {self.phrase!r} here ({self.withdrawn} tokens taken back, {self.banned_token_text!r} banned)"


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token and how it was chosen.

    `text` is the newly *displayable* text: empty while a multi-byte character
    or a possible stop string is still incomplete, so concatenating `text`
    over a generation gives exactly the final answer. `token_text` is the
    token's own surface form, for token views.

    When the model's distribution is known only in part (a server's top N),
    `top_model` holds the reported log-probs as they are, followed by one
    "rest" entry (`TokenProb.is_rest`) with the unreported probability, and
    `entropy` counts that rest as one outcome: a lower bound of the model's.
    The sampler's views (`top_sampler`, `stages`) are over the reported
    tokens only, renormalised, and their stage notes say so.
    """

    index: int  # 0-based position among generated tokens
    token_id: int
    text: str
    token_text: str
    logprob: float  # under the model
    sampler_logprob: float  # under the sampler's final distribution
    rank: int  # 0 = the model's most likely token
    entropy: float  # of the model distribution, nats
    top_model: tuple[TokenProb, ...]
    top_sampler: tuple[TokenProb, ...]
    # One per sampler stage when recorded: a tuple, or a `LazyTuple` (engine.lazy_tuple) the decode loop
    # hands out, built when first read; either reads as a tuple.
    stages: Sequence[StageSnapshot] | None = None
    forced: bool = False
    special: bool = False  # an end-of-sequence token: shown in token views, not in text
    token_bytes: bytes | None = None  # as in TokenProb: set only for a piece of a multi-byte character
    rewind: Rewind | None = None  # set on the first token after a banned string made the loop step back
    constraint: ConstraintStep | None = None  # what the request's constraint did here (None: no constraint)
    # Where the token stands in a tool call (engine.tools.tracker): "opener", "name", "arguments", the JSON
    # path of its argument ("arguments.city"), "closer"; None outside a call or without tools.
    tool_position: str | None = None

    @property
    def prob(self) -> float:
        return math.exp(self.logprob)

    @property
    def sampler_prob(self) -> float:
        return math.exp(self.sampler_logprob)

    def to_dict(self) -> dict:
        if isinstance(self.stages, LazyTuple):  # asdict copies what is not a tuple, list or dict as it is
            return asdict(replace(self, stages=self.stages.get()))
        return asdict(self)


@dataclass(frozen=True, slots=True)
class GenerationStats:
    """How a generation went. Times in seconds, memory in bytes."""

    finish_reason: FinishReason
    prompt_tokens: int
    reused_tokens: int  # prompt tokens whose KV cache was reused, not recomputed
    generated_tokens: int
    time_to_first_token_s: float
    decode_tokens_per_s: float  # tokens after the first / time after the first
    total_s: float
    peak_memory_bytes: int
    seed: int
    text: str
    token_ids: tuple[int, ...]
    error: str | None = None
    # With a constraint: sum over the steps of log(mass it kept) (0 = it removed nothing the model wanted),
    # and how it ended ("complete", "stopped at the length limit inside the grammar: ...", a dead end).
    constraint_logprob: float | None = None
    constraint_status: str = ""
    # What the numbers depend on (engine/fingerprints/record.py): model hash, backend and versions, threads, seed,
    # settings. Set on the way out of the worker (engine.fingerprints.taking.with_fingerprint); None on old records.
    fingerprint: Fingerprint | None = None
    # What the model continued, as a SHA-256 of its token ids (engine.fingerprints.record.token_ids_sha256), and the forward
    # calls its cache was computed in (engine/cache_schedule.py, run-length form; () where the backend does not say):
    # the answer's fingerprint takes both, so a replay can compute its prompt the same way and say when it did not.
    prompt_sha256: str = ""
    cache_schedule: tuple[tuple[int, int, int], ...] = ()
    # With tools (engine.tools): the calls read from the answer, in order (empty: it answered in text).
    tool_calls: tuple[ToolCall, ...] = ()

    @property
    def prefilled_tokens(self) -> int:
        return self.prompt_tokens - self.reused_tokens

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Done:
    """The last event of every generation."""

    stats: GenerationStats


Event = TokenEvent | Done
