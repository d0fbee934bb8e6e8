"""`logitlab-cli lens`: what each layer predicts for one token of a prompt (the logit lens), as a table.

    logitlab-cli lens --prompt "The capital of Germany is" [--position N] [--top-k K] [--output trace.jsonl]

A position is the index of a predicted token among the prompt's tokens
(1..len); the default is the next token after the prompt. Each row is a
decoder layer: the target token's probability and rank there, then the
layer's top-k tokens. With `--output` the view is also written as a JSONL
trace (engine.experiments.trace: a `lens` run whose token line carries `layers`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.capabilities import LayerLens, require
from engine.layer_capture import LayerCapture
from engine.errors import UsageError

if TYPE_CHECKING:
    from engine.cli.options import OneLineParser
    from engine.backend import Backend

DEFAULT_TOP_K = 5


def add_lens_parser(
    sub: argparse._SubParsersAction[OneLineParser], add_model_args: Callable[[argparse.ArgumentParser], None]
) -> None:
    p = sub.add_parser("lens", help="what each layer predicts for a token of the prompt (logit lens)")
    p.add_argument("-p", "--prompt", required=True, help="the text whose token is looked at")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--position", type=int, default=None, metavar="N",
                   help="index of the predicted token among the prompt's tokens (default: the next token after it)")
    p.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, help="tokens shown per layer")
    p.add_argument("--output", default=None, help="also write the view as a JSONL trace here (- = stdout)")
    add_model_args(p)


def _cell(text: str, logprob: float, width: int = 18) -> str:
    import math

    shown = repr(text)[1:-1]
    shown = shown if len(shown) <= width - 7 else shown[: width - 8] + "…"
    return f"{shown:<{width - 7}} {100 * math.exp(logprob):5.1f}%"


def format_table(capture: Any, decode: Callable[[list[int]], str]) -> list[str]:
    """The layer view as text lines: one row per layer, the target's probability and rank, then the top tokens."""
    target = repr(decode([capture.target_id]))
    lines = [f"position {capture.position}: target {target} (id {capture.target_id})",
             f"{'layer':>5}  {'p(target)':>9}  {'rank':>6}  top tokens"]
    for i, layer in enumerate(capture.layers):
        tops = "  ".join(_cell(decode([t]), lp) for t, lp in layer.top)
        lines.append(f"{i:>5}  {100 * layer.target_prob:8.2f}%  {layer.target_rank + 1:>6}  {tops}")
    first = capture.first_top1_layer
    lines.append(f"first layer where {target} is the top token: "
                 f"{first if first is not None else 'none (never top-1)'} of {capture.n_layers}")
    return lines


def cmd_lens(args: argparse.Namespace, load: Callable[[argparse.Namespace], Any]) -> int:
    from engine.cli.input import check_output_file

    if args.top_k < 1:
        raise UsageError(f"--top-k must be at least 1, got {args.top_k}")
    if args.position is not None and args.position < 1:
        raise UsageError(f"--position must be at least 1 (the index of a predicted token), got {args.position}")
    if args.output not in (None, "-"):
        check_output_file(args.output, "--output")  # before the model loads
    with load(args) as engine:
        tok = engine.tokenizer
        messages = [{"role": "user", "content": args.prompt}]
        ids = list(tok.chat_ids(messages) if args.chat else tok.encode(args.prompt))
        position = len(ids) if args.position is None else args.position
        if not 1 <= position <= len(ids):
            raise UsageError(f"--position {position} is outside 1..{len(ids)} (the prompt is {len(ids)} tokens; "
                             f"{len(ids)} is the next token after it)")

        def work(backend: Backend) -> LayerCapture:  # on the model's worker thread
            lens = require(backend, LayerLens, "the layer view")
            return lens.layer_capture(ids, [position], top_k=args.top_k)[0]

        capture = engine.call(work).result()
        for line in format_table(capture, tok.decode):
            print(line)
        if args.output is not None:
            _write_trace(args.output, engine.info, ids, capture)
    return 0


def _write_trace(path: str, info: Any, ids: list[int], capture: Any) -> None:
    from engine.experiments.trace import header, layer_view_dict, write_lines

    token = {"type": "token", "index": capture.position, "token_id": capture.target_id,
             "layers": layer_view_dict(capture)}
    lines = [header(kind="lens", model=info, prompt_ids=ids), token, {"type": "end"}]
    if path == "-":
        write_lines(sys.stdout, lines)
    else:
        with open(path, "w", encoding="utf-8") as f:
            write_lines(f, lines)
