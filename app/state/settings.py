"""What the next generation will use (sampler + length + stop strings), presets, and view options.

All values are validated before they are accepted: a `ValueError` leaves the
state unchanged, so the panel can never hold settings the engine would
refuse. Everything here is remembered across restarts through the store.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from engine import DEFAULT_SAMPLER, Constraint, SamplerSettings, steering

from app.state.observable import Signal
from app.state.database.store import Store
from app.state.steering_state import SteeringState

log = logging.getLogger(__name__)

MAX_NEW_TOKENS_LIMIT = 32768
MAX_STOP_STRINGS = 16

BUILTIN_PRESETS: dict[str, SamplerSettings] = {
    # Always the most likely token: deterministic, good for checking what the model "thinks".
    "Greedy": SamplerSettings(temperature=0.0),
    # The default: llama.cpp's own sampling (engine.DEFAULT_SAMPLER, which the CLI uses too).
    "Balanced": DEFAULT_SAMPLER,
    # Hotter, with min-p keeping junk out and XTC sometimes skipping the obvious choice.
    "Creative": SamplerSettings(
        temperature=1.2, min_p=0.05, repetition_penalty=1.05, xtc_probability=0.5, xtc_threshold=0.1
    ),
    # llama.cpp server's own defaults (common/common.h `common_params_sampling`), in its stage order.
    "llama.cpp defaults": SamplerSettings(
        temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, typical_p=1.0, repetition_penalty=1.0,
        penalty_last_n=64, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=64, xtc_threshold=0.1,
        mirostat_tau=5.0, mirostat_eta=0.1, adaptive_decay=0.9
    ),
    # The common 2025 creative-writing setup: DRY stops looping phrases, XTC skips the most obvious words,
    # min-p keeps the tail out; temperature 1 (the model's own distribution) last.
    "DRY + XTC creative": SamplerSettings(
        temperature=1.0, min_p=0.05, dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2,
        xtc_probability=0.5, xtc_threshold=0.1
    ),
    # Mirostat 2 as llama.cpp runs it (--mirostat 2): temperature, then mirostat aiming at 5 bits of surprise.
    "Mirostat 2": SamplerSettings(temperature=0.8, mirostat=2, mirostat_tau=5.0, mirostat_eta=0.1),
}
DEFAULT_PRESET = "Balanced"
# Balanced before it followed llama.cpp (a repetition penalty of 1.1 pulled the user's own words down): saved
# settings still equal to it were never chosen apart from the default, and become today's default.
_OLD_BALANCED = SamplerSettings(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, repetition_penalty=1.1)
# What each built-in preset does, in a line (the preset list's tooltips).
PRESET_DESCRIPTIONS: dict[str, str] = {
    "Greedy": "Always the most likely token (temperature 0): the same answer every time.",
    "Balanced": "The default, as llama.cpp samples: top-k 40, top-p 0.95, min-p 0.05, then temperature 0.8; "
                "no repetition penalty, so what you see is the model's own distribution, trimmed.",
    "Creative": "Hotter (temperature 1.2) with min-p 0.05 keeping junk out, a light repetition penalty, and XTC "
                "sometimes skipping the most obvious token.",
    "llama.cpp defaults": "Every setting exactly as llama.cpp's common_params_sampling has it (as Balanced, and "
                          "DRY's scan window of 64 tokens should DRY be turned on).",
    "DRY + XTC creative": "DRY stops looping phrases, XTC skips the most obvious words, min-p keeps the tail out; "
                          "temperature 1 (the model's own distribution).",
    "Mirostat 2": "Mirostat 2 as llama.cpp runs it: temperature 0.8, then a cut that aims at 5 bits of surprise per token.",
}


@dataclass(frozen=True)
class Preset:
    """A named set of sampler settings, and, when the user asked, the answer length and stop strings.

    Stored as the sampler's dict (presets saved before length and stop could be
    kept) or as {"sampler", "max_new_tokens", "stop"}.
    """

    sampler: SamplerSettings
    max_new_tokens: int | None = None  # None: applying the preset keeps the current length
    stop: tuple[str, ...] | None = None  # None: applying it keeps the current stop strings

    def to_dict(self) -> dict[str, Any]:
        if self.max_new_tokens is None and self.stop is None:
            return self.sampler.to_dict()
        return {"sampler": self.sampler.to_dict(), "max_new_tokens": self.max_new_tokens,
                "stop": None if self.stop is None else list(self.stop)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Preset":
        if "sampler" not in d:
            return cls(SamplerSettings.from_dict(d))
        stop = d.get("stop")
        return cls(SamplerSettings.from_dict(d["sampler"]), d.get("max_new_tokens"), None if stop is None else tuple(stop))

    def applied_to(self, options: "GenerationOptions") -> "GenerationOptions":
        """`options` with this preset's settings (validated: a bad stored value raises ValueError)."""
        return replace(
            options,
            sampler=self.sampler,
            max_new_tokens=options.max_new_tokens if self.max_new_tokens is None else self.max_new_tokens,
            stop=options.stop if self.stop is None else self.stop,
        )

    def matches(self, options: "GenerationOptions") -> bool:
        return self.sampler == options.sampler and self.applied_to(options) == options


@dataclass(frozen=True)
class GenerationOptions:
    """Sampler settings plus the per-request limits the panel edits."""

    sampler: SamplerSettings = field(default_factory=lambda: BUILTIN_PRESETS[DEFAULT_PRESET])
    max_new_tokens: int = 512
    stop: tuple[str, ...] = ()
    # Remote models only: the server samples (fast, streaming; no per-stage view, no branching) instead of
    # our sampler on its top-N log-probs. Local models ignore it.
    server_sampling: bool = False
    # Structured output: the answer must match this (JSON schema, regex, grammar); None = off.
    constraint: Constraint | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))
        n = self.max_new_tokens
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_NEW_TOKENS_LIMIT:
            raise ValueError(f"max new tokens must be an integer in [1, {MAX_NEW_TOKENS_LIMIT}], got {n!r}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop strings must be non-empty text")
        if not isinstance(self.server_sampling, bool):
            raise ValueError(f"server sampling must be on or off, got {self.server_sampling!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.to_dict(), "max_new_tokens": self.max_new_tokens, "stop": list(self.stop),
                "server_sampling": self.server_sampling,
                "constraint": self.constraint.to_dict() if self.constraint is not None else None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GenerationOptions":
        return cls(
            sampler=SamplerSettings.from_dict(d["sampler"]),
            max_new_tokens=int(d["max_new_tokens"]),
            stop=tuple(d.get("stop", ())),
            server_sampling=bool(d.get("server_sampling", False)),  # absent in settings saved before remote models
            constraint=Constraint.from_dict(d["constraint"]) if d.get("constraint") else None,
        )


class SettingsState:
    """The options for the next generation, and the presets; persisted on every change."""

    KEY = "generation_options"
    PRESET_KEY = "preset_name"  # the preset last chosen or saved: shown when several have the same values

    def __init__(self, store: Store):
        self._store = store
        self.changed = Signal()  # (GenerationOptions)
        self.presets_changed = Signal()  # ()
        # Why nothing may be sent now (the Structured output text is invalid or still being checked), or None.
        # Not saved: it describes the editor's text, and a start shows the saved constraint, which is valid.
        self.constraint_problem: str | None = None
        self.constraint_problem_changed = Signal()  # (str | None)
        chosen = store.get_setting(self.PRESET_KEY)
        self._chosen_preset: str | None = chosen if isinstance(chosen, str) else None
        saved = store.get_setting(self.KEY)
        try:
            self.options = GenerationOptions.from_dict(saved) if saved else GenerationOptions()
            if self.options.sampler == _OLD_BALANCED and self._chosen_preset in (None, DEFAULT_PRESET):
                self.options = replace(self.options, sampler=BUILTIN_PRESETS[DEFAULT_PRESET])
        except (ValueError, KeyError, TypeError) as e:
            # Settings written by another version (a renamed field, a tightened range): start fresh.
            log.warning("ignoring saved generation options: %s", e)
            self.options = GenerationOptions()

    def _set(self, options: GenerationOptions) -> None:
        if options == self.options:
            return
        self.options = options
        self._store.put_setting(self.KEY, options.to_dict())
        self.changed.emit(options)

    def update_sampler(self, **changes: Any) -> SamplerSettings:
        """Change sampler fields; raises ValueError (and changes nothing) when the result is invalid."""
        sampler = self.options.sampler.with_(**changes)
        self._set(replace(self.options, sampler=sampler))
        return sampler

    def set_sampler(self, sampler: SamplerSettings) -> None:
        self._set(replace(self.options, sampler=sampler))

    def set_options(self, options: GenerationOptions) -> None:
        """Replace every option at once (an imported setup); `options` is already validated."""
        self._set(options)

    def set_constraint_problem(self, problem: str | None) -> None:
        """Say why answers may not be sent now (None: they may): the window's Send and the controller ask."""
        if problem != self.constraint_problem:
            self.constraint_problem = problem
            self.constraint_problem_changed.emit(problem)

    def set_max_new_tokens(self, n: int) -> None:
        self._set(replace(self.options, max_new_tokens=n))

    def set_stop(self, stop: list[str] | tuple[str, ...]) -> None:
        self._set(replace(self.options, stop=tuple(stop)))

    def set_server_sampling(self, on: bool) -> None:
        self._set(replace(self.options, server_sampling=bool(on)))

    def reset(self) -> None:
        # Who samples is a choice about the server, not a sampler setting: Reset keeps it.
        self._choose(DEFAULT_PRESET)
        self._set(GenerationOptions(server_sampling=self.options.server_sampling))

    # -- presets ---------------------------------------------------------------------------

    def preset_names(self) -> list[str]:
        return list(BUILTIN_PRESETS) + [n for n in self._store.presets() if n not in BUILTIN_PRESETS]

    @staticmethod
    def is_builtin(name: str) -> bool:
        return name in BUILTIN_PRESETS

    def preset(self, name: str) -> SamplerSettings:
        """The sampler settings of preset `name` (KeyError when there is none)."""
        return self.preset_entry(name).sampler

    def preset_entry(self, name: str) -> Preset:
        """Preset `name` with what it stores besides the sampler (KeyError when there is none)."""
        if name in BUILTIN_PRESETS:
            return Preset(BUILTIN_PRESETS[name])
        saved = self._store.presets()
        if name not in saved:
            raise KeyError(f"no preset named {name!r}")
        return Preset.from_dict(saved[name])

    def apply_preset(self, name: str) -> None:
        options = self.preset_entry(name).applied_to(self.options)
        self._choose(name)
        self._set(options)

    def matching_preset(self) -> str | None:
        """The preset whose settings equal the current ones, if any.

        Several can (a preset saved with a built-in's values): the one last chosen or saved wins,
        then the user's own, then the built-ins.
        """
        names = self.preset_names()
        own = [n for n in names if n not in BUILTIN_PRESETS]
        order = ([self._chosen_preset] if self._chosen_preset in names else []) + own + list(BUILTIN_PRESETS)
        for name in order:
            try:
                if self.preset_entry(name).matches(self.options):
                    return name
            except (KeyError, ValueError, TypeError):
                continue
        return None

    def save_preset(self, name: str, include_length_and_stop: bool = False) -> None:
        """Save the current sampler settings as `name`; with `include_length_and_stop`, the length and stop strings too."""
        name = name.strip()
        if not name:
            raise ValueError("a preset needs a name")
        if name in BUILTIN_PRESETS:
            raise ValueError(f"{name!r} is a built-in preset; choose another name")
        o = self.options
        preset = Preset(o.sampler, o.max_new_tokens, o.stop) if include_length_and_stop else Preset(o.sampler)
        self._store.save_preset(name, preset.to_dict())
        self._choose(name)
        self.presets_changed.emit()

    def _choose(self, name: str) -> None:
        if name != self._chosen_preset:
            self._chosen_preset = name
            self._store.put_setting(self.PRESET_KEY, name)

    def delete_preset(self, name: str) -> None:
        if name in BUILTIN_PRESETS:
            raise ValueError(f"{name!r} is built in and cannot be deleted")
        self._store.delete_preset(name)
        self.presets_changed.emit()


HEAT_MODES = ("probability", "surprisal", "entropy", "steering")  # steering: KL per token vs. the unsteered model


class ViewOptions:
    """How assistant text is shown: Markdown, or tokens coloured by a metric."""

    KEY = "view_options"

    def __init__(self, store: Store):
        self._store = store
        self.changed = Signal()  # ()
        saved = store.get_setting(self.KEY) or {}
        self.heatmap: bool = bool(saved.get("heatmap", False))
        mode = saved.get("mode", "probability")
        self.mode: str = mode if mode in HEAT_MODES else "probability"

    def set_heatmap(self, on: bool) -> None:
        if on != self.heatmap:
            self.heatmap = on
            self._save()

    def set_mode(self, mode: str) -> None:
        if mode not in HEAT_MODES:
            raise ValueError(f"unknown colouring {mode!r}; choose one of {', '.join(HEAT_MODES)}")
        if mode != self.mode:
            self.mode = mode
            self._save()

    def _save(self) -> None:
        self._store.put_setting(self.KEY, {"heatmap": self.heatmap, "mode": self.mode})
        self.changed.emit()


class Selection:
    """The token the inspector shows: (message id, token index), or nothing."""

    def __init__(self) -> None:
        self.message_id: int | None = None
        self.index: int | None = None
        self.changed = Signal()  # (message_id | None, index | None)

    def set(self, message_id: int | None, index: int | None) -> None:
        if (message_id, index) != (self.message_id, self.index):
            self.message_id, self.index = message_id, index
            self.changed.emit(message_id, index)

    def clear(self) -> None:
        self.set(None, None)


class SteeringMemory:
    """The Steering panel's strengths (by vector content hash) and layer range, kept across restarts.

    `SteeringState` starts every vector at 0; the window restores what the user last set, for the vectors
    still listed (kept in the steering folder), and writes each change. The panel shows the restored
    strengths, so a restart steers only as the user last chose, in plain view. A saved value the state
    refuses (out of range, written by another version) is skipped with a warning."""

    KEY = "steering"

    def __init__(self, store: Store, state: SteeringState):
        self._store, self._state = store, state
        saved = store.get_setting(self.KEY)
        self._saved: dict[str, Any] = saved if isinstance(saved, dict) else {}
        self._restore()
        state.changed.connect(self._save)

    def _restore(self) -> None:
        state, saved = self._state, self._saved
        strengths = saved.get("strengths")
        if isinstance(strengths, dict):
            for vector in state.vectors:
                if vector.digest in strengths:
                    try:
                        state.set_strength(vector, strengths[vector.digest])
                    except (ValueError, steering.SteeringError) as e:
                        log.warning("ignoring the saved strength of steering vector %r: %s", vector.name, e)
        layers = saved.get("layers")
        if isinstance(layers, list) and len(layers) == 2 and all(v is None or type(v) is int for v in layers):
            try:
                state.set_layers(layers[0], layers[1])
            except (ValueError, steering.SteeringError) as e:
                log.warning("ignoring the saved steering layer range: %s", e)

    def _save(self) -> None:
        state = self._state
        # Vectors no longer listed keep their saved strength: one removed and loaded again comes back as it was.
        old = self._saved.get("strengths")
        strengths = {**(old if isinstance(old, dict) else {}), **{v.digest: state.strength(v) for v in state.vectors}}
        data = {"strengths": strengths, "layers": [state.layer_start, state.layer_end]}
        if data != self._saved:
            self._saved = data
            self._store.put_setting(self.KEY, data)
