"""`chat --mcp-config mcp.json` (and `generate --mcp-config`): the tool loop on the terminal.

The servers start first (each one's state printed; a server that fails is said and the others are used),
then the model loads. Each turn runs engine/tools/tool_loop.py: the answer streams, each call is printed
with its confidence (as `--tools` prints it), then asked about on the terminal:

    run get_weather {"city": "Paris"} (server 'weather')? [y] once, [n] no, [a] always for this tool:

Answers are lines of standard input (the same stream a chat's messages come from); the end of input is
"no": nothing runs without a "y" or an "a". A tool's result is printed escaped (control characters shown
as `\\x1b`, never acting on the terminal) and goes back to the model; Ctrl-C stops the turn (a call under
way is ended). docs/tools.md "MCP".
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from engine.cli.answer_output import TOOLS_TOP_N, fit_length, print_stats, print_tool_calls, stream_to
from engine.cli.sampling_args import sampler_from_args
from engine.cli.steer import steering_from_args
from engine.cli.text_files import bad_utf8
from engine.errors import EngineError, UsageError
from engine.events import TokenEvent
from engine.tools.calls import ToolCall
from engine.tools.mcp_hub import McpHub
from engine.tools.mcp_results import ServerStatus, shown_escaped
from engine.tools.spec import ToolChoice, ToolSpec, ToolSpecError, parse_tool_choice
from engine.tools.tool_loop import Approvals, CallRecord, LoopOutcome, StepAnswer, run_tool_loop, step_from_stats

if TYPE_CHECKING:
    from engine.engine import Engine

ANSWERS = {"y": "once", "yes": "once", "n": "deny", "no": "deny", "a": "always", "always": "always"}
MCP_CHAT_HELP = """commands:
  /reset   forget the conversation (tools approved "always" stay approved)
  /quit    leave (Ctrl-D too); Ctrl-C stops a turn, and a tool call under way
A call is run only after you answer y (once) or a (always for this tool); n or the end of input denies it.
(/set and /probs are for chat without --mcp-config.)"""


def cmd_with_mcp(args: argparse.Namespace, load: Callable[[argparse.Namespace], Engine]) -> int:
    """generate/chat with --mcp-config: start the servers, load the model, run the loop per turn."""
    sampler_from_args(args)
    steering = steering_from_args(args)
    with McpHub() as hub:
        print(f"[starting the MCP servers of {args.mcp.source}]", file=sys.stderr, flush=True)
        print_statuses(hub.start(args.mcp))
        tools = hub.tools()
        if not tools:
            raise UsageError(f"--mcp-config {args.mcp.source}: no server is running with a tool to offer (see above)")
        try:
            choice = parse_tool_choice(args.tool_choice or "auto", tools)
        except ToolSpecError as e:
            raise UsageError(f"--tool-choice {args.tool_choice}: {e}") from None
        with load(args) as engine:
            turns = McpTurns(engine, args, hub, tools, choice, steering, sys.stdin)
            if args.command == "generate":
                return turns.run(args.prompt)
            return turns.repl()


def print_statuses(statuses: list[ServerStatus]) -> None:
    for s in statuses:
        if s.ok:
            names = ", ".join(t.name for t in s.tools) or "none"
            print(f"[mcp server {s.name!r} ({s.transport}): {len(s.tools)} tools: {names}]", file=sys.stderr)
        else:
            print(f"error: {s.error}; its tools are not offered", file=sys.stderr)
        for problem in s.tool_errors:
            print(f"note: {problem}", file=sys.stderr)
    sys.stderr.flush()


@dataclass
class McpTurns:
    """A conversation whose turns run the tool loop; `messages` holds it (calls and results included)."""

    engine: Any
    args: argparse.Namespace
    hub: McpHub
    tools: tuple[ToolSpec, ...]
    choice: ToolChoice
    steering: Any
    stdin: TextIO
    approvals: Approvals = field(default_factory=Approvals)
    messages: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.args.system}] if self.args.system else []

    def repl(self) -> int:
        attachments = list(getattr(self.args, "attachments", []))
        print(f"{self.engine.info.name} on {self.engine.info.backend}/{self.engine.info.device} with "
              f"{len(self.tools)} MCP tools. /help for commands.", file=sys.stderr)
        while True:
            if self.stdin.isatty():
                print("you> ", end="", flush=True)
            line = self.stdin.readline()
            if not line:
                return 0
            text = line.rstrip("\n")
            if where := bad_utf8(text):
                print(f"error: that line is not valid UTF-8 ({where}) and was skipped; the chat goes on", file=sys.stderr)
                continue
            command = text.strip()
            if not command:
                continue
            if command in ("/quit", "/exit", "/q"):
                return 0
            if command.startswith("/"):
                self._command(command)
                continue
            if attachments:
                from engine.documents import compose_message

                text, attachments = compose_message(text, attachments).text, []
            self.run(text)

    def _command(self, command: str) -> None:
        if command == "/help":
            print(MCP_CHAT_HELP)
        elif command == "/reset":
            self.reset()
            print("(conversation cleared)")
        else:
            print(f"unknown command {command.split()[0]}; /help lists them", file=sys.stderr)

    def run(self, text: str) -> int:
        """One turn: the user's `text`, then answers and approved calls until the loop ends."""
        start = [*self.messages, {"role": "user", "content": text}]
        try:
            outcome = run_tool_loop(start, self.tools, self._generate, self._approve, self._call,
                                    first_choice=self.choice, max_steps=self.args.max_tool_steps,
                                    approvals=self.approvals, on_result=self._show_result)
        except KeyboardInterrupt:
            self.hub.cancel_calls()
            print("\n(stopped; this turn is dropped)", file=sys.stderr)
            return 130
        except EngineError as e:
            print(f"\nerror: {e}", file=sys.stderr)
            return 1
        self._keep(outcome)
        return 1 if outcome.ended == "error" else 0

    def _keep(self, outcome: LoopOutcome) -> None:
        self.messages = list(outcome.messages)
        if outcome.ended != "answered":
            print(f"[{outcome.reason}]", file=sys.stderr)
        if outcome.ended == "step_limit" and outcome.last is not None:
            self.messages.append({"role": "assistant", "content": outcome.last.content})

    def _generate(self, messages: tuple[dict[str, Any], ...], choice: ToolChoice) -> StepAnswer:
        from engine.request import GenerationRequest

        a = self.args
        request = GenerationRequest(messages=messages, sampler=a.sampler, max_new_tokens=max(a.max_new_tokens, 1),
                                    stop=tuple(a.stop), top_n=max(a.top_n, TOOLS_TOP_N), ignore_eos=a.ignore_eos,
                                    server_sampling=a.server_sampling, steering=self.steering, tools=self.tools,
                                    tool_choice=choice)
        request = fit_length(self.engine, request, a.max_new_tokens)
        print("assistant> ", end="", flush=True)
        events: list[TokenEvent] = []
        done = stream_to(sys.stdout, self.engine, request, a.show_probs, events)
        print()
        print_tool_calls(sys.stdout, events, done, request)
        print_stats(done)
        return step_from_stats(self.engine.tokenizer, request, done.stats)

    def _approve(self, call: ToolCall) -> str:
        where = self.hub.server_of(call.name)
        while True:
            print(f"run {call.name} {shown_escaped(call.arguments)} (server {where!r})? "
                  "[y] once, [n] no, [a] always for this tool: ", end="", flush=True)
            line = self.stdin.readline()
            if not line:
                print("\n(no answer: the end of input; denied)")
                return "deny"
            answer = ANSWERS.get(line.strip().lower())
            if answer is not None:
                if not self.stdin.isatty():
                    print(line.strip())  # the answer read from a pipe, shown where a typed one would be
                return answer
            print("answer y, n or a", file=sys.stderr)

    def _call(self, name: str, arguments: dict[str, Any]) -> Any:
        return self.hub.call_tool(name, arguments, timeout_s=self.args.tool_timeout)

    def _show_result(self, record: CallRecord) -> None:
        if record.result is None:
            print(f"[denied: {record.call.name} did not run; the model is told so]")
            return
        r = record.result
        kind = {"ok": "result", "error": "the tool's error"}.get(r.outcome, r.outcome)
        print(f"[{record.call.name}: {kind} in {r.seconds:.2f} s"
              + (f", {record.decision}" if record.decision == "always" else "") + "]")
        print(shown_escaped(r.text), flush=True)
