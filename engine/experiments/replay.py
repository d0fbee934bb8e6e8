"""Replay a generation with its seed, optionally with one setting changed, and diff the tokens.

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
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from engine.experiments.compare import first_divergence
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
