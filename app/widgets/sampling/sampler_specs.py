"""Where each sampler control stands in the panel; what it says (label, range, tip) is the stage registry's.

The engine's stage registry (`engine.SAMPLER_CONTROLS`, from engine/sampling/registry.py) gives every stage
setting's label, range, step and tooltip; this module only places them: the panel's own groups (temperature
and the filters, the penalties, XTC) and the folding sections of `SamplerGroups`. A number control the layout
does not place (a stage added to the registry since) goes to `UNPLACED`, which the folding sections show under
"Other samplers", so a new stage has its controls without an edit here.
"""

from __future__ import annotations

from engine import SAMPLER_CONTROLS

from app.widgets.sampling.param_row import ParamSpec


def spec(field: str) -> ParamSpec:
    """The panel's `ParamSpec` for a number setting, from its registry control."""
    c = SAMPLER_CONTROLS[field]
    return ParamSpec(c.field, c.label, c.tip, c.minimum, c.maximum, c.step, c.decimals, c.slider_max, c.special)


def specs(*fields: str) -> tuple[ParamSpec, ...]:
    return tuple(spec(f) for f in fields)


FILTERS = specs("temperature", "top_k", "top_p", "min_p", "typical_p")
PENALTIES = specs("repetition_penalty", "presence_penalty", "frequency_penalty", "penalty_last_n")
XTC = specs("xtc_probability", "xtc_threshold")
# The folding sections of SamplerGroups (app/widgets/sampling/sampler_groups.py), in the panel's order.
SECTIONS: tuple[tuple[str, tuple[ParamSpec, ...]], ...] = (
    ("Dynamic temp · top-nσ", specs("dynatemp_range", "dynatemp_exponent", "top_n_sigma")),
    ("DRY (repetition of phrases)", specs("dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n")),
    ("Mirostat", specs("mirostat", "mirostat_tau", "mirostat_eta")),
    ("Adaptive-p", specs("adaptive_target", "adaptive_decay")),
    ("Smoothing (quadratic)", specs("smoothing_factor", "smoothing_curve")),
)
# Text boxes, one entry a line: the sections they stand in (their labels and tips: the registry's, or below).
TEXT_SECTIONS = (("DRY (repetition of phrases)", ("dry_sequence_breakers",)),
                 ("Logit bias · banned strings", ("logit_bias", "banned_strings")))
BANNED_STRINGS_TEXT = ("Banned strings", "Phrases the answer must not contain, one per line: when one appears, the "
                       "answer steps back to where it began and takes another token there")  # not a stage: no row
OTHER_SECTION = "Other samplers"
_PLACED = {s.name for group in (FILTERS, PENALTIES, XTC, *(specs for _, specs in SECTIONS)) for s in group}
UNPLACED: tuple[ParamSpec, ...] = tuple(
    spec(f) for f, c in SAMPLER_CONTROLS.items() if not c.lines and f not in _PLACED
)
