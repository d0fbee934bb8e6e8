"""What the answer must look like: a constraint spec, checked when it is made.

A `Constraint` is a frozen value (kind + text), like `SamplerSettings`: it can
be stored, compared and sent to a server. Making one compiles it with
llguidance (the grammar engine behind llama.cpp's, vLLM's and SGLang's
structured output) and validates the result, so a schema, regex or grammar
that cannot work is one `ConstraintError` naming where it fails, before any
model runs. The compiled grammar is kept on the value (`grammar`); a run
builds its own matcher from it (`engine.constraints.matcher`).

Kinds:

- ``json_schema``: a JSON Schema (text or a dict); the answer is JSON valid against it.
- ``json``: any JSON value (the text is ignored).
- ``regex``: the whole answer matches the regular expression (Rust `regex` syntax).
- ``lark``: a Lark grammar in llguidance's dialect (``start:`` is the top rule).
- ``gbnf``: a llama.cpp GBNF grammar (``root ::= ...``), converted to Lark by llguidance.
- ``choice``: one of a list of texts (a JSON list, or `Constraint.choice([...])`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from engine.constraints.limits import ConstraintTooBig, check_choice_count, check_size, on_deep_stack
from engine.errors import EngineError

ConstraintKind = Literal["json_schema", "json", "regex", "lark", "gbnf", "choice"]
KINDS: tuple[str, ...] = ("json_schema", "json", "regex", "lark", "gbnf", "choice")
# Words for people, per kind (CLI help, the window's selector, error messages).
KIND_LABELS = {
    "json_schema": "JSON schema",
    "json": "any JSON",
    "regex": "regular expression",
    "lark": "Lark grammar",
    "gbnf": "GBNF grammar",
    "choice": "choice list",
}


class ConstraintError(EngineError, ValueError):
    """A schema, regex or grammar that cannot constrain an answer; the message says where it fails."""


@dataclass(frozen=True)
class Constraint:
    """A constraint on the whole answer, validated on construction.

    Attributes:
        kind: one of `KINDS`.
        text: the schema / regex / grammar / JSON list of choices, as the user wrote it.
        fast_forward: splice the tokens the grammar forces (llguidance's fast-forward
            tokens) without asking the sampler; off, only a step where a single token is
            allowed is forced. The answer's text is the same either way.
        grammar: the compiled llguidance grammar (set on construction).
    """

    kind: str
    text: str = ""
    fast_forward: bool = True
    grammar: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConstraintError(f"unknown constraint kind {self.kind!r}; known: {', '.join(KINDS)}")
        if not isinstance(self.text, str):
            raise ConstraintError(f"the {KIND_LABELS[self.kind]} must be text, got {type(self.text).__name__}")
        if not isinstance(self.fast_forward, bool):
            raise ConstraintError(f"fast_forward must be True or False, got {self.fast_forward!r}")
        object.__setattr__(self, "grammar", compile_grammar(self.kind, self.text))

    @property
    def label(self) -> str:
        return KIND_LABELS[self.kind]

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str, **kw: Any) -> "Constraint":
        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema), **kw)

    @classmethod
    def any_json(cls, **kw: Any) -> "Constraint":
        return cls("json", "", **kw)

    @classmethod
    def regex(cls, pattern: str, **kw: Any) -> "Constraint":
        return cls("regex", pattern, **kw)

    @classmethod
    def lark(cls, grammar: str, **kw: Any) -> "Constraint":
        return cls("lark", grammar, **kw)

    @classmethod
    def gbnf(cls, grammar: str, **kw: Any) -> "Constraint":
        return cls("gbnf", grammar, **kw)

    @classmethod
    def choice(cls, options: list[str] | tuple[str, ...], **kw: Any) -> "Constraint":
        return cls("choice", json.dumps(list(options)), **kw)

    def schema(self) -> dict[str, Any] | None:
        """The JSON schema as a dict (kind json_schema), `{}` for any JSON, else None."""
        if self.kind == "json_schema":
            return json.loads(self.text)
        return {} if self.kind == "json" else None

    def choices(self) -> list[str] | None:
        return json.loads(self.text) if self.kind == "choice" else None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "fast_forward": self.fast_forward}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Constraint":
        if not isinstance(d, dict) or "kind" not in d:
            raise ConstraintError(f"a constraint is {{'kind': ..., 'text': ...}}, got {d!r}")
        return cls(d["kind"], d.get("text", ""), fast_forward=d.get("fast_forward", True))


def compile_grammar(kind: str, text: str) -> str:
    """The llguidance grammar for `text` of `kind`, validated; ConstraintError naming where it fails.

    Its size is checked first (`engine.constraints.limits`: past a limit llguidance can crash the
    process), and it is built on a thread with a deep stack.
    """
    label = KIND_LABELS[kind]
    try:
        check_size(kind, text, label)
    except ConstraintTooBig as e:
        raise ConstraintError(str(e)) from None
    if kind == "json_schema":
        _check_json_schema_text(text)
    elif kind == "choice":
        _check_choices(text)
    elif kind in ("regex", "lark", "gbnf") and not text.strip():
        raise ConstraintError(f"the {label} is empty")
    return on_deep_stack(_build, kind, text, label)


def _build(kind: str, text: str, label: str) -> str:
    from llguidance import LLMatcher, grammar_from

    try:
        if kind == "json":
            grammar = grammar_from("json_schema", json.dumps(with_bounded_whitespace({})))
        elif kind == "json_schema":
            grammar = grammar_from("json_schema", json.dumps(with_bounded_whitespace(json.loads(text))))
        elif kind == "choice":
            # One regular expression, not one grammar alternative per option: the lexer takes any number
            # of alternatives, the parser at most 2,000 at one place (past that it fails mid-answer).
            grammar = grammar_from("regex", "|".join(_regex_literal(o) for o in json.loads(text)))
        else:
            grammar = grammar_from(kind, text)  # type: ignore[arg-type]  # `kind` was checked by the caller
    except ValueError as e:  # GBNF that does not convert; says the line and the place
        raise ConstraintError(f"the {label} cannot be read: {_strip(str(e))}") from None
    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        raise ConstraintError(f"the {label} cannot be used: {_tidy(kind, messages[0])}")
    return grammar


# JSON's whitespace as llama.cpp's json-schema-to-grammar allows it (SPACE_RULE: nothing, one space, or one or
# two newlines and at most 20 spaces or tabs). llguidance's default allows any amount, and a small model at
# temperature 0 can then write newlines inside `{` until the token limit (SmolLM2 did, in a tool call's `{}`).
JSON_WHITESPACE = r"( |\n{1,2}[ \t]{0,20})?"


def with_bounded_whitespace(schema: Any) -> Any:
    """`schema` with llguidance told to bound JSON's whitespace (`JSON_WHITESPACE`), unless it says otherwise
    itself in its `x-guidance` options; a schema that is not an object (`true`) is returned as it is."""
    if not isinstance(schema, dict) or "x-guidance" in schema:
        return schema
    return {**schema, "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}}


_REGEX_SPECIAL = frozenset("\\.+*?()|[]{}^$#&-~")  # what Rust's regex_syntax::escape escapes


def _regex_literal(text: str) -> str:
    """`text` as a Rust regular expression that matches exactly it."""
    return "".join("\\" + c if c in _REGEX_SPECIAL else c for c in text)


def _check_json_schema_text(text: str) -> None:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConstraintError(
            f"the JSON schema is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}"
        ) from None
    if not isinstance(schema, (dict, bool)):
        raise ConstraintError(f"a JSON schema is an object ({{...}}), got {type(schema).__name__}")


def _check_choices(text: str) -> None:
    try:
        options = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConstraintError(f"the choice list is not a JSON list of texts: {e.msg} at column {e.colno}") from None
    if not isinstance(options, list) or not options or not all(isinstance(o, str) and o for o in options):
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise ConstraintError(f'the choice list must be a non-empty list of non-empty texts, e.g. ["yes", "no"]; got {shown!r}')
    try:
        check_choice_count(len(options))
    except ConstraintTooBig as e:
        raise ConstraintError(str(e)) from None


def _strip(message: str) -> str:
    return message.removeprefix("Failed to convert the grammar from GBNF to Lark: ")


def _tidy(kind: str, message: str) -> str:
    """llguidance's message without what refers to its own wrapping (a regex is compiled as `start: /.../`)."""
    message = message.strip()
    if kind == "regex":
        # "at 1(8): invalid regex ... regex parse error:\n <pattern>\n ^^^\nerror: ...\n   1 | start: /.../ ..."
        message = message.split("\n   1 | start:")[0]
        body = message.split("regex parse error:", 1)[-1].strip("\n").splitlines()
        what = next((line.removeprefix("error: ") for line in body if line.startswith("error: ")), "")
        carets = next((line for line in body if line.strip() and set(line.strip()) <= {"^"}), "")
        if what and carets and body:
            column = len(carets) - len(carets.lstrip()) - (len(body[0]) - len(body[0].lstrip())) + 1
            return f"{what} at column {column}"
    return message.replace("\n", " ")
