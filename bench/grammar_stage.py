"""The tools' `grammar` stage alone, per token: thread CPU time now against the stage before issue 45.

    python bench/grammar_stage.py [--prompts 8] [--tokens 48]

The first N prompts of bench/tools.py answered on the default model (SmolLM2-135M GGUF, llama.cpp, 1 thread),
under tool_choice "auto" (text or a call: the grammar bans a few dozen tokens of 49,152) and then "required"
(where a tool fits: a call, masks of a few tokens and fast-forwards). At every step the stage runs twice as
it is and twice as it was (the reference copied in tests/engine/test_grammar_stage_same_numbers.py, which
checks that both report the same numbers), alternated on the same row and matcher state (neither advances
the matcher); each call's `time.thread_time_ns` is kept. The stage includes llguidance's mask and
fast-forward, the same in both. Printed per pass: steps, median and mean microseconds, new/old.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "engine"))

import tools as bench_tools  # noqa: E402  (bench/tools.py: its prompts and requests)
from test_grammar_stage_same_numbers import _old_call  # noqa: E402  (the stage before issue 45)

from engine.sampling import grammar  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8, help="how many of bench/tools.py's prompts")
    ap.add_argument("--tokens", type=int, default=48, help="each answer's limit")
    args = ap.parse_args()
    from engine.backends.llamacpp import LlamaCppBackend
    from engine.sources import resolve_spec

    new_call = grammar.GrammarStage.__call__
    times: dict[str, list[int]] = {"new": [], "old": []}

    def both(self, scores, ctx):
        out = None
        for _ in range(2):
            for name, call in (("old", _old_call), ("new", new_call)):
                t0 = time.thread_time_ns()
                out = call(self, scores, ctx)
                times[name].append(time.thread_time_ns() - t0)
        return out  # the new stage's row: the answer goes on with it

    grammar.GrammarStage.__call__ = both
    source = resolve_spec(None)
    backend = LlamaCppBackend(source.path, spec="default", display_name=source.name, n_threads=1)
    items = bench_tools.prompts(False)[: args.prompts]
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    print(f"prompts={len(items)} tokens={args.tokens} load_at_start={load}")
    for choice in ("auto", "required"):
        for v in times.values():
            v.clear()
        for p in items:
            if choice == "required" and p.group == "nofit":
                continue
            bench_tools.run(backend, bench_tools.request_for(p, args.tokens, choice))
        old, new = statistics.median(times["old"]), statistics.median(times["new"])
        print(f"{choice}: steps={len(times['new']) // 2} old_median_us={old / 1e3:.0f} new_median_us={new / 1e3:.0f} "
              f"old_mean_us={statistics.mean(times['old']) / 1e3:.0f} new_mean_us={statistics.mean(times['new']) / 1e3:.0f} "
              f"new_vs_old={new / old:.2f}")
    backend.close()


if __name__ == "__main__":
    main()
