"""Whether tokens recorded with one model are being continued on another, in words.

An answer's tokens are ids in its model's vocabulary. Continued on another
model (a loom tree imported from elsewhere, an old chat after switching
models), the same ids can stand for other tokens, or none: the run goes on,
but the user is told, because what follows is no longer that model's answer.
"""

from __future__ import annotations

from typing import Any


def _name(model: dict[str, Any]) -> str:
    for key in ("name", "spec"):
        value = model.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return "an unnamed model"


def same_model(recorded: dict[str, Any], loaded: dict[str, Any]) -> bool:
    """The same weights as far as the records tell: the same spec, or the same name and architecture."""
    spec_a, spec_b = recorded.get("spec"), loaded.get("spec")
    if spec_a and spec_b and spec_a == spec_b:
        return True
    name_a, name_b = recorded.get("name"), loaded.get("name")
    if not name_a or not name_b or name_a != name_b:
        return False
    arch_a, arch_b = recorded.get("architecture"), loaded.get("architecture")
    return not (arch_a and arch_b and arch_a != arch_b)


def other_model_notice(recorded: dict[str, Any] | None, loaded: dict[str, Any]) -> str | None:
    """A sentence for continuing tokens recorded with `recorded` on `loaded` (model records), or None when it
    is the same model or the tokens' model is not known."""
    if not isinstance(recorded, dict) or not recorded or same_model(recorded, loaded):
        return None
    return (f"these tokens were written by {_name(recorded)}; they are continued on {_name(loaded)}, "
            "whose token ids may stand for other tokens")


class OtherModelsAnswer(ValueError):
    """A view that reads an answer through its model (layers, attention, what steering did) was asked for with
    another model loaded: its token ids mean other tokens there, or none. Refused before anything runs."""


def made_by_other_model(recorded: dict[str, Any] | None, loaded: dict[str, Any]) -> bool:
    """Whether an answer recorded with `recorded` was made by another model than `loaded` (model records): not the
    same model by `same_model`, or the same name at another hub revision. An answer with no record: unknown, False."""
    if not isinstance(recorded, dict) or not recorded:
        return False
    rev_a, rev_b = recorded.get("revision"), loaded.get("revision")
    return not same_model(recorded, loaded) or bool(rev_a and rev_b and rev_a != rev_b)


def check_answer_model(recorded: dict[str, Any] | None, loaded: dict[str, Any], what: str) -> None:
    """Raise `OtherModelsAnswer` in words ("this answer was made by X; open X to see its layers") when the answer
    recorded with `recorded` is another model's than `loaded`; `what` names what the view shows ("its layers")."""
    if made_by_other_model(recorded, loaded):
        assert recorded is not None
        made = _name(recorded)
        raise OtherModelsAnswer(f"This answer was made by {made}, and {_name(loaded)} is loaded: its token ids "
                                f"would be read as {_name(loaded)}'s tokens. Open {made} to see {what}.")
