"""CLI commands for sampling experiments: `score` (teacher-forced surprisal of a text) and `compare`.

Without `--output` a readable report goes to stdout; with `--output F` the
JSONL trace (docs/experiments.md) goes to F (`-` = stdout) and a one-line
summary to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from engine.errors import EngineError, UsageError

if TYPE_CHECKING:
    from engine.cli.options import OneLineParser
    from engine.sampling.settings import SamplerSettings

MAX_SETTINGS_FILE_BYTES = 1 << 20


def add_experiment_parsers(
    sub: argparse._SubParsersAction[OneLineParser], add_model_args: Callable[[argparse.ArgumentParser], None]
) -> None:
    s = sub.add_parser("score", help="how surprising a text is to the model, token by token (teacher-forced)",
                       description="Each token's surprisal and rank (rank 1 is the model's most likely token).")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the text to score")
    src.add_argument("-f", "--file", help="a UTF-8 text file to score (its final newline is dropped, as with -f in generate); "
                                          'a .jsonl file holds one item per line -- "a text", {"text": ...} or '
                                          '{"context": ..., "continuation": ...}, optionally with "id" -- all scored on '
                                          "one model context, one trace run per item")
    s.add_argument("--top-n", type=int, default=5, help="alternatives per position")
    s.add_argument("--output", default=None, help="write a JSONL trace here (- = stdout)")
    add_model_args(s)

    c = sub.add_parser("compare", help="one prompt under several sampler settings, same seed, aligned tokens")
    c.add_argument("-p", "--prompt", required=True)
    c.add_argument("--settings", action="append", required=True, metavar="JSON",
                   help="a JSON file (or inline JSON object) of sampler settings, e.g. {\"temperature\": 0.7}; "
                        "give it 2 or more times")
    c.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    c.add_argument("-s", "--seed", type=int, default=None, help="shared seed for columns that set none (default: random)")
    c.add_argument("-n", "--predict", "--n-predict", "--max-new-tokens", dest="max_new_tokens", type=int, default=64)
    c.add_argument("--top-n", type=int, default=5, help="alternatives per token in the trace")
    c.add_argument("--output", default=None, help="write a JSONL trace here (- = stdout)")
    add_model_args(c)


def load_settings(arg: str) -> SamplerSettings:
    """Sampler settings from a JSON file or an inline JSON object; ValueError with the reason otherwise."""
    from engine.sampling.settings import SamplerSettings

    text = arg
    inline = arg.lstrip()[:1] in ("{", "[", '"') or arg.strip() in ("null", "true", "false") or _is_number(arg)
    if not inline:
        path = Path(arg)
        if path.is_dir():
            raise EngineError(f"settings file {path} is a folder; give a JSON file or an inline JSON object")
        if not path.is_file():
            raise EngineError(f"settings file not found: {path} (or give the settings inline, e.g. "
                              '\'{"temperature": 0.7}\')')
        if path.stat().st_size > MAX_SETTINGS_FILE_BYTES:
            raise EngineError(f"settings file {path} is larger than 1 MiB; it should hold one JSON object")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"settings file {path} is not UTF-8 text (byte {e.start} cannot be read); "
                             "it should hold one JSON object") from None
    where = f"settings file {arg}" if not inline else f"settings {arg!r}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not valid JSON: {e}") from None
    except RecursionError:
        raise ValueError(f"{where} is nested too deeply to read; it should hold one flat JSON object") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a JSON object of sampler fields, e.g. {{\"temperature\": 0.7}}; "
                         f"it holds {type(data).__name__ if data is not None else 'null'}")
    try:
        return SamplerSettings.from_dict(data)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@contextmanager
def _output(path: str | None) -> Iterator[TextIO]:
    if path in (None, "-"):
        yield sys.stdout
        return
    with open(path, "w", encoding="utf-8") as f:
        yield f


def _non_default(settings: SamplerSettings) -> dict[str, Any]:
    """The fields that differ from the defaults, and the seed (what a reader needs to tell columns apart)."""
    default = type(settings)().to_dict()
    return {k: v for k, v in settings.to_dict().items() if k == "seed" or v != default[k]}


def model_context_before_load(args: argparse.Namespace) -> int:
    """The context the model will have, as far as it is known before loading: -c/--ctx-size, else a GGUF file's
    own header (0 when neither says; the loaded model's check then decides)."""
    from engine.cli.input import _gguf_context_length

    return int(getattr(args, "n_ctx", None) or 0) or _gguf_context_length(args)


def refuse_before_load(args: argparse.Namespace, items: list[Any],
                       progress: Callable[[int], None] | None = None) -> list[tuple[list[int], int]] | None:
    """Texts to score (`--text`, one `--file`, or a .jsonl's items) of fewer than two tokens or longer than the
    model's context, refused before the model loads where its tokenizer loads without the weights (a .gguf on
    llama.cpp: engine.backends.select.cheap_tokenizer), by the check the loaded model makes
    (engine.experiments.score.check_token_count) and in its words, so a 10 MB text is one line, not a scoring
    context sized for it. Elsewhere (a torch or MLX folder, a server) the loaded model refuses it.

    Returns the items' (token ids, context) when it made them (the vocabulary is the loaded model's, so scoring
    reuses them), else None; `progress(done)` after each item (tokenizing 100,000 items takes a minute)."""
    from engine.backends.select import cheap_tokenizer
    from engine.cli.token_count import clearly_over
    from engine.experiments.batch_score import ScoreItem, item_ids
    from engine.experiments.score import check_token_count

    opening = cheap_tokenizer(args.model, args.backend)
    if opening is None:
        return None
    limit = model_context_before_load(args)
    made: list[tuple[list[int], int]] = []
    try:
        with opening as tokenizer:
            for i, item in enumerate(items):
                item = ScoreItem(text=item) if isinstance(item, str) else item
                try:
                    for part in (item.text, item.context, item.continuation):
                        if part and (over := clearly_over(tokenizer, part, limit)):  # a huge text: from its start
                            check_token_count(over.tokens, limit, at_least=over.describe())
                    ids, context = item_ids(tokenizer, item)
                    check_token_count(len(ids), limit)
                except ValueError as e:  # ContextLengthError is one; the wording is the loaded model's
                    raise UsageError(f"item {i}: {e}" if len(items) > 1 else str(e)) from None
                made.append((ids, context))
                if progress is not None:
                    progress(i + 1)
    except UsageError:
        raise
    except EngineError:  # the vocabulary could not be read: the model's load says why, in its own words
        return None
    return made


def cmd_score(args: argparse.Namespace, load: Callable[[argparse.Namespace], Any]) -> int:
    from engine.experiments.trace import score_run, write_lines

    if getattr(args, "items", None) is not None:  # --file X.jsonl
        return cmd_score_batch(args, load)
    text = args.text  # read and checked before the model loads (engine.cli.input.score_text)
    refuse_before_load(args, [text])
    with load(args) as engine:
        result = engine.score(text, top_n=args.top_n)
        summary = f"[{result.summary(engine.info.reports_top_n)}]"  # says why when the perplexity is inf
        if args.output is not None:
            with _output(args.output) as out:
                write_lines(out, score_run(result, model=engine.info, text=text))
            print(summary, file=sys.stderr)
            return 0
        for t in result.tokens:
            alts = ", ".join(f"{a.text!r} {a.prob:.3f}" for a in t.top if a.token_id != t.token_id)
            print(f"{t.token_text!r:>16} {t.surprisal_bits:6.2f} bits rank={t.rank + 1:<5} | {alts}")
        print(summary)
    return 0


class _Progress:
    """`[scored 1,200 of 100,000 items]` on stderr, at most once a second and once at the end."""

    def __init__(self, total: int, verb: str = "scored", every_s: float = 1.0) -> None:
        self.total, self.verb, self.every_s = total, verb, every_s
        self.last = time.monotonic()

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if done == self.total or now - self.last >= self.every_s:
            self.last = now
            print(f"[{self.verb} {done:,} of {self.total:,} items]", file=sys.stderr, flush=True)


def cmd_score_batch(args: argparse.Namespace, load: Callable[[argparse.Namespace], Any]) -> int:
    """`score --file X.jsonl`: every item on one scoring context; a trace run per item, or a line per item.

    Each item's lines are written (and flushed) as soon as it is scored, with progress on stderr, so a long
    batch shows its results as it goes and an interrupted one keeps what it did."""
    from engine.experiments.batch_score import each_score, each_score_ids, item_fields
    from engine.experiments.trace import score_run, write_lines

    items = args.items
    # Tokenized once, before the load, with the model's own vocabulary where it opens alone (a .gguf), with a
    # line a second on stderr for a long batch; elsewhere each_score tokenizes them once loaded.
    token_items = refuse_before_load(args, items, _Progress(len(items), "tokenized") if len(items) > 1000 else None)
    progress = _Progress(len(items))
    tokens = 0

    with load(args) as engine, ExitStack() as files:
        info = engine.info
        out: TextIO | None = None  # opened at the first result: an item refused after the load truncates nothing

        def write_all(backend: Any) -> int:
            nonlocal tokens, out
            n = 0
            results = each_score(backend, items, top_n=args.top_n) if token_items is None \
                else each_score_ids(backend, token_items, top_n=args.top_n)
            for n, (item, r) in enumerate(zip(items, results), 1):
                i = n - 1
                tokens += len(r.tokens)
                out = out or files.enter_context(_output(args.output))
                if args.output is not None:
                    write_lines(out, score_run(r, model=info, **item_fields(item, i)))
                else:
                    name = f"item {i}" + (f" ({item.id})" if item.id is not None else "")
                    print(f"{name}: total log-prob {r.total_logprob:.3f}; {r.summary(info.reports_top_n)}", file=out)
                out.flush()
                progress(n)
            return n

        done = engine.call(write_all).result()
        summary = f"[{done} items, {tokens} tokens scored]"
        print(summary, file=sys.stderr if args.output is not None else sys.stdout)
    return 0


def cmd_compare(args: argparse.Namespace, load: Callable[[argparse.Namespace], Any]) -> int:
    from engine.experiments.trace import generation_run, write_lines
    from engine.request import GenerationRequest

    settings = [load_settings(s) for s in args.settings]
    if len(settings) < 2:
        raise ValueError("compare needs --settings at least twice (one per column)")
    common = dict(max_new_tokens=args.max_new_tokens, top_n=args.top_n, record_stages=True)
    if args.chat:
        request = GenerationRequest(messages=({"role": "user", "content": args.prompt},), **common)
    else:
        request = GenerationRequest(prompt=args.prompt, **common)
    with load(args) as engine:
        result = engine.compare(request, settings, seed=args.seed)
        div = result.first_divergence
        if args.output is not None:
            lines = []
            for i, col in enumerate(result.columns):
                lines += generation_run(
                    model=engine.info, prompt_ids=result.prompt_ids, settings=col.settings, seed=col.settings.seed,
                    events=col.events, stats=col.stats, column=i, prompt=args.prompt,
                    end={"summary": col.summary.to_dict(), "first_divergence": div},
                )
            with _output(args.output) as out:
                write_lines(out, lines)
            print(f"[{len(result.columns)} columns; first divergence at index {div}; "
                  f"prompt {len(result.prompt_ids)} tokens, {result.prefilled_tokens} computed]", file=sys.stderr)
            return 0
        for i, col in enumerate(result.columns):
            s = col.summary
            print(f"--- column {i + 1}: {json.dumps(_non_default(col.settings))}")
            print(col.stats.text)
            print(f"[{s.length} tokens, {s.finish_reason}; {s.mean_surprisal_bits:.2f} bits/token; "
                  f"entropy {s.mean_entropy:.2f} nats; distinct-2 {s.distinct_2:.2f}; "
                  f"repeated 3-grams {s.repeated_ngrams}; {s.tokens_per_s:.1f} tok/s]")
        print(f"first divergence: {'none (identical)' if div is None else f'token {div + 1} (index {div})'}")
    return 0
