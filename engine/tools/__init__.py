"""Tool calling: the tools a request offers, their prompt, the grammar that keeps calls valid, the parsed calls.

`spec` checks tools and tool_choice; `render` puts them in the prompt (the model's template or the
built-in format, `formats`); `constraint` is the llguidance grammar; `tracker` follows a call as it
streams (positions, completion); `parse_*` read calls back; `calls` holds them. docs/tools.md.
"""

from engine.tools.calls import ToolAnswer, ToolCall
from engine.tools.request_tools import answer_calls, plan_for_request, prompt_ids_with_tools
from engine.tools.spec import ToolChoice, ToolSpec, ToolSpecError, parse_tool_choice, parse_tools

__all__ = ["ToolAnswer", "ToolCall", "ToolChoice", "ToolSpec", "ToolSpecError", "answer_calls", "parse_tool_choice",
           "parse_tools", "plan_for_request", "prompt_ids_with_tools"]
