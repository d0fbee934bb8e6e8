"""What the structured-output constraint says about a token: allowed or not, forced, and how much it removed.

Read from the token's record (`TokenEvent.constraint` and the `grammar` stage's
snapshot); the inspector greys what the constraint did not allow and never
offers branching with it, and the token view marks forced steps.
"""

from __future__ import annotations

from PySide6.QtCore import Qt

from engine import TokenEvent

DISALLOWED_ROLE = Qt.ItemDataRole.UserRole + 7  # a row's reason it may not be chosen here (str), else None
GRAMMAR_STAGE = "grammar"


def disallowed_reason(ev: TokenEvent, token_id: int) -> str | None:
    """Why the constraint did not allow `token_id` at this step, or None when it did (or is not known to have not)."""
    c = ev.constraint
    if c is None or token_id == ev.token_id:
        return None
    if any(p.token_id == token_id for p in c.disallowed):
        return f"not allowed by the structured-output constraint here; it kept {c.mass_kept:.1%} of the model's probability"
    if c.forced:
        return "not allowed: the constraint left one token here (forced)"
    stage = next((s for s in ev.stages or () if s.stage == GRAMMAR_STAGE), None)
    if stage is not None and stage.survivors <= len(stage.top) and all(t.token_id != token_id for t in stage.top):
        return "not allowed by the structured-output constraint here"
    return None


def forced_badge(ev: TokenEvent) -> str:
    """A few words for a token the constraint forced ("" otherwise)."""
    c = ev.constraint
    if c is None or not c.forced:
        return ""
    return "forced by the grammar" if "fast-forward" in c.note else "the only token the grammar allows"


def constraint_summary(ev: TokenEvent) -> str:
    """One line for the inspector: what the constraint did at this step ("" without one)."""
    c = ev.constraint
    if c is None:
        return ""
    removed = ", ".join(f"{p.text!r} {p.prob:.1%}" for p in c.disallowed[:3])
    text = f"constraint: {c.allowed} allowed, kept {c.mass_kept:.1%} of the probability"
    text += f"; removed {removed}" if removed else ""
    text += f" · {forced_badge(ev)}" if c.forced else ""
    return text + (f" ({c.note})" if c.note and not c.forced else "")
