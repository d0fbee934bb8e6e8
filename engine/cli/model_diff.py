"""`logitlab-cli compare-models`: two models on one text, token by token (engine/experiments/model_diff.py).

    logitlab-cli compare-models --model-b default --backend-b torch --text "..."   # the default GGUF vs its float32 twin
    logitlab-cli compare-models -m a.gguf --model-b b.gguf -f text.txt --output diff.jsonl

Model A takes the usual model options (`--model`, `--backend`, threads, ...); model B its own `--model-b`,
`--backend-b`, `--dtype-b`, `--device-b` (llama.cpp's thread and context options apply to both). Every value,
the text and the output path are checked before either model loads. Without `--output` a table goes to stdout;
with it the JSON lines (engine/experiments/model_diff_io.py) go to the file (`-` = stdout) and the summary to stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from engine.cli.options import USER_BACKENDS
from engine.errors import UsageError

COMMAND = "compare-models"


def add_model_diff_parser(sub: Any, add_model_args: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser(COMMAND, help="two models on one text: per-token KL, log-probs and ranks",
                       description="Score one text under two models and compare them token by token (same "
                                   "tokenizer: KL of the full next-token distributions) or by byte spans "
                                   "(different tokenizers). Model A is --model, model B --model-b.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the text to compare the models on")
    src.add_argument("-f", "--file", help="a UTF-8 text file (its final newline is dropped)")
    p.add_argument("--model-b", required=True, metavar="SPEC",
                   help='model B: a model folder, a .gguf file, a hub id, or "default" (the default model; with '
                        "--backend-b torch, its float32 twin converted from the GGUF)")
    p.add_argument("--backend-b", default="auto", choices=USER_BACKENDS, help="model B's runtime (default: as for -m)")
    p.add_argument("--dtype-b", default=None, choices=["float32", "bfloat16", "float16"], help="model B's torch dtype")
    p.add_argument("--device-b", default=None, help="model B's torch device (cpu, cuda, mps)")
    p.add_argument("--top", type=int, default=10, help="how many of the largest divergences to list (default 10)")
    p.add_argument("--top-n", type=int, default=5, help="alternatives kept per token and model (default 5)")
    p.add_argument("--output", default=None, help="write JSON lines here (- = stdout)")
    add_model_args(p)


def check_model_diff_args(args: argparse.Namespace) -> None:
    """What `check_args` does not know of this command: the text, --top, the output, model B. UsageError."""
    from engine.cli.input import STDIN, check_output_file, planned_backend, score_text

    args.text = score_text(args)  # --text or --file, never empty
    if not 0 <= args.top <= 10_000:
        raise UsageError(f"--top must be between 0 and 10,000, got {args.top}")
    if args.output not in (None, STDIN):
        check_output_file(args.output, "--output")
    b = model_b_args(args)
    try:
        planned_backend(b)
    except UsageError as e:
        raise UsageError(str(e).replace("--model:", "--model-b:").replace("--backend ", "--backend-b ")) from None


def model_b_args(args: argparse.Namespace) -> argparse.Namespace:
    """The namespace model B loads from: A's options with B's model, backend, dtype and device."""
    b = argparse.Namespace(**vars(args))
    b.model = None if args.model_b in ("default", "") else args.model_b
    b.backend, b.dtype, b.device, b.offload = args.backend_b, args.dtype_b, args.device_b, None
    b.chat_template = None
    return b


def cmd_compare_models(args: argparse.Namespace, load: Callable[[argparse.Namespace], Any]) -> int:
    from engine.experiments.model_diff import compare_models
    from engine.experiments.model_diff_io import diff_lines, diff_table
    from engine.experiments.trace import write_lines

    check_model_diff_args(args)
    with load(args) as engine_a, load(model_b_args(args)) as engine_b:
        diff = compare_models(engine_a, engine_b, args.text, top_n=args.top_n)
        if args.output is None:
            print("\n".join(diff_table(diff, top=args.top)))
            return 0
        lines = diff_lines(diff, top=args.top, text=args.text)
        if args.output == "-":
            write_lines(sys.stdout, lines)
        else:
            from engine.atomic_file import atomic_text_file

            with atomic_text_file(args.output) as out:
                write_lines(out, lines)
        print(f"[{diff.summary()}; {diff.seconds:.2f} s]", file=sys.stderr)
    return 0
