"""Tool calls on the default model: well-formed with the constraint and without, calls when no tool fits, speed.

    python bench/tools.py [--quick] [--auto-only] [--max-new-tokens 128] [--auto-tokens 64] [--threads 1] [--repeat 20]

52 prompts written here (`--quick`: 5 of them), each answered greedily (temperature 0) on the default model
(SmolLM2-135M GGUF on llama.cpp; its template renders no tools, so the built-in `<tool_call>` format does), in
three groups: one tool offered that fits (`single`, 20), three or four offered of which one fits (`multi`, 20),
and tools offered none of which fits the question (`nofit`, 12). Nine tool schemas (strings, an enum,
integers, numbers, a boolean, an array).

Two passes:
- `auto` (every prompt): the normal path, `GenerationRequest(messages, tools, tool_choice="auto")`, the
  constraint on. It gives `called_when_none_fits=` and the speed pairs. The 135M model almost never calls under
  auto (its p(call) at the first token is about 1%), so this pass alone makes few calls or none.
- `required` (the 40 prompts where a tool fits; `--auto-only` skips it): tool_choice "required", with the
  constraint (the normal path) and without it. Without: the same prompt's ids, built by the engine's own
  `prompt_ids_with_tools` (the tools and "You must call one of the tools now" in it exactly as with the
  constraint), sent as `prompt_ids` with no tools, so no grammar applies, and its first tokens forced to the
  opener `<tool_call>` (as the grammar forces a call under "required": the model alone answers in text even
  when told to call, so without this no call would be made to judge); what follows is the model's, free. The
  call ends at its closer (a stop string, put back) and the text is read by the same parser (`answer_calls`).
  The engine has no switch to turn the tools' grammar off; this bench needs none and changes nothing in it.

Printed (`name=value`):
- `well_formed_with_constraint=`: among the constrained answers (both passes) that made a call (their text has
  `<tool_call>` anywhere, as a client's parser looks for it), the share whose call parsed, names an offered
  tool and whose arguments validate against that tool's schema (jsonschema); goal 1.00.
  `well_formed_without=`: the same for the unconstrained answers.
- `called_when_none_fits=`: the share of `nofit` prompts answered with a call under auto, with the constraint.
- `ratio_tools_vs_plain=`: decode tokens/s of the auto answers with tools (constraint on) against the same
  questions asked without tools, answered to the same number of tokens (end of sequence ignored), alternated;
  median over the answers of at least 8 tokens; goal >= 0.9.
- `ratio_tools_vs_same_prompt=`: the same auto answers against their own prompt (the tools' block included)
  decoded with no tools to the same length: the grammar's and the call tracker's cost per token alone, apart
  from the longer prompt (each step attends over the tools' descriptions too).
- `confidence_ms_per_call=`: `call_confidence` per call, median over the constrained calls (each timed
  `--repeat` times, 20 alternatives per token); goal < 1.
Counts before them: `calls_auto=` (auto answers that called), `calls_with_constraint=`, `calls_without=`,
`prompt_tokens=` (the speed pairs' median prompt length, with the tools' block and without: every decode step
attends over it, most of what `ratio_tools_vs_plain` loses), and
why constrained calls were malformed: `cut_off` (max_new_tokens ran out inside the call), `after_text` (under
auto the grammar only keeps text from *beginning* like a call: text that opens `<tool_call>` later is not
constrained), `other`.
Figures depend on the machine and on what else runs on it (the load is printed beside them). Not part of the
test suite (tests/engine/test_bench_tools.py runs `--quick` and checks the lines only).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jsonschema  # noqa: E402

from engine.events import Done, GenerationStats, TokenEvent  # noqa: E402
from engine.request import GenerationRequest  # noqa: E402
from engine.sampling.settings import SamplerSettings  # noqa: E402
from engine.tools.calls import ToolCall  # noqa: E402
from engine.tools.confidence import call_confidence  # noqa: E402
from engine.tools.request_tools import answer_calls, plan_for_request, prompt_ids_with_tools  # noqa: E402
from engine.tools.spec import parse_tools  # noqa: E402


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


_S = {"type": "string", "maxLength": 60}  # bounded: a greedy 135M model may otherwise repeat inside a string
TOOLS = {t["function"]["name"]: t for t in (
    _tool("get_weather", "Current weather in a city",
          {"city": _S, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"]),
    _tool("add", "Add two numbers", {"a": {"type": "number"}, "b": {"type": "number"}}, ["a", "b"]),
    _tool("search_web", "Search the web for a query", {"query": _S}, ["query"]),
    _tool("send_email", "Send an email", {"to": _S, "subject": _S, "body": _S}, ["to", "subject"]),
    _tool("set_timer", "Start a countdown timer", {"minutes": {"type": "integer", "minimum": 0}}, ["minutes"]),
    _tool("convert_currency", "Convert an amount of money between currencies",
          {"amount": {"type": "number"}, "from_currency": _S, "to_currency": _S},
          ["amount", "from_currency", "to_currency"]),
    _tool("translate", "Translate a text into another language", {"text": _S, "target_language": _S},
          ["text", "target_language"]),
    _tool("get_stock_price", "The latest price of a stock", {"symbol": _S}, ["symbol"]),
    _tool("set_lights", "Turn lights in a room on or off",
          {"room": _S, "on": {"type": "boolean"},
           "rooms_also": {"type": "array", "items": _S, "maxItems": 4}}, ["room", "on"]),
)}

SINGLE = [  # (question, the one tool offered, which fits)
    ("What is the weather in Paris?", "get_weather"), ("Is it raining in London right now?", "get_weather"),
    ("How hot is it in Tokyo, in fahrenheit?", "get_weather"), ("What is 17 plus 25?", "add"),
    ("Add 3.5 and 4.25 for me.", "add"), ("Search the web for the tallest building in the world.", "search_web"),
    ("Look up the latest news about electric cars.", "search_web"),
    ("Email bob@example.com with the subject 'Lunch' and ask if he is free on Friday.", "send_email"),
    ("Send an email to alice@example.com saying the report is ready.", "send_email"),
    ("Set a timer for 10 minutes.", "set_timer"), ("Start a 25 minute countdown.", "set_timer"),
    ("Convert 100 US dollars to euros.", "convert_currency"), ("How many yen is 50 pounds?", "convert_currency"),
    ("Translate 'good morning' into Spanish.", "translate"), ("How do you say 'thank you' in German?", "translate"),
    ("What is Apple's stock price?", "get_stock_price"), ("How is MSFT trading today?", "get_stock_price"),
    ("Turn off the lights in the kitchen.", "set_lights"), ("Switch on the bedroom light.", "set_lights"),
    ("What's the forecast for Berlin?", "get_weather"),
]
MULTI = [  # (question, the tools offered: the first fits)
    ("What is the weather in Madrid?", ["get_weather", "add", "search_web"]),
    ("What is 12 plus 30?", ["get_weather", "add", "set_timer"]),
    ("Search for the best pizza recipe.", ["search_web", "translate", "add"]),
    ("Set a timer for 5 minutes.", ["set_timer", "get_weather", "send_email"]),
    ("Convert 20 euros to dollars.", ["convert_currency", "get_stock_price", "add"]),
    ("Translate 'where is the station' into French.", ["translate", "search_web", "set_lights"]),
    ("What is the stock price of Tesla?", ["get_stock_price", "convert_currency", "search_web"]),
    ("Turn on the living room lights.", ["set_lights", "set_timer", "get_weather"]),
    ("Send an email to tom@example.com about the meeting tomorrow.", ["send_email", "translate", "search_web"]),
    ("Is it cold in Oslo today?", ["get_weather", "get_stock_price", "set_lights", "add"]),
    ("What do you get when you add 7 and 8?", ["add", "convert_currency", "search_web", "set_timer"]),
    ("Find information about the Eiffel Tower online.", ["search_web", "get_weather", "send_email"]),
    ("Remind me in 15 minutes with a timer.", ["set_timer", "set_lights", "add"]),
    ("How much is 300 Swiss francs in British pounds?", ["convert_currency", "add", "translate"]),
    ("Say 'I love cats' in Italian.", ["translate", "send_email", "get_weather"]),
    ("Check the price of NVDA shares.", ["get_stock_price", "search_web", "add", "get_weather"]),
    ("Lights off in the garage, please.", ["set_lights", "send_email", "set_timer"]),
    ("Weather in New York in celsius?", ["get_weather", "convert_currency", "translate"]),
    ("Please add 1000 and 2024.", ["add", "get_stock_price", "set_lights"]),
    ("Write an email to jane@example.com with the subject 'Hello'.", ["send_email", "search_web", "set_timer"]),
]
NOFIT = [  # (question, tools offered none of which fits)
    ("Write a haiku about autumn.", ["get_weather", "add"]), ("Hi! How are you today?", ["set_timer", "send_email"]),
    ("Who wrote Romeo and Juliet?", ["set_lights", "convert_currency"]),
    ("Tell me a joke about cats.", ["get_stock_price", "set_timer"]),
    ("What is the capital of Italy?", ["add", "set_lights"]),
    ("Explain what photosynthesis is in one sentence.", ["convert_currency", "set_timer", "add"]),
    ("Give me three names for a pet dog.", ["get_weather", "get_stock_price"]),
    ("What colour do you get mixing blue and yellow?", ["send_email", "set_timer"]),
    ("Summarise the plot of Cinderella.", ["set_lights", "add", "get_stock_price"]),
    ("Thank you, that is all.", ["get_weather", "convert_currency"]),
    ("Describe the taste of a lemon.", ["set_timer", "get_stock_price"]),
    ("What is your favourite book?", ["add", "send_email", "set_lights"]),
]


@dataclass
class Prompt:
    group: str
    question: str
    tools: list[str]


@dataclass
class Tally:
    calls: int = 0  # answers that made a call
    well_formed: int = 0
    cut_off: int = 0  # malformed ones that ran out of max_new_tokens inside the call
    after_text: int = 0  # malformed ones whose call opens after some text (not where an answer begins)
    failures: list[str] = field(default_factory=list)

    def share(self) -> float:
        return self.well_formed / self.calls if self.calls else float("nan")  # nan: no answer made a call


def prompts(quick: bool) -> list[Prompt]:
    every = ([Prompt("single", q, [t]) for q, t in SINGLE] + [Prompt("multi", q, ts) for q, ts in MULTI]
             + [Prompt("nofit", q, ts) for q, ts in NOFIT])
    if not quick:
        return every
    # One per group, two each of single and multi (where a call is expected), and one no-fit question.
    return [every[0], every[3], every[len(SINGLE)], every[len(SINGLE) + 1], every[len(SINGLE) + len(MULTI)]]


def request_for(p: Prompt, max_new_tokens: int, choice: str) -> GenerationRequest:
    return GenerationRequest(messages=({"role": "user", "content": p.question},),
                             tools=parse_tools([TOOLS[n] for n in p.tools]),
                             tool_choice=choice, max_new_tokens=max_new_tokens, top_n=20,
                             sampler=SamplerSettings(temperature=0.0))


def run(backend: Any, request: GenerationRequest) -> tuple[list[TokenEvent], GenerationStats]:
    from engine.decode.loop import generate_events

    # No trim: the tools' block leads the prompt, so answers offering the same tools reuse its cache (prefill
    # is most of a short answer's time on two cores); decode speed, the figure here, does not depend on it.
    events = list(generate_events(backend, request))
    done = events[-1]
    assert isinstance(done, Done)
    return [e for e in events if isinstance(e, TokenEvent)], done.stats


def well_formed(text: str, calls: tuple[ToolCall, ...], p: Prompt) -> str | None:
    """None when the answer's call is well formed, else why not."""
    if not calls:
        return "no call parsed"
    call = calls[0]
    if call.name not in p.tools:
        return f"names {call.name!r}, not offered"
    try:
        jsonschema.validate(json.loads(call.arguments), TOOLS[call.name]["function"]["parameters"])
    except (ValueError, jsonschema.ValidationError) as e:
        return f"arguments do not validate: {str(e).splitlines()[0][:80]}"
    return None


def count(tally: Tally, answer: tuple[str, tuple[ToolCall, ...], str], p: Prompt) -> bool:
    """Add an answer (text, calls, finish reason) to `tally`; True when it made a call (its text opens one
    anywhere, as a client's parser would look for it, or a call was parsed)."""
    text, calls, finish = answer
    if "<tool_call>" not in text and not calls:
        return False
    tally.calls += 1
    why = well_formed(text, calls, p)
    if why is None:
        tally.well_formed += 1
        return True
    tally.cut_off += finish == "length"
    tally.after_text += finish != "length" and not text.lstrip().startswith("<tool_call>")
    tally.failures.append(f"{p.question[:40]!r}: {why} ({finish}); answer {text[:90]!r}")
    return True


def without_constraint(backend: Any, p: Prompt, max_new_tokens: int,
                       choice: str) -> tuple[str, tuple[ToolCall, ...], str]:
    """The same prompt (the engine's own rendering with the tools), decoded with no grammar, read by the same parser."""
    tok = backend.tokenizer
    with_tools = request_for(p, max_new_tokens, choice)
    ids = prompt_ids_with_tools(tok, with_tools)
    assert ids is not None
    # "required" without the grammar: the prompt asks for a call, and the opener is written for the model (as
    # the grammar would force it: the model alone answers in text even when told to call); what follows is free.
    opener = tuple(tok.encode("<tool_call>", add_special_tokens=False)) if choice == "required" else ()
    plain = GenerationRequest(prompt_ids=tuple(ids), max_new_tokens=max_new_tokens, top_n=20, forced_tokens=opener,
                              sampler=SamplerSettings(temperature=0.0), stop=("</tool_call>",))
    _, stats = run(backend, plain)
    # The stop string is cut from the text; put it back so the call reads as written.
    text = stats.text + "</tool_call>" if stats.finish_reason == "stop" else stats.text
    return text, answer_calls(text, plan_for_request(tok, with_tools)).calls, stats.finish_reason


def plain_rate(backend: Any, p: Prompt, tokens: int) -> tuple[float, int]:
    """Decode tokens/s of the same question with no tools, answered to exactly `tokens` tokens; its prompt's length."""
    request = GenerationRequest(messages=({"role": "user", "content": p.question},), max_new_tokens=tokens,
                                top_n=20, ignore_eos=True, sampler=SamplerSettings(temperature=0.0))
    stats = run(backend, request)[1]
    return stats.decode_tokens_per_s, stats.prompt_tokens


def same_prompt_rate(backend: Any, p: Prompt, tokens: int) -> float:
    """Decode tokens/s of the auto answer's own prompt (the tools' block included) with no tools, so no grammar
    or call tracker: what tools cost per token, apart from the longer prompt every step attends over."""
    ids = prompt_ids_with_tools(backend.tokenizer, request_for(p, tokens, "auto"))
    assert ids is not None
    request = GenerationRequest(prompt_ids=tuple(ids), max_new_tokens=tokens, top_n=20, ignore_eos=True,
                                sampler=SamplerSettings(temperature=0.0))
    return run(backend, request)[1].decode_tokens_per_s


def confidence_ms(events: list[TokenEvent], calls: tuple[ToolCall, ...], allowed: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        call_confidence(events, calls, allowed)
        times.append((time.perf_counter() - t0) * 1e3 / len(calls))
    return statistics.median(times)


def one_prompt(backend: Any, p: Prompt, choice: str, tokens: tuple[int, int], r: dict[str, Any],
               repeat: int) -> tuple[bool, GenerationStats]:
    """Answer `p` under `choice` with the constraint (and, under "required", without it); whether it called.

    `tokens`: (an auto answer's limit, a call's): an auto answer is mostly text, cut short to save time; one
    that was cut inside a call is answered again with a call's room."""
    max_new_tokens = tokens[1]
    events, stats = run(backend, request_for(p, tokens[0] if choice == "auto" else max_new_tokens, choice))
    if stats.finish_reason == "length" and stats.text.lstrip().startswith("<tool_call>"):
        events, stats = run(backend, request_for(p, max_new_tokens, choice))
    called = count(r["con"], (stats.text, stats.tool_calls, stats.finish_reason), p)
    if stats.tool_calls:
        r["conf_ms"].append(confidence_ms(events, stats.tool_calls, p.tools, repeat))
    if choice == "required":
        count(r["free"], without_constraint(backend, p, max_new_tokens, choice), p)
    return called, stats


def bench(backend: Any, items: list[Prompt], tokens: tuple[int, int], repeat: int, required: bool) -> dict[str, Any]:
    r: dict[str, Any] = {"con": Tally(), "free": Tally(), "rates": [], "conf_ms": [], "auto_calls": 0,
                         "prompt_tokens": []}
    nofit_called = 0
    # Per prompt: auto, then required with and without the grammar (where a tool fits: the calls' form), then
    # the plain answer of the speed pair last, so the three with the same tools' block reuse its cache.
    for p in items:
        called, auto = one_prompt(backend, p, "auto", tokens, r, repeat)
        r["auto_calls"] += called
        nofit_called += called and p.group == "nofit"
        if required and p.group != "nofit":
            one_prompt(backend, p, "required", tokens, r, repeat)
        if auto.generated_tokens >= 8:  # shorter answers' rates are mostly timer noise
            plain, plain_tokens = plain_rate(backend, p, auto.generated_tokens)
            r["rates"].append((auto.decode_tokens_per_s, plain, same_prompt_rate(backend, p, auto.generated_tokens)))
            r["prompt_tokens"].append((auto.prompt_tokens, plain_tokens))
    nofit_n = sum(p.group == "nofit" for p in items)
    r["nofit"] = nofit_called / nofit_n if nofit_n else 0.0
    return r


def _median(values: Any) -> float:
    values = list(values)
    return statistics.median(values) if values else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="5 prompts (the test's run)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="a call's limit (default 128; 48 with --quick): "
                    "room for a whole call (strings up to 60 characters); one cut off counts as malformed")
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp's threads, the same for every answer "
                    "(1: on a shared, loaded 2-core machine 2 threads ran 5x slower)")
    ap.add_argument("--auto-tokens", type=int, default=None, help="an auto answer's limit (default 64; "
                    "16 with --quick); one cut off inside a call is answered again in full")
    ap.add_argument("--auto-only", action="store_true", help="skip the required pass (see the module's text)")
    ap.add_argument("--repeat", type=int, default=20, help="timings of call_confidence per call")
    ap.add_argument("--verbose", action="store_true", help="print each answer that made a malformed call")
    args = ap.parse_args()
    args.max_new_tokens = args.max_new_tokens or (48 if args.quick else 128)
    args.auto_tokens = args.auto_tokens or (16 if args.quick else 64)
    from engine.backends.llamacpp import LlamaCppBackend
    from engine.sources import resolve_spec

    source = resolve_spec(None)
    assert source.path is not None  # the default model is a local GGUF
    # Fixed threads: llama.cpp otherwise picks them per answer from the cores free then, and the two answers
    # of a speed pair could run on different counts on a shared machine.
    backend = LlamaCppBackend(source.path, spec="default", display_name=source.name, n_threads=args.threads)
    items = prompts(args.quick)
    print(f"machine={platform.machine()} {platform.processor() or platform.system()} cpus={os.cpu_count()} "
          f"threads={args.threads} model={source.name} prompts={len(items)} max_new_tokens={args.max_new_tokens} "
          f"auto_tokens={args.auto_tokens} "
          f"passes={'auto' if args.auto_only else 'auto,required'}",
          flush=True)
    t0 = time.perf_counter()
    r = bench(backend, items, (args.auto_tokens, args.max_new_tokens), args.repeat, not args.auto_only)
    backend.close()
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    con, free = r["con"], r["free"]
    ratios = [t / p for t, p, _ in r["rates"] if p > 0]
    same = [t / q for t, _, q in r["rates"] if q > 0]
    print(f"calls_auto={r['auto_calls']}/{len(items)} calls_with_constraint={con.calls} calls_without={free.calls} "
          f"malformed_with=(cut_off {con.cut_off}, after_text {con.after_text}, other "
          f"{con.calls - con.well_formed - con.cut_off - con.after_text}) speed_pairs={len(ratios)} "
          f"prompt_tokens=(tools {_median(t for t, _ in r['prompt_tokens'])}, plain "
          f"{_median(q for _, q in r['prompt_tokens'])}) "
          f"seconds={time.perf_counter() - t0:.1f} load={load}")
    if args.verbose:
        for line in free.failures + con.failures:
            print("  malformed:", line)
    print(f"well_formed_with_constraint={con.share():.2f}")
    print(f"well_formed_without={free.share():.2f}")
    print(f"called_when_none_fits={r['nofit']:.2f}")
    print(f"ratio_tools_vs_plain={statistics.median(ratios) if ratios else 0.0:.3f}")
    print(f"ratio_tools_vs_same_prompt={statistics.median(same) if same else 0.0:.3f}")
    print(f"confidence_ms_per_call={statistics.median(r['conf_ms']) if r['conf_ms'] else float('nan'):.3f}")


if __name__ == "__main__":
    main()
