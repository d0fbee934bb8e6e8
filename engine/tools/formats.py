"""The ways a model writes a call, and how to tell which its chat template asks for.

- ``builtin``: ours, for a template that renders no tools (SmolLM2's): `engine.tools.render` puts the
  tools in a system block and asks for `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
  read like Hermes.
- ``hermes``: Hermes 2/3, Qwen 2.5/3 (`<tool_call>` blocks).
- ``llama3``: Llama 3.1-3.3 (the answer a JSON object with `name` and `parameters`).
- ``mistral``: Mistral (`[TOOL_CALLS]` and a JSON list).
"""

from __future__ import annotations

from collections.abc import Callable

from engine.tools import parse_hermes, parse_llama3, parse_mistral
from engine.tools.calls import ToolAnswer

FORMATS = ("builtin", "hermes", "llama3", "mistral")
Parser = Callable[[str, "frozenset[str] | None"], ToolAnswer]
PARSERS: dict[str, Parser] = {
    "builtin": parse_hermes.parse,
    "hermes": parse_hermes.parse,
    "llama3": parse_llama3.parse,
    "mistral": parse_mistral.parse,
}
# The JSON key a format's call object holds its arguments under.
ARGUMENTS_KEY = {"builtin": "arguments", "hermes": "arguments", "llama3": "parameters", "mistral": "arguments"}


def format_of_rendered(with_tools: str, without_tools: str) -> str:
    """The format a template asks for, from its prompt rendered with and without tools.

    "builtin" where the tools change nothing (the template ignores them) or change it in a way none of
    the known formats explains (then the built-in block says how to call, and the template's own text
    about tools is left out).
    """
    if with_tools == without_tools:
        return "builtin"
    if "<tool_call>" in with_tools:
        return "hermes"
    if "[AVAILABLE_TOOLS]" in with_tools or "[TOOL_CALLS]" in with_tools:
        return "mistral"
    if "<|python_tag|>" in with_tools or '"parameters"' in with_tools or "ipython" in with_tools:
        return "llama3"
    return "builtin"


def parse_answer(text: str, fmt: str, names: frozenset[str] | None = None) -> ToolAnswer:
    """The answer's text split into content and calls, as `fmt` writes them; malformed calls stay text."""
    try:
        return PARSERS[fmt](text, names)
    except Exception:  # noqa: BLE001  (a parser bug must not lose the answer: it is text then)
        return ToolAnswer(text)
