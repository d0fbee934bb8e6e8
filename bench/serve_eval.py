"""What an evaluator's log-likelihood run costs through the server, against the same scores in-process.

    python bench/serve_eval.py [--model SPEC] [--items 100] [--batch-size 16] [--max-tokens 1] [--threads N]

A 100-item loglikelihood task as lm-eval's `local-completions` sends it (engine/serve/scoring.py): each request
`{"prompt": [token ids, ...batch], "echo": true, "logprobs": 1, "max_tokens": 1, "temperature": 0, "seed": 1234}`,
one after another (its default `num_concurrent=1`), read back with lm-eval's own `parse_logprobs` when lm-eval is
installed (`token_logprobs[ctxlen:-1]`: the continuation's tokens, the generated one dropped). Against it: the
same texts through `LanguageModel.score` in-process (every text on the model's one batch runner). The
continuations' log-likelihoods are asserted equal (|d| <= 1e-4); prints `ratio_eval_vs_direct=` (direct time /
served time; 1.0: the server costs nothing more) with the machine's load, since on a shared machine both sides'
compute grows with it. `--max-tokens 0` asks for the scores only (no answer token): the scoring path alone.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from score import loadavg, sentences  # noqa: E402

TOLERANCE = 1e-4


def items(n: int) -> list[tuple[str, str]]:
    """(context, continuation) pairs: a sentence cut before its last two words."""
    out = []
    for s in sentences(n):
        words = s.split(" ")
        out.append((" ".join(words[:-2]), " " + " ".join(words[-2:])))
    return out


def parse(doc: dict, ctxlens: list[int]) -> list[float]:
    try:
        from lm_eval.models.openai_completions import LocalCompletionsAPI
    except ImportError:  # the same slice lm-eval reads
        return [sum(c["logprobs"]["token_logprobs"][k:-1]) for c, k in zip(doc["choices"], ctxlens)]
    return [lp for lp, _ in LocalCompletionsAPI.parse_logprobs(doc, ctxlens=ctxlens)]


def served(args: argparse.Namespace, pairs: list[tuple[str, str]]) -> tuple[float, list[float], list[int]]:
    """The served run's time, the continuations' log-likelihoods, and each context's token count."""
    from engine import Engine
    from engine.serve import start_server

    with Engine.load(args.model, n_threads=args.threads) as eng:
        server = start_server(eng)
        try:
            tok = eng.tokenizer
            encoded = []
            for ctx, cont in pairs:  # lm-eval's split: the whole text's tokens, the context's count
                whole = tok.encode(ctx + cont, add_special_tokens=False)
                encoded.append((whole, len(tok.encode(ctx, add_special_tokens=False))))
            with httpx.Client(timeout=600) as client:
                def send(batch: list[tuple[list[int], int]]) -> list[float]:
                    r = client.post(f"{server.url}/completions", json={
                        "model": eng.info.name, "prompt": [ids for ids, _ in batch], "temperature": 0,
                        "max_tokens": args.max_tokens, "logprobs": 1, "seed": 1234, "echo": True})
                    r.raise_for_status()
                    doc = r.json()
                    if args.max_tokens == 0:  # no answer token at the end: lm-eval's slice would drop a prompt token
                        return [sum(c["logprobs"]["token_logprobs"][k:]) for c, k in
                                zip(doc["choices"], (k for _, k in batch))]
                    return parse(doc, [k for _, k in batch])

                send(encoded[:2])  # warm-up
                got: list[float] = []
                t0 = time.perf_counter()
                for i in range(0, len(encoded), args.batch_size):
                    got += send(encoded[i:i + args.batch_size])
                return time.perf_counter() - t0, got, [k for _, k in encoded]
        finally:
            server.stop()


def direct(args: argparse.Namespace, pairs: list[tuple[str, str]], ctxlens: list[int]) -> tuple[float, list[float]]:
    from engine.research import LanguageModel

    lm = LanguageModel.load(args.model, load_options={"n_threads": args.threads})
    try:
        texts = [a + b for a, b in pairs]
        lm.score(texts[:2], top_n=1)  # warm-up
        t0 = time.perf_counter()
        results = lm.score(texts, top_n=1)
        took = time.perf_counter() - t0
    finally:
        lm.close()
    # Position k of the text predicts token k; the continuation starts at token ctxlen.
    return took, [sum(t.logprob for t in r.tokens if t.index >= k) for r, k in zip(results, ctxlens)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--items", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=16, help="prompts per request (lm-eval's batch_size)")
    p.add_argument("--max-tokens", type=int, default=1, help="answer tokens per prompt (lm-eval asks for 1)")
    p.add_argument("--threads", type=int, default=None, help="llama.cpp threads on both sides (default: the engine's)")
    args = p.parse_args()
    pairs = items(args.items)
    print(f"load before: {loadavg()}")
    served_s, served_lls, ctxlens = served(args, pairs)
    direct_s, direct_lls = direct(args, pairs, ctxlens)
    worst = max(abs(a - b) for a, b in zip(served_lls, direct_lls, strict=True))
    assert worst <= TOLERANCE, f"the served log-likelihoods differ from the direct ones by {worst:.3g}"
    print(f"{len(pairs)} items, {args.batch_size} a request: served (echo, max_tokens {args.max_tokens}; lm-eval sends 1) "
          f"{served_s:.2f} s; LanguageModel.score in-process {direct_s:.2f} s; largest difference {worst:.2g}")
    print(f"load after: {loadavg()}")
    print(f"ratio_eval_vs_direct={direct_s / served_s:.2f}")


if __name__ == "__main__":
    main()
