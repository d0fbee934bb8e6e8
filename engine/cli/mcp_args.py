"""`--mcp-config FILE`, `--tool-timeout S`, `--max-tool-steps N` (generate, chat): tools from MCP servers, run
after a y/n/a answer per call (engine/cli/mcp_chat.py). Checked before anything loads: the file is read
and checked here (engine/tools/mcp_config.py), no server starts until the command runs."""

from __future__ import annotations

import argparse
import math

from engine.errors import UsageError
from engine.tools.tool_loop import DEFAULT_MAX_STEPS

DEFAULT_TOOL_TIMEOUT_S = 30.0


def add_mcp_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mcp-config", default=None, metavar="FILE",
                   help='offer the tools of the MCP servers in this mcp.json (LM Studio\'s and Claude Desktop\'s '
                        '{"mcpServers": {...}}) and run each call the model makes after you answer y (once), '
                        "n (no) or a (always for this tool); docs/tools.md")
    p.add_argument("--tool-timeout", type=float, default=DEFAULT_TOOL_TIMEOUT_S, metavar="S",
                   help=f"with --mcp-config: seconds a tool may take before its call is abandoned (default: {DEFAULT_TOOL_TIMEOUT_S:g})")
    p.add_argument("--max-tool-steps", type=int, default=DEFAULT_MAX_STEPS, metavar="N",
                   help=f"with --mcp-config: answers per turn before the loop stops (default: {DEFAULT_MAX_STEPS})")


def check_mcp_args(args: argparse.Namespace) -> None:
    """`args.mcp` (the checked McpConfig) set from --mcp-config; what cannot go with it refused in words.
    `--tool-choice` is checked for its mode here; a tool's name once the servers have listed their tools."""
    from engine.tools.mcp_config import McpConfigError, read_mcp_config

    if getattr(args, "tools", None) is not None:
        raise UsageError("give --tools FILE or --mcp-config FILE, not both (--tools' calls are printed, never run)")
    if not (math.isfinite(args.tool_timeout) and args.tool_timeout > 0):
        raise UsageError(f"--tool-timeout must be a number of seconds above 0, got {args.tool_timeout}")
    if args.max_tool_steps < 1:
        raise UsageError(f"--max-tool-steps must be at least 1, got {args.max_tool_steps}")
    if getattr(args, "constraint", None) is not None:
        raise UsageError("--mcp-config cannot be combined with --json-schema, --grammar or --regex: with tools the "
                         "answer is kept to text or a valid call")
    if getattr(args, "num_beams", 1) > 1:
        raise UsageError("--mcp-config is for sampling; beam search (--num-beams) does not read tool calls")
    try:
        args.mcp = read_mcp_config(args.mcp_config)
    except McpConfigError as e:
        raise UsageError(f"--mcp-config {e}") from None
