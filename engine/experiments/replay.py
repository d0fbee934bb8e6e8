"""Replay a generation with its seed, optionally with one setting changed, and diff the tokens;
say whether the replay repeated the original (`replay_verdict`) and what differs in their fingerprints.

The same seed, settings and prompt give the same tokens (the chain's draws
depend only on the step). With one setting changed, the two runs take the
same uniform number at every step, so up to their first divergence a step's
token changes only where the change altered the survivors at that step.
Tokens are compared position by position: position i of both runs used the
same draw. After the first divergence the runs continue different texts, so
later equal positions are coincidences, not "unchanged" steps; the
`opcodes` (difflib) give the usual insert/delete view for reading.
"""

from __future__ import annotations

import difflib
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from engine.events import TokenEvent
from engine.experiments.compare import first_divergence
from engine.fingerprints.record import Fingerprint
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings

Opcode = tuple[str, int, int, int, int]  # difflib: (tag, a_start, a_end, b_start, b_end)


@dataclass(frozen=True)
class TokenDiff:
    a: tuple[int, ...]
    b: tuple[int, ...]
    first_divergence: int | None  # None: identical
    changed: tuple[int, ...]  # positions whose tokens differ (or exist in one run only)
    opcodes: tuple[Opcode, ...]

    @property
    def identical(self) -> bool:
        return self.first_divergence is None


def token_diff(a: Sequence[int], b: Sequence[int]) -> TokenDiff:
    a, b = tuple(int(t) for t in a), tuple(int(t) for t in b)
    changed = tuple(i for i in range(max(len(a), len(b))) if i >= len(a) or i >= len(b) or a[i] != b[i])
    ops = tuple(difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes())
    return TokenDiff(a, b, first_divergence([a, b]), changed, ops)


def replay_settings(settings: SamplerSettings, seed: int, **changes: Any) -> SamplerSettings:
    """`settings` with the run's seed and any changed fields (validated)."""
    return settings.with_(seed=seed, **changes)


def changed_fields(a: SamplerSettings, b: SamplerSettings) -> dict[str, tuple[Any, Any]]:
    """{field: (a's value, b's value)} for every field that differs."""
    return {f.name: (getattr(a, f.name), getattr(b, f.name)) for f in fields(SamplerSettings)
            if getattr(a, f.name) != getattr(b, f.name)}


# ---------------------------------------------------------------------------------- would it repeat? (the verdict)

IDENTICAL, WITHIN, DIVERGED = "identical", "within", "diverged"


@dataclass(frozen=True)
class ReplayVerdict:
    """How a replay compares with its original, token by token and log-prob by log-prob.

    `kind`: "identical" (same tokens, every log-prob equal bit for bit), "within" (same tokens, log-probs
    differ by at most `max_logprob_diff`), "diverged" (a token differs first at `diverged_at`; up to
    there the log-probs differed by at most `max_logprob_diff`). `fingerprint_changes` says which recorded
    facts differ between the two runs ("n_threads 2 -> 4"); None when either run has no fingerprint.
    """

    kind: str
    tokens: int  # positions compared (the longer run's length)
    max_logprob_diff: float
    diverged_at: int | None = None
    original_token: str | None = None  # at `diverged_at`; None: the original had ended there
    replay_token: str | None = None
    fingerprint_changes: tuple[str, ...] | None = None
    unrecorded: str = ""  # what the records lack that could explain a difference ("the original's prompt cache ...")

    @property
    def identical(self) -> bool:
        return self.kind == IDENTICAL

    def headline(self) -> str:
        """'identical', 'same tokens, log-probs within 3.1e-06 nats', "diverged at token 8 (' the' vs ' a')".

        Tokens are counted from 1, as the window numbers them (`diverged_at` is the 0-based index)."""
        if self.kind == IDENTICAL:
            return "identical"
        if self.kind == WITHIN:
            return f"same tokens, log-probs within {self.max_logprob_diff:.3g} nats"
        def shown(t: str | None) -> str:
            return "(ended)" if t is None else repr(t)
        assert self.diverged_at is not None
        return f"diverged at token {self.diverged_at + 1} ({shown(self.original_token)} vs {shown(self.replay_token)})"

    def fingerprint_text(self) -> str:
        """Which recorded facts differ, in words; for a replay that did not repeat with none differing, that the
        cause is not among them (an older record without its prompt cache's pieces, say)."""
        if self.fingerprint_changes is None:
            return "fingerprint: not recorded for both runs"
        if not self.fingerprint_changes:
            if self.kind == IDENTICAL:
                return "fingerprint: no recorded difference"
            return ("fingerprint: no recorded difference, so the cause is something the record does not hold "
                    + (self.unrecorded or "(please report it)"))
        return "fingerprint differs: " + "; ".join(self.fingerprint_changes)

    def describe(self) -> str:
        return f"{self.headline()}; {self.fingerprint_text()}"


def logprob_gap(a: float, b: float) -> float:
    """|a - b|, with two equal values (two -inf) 0 and one infinite against a finite one inf."""
    if a == b:
        return 0.0
    return abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.inf


def replay_verdict(
    original: Sequence[TokenEvent],
    replay: Sequence[TokenEvent],
    original_fingerprint: Fingerprint | None = None,
    replay_fingerprint: Fingerprint | None = None,
) -> ReplayVerdict:
    """Compare a replay's tokens and log-probs with the original's (events in order, index 0 first).

    Log-probs are compared bit for bit (`==`): a replay that is "identical" computed the very same floats.
    Past a divergence the runs continue different texts, so only the positions before it are measured.
    """
    changes = (tuple(original_fingerprint.changes(replay_fingerprint))
               if original_fingerprint is not None and replay_fingerprint is not None else None)
    unrecorded = _unrecorded(original_fingerprint, replay_fingerprint)
    worst = 0.0
    n = max(len(original), len(replay))
    for i in range(n):
        a = original[i] if i < len(original) else None
        b = replay[i] if i < len(replay) else None
        if a is None or b is None or a.token_id != b.token_id:
            return ReplayVerdict(DIVERGED, n, worst, i, a.token_text if a else None, b.token_text if b else None,
                                 changes, unrecorded)
        worst = max(worst, logprob_gap(a.logprob, b.logprob))
    return ReplayVerdict(IDENTICAL if worst == 0.0 and _bitwise_equal(original, replay) else WITHIN, n, worst,
                         fingerprint_changes=changes, unrecorded=unrecorded)


def _unrecorded(original: Fingerprint | None, replay: Fingerprint | None) -> str:
    """What a difference could come from that the two records cannot compare."""
    if original is None or replay is None:
        return ""
    if not original.prompt_sha256 or not replay.prompt_sha256:
        return ("(the original's record is older than prompt hashes: its prompt, rebuilt from the conversation, "
                "may differ from what the model read)")
    if not original.cache_schedule or not replay.cache_schedule:
        return ("(the original's record does not say in which pieces its prompt's cache was computed; on a "
                "backend whose numbers depend on the batch, a prompt whose start came from an earlier turn's "
                "cache gives other log-probs)")
    return ""


def _bitwise_equal(a: Sequence[TokenEvent], b: Sequence[TokenEvent]) -> bool:
    """Every log-prob the same float (0.0 and -0.0 apart, as `struct` sees them)."""
    return all(struct.pack("<d", x.logprob) == struct.pack("<d", y.logprob) for x, y in zip(a, b))


def fingerprint_of(stats: Any) -> Fingerprint | None:
    """The fingerprint of a run's stats: a GenerationStats, or a stored / traced stats mapping (None: none, or
    unreadable; an old record has none)."""
    fp = getattr(stats, "fingerprint", None) if not isinstance(stats, dict) else stats.get("fingerprint")
    if fp is None or isinstance(fp, Fingerprint):
        return fp
    try:
        return Fingerprint.from_dict(fp)
    except ValueError:
        return None


def as_recorded(request: GenerationRequest, fingerprint: Fingerprint | None) -> GenerationRequest:
    """`request` with its prompt's cache computed in the pieces `fingerprint` recorded (an exact replay; the
    request as it is when none were recorded, or they do not describe this prompt: `prefill` checks)."""
    from dataclasses import replace

    from engine.cache_schedule import from_record

    if fingerprint is None or not fingerprint.cache_schedule:
        return request
    return replace(request, cache_schedule=from_record(fingerprint.cache_schedule))


def request_for_run(run: Any, *, where: str = "the run") -> GenerationRequest:
    """The request that makes a traced generation run again: its prompt ids, settings with its seed, its length
    limit (the header's `max_new_tokens`, else as many tokens as it has) and stop strings; ValueError in words."""
    h = run.header
    ids = h.get("prompt_ids")
    if not isinstance(ids, list) or not ids:
        raise ValueError(f"{where} has no prompt ids to replay (a trace exported with no model loaded has none)")
    bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, int) or t < 0), None)
    if bad is not None:
        raise ValueError(f"{where}'s prompt ids hold {bad!r}; token ids are whole numbers, 0 or more")
    settings = h.get("settings")
    if not isinstance(settings, dict):
        raise ValueError(f"{where} records no sampler settings, so it cannot be replayed")
    seed = h.get("seed", (run.end or {}).get("seed"))
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"{where} records no seed, so it cannot be replayed")
    try:
        sampler = SamplerSettings.from_dict({**settings, "seed": seed})
    except ValueError as e:
        raise ValueError(f"{where}'s settings cannot be replayed: {e}") from None
    limit = h.get("max_new_tokens")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        limit = max(1, len(run.tokens))
    stop = h.get("stop") if isinstance(h.get("stop"), list) else []
    top_n = max((len(t.get("top_model") or []) for t in run.tokens), default=20)
    fingerprint = fingerprint_of(run.end or {})
    constraint = _recorded_constraint(h.get("constraint") or (fingerprint.extras.get("constraint")
                                                                if fingerprint is not None else None), where)
    request = GenerationRequest(prompt_ids=tuple(ids), sampler=sampler, max_new_tokens=limit,
                                stop=tuple(s for s in stop if isinstance(s, str) and s), top_n=min(top_n, 1000),
                                ignore_eos=h.get("ignore_eos") is True, constraint=constraint)
    return as_recorded(request, fingerprint)


def _recorded_constraint(doc: Any, where: str) -> Any:
    """The structured-output constraint a run was held to (its JSON schema, grammar...), from its record."""
    from engine.constraints import Constraint

    if not doc:
        return None
    try:
        return Constraint.from_dict(doc)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}'s constraint cannot be read ({e}), so it cannot be replayed as it ran") from None
