"""What scoring costs: many texts on one context vs one `Engine.score` call each; one text in one pass vs step by step.

    python bench/score.py [--model SPEC] [--backend auto] [--texts 100] [--threads N] [--no-floor]
    python bench/score.py --one-text [--model SPEC] [--backend torch] [--repeat 2] [--no-step]

Default: 100 short sentences scored by `LanguageModel.score` (every text on the
model's one batch runner) against 100 `Engine.score` calls (a scoring context
built per call), the same numbers asserted (log-probs and entropies within
1e-4, token ids and ranks equal), and printed as `batch_score_speedup=<x>`
together with the machine's load (`/proc/loadavg`): on a shared machine the
compute per token, which both sides pay, grows with the load, and the ratio shrinks.
On llama.cpp it also times llama-cpp-python's own `Llama.eval` of the same
tokens, one eval per text and all joined in one (bench/llamacpp_floor.py), and
prints `batch_score_ceiling=`: the 100 calls' time over the joined eval's. That eval
keeps only the last position's logits, so it skips work scoring cannot skip: the
unembedding (576 x 49k multiply-adds per position at the default model, about a
fifth of a 135M model's forward) and the copy of every scored row. So the same
evals are timed again with every position's logits (`Llama(logits_all=True)`, each
row copied out as llama-cpp-python does) and printed as
`batch_score_ceiling_all_logits=`: the fair bound for scoring, which must compute
every scored position's distribution. Both are printed, so the goal (0.9 of the
ceiling, issue 46) can be read against either; docs/experiments.md gives both ratios.

`--one-text`: `score` runs the text through the backend's research runner, every
position's logits kept, one forward per chunk of positions (256 at the default
model's vocabulary). The step-by-step fallback (`score_step_by_step`, what backends
without such a runner use) costs one forward per token. This prints both,
next to one plain transformers forward over the whole text (torch backends
only): the floor that a teacher-forced pass can reach.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from engine import Engine
from engine.experiments import score, score_step_by_step, text_ids

TEXT = (
    "The lighthouse keeper climbed the narrow stairs every evening, counting each step out loud, "
    "because his father had done the same and his grandfather before him. "
)


def best_of_two(eng: Engine, fn) -> tuple[float, object]:
    """The faster of two runs on the model's worker thread (the first warms up), and its result."""
    best, result = float("inf"), None
    for _ in range(2):
        eng.call(lambda b: b.trim_cache(0)).result()
        t0 = time.perf_counter()
        result = eng.call(fn).result()
        best = min(best, time.perf_counter() - t0)
    return best, result


# Same numbers: the batch runs on a context of another size than Engine.score's, which may round differently.
TOLERANCE = 1e-4
SUBJECTS = ["The old sailor", "A young teacher", "My neighbour's cat", "The city council", "Every student",
            "The tired engineer", "Our small team", "The river", "A famous painter", "The morning train"]
ACTIONS = ["walked slowly to the harbour", "wrote a long letter", "forgot the meeting", "planted three trees",
           "solved the puzzle", "sang an old song", "missed the last bus", "found a silver coin",
           "opened the window", "counted the stars"]
ENDINGS = ["before dawn.", "after the storm.", "on a quiet Sunday.", "without a word.", "for the first time."]


def sentences(n: int) -> list[str]:
    """`n` different short sentences (10-20 tokens each), the same every run."""
    return [f"{SUBJECTS[i % 10]} {ACTIONS[(i // 10) % 10]} {ENDINGS[(i * 7) % 5]}" for i in range(n)]


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "unknown (no /proc/loadavg)"


def assert_same_numbers(batch, singles) -> float:
    """The largest log-prob difference; AssertionError when ids, ranks or numbers differ beyond TOLERANCE."""
    worst = 0.0
    for b, s in zip(batch, singles, strict=True):
        assert b.token_ids == s.token_ids and b.context == s.context, "the two paths scored different tokens"
        for x, y in zip(b.tokens, s.tokens, strict=True):
            assert x.rank == y.rank, f"rank differs at {x.token_text!r}: {x.rank} vs {y.rank}"
            assert abs(x.entropy - y.entropy) <= TOLERANCE, f"entropy differs at {x.token_text!r}"
            worst = max(worst, abs(x.logprob - y.logprob))
    assert worst <= TOLERANCE, f"log-probs differ by {worst:.3g} (> {TOLERANCE})"
    return worst


def batch_main(args: argparse.Namespace) -> None:
    from engine.research import LanguageModel

    texts = sentences(args.texts)
    load = {"backend": args.backend, "n_threads": args.threads}
    print(f"load before: {loadavg()}")
    with Engine.load(args.model, **load) as eng:
        eng.score(texts[0])  # warm-up
        t0 = time.perf_counter()
        singles = [eng.score(t) for t in texts]
        one_by_one = time.perf_counter() - t0
        device = eng.info.device
        floor = llamacpp_floor(eng, singles) if args.floor and eng.info.backend == "llamacpp" else None
    lm = LanguageModel.load(args.model, backend=args.backend, load_options={"n_threads": args.threads})
    try:
        lm.score(texts[:1])  # warm-up
        t0 = time.perf_counter()
        batch = lm.score(texts)
        batched = time.perf_counter() - t0
    finally:
        lm.close()
    worst = assert_same_numbers(batch, singles)
    n = sum(len(r.tokens) for r in batch)
    print(f"{device}: {len(texts)} texts, {n} tokens scored; {len(texts)} Engine.score calls {one_by_one:.2f} s "
          f"({one_by_one / len(texts) * 1000:.0f} ms each); LanguageModel.score {batched:.2f} s "
          f"({batched / len(texts) * 1000:.0f} ms each); largest log-prob difference {worst:.2g} (bound {TOLERANCE})")
    if floor is not None:
        each, joined, each_all, joined_all, threads = floor
        print(f"floor: llama-cpp-python's own Llama.eval of the same tokens ({threads} threads, only the last "
              f"position's logits): "
              f"{each:.2f} s one eval per text, {joined:.2f} s all in one eval; so no batching of these texts on "
              f"llama.cpp here can be faster than {one_by_one / joined:.2f}x the {len(texts)} Engine.score calls")
        print(f"batch_score_ceiling={one_by_one / joined:.2f}")
        print(f"floor with every scored position's logits (logits_all=True, what scoring must compute): "
              f"{each_all:.2f} s one eval per text, {joined_all:.2f} s all in one eval; "
              f"{one_by_one / joined_all:.2f}x the {len(texts)} Engine.score calls")
        print(f"batch_score_ceiling_all_logits={one_by_one / joined_all:.2f}")
        print(f"speedup over ceiling: {one_by_one / batched / (one_by_one / joined):.2f} (last logits only), "
              f"{one_by_one / batched / (one_by_one / joined_all):.2f} (all logits)")
    print(f"load after: {loadavg()}")
    print(f"batch_score_speedup={one_by_one / batched:.2f}")


def llamacpp_floor(eng: Engine, singles) -> tuple[float, float, float, float, int]:
    """llama.cpp's own `Llama.eval` of every text's forward (bench/llamacpp_floor.py): one eval per text, and every
    text's tokens joined in one eval (what the largest possible batch would compute); then the same two with every
    position's logits (`all_logits_eval_seconds`)."""
    from llamacpp_floor import llama_eval_seconds

    backend = eng.wait_ready()
    groups = [r.token_ids[:-1] for r in singles]  # the last token predicts nothing, so it is not run
    joined = [t for g in groups for t in g]
    each, one = llama_eval_seconds(str(backend.path), backend, [groups, [joined]])
    each_all, one_all = all_logits_eval_seconds(str(backend.path), backend, [groups, [joined]])
    return each, one, each_all, one_all, backend.n_threads


def all_logits_eval_seconds(path: str, backend, runs, repeat: int = 2) -> list[float]:
    """`llama_eval_seconds` on a `Llama` made with `logits_all=True`: every position of every eval asks for logits,
    and `Llama.eval` copies each row into its `scores` (the same file, context, batch, threads and kernels as
    bench/llamacpp_decode.py's `llama_class`). Scoring computes every one of these rows (each text's positions
    1..T-1 predict its tokens 2..T), so this is the bound that counts its unembedding too."""
    from llamacpp_floor import llama_eval_seconds

    return llama_eval_seconds(path, backend, runs, repeat, logits_all=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--backend", default=None, help="default: auto (batch), torch (--one-text)")
    p.add_argument("--texts", type=int, default=100, help="sentences scored (batch)")
    p.add_argument("--threads", type=int, default=None, help="llama.cpp threads for both sides (default: the engine's)")
    p.add_argument("--one-text", action="store_true", help="one text: one pass vs step by step")
    p.add_argument("--no-floor", dest="floor", action="store_false",
                   help="skip timing llama.cpp's own Llama.eval of the same tokens (bench/llamacpp_floor.py)")
    p.add_argument("--repeat", type=int, default=2, help="copies of the sample text (--one-text)")
    p.add_argument("--no-step", action="store_true", help="skip the (slow) step-by-step run (--one-text)")
    args = p.parse_args()
    if not args.one_text:
        args.backend = args.backend or "auto"
        batch_main(args)
        return
    args.backend = args.backend or "torch"
    text = TEXT * args.repeat
    with Engine.load(args.model, backend=args.backend) as eng:
        backend = eng.wait_ready()
        ids, context = text_ids(backend.tokenizer, text)
        one_pass, result = best_of_two(eng, lambda b: score(b, ids, context=context))
        n = len(result.tokens)
        print(f"{args.backend}: {n} tokens scored in one pass ({result.forward_calls} forward calls): "
              f"{one_pass:.2f} s ({one_pass / n * 1000:.1f} ms/token); perplexity {result.perplexity:.2f}")
        if not args.no_step:
            step, stepped = best_of_two(eng, lambda b: score_step_by_step(b, ids, context=context))
            print(f"step by step ({stepped.forward_calls} forward calls): {step:.2f} s "
                  f"({step / n * 1000:.1f} ms/token); perplexity {stepped.perplexity:.2f}; "
                  f"one pass is {step / one_pass:.1f}x faster")
        model = getattr(backend, "model", None)
        if args.backend == "torch" and model is not None:
            import torch

            def plain_forward(b):
                t = torch.tensor([ids], device=next(model.parameters()).device)
                with torch.inference_mode():
                    model(input_ids=t)
                    t0 = time.perf_counter()
                    model(input_ids=t)
                    return time.perf_counter() - t0

            full = eng.call(plain_forward).result()
            print(f"one plain forward over all {len(ids)} tokens: {full * 1000:.0f} ms "
                  f"(one pass adds the KV cache and the per-position sampler statistics: {one_pass / full:.1f}x that)")


if __name__ == "__main__":
    main()
