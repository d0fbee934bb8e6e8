"""CLI commands over the research APIs: beam search for `generate --num-beams`, and `batch`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from engine.errors import EngineError


def add_batch_parser(sub, add_model_args) -> None:
    b = sub.add_parser("batch", help="generate for every line of a file, in batches; write JSON lines")
    b.add_argument("--input", required=True, help="text file, one prompt per line")
    b.add_argument("--output", required=True, help="JSON-lines file: one record per prompt")
    b.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template")
    b.add_argument("--max-new-tokens", type=int, default=64)
    b.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    b.add_argument("--top-k", type=int, default=0)
    b.add_argument("--top-p", type=float, default=1.0)
    b.add_argument("--seed", type=int, default=None)
    b.add_argument("--batch-size", type=int, default=16)
    add_model_args(b)


def _load_lm(args: argparse.Namespace):
    from engine.research import LanguageModel

    return LanguageModel.load(args.model, backend=args.backend)


def cmd_beams(args: argparse.Namespace) -> int:
    """`generate --num-beams N`: print the best beams with their scores."""
    lm = _load_lm(args)
    try:
        tok = lm.tokenizer
        prompt = tok.chat_ids([{"role": "user", "content": args.prompt}]) if args.chat else tok.encode(args.prompt)
        results = lm.beam_search(prompt, num_beams=args.num_beams, max_new_tokens=args.max_new_tokens,
                                 num_return_sequences=args.num_return_sequences)
        for rank, r in enumerate(results):
            text = tok.decode([t for t in r.generated if t not in tok.eos_token_ids])
            prefix = f"[beam {rank + 1}, score {r.score:.3f}] " if len(results) > 1 else ""
            print(prefix + text)
        if len(results) == 1:
            print(f"[beam score {results[0].score:.3f}]", file=sys.stderr)
    finally:
        lm.close()
    return 0


def cmd_batch(args: argparse.Namespace) -> int:
    path = Path(args.input)
    if not path.is_file():
        raise EngineError(f"input file not found: {path}")
    prompts = [line.rstrip("\n") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise EngineError(f"{path} has no prompts (one per line)")
    lm = _load_lm(args)
    tok = lm.tokenizer
    written = 0
    try:
        with Path(args.output).open("w", encoding="utf-8") as out:
            for start in range(0, len(prompts), args.batch_size):
                chunk = prompts[start : start + args.batch_size]
                rows = [tok.chat_ids([{"role": "user", "content": p}]) if args.chat else tok.encode(p) for p in chunk]
                ids, logprobs = lm.generate_with_logprobs(
                    rows, max_new_tokens=args.max_new_tokens, do_sample=args.temperature > 0,
                    temperature=args.temperature or 1.0, top_k=args.top_k, top_p=args.top_p,
                    stop=sorted(tok.eos_token_ids), seed=args.seed,
                )
                width = ids.shape[1] - args.max_new_tokens
                for prompt, gen, lps in zip(chunk, ids[:, width:], logprobs):
                    n = int((~np.isnan(lps)).sum())
                    gen_ids = [int(t) for t in gen[:n]]
                    shown = [t for t in gen_ids if t not in tok.eos_token_ids]
                    record = {"prompt": prompt, "text": tok.decode(shown), "token_ids": gen_ids,
                              "logprobs": [round(float(x), 6) for x in lps[:n]]}
                    out.write(json.dumps(record, ensure_ascii=False) + "\n")
                    written += 1
                print(f"[{written}/{len(prompts)} prompts]", file=sys.stderr, flush=True)
    finally:
        lm.close()
    return 0

