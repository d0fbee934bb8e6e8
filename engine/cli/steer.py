"""Steering on the command line: llama.cpp's control-vector flags, and `logitlab-cli steer train`.

generate / chat take llama.cpp's flags and meanings:

    --control-vector FILE               a vector at strength 1 (repeatable)
    --control-vector-scaled FILE SCALE  at strength SCALE (repeatable; FILE:SCALE also works)
    --control-vector-layer-range START END   the layers steered, both inclusive (default: 1 to the last)

and `steer train` makes a vector llama.cpp reads with `--control-vector`:

    logitlab-cli steer train --positive-file P --negative-file N --output v.gguf [--method pca|mean]
    logitlab-cli steer train --pairs happy-sad --output happy.gguf     (a built-in pair set)
    logitlab-cli steer train --pairs-file mine.jsonl --output mine.gguf

Files are read (and refused in one line) before the model loads; a vector
made for another model is refused in words before anything is generated.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from engine.errors import UsageError


class _ScaledVector(argparse.Action):
    """--control-vector-scaled FILE SCALE, or FILE:SCALE as newer llama.cpp writes it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        items = [str(v) for v in (values or [])]
        if len(items) == 1 and ":" in items[0]:
            items = items[0].rsplit(":", 1)
        if len(items) != 2:
            parser.error(f"{option_string} takes a file and a scale (FILE SCALE or FILE:SCALE), got {' '.join(items)!r}")
        found = getattr(namespace, self.dest, None) or []
        setattr(namespace, self.dest, [*found, (items[0], items[1])])


def add_steering_args(p: argparse.ArgumentParser) -> None:
    """llama.cpp's control-vector flags (generate, chat)."""
    p.add_argument("--control-vector", dest="control_vectors", action="append", default=[], metavar="FILE",
                   help="steer with this control-vector GGUF at strength 1 (llama.cpp's flag; repeatable)")
    p.add_argument("--control-vector-scaled", dest="control_vectors_scaled", action=_ScaledVector, nargs="+",
                   default=[], metavar="FILE SCALE", help="a control vector at strength SCALE (repeatable)")
    p.add_argument("--control-vector-layer-range", dest="control_vector_layers", nargs=2, type=int, default=None,
                   metavar=("START", "END"), help="the layers the control vectors steer, both inclusive (default: all)")


def _scale(text: str, path: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--control-vector-scaled {path}: the scale {text!r} is not a number") from None
    if not math.isfinite(value):
        raise UsageError(f"--control-vector-scaled {path}: the scale must be a finite number, got {text!r}")
    return value


def steering_from_args(args: argparse.Namespace) -> Any:
    """The `Steering` the flags ask for (None without any), every file read and checked; nothing loads a model."""
    plain = list(getattr(args, "control_vectors", None) or [])
    scaled = list(getattr(args, "control_vectors_scaled", None) or [])
    layers = getattr(args, "control_vector_layers", None)
    if not plain and not scaled:
        if layers is not None:
            raise UsageError("--control-vector-layer-range needs a --control-vector or --control-vector-scaled")
        return None
    if getattr(args, "num_beams", 1) > 1:
        raise UsageError("control vectors steer sampling; they do not apply to --num-beams")
    from engine.steering import Steering, SteeringEntry, load_vector

    entries = [SteeringEntry(load_vector(path), 1.0) for path in plain]
    entries += [SteeringEntry(load_vector(path), _scale(scale, path)) for path, scale in scaled]
    start, end = layers if layers is not None else (None, None)
    return Steering(tuple(entries), start, end)


def add_steer_parser(sub: Any, add_model_args: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("steer", help="steering vectors: train one from contrastive prompts (llama.cpp's GGUF)")
    steer_sub = p.add_subparsers(dest="steer_command", required=True)
    t = steer_sub.add_parser("train", help="train a control vector from positive and negative prompts (repeng's method)")
    t.add_argument("--positive-file", default=None, metavar="FILE", help="positive prompts, one a line")
    t.add_argument("--negative-file", default=None, metavar="FILE", help="negative prompts, one a line (the n-th lines pair)")
    t.add_argument("--pairs-file", default=None, metavar="FILE.jsonl",
                   help='pairs as JSONL lines {"positive": "...", "negative": "..."}')
    t.add_argument("--pairs", default=None, metavar="NAME", help="a built-in pair set (happy-sad, formal-casual, "
                                                                   "concise-verbose, calm-angry)")
    t.add_argument("--limit", type=int, default=None, metavar="N", help="train on the first N pairs only")
    t.add_argument("--method", default="pca", choices=["pca", "mean"],
                   help="pca: first principal component of the differences (repeng's pca_diff); mean: mean difference")
    t.add_argument("-o", "--output", required=True, metavar="FILE.gguf", help="where to write the control vector")
    t.add_argument("--name", default=None, help="the vector's name (default: the output file's stem)")
    add_model_args(t)


def _pair_set(args: argparse.Namespace) -> Any:
    from engine.steering import builtin_pair_sets, read_pair_files, read_pairs_jsonl
    from engine.steering.pairs import check_distinct, check_pair_count

    given = [x for x in (args.pairs, args.pairs_file, args.positive_file or args.negative_file) if x]
    if len(given) != 1:
        raise UsageError("give the pairs one way: --positive-file and --negative-file, --pairs-file, or --pairs NAME")
    if args.pairs:
        sets = builtin_pair_sets()
        if args.pairs not in sets:
            raise UsageError(f"no built-in pair set {args.pairs!r}; there are {', '.join(sorted(sets))}")
        pairs = sets[args.pairs]
    elif args.pairs_file:
        pairs = read_pairs_jsonl(args.pairs_file)
    else:
        if not (args.positive_file and args.negative_file):
            raise UsageError("give both --positive-file and --negative-file")
        pairs = read_pair_files(args.positive_file, args.negative_file)
    if args.limit is not None:
        if args.limit < 1:
            raise UsageError(f"--limit must be 1 or more, got {args.limit}")
        pairs = pairs.limited(args.limit)
    check_pair_count(pairs, "--limit N trains on the first N")
    check_distinct(pairs.texts(), pairs.name)
    return pairs


def refuse_long_pairs_before_load(args: argparse.Namespace, pairs: Any) -> None:
    """Pairs with a prompt longer than the model's context (or the same tokens on both sides), refused before the
    model loads where its tokenizer loads without the weights (a .gguf: engine.backends.select.cheap_tokenizer),
    by the check training makes (engine.steering.train.check_token_pairs). Elsewhere training refuses them."""
    from engine.backends.select import cheap_tokenizer
    from engine.cli.experiments import model_context_before_load
    from engine.cli.token_count import clearly_over
    from engine.errors import EngineError
    from engine.steering.errors import SteeringError
    from engine.steering.train import check_token_pairs, too_long

    if pairs.personas is not None:  # a built-in set: short sentences through the chat template, checked in training
        return
    opening = cheap_tokenizer(args.model, args.backend)
    if opening is None:
        return
    context = model_context_before_load(args)
    try:
        with opening as tokenizer:
            for i, texts in enumerate(pairs.texts(), 1):  # a huge prompt is not tokenized whole to be refused
                for side, text in zip(("positive", "negative"), texts):
                    if over := clearly_over(tokenizer, text, context):
                        raise UsageError(str(too_long(i, pairs.name, side, over.describe(),
                                                      f"at least {over.tokens - context:,}", context)))
            token_pairs = pairs.token_pairs(tokenizer)
    except EngineError as e:  # the vocabulary could not be read: the model's load says why, in its own words
        if isinstance(e, UsageError):
            raise
        return
    try:
        check_token_pairs(token_pairs, pairs.name, context)
    except SteeringError as e:
        raise UsageError(str(e)) from None


class _TrainProgress:
    """`[steer train: 64 of 400 prompts read]` on stderr, at most once a second and once at the end."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s, self.last = every_s, time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - self.last >= self.every_s:
            self.last = now
            print(f"[steer train: {done:,} of {total:,} prompts read]", file=sys.stderr, flush=True)


def cmd_steer(args: argparse.Namespace, load: Callable[[argparse.Namespace], Any]) -> int:
    from pathlib import Path

    from engine.steering import save_vector

    pairs = _pair_set(args)  # read and checked before the model loads
    output = Path(args.output)
    if output.is_dir():
        raise UsageError(f"--output {output} is a folder; give a file name such as happy.gguf")
    refuse_long_pairs_before_load(args, pairs)
    with load(args) as engine:
        t0 = time.perf_counter()
        vector = engine.train_steering_vector(pairs, method=args.method, name=args.name or output.stem,
                                              progress=_TrainProgress())
        seconds = time.perf_counter() - t0
    save_vector(vector, output)
    print(f"wrote {output}: {vector.n_layer - 1} layers of width {vector.n_embd} ({vector.model_hint or 'model'}), "
          f"{len(pairs)} pairs, {args.method}, {seconds:.1f} s; sha256 {vector.digest}", file=sys.stderr)
    return 0
