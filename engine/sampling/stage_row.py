"""The shape of a sampler stage's registry row (engine.sampling.registry): `StageRow`, its panel `Control`s,
and what a stage's factory is given (`BuildContext`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from engine.sampling.dry import Vocabulary
from engine.sampling.stages import Stage

if TYPE_CHECKING:
    from engine.sampling.grammar import GrammarStage
    from engine.sampling.settings import SamplerSettings

# The OpenAI-compatible server kinds besides llama.cpp's own server, whose names are its JSON keys
# (`StageRow.llamacpp`). `engine.servers` tells which kind a server is.
SERVER_KINDS: tuple[str, ...] = ("vllm", "sglang", "llama-cpp-python", "lmstudio", "ollama", "openai")
LLAMA_CPP_SERVER = "llama.cpp"


@dataclass(frozen=True)
class Control:
    """The panel's control for one settings field: a number row (slider and spin box) or a list of lines.

    `slider_max`: the slider covers [minimum, slider_max], the spin box goes on to `maximum`; `special` is shown
    instead of the minimum ("off"); `decimals` 0 is an integer box (and an int on the command line). A `lines`
    control is a text box, one entry a line (the range fields are unused). `cli`: the command line's flags for it
    (llama.cpp's name first, then aliases; `logitlab-cli`), with `cli_help`.
    """

    field: str
    label: str
    tip: str
    minimum: float = 0.0
    maximum: float = 0.0
    step: float = 0.0
    decimals: int = 2
    slider_max: float | None = None
    special: str = ""
    lines: bool = False
    cli: tuple[str, ...] = ()
    cli_help: str = ""


@dataclass(frozen=True)
class BuildContext:
    """What a factory may need besides the settings: the model's tokenizer and this run's constraint stage."""

    vocab: Vocabulary | None = None
    constraint: GrammarStage | None = None

    def needs_vocab(self, what: str) -> Vocabulary:
        if self.vocab is None:
            raise ValueError(f"{what} needs the model's tokenizer, and this sampler was built without one")
        return self.vocab


Factory = Callable[["SamplerSettings", BuildContext], "Stage | None"]
# How `server_parameters` treats a stage on a server other than llama.cpp's:
#   "fields": each field in `server` is sent where the server names it, else refused when not at its default;
#   "switch": the first field of `switches` is sent where named (its default when the stage is left out of the
#             order) with the stage's other named fields, else refused when the stage is on;
#   "own":    server_params has a rule of its own (the logit bias's encodings).
ServerRule = Literal["fields", "switch", "own"]


@dataclass(frozen=True)
class StageRow:
    """One sampler stage, everything but its arithmetic (see the module docstring for who reads what).

    Attributes:
        name: the stage's name in `SamplerSettings.order` (and in the recorded stage snapshots).
        fields: the `SamplerSettings` fields it reads.
        build: factory (settings, context) -> stage function, or None when the settings make it a no-op.
        active: whether the settings turn it on (not at its neutral value).
        switches: the fields whose value turns it on (the rest tune it).
        help: one line, shown on the stage in the panel's order list.
        argmax_preserving: never changes which token scores highest (greedy may stop before it).
        on_survivors: looks only at the scores, never at token ids (may run on a filter's survivors alone).
        llamacpp: {field: llama.cpp server JSON key}, every field llama.cpp has.
        llamacpp_sampler: its name in llama.cpp's `samplers` list (None: llama.cpp runs it outside that list,
            or has no such stage).
        llamacpp_outside: llama.cpp has it but runs it outside `samplers` (a grammar, the logit bias, mirostat):
            it stays on when llama.cpp's mirostat replaces the listed samplers.
        llamacpp_char: its letter when `samplers` is a string ("edskypmxt").
        sampler_aliases: more names llama.cpp's `samplers` accepts for it (lower case).
        json_aliases: {key in a pasted setup (SillyTavern, llama.cpp's other spellings): our field}.
        not_llamacpp: fields llama.cpp does not know, exported under our names when the stage is on.
        server: {field: {server kind: parameter name}} for the kinds in SERVER_KINDS; a field with no kinds is
            one no such server takes.
        server_rule: how `server_parameters` checks it ("fields", "switch", "own").
        server_defaults: fields a server without a parameter for them runs at a value of its own (server_params'
            own rule: refused only when they differ from it), so the window calls them the server's own.
        controls: the panel's control for each field.
    """

    name: str
    fields: tuple[str, ...]
    build: Factory
    active: Callable[[SamplerSettings], bool]
    switches: tuple[str, ...] = ()
    help: str = ""
    argmax_preserving: bool = False
    on_survivors: bool = False
    llamacpp: Mapping[str, str] = field(default_factory=dict)
    llamacpp_sampler: str | None = None
    llamacpp_outside: bool = False
    llamacpp_char: str | None = None
    sampler_aliases: tuple[str, ...] = ()
    json_aliases: Mapping[str, str] = field(default_factory=dict)
    not_llamacpp: tuple[str, ...] = ()
    server: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    server_rule: ServerRule = "fields"
    server_defaults: tuple[str, ...] = ()
    controls: tuple[Control, ...] = ()
