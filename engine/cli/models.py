"""`logitlab-cli models` (the model library: what is on this machine) and `logitlab-cli pull` (download one).

Neither loads a model: `models` reads headers and config files, `pull`
downloads with a progress bar on stderr (Ctrl-C stops it; a .gguf address
resumes where it stopped on the next pull).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from engine.errors import EngineError, UsageError
from engine.library.entry import LibraryEntry, printable
from engine.library.progress import CancelToken, DownloadProgress, format_bytes

if TYPE_CHECKING:
    from engine.cli.options import OneLineParser

EXIT_CANCELLED = 130
EXIT_FAILED = 1
BAR_WIDTH = 24
LINE_EVERY_S = 2.0  # not a terminal (a log file): one line this often instead of a redrawn bar


def add_library_parsers(sub: argparse._SubParsersAction[OneLineParser]) -> None:
    m = sub.add_parser("models", help="list the models on this machine (LM Studio, Ollama, Hugging Face cache, ...)")
    m.add_argument("--folder", action="append", default=[], metavar="PATH",
                   help="also look in this folder (repeatable; $LOGITLAB_MODEL_FOLDERS adds folders too)")
    m.add_argument("--search", default="", metavar="WORDS", help="only models whose name, source or path has these words")
    m.add_argument("--json", action="store_true", help="one JSON object per model, for scripts")
    p = sub.add_parser("pull", help="download a model: org/name, org/name:Q4_K_M, org/name/file.gguf or a .gguf URL")
    p.add_argument("what", help="a hub id (org/name, org/name:QUANT, org/name/file.gguf) or an http(s) address of a .gguf file")
    p.add_argument("--sha256", default=None, metavar="HEX", help="the file's SHA-256, checked after download (a .gguf address)")
    p.add_argument("--if-exists", choices=("refuse", "keep-both", "replace"), default="refuse",
                   help="when a .gguf address's file name is already in the models folder: refuse (default), "
                        "keep both (the new file gets a number) or replace it")


def _params(n: int) -> str:
    if not n:
        return "?"
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}".replace(".0", "")
    return str(n)


def _row(e: LibraryEntry) -> list[str]:
    f = e.facts
    memory = f"{format_bytes(e.memory_bytes)} {e.fit}" if e.memory_bytes else e.fit
    return [e.name, e.source_name, f.architecture or "?", _params(f.parameters), f.quantization or "?",
            format_bytes(e.file_bytes) if e.file_bytes else "?", f"{f.context_length:,}" if f.context_length else "?",
            memory, e.backend]


HEADINGS = ["NAME", "SOURCE", "ARCH", "PARAMS", "QUANT", "SIZE", "CONTEXT", "MEMORY", "BACKEND"]


def format_table(entries: list[LibraryEntry]) -> list[str]:
    rows = [HEADINGS] + [_row(e) for e in entries]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADINGS))]
    lines = []
    for row, entry in zip(rows, [None, *entries]):
        line = "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
        if entry is not None:
            line += f"\n    {entry.problem and 'cannot be opened: ' + entry.problem or 'open: --model ' + _quote(printable(entry.spec))}"
        lines.append(line)
    return lines


def _quote(spec: str) -> str:
    return f"'{spec}'" if any(c.isspace() for c in spec) else spec


def _as_json(e: LibraryEntry) -> str:
    f = e.facts
    return json.dumps({
        "name": e.name, "source": e.source, "format": e.format, "path": str(e.path), "spec": e.spec,
        "architecture": f.architecture, "parameters": f.parameters, "quantization": f.quantization,
        "file_bytes": e.file_bytes, "context_length": f.context_length, "memory_bytes": e.memory_bytes,
        "fit": e.fit, "backend": e.backend, "problem": e.problem,
    })


def cmd_models(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from engine.library import default_locations, scan

    out = out or sys.stdout
    result = scan(default_locations(extra_folders=[Path(p) for p in args.folder]))
    entries = [e for e in result.entries if e.matches(args.search)]
    if args.json:
        for e in entries:
            print(_as_json(e), file=out)
        return 0
    if entries:
        print("\n".join(format_table(entries)), file=out)
    places = ", ".join(str(loc.path) for loc in result.searched) or "none of the usual places exist here"
    machine = result.machine
    print(
        f"{len(entries)} model{'s' * (len(entries) != 1)}{' matching ' + repr(args.search) if args.search else ''} "
        f"in {places} ({result.seconds * 1000:.0f} ms). This machine: {format_bytes(machine.total_bytes)} memory, "
        f"{format_bytes(machine.available_bytes)} available. Download one with: logitlab-cli pull org/name",
        file=sys.stderr,
    )
    return 0


class TerminalBar:
    """A progress bar on a terminal (redrawn in place), or a line now and then in a log."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.tty = stream.isatty()
        self._last_line = 0.0

    def __call__(self, p: DownloadProgress) -> None:
        fraction = p.fraction
        filled = int(BAR_WIDTH * fraction) if fraction is not None else 0
        bar = f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {fraction:4.0%}" if fraction is not None else "[  ?  ]"
        text = f"{p.what}: {bar}  {p.describe()}"
        if self.tty:
            self.stream.write("\r" + text.ljust(100)[:160])
            self.stream.flush()
        elif time.monotonic() - self._last_line >= LINE_EVERY_S or fraction == 1.0:
            self._last_line = time.monotonic()
            print(text, file=self.stream, flush=True)

    def end(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def cmd_pull(args: argparse.Namespace) -> int:
    from engine.library.pull import pull

    if not args.verbose:  # huggingface_hub's own retry warnings would break the bar's line
        logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    bar = TerminalBar(sys.stderr)
    try:
        result = pull(args.what, progress=bar, cancel=CancelToken(), expected_sha256=args.sha256,
                      if_exists=args.if_exists)
    except KeyboardInterrupt:
        bar.end()
        print("cancelled (a .gguf address resumes where it stopped when pulled again)", file=sys.stderr)
        return EXIT_CANCELLED
    except UsageError:
        bar.end()
        raise  # what was typed cannot be downloaded: the usage error's status (2)
    except (EngineError, OSError) as e:
        # The network or the hub failed (unreachable, refused, cut off, no such file there): the command was
        # fine and may work when pulled again, so this is a failure (1), not a usage error (2).
        bar.end()
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except BaseException:
        bar.end()  # the error message starts on a line of its own
        raise
    bar.end()
    print(f"downloaded to {printable(str(result.path))}\nopen it with: logitlab-cli chat --model "
          f"{_quote(printable(result.spec))}", file=sys.stderr)
    print(result.spec)
    return 0


LIBRARY_COMMANDS = {"models": cmd_models, "pull": cmd_pull}
