"""`logitlab-cli replay TRACE`: run a traced answer again and say whether it repeated.

Reads a generation run of a JSONL trace (File ▸ Export trace, `compare --output`), generates it again from
its prompt ids, settings and seed on the model the command line loads, and prints the verdict:
"identical" (same tokens, log-probs equal bit for bit), "same tokens, probabilities within x", or
"diverged at token i ('a' vs 'b')", and which fingerprint fields differ between the traced run and the
replay ("n_threads 2 -> 4"). The trace is read and checked before the model loads.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import UsageError

if TYPE_CHECKING:
    from engine.cli.options import OneLineParser

MAX_TRACE_BYTES = 256 << 20


def add_replay_parser(
    sub: argparse._SubParsersAction[OneLineParser], add_model_args: Callable[[argparse.ArgumentParser], None]
) -> None:
    r = sub.add_parser("replay", help="run a traced answer again and say whether it repeated, and what differs",
                       description="Replays a generation run of a trace with its seed and settings and compares "
                                   "tokens and log-probs bit for bit; the fingerprint fields that differ are named.")
    r.add_argument("trace", help="a JSONL trace holding generation runs (e.g. from File > Export trace)")
    r.add_argument("--run", type=int, default=None, metavar="N", help="replay only run N (0-based; default: every run)")
    add_model_args(r)


def read_generation_runs(path: str, only: int | None) -> list[tuple[int, Any]]:
    """The trace's generation runs as (index, TraceRun); UsageError in words for a file that will not do."""
    from engine.experiments.trace import read_trace

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"trace file not found: {p}")
    if p.stat().st_size > MAX_TRACE_BYTES:
        raise UsageError(f"trace file {p} is larger than {MAX_TRACE_BYTES >> 20} MiB")
    try:
        runs = read_trace(p)
    except UnicodeDecodeError as e:
        raise UsageError(f"trace file {p} is not UTF-8 text (byte {e.start})") from None
    except ValueError as e:
        raise UsageError(f"trace file {p}: {e}") from None
    found = [(i, r) for i, r in enumerate(runs) if r.header.get("kind", "generation") == "generation"]
    if only is not None:
        found = [(i, r) for i, r in found if i == only]
        if not found:
            raise UsageError(f"trace file {p} has no generation run {only} (it has {len(runs)} runs)")
    if not found:
        raise UsageError(f"trace file {p} holds no generation run to replay")
    for i, run in found:
        from engine.experiments.replay import request_for_run

        request_for_run(run, where=f"run {i}")  # every run checked before the model loads
    return found


def cmd_replay(args: argparse.Namespace, load: Callable[[argparse.Namespace], Any]) -> int:
    from engine.events import Done
    from engine.experiments.replay import fingerprint_of, replay_verdict, request_for_run

    runs = read_generation_runs(args.trace, args.run)
    worst = 0
    with load(args) as engine:
        for i, run in runs:
            original = run.events()
            events, done = [], None
            for ev in engine.generate(request_for_run(run, where=f"run {i}")):
                if isinstance(ev, Done):
                    done = ev
                else:
                    events.append(ev)
            assert done is not None
            verdict = replay_verdict(original, events, fingerprint_of(run.end or {}), done.stats.fingerprint)
            print(f"run {i}: {verdict.headline()} ({len(original)} tokens traced, {len(events)} replayed)")
            print(f"  {verdict.fingerprint_text()}")
            worst = max(worst, 0 if verdict.identical else 1)
    return worst


def add_audit_parser(
    sub: argparse._SubParsersAction[OneLineParser], add_model_args: Callable[[argparse.ArgumentParser], None]
) -> None:
    from engine.cli.sampling_args import add_sampler_flags

    a = sub.add_parser("audit", help="N loom continuations as one batch, each run again alone: the largest log-prob "
                                     "difference per row and overall",
                       description="Makes --rows continuations of the prompt as rows of one batch (as the loom "
                                   "does, seeds seed..seed+N-1), reruns each as a single answer with its seed and "
                                   "settings, and reports each row's verdict and largest |Δ log-prob|.")
    a.add_argument("-p", "--prompt", required=True)
    a.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    a.add_argument("--rows", type=int, default=4, help="continuations, 2 to 16 (default: 4)")
    add_sampler_flags(a)
    add_model_args(a)


def cmd_audit(args: argparse.Namespace, load: Callable[[argparse.Namespace], Any]) -> int:
    """Exit 0 when every row came out identical, 1 otherwise (the report says where and by how much)."""
    import secrets

    from engine.experiments.audit import audit_loom
    from engine.loom import check_children
    from engine.request import GenerationRequest

    check_children(args.rows)
    sampler = args.sampler if args.sampler.seed is not None else args.sampler.with_(seed=secrets.randbits(31))
    prompt = {"messages": ({"role": "user", "content": args.prompt},)} if args.chat else {"prompt": args.prompt}
    request = GenerationRequest(**prompt, sampler=sampler, max_new_tokens=args.max_new_tokens, stop=tuple(args.stop),
                                ignore_eos=args.ignore_eos, constraint=args.constraint)
    with load(args) as engine:
        audit = engine.call(lambda backend: audit_loom(backend, request, args.rows)).result()
        print(f"{engine.info.name} ({engine.info.backend}), seed {sampler.seed}:")
    print("\n".join(audit.lines()))
    return 0 if audit.all_identical else 1
