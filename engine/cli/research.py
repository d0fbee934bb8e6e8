"""CLI commands over the research APIs: beam search for `generate --num-beams`, and `batch`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.decode.loop import check_context
from engine.errors import ContextLengthError

if TYPE_CHECKING:
    from engine.cli.options import OneLineParser
    from engine.research import LanguageModel


def add_batch_parser(sub: argparse._SubParsersAction[OneLineParser],
                     add_model_args: Callable[[argparse.ArgumentParser], None]) -> None:
    b = sub.add_parser("batch", help="generate for every line of a file, in batches; write JSON lines",
                       description="Exit status 0 when every prompt ran, 1 when some got an error record "
                                   "(e.g. too long for the model's context), 2 for unusable options.")
    b.add_argument("--input", required=True, help="text file, one prompt per line")
    b.add_argument("--output", required=True, help="JSON-lines file: one record per prompt")
    b.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template")
    b.add_argument("-n", "--predict", "--n-predict", "--max-new-tokens", dest="max_new_tokens", type=int, default=64)
    # Greedy unless asked: a batch is for reproducible records (the research API's generate, transformers' knobs).
    b.add_argument("--temp", "--temperature", dest="temperature", type=float, default=0.0, help="0 = greedy (the default here)")
    b.add_argument("--top-k", type=int, default=0)
    b.add_argument("--top-p", type=float, default=1.0)
    b.add_argument("-s", "--seed", type=int, default=None)
    b.add_argument("--batch-size", type=int, default=16)
    add_model_args(b)


def _load_lm(args: argparse.Namespace) -> LanguageModel:
    from engine.cli.input import runtime_settings_from
    from engine.research import LanguageModel

    options = dict(device=args.device, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    if args.offload is not None:
        options["offload"] = args.offload
    options.update(runtime_settings_from(args).load_kwargs())  # --threads, --n-ctx, --n-gpu-layers, --n-batch
    return LanguageModel.load(args.model, backend=args.backend, load_options=options)


def _messages(args: argparse.Namespace, prompt: str) -> list[dict]:
    system = getattr(args, "system", None)
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


def cmd_beams(args: argparse.Namespace) -> int:
    """`generate --num-beams N`: print the best beams with their scores."""
    lm = _load_lm(args)
    try:
        tok = lm.tokenizer
        prompt = tok.chat_ids(_messages(args, args.prompt)) if args.chat else tok.encode(args.prompt)
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
    """Generate for each prompt of `args.prompts` (read and checked by `engine.cli.input.check_args`).

    Each prompt is tokenized and checked against the context before any
    forward pass; one that does not fit gets an error record in its place
    and the others still run. Records keep the input order.
    """
    prompts: list[str] = args.prompts
    lm = _load_lm(args)
    tok = lm.tokenizer
    written = failed = 0
    try:
        rows: list[list[int] | str] = []  # token ids, or why the prompt cannot run
        for p in prompts:
            ids = tok.chat_ids(_messages(args, p)) if args.chat else tok.encode(p)
            try:
                check_context(len(ids), args.max_new_tokens, lm.context_length)
                rows.append(ids)
            except ContextLengthError as e:
                rows.append(str(e))
        with Path(args.output).open("w", encoding="utf-8") as out:
            for start in range(0, len(prompts), args.batch_size):
                chunk = list(zip(prompts[start : start + args.batch_size], rows[start : start + args.batch_size]))
                runnable = [ids for _, ids in chunk if not isinstance(ids, str)]
                results = iter(_generate(lm, args, runnable) if runnable else ())
                for prompt, row in chunk:
                    record = {"prompt": prompt, "error": row} if isinstance(row, str) else {"prompt": prompt, **next(results)}
                    failed += isinstance(row, str)
                    out.write(json.dumps(record, ensure_ascii=False) + "\n")
                    written += 1
                print(f"[{written}/{len(prompts)} prompts]", file=sys.stderr, flush=True)
    finally:
        lm.close()
    if failed:
        print(f"error: {failed} of {len(prompts)} prompts did not run (their records in {args.output} say why)",
              file=sys.stderr)
        return 1
    return 0


def _generate(lm: LanguageModel, args: argparse.Namespace, rows: list[list[int]]) -> list[dict]:
    """One batched generation; a record body (text, token ids, logprobs) per row."""
    tok = lm.tokenizer
    ids, logprobs = lm.generate_with_logprobs(
        rows, max_new_tokens=args.max_new_tokens, do_sample=args.temperature > 0,
        temperature=args.temperature or 1.0, top_k=args.top_k, top_p=args.top_p,
        stop=sorted(tok.eos_token_ids), seed=args.seed,
    )
    width = ids.shape[1] - args.max_new_tokens
    bodies = []
    for gen, lps in zip(ids[:, width:], logprobs):
        n = int((~np.isnan(lps)).sum())
        gen_ids = [int(t) for t in gen[:n]]
        shown = [t for t in gen_ids if t not in tok.eos_token_ids]
        bodies.append({"text": tok.decode(shown), "token_ids": gen_ids, "logprobs": [round(float(x), 6) for x in lps[:n]]})
    return bodies
