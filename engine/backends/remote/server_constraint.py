"""A constraint sent to the server when the server samples: the request fields each server reads.

Servers spell structured output differently:

- OpenAI and everyone copying its chat API (vLLM, SGLang, llama.cpp, LM Studio, Ollama):
  `response_format: {"type": "json_schema", "json_schema": {"name", "schema"}}` for a JSON schema;
- llama.cpp's server: `json_schema` and `grammar` (GBNF) on both endpoints;
- llama-cpp-python: `grammar` (GBNF) on both, and `response_format: {"type": "json_object", "schema"}`
  on chat;
- vLLM: `structured_outputs: {"json" | "regex" | "grammar" | "choice": ...}`;
- SGLang: `json_schema` (as text), `regex`, `ebnf`.

A kind of constraint a server does not read is refused in words (never an unconstrained answer
in silence), pointing at we-sample mode, where our own mask applies to the server's top N.
"""

from __future__ import annotations

import json

from engine.backends.remote.errors import UnsupportedByServerError
from engine.constraints import Constraint


def constraint_fields(constraint: Constraint | None, kind: str, chat: bool, host: str) -> dict:
    """Request-body fields that make server `kind` follow `constraint` ({} for none).

    Args:
        chat: the request goes to /chat/completions (else /completions).

    Raises:
        UnsupportedByServerError: this server cannot be given this kind of constraint.
    """
    if constraint is None:
        return {}
    schema = constraint.schema()  # JSON schema or any JSON ({}), else None
    gbnf = _gbnf(constraint)
    if kind == "vllm":
        key = {"json_schema": "json", "json": "json", "regex": "regex", "gbnf": "grammar", "lark": "grammar",
               "choice": "choice"}[constraint.kind]
        value = schema if schema is not None else constraint.choices() if constraint.kind == "choice" else constraint.text
        return {"structured_outputs": {key: value}}
    if kind == "sglang":
        if schema is not None:
            return {"json_schema": json.dumps(schema)}
        if constraint.kind == "regex":
            return {"regex": constraint.text}
        if gbnf is not None:
            return {"ebnf": gbnf}
    if kind == "llama.cpp":
        if schema is not None:
            return {"json_schema": schema}
        if gbnf is not None:
            return {"grammar": gbnf}
    if kind == "llama-cpp-python":
        if schema is not None and chat:
            return {"response_format": {"type": "json_object", "schema": schema}}
        if gbnf is not None:
            return {"grammar": gbnf}
    if schema is not None and chat:  # the OpenAI chat API: LM Studio, Ollama, OpenAI, and the rest
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema or {"type": "object"}}}}
    raise UnsupportedByServerError(
        f"{host} ({kind}) cannot be given a {constraint.label} constraint when it samples"
        f"{'' if chat else ' a text prompt'}: let Logit Lab sample instead (the mask then applies to the "
        "server's top N)"
    )


def _gbnf(constraint: Constraint) -> str | None:
    """The constraint as llama.cpp GBNF where it is one already (GBNF, a choice list), else None."""
    if constraint.kind == "gbnf" and "::=" in constraint.text:
        return constraint.text
    if constraint.kind == "choice":
        return "root ::= " + " | ".join(json.dumps(o) for o in constraint.choices() or ())
    return None
