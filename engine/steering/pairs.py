"""Contrastive prompt pairs a steering vector is trained from: the built-in sets and the user's own files.

A `PairSet` is either persona-based (the built-in sets, repeng's recipe: the
same sentence start after "Act as if you're <positive persona>." and after
"... <negative persona>.", through the model's chat template), or plain
texts (the user's own: a JSONL of {"positive": ..., "negative": ...} lines,
or two text files with one prompt per line, the n-th lines a pair), which
are tokenized as they are. Reading a file refuses, in one line naming it,
an empty set, a line that is not a pair, or files of different lengths.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.steering import builtin_pairs
from engine.steering.errors import SteeringError
from engine.tokenizer import TokenizerLike

MAX_PAIR_FILE_BYTES = 16 << 20  # a pair file is prompts, not a corpus
# Training keeps every prompt's last-token state of every layer: 2 x pairs x layers x width float32, 0.15 GB at
# this count for the default model, 2.2 GB for an 8B one; repeng's own examples train on a few hundred pairs.
MAX_PAIRS = 2048
TokenPair = tuple[list[int], list[int]]


@dataclass(frozen=True)
class PairSet:
    """Positive and negative prompts, pair by pair. Positive strength then steers toward the positive side.

    Plain sets hold `pairs` of texts; persona sets hold the two `personas`, the `template` they go into
    and the sentence starts (`suffixes`), one pair per start.
    """

    name: str
    pairs: tuple[tuple[str, str], ...] = ()
    personas: tuple[str, str] | None = None
    template: str = builtin_pairs.TEMPLATE
    suffixes: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.suffixes) if self.personas is not None else len(self.pairs)

    def limited(self, n: int) -> "PairSet":
        """The first `n` pairs (the speed goal and the tests train on 32)."""
        if self.personas is not None:
            return PairSet(self.name, personas=self.personas, template=self.template, suffixes=self.suffixes[:n])
        return PairSet(self.name, pairs=self.pairs[:n])

    def texts(self) -> list[tuple[str, str]]:
        """The pairs as plain texts: persona pairs without a chat template (what a model without one reads)."""
        if self.personas is None:
            return list(self.pairs)
        pos, neg = (self.template.format(persona=p) for p in self.personas)
        return [(f"{pos} {s}", f"{neg} {s}") for s in self.suffixes]

    def token_pairs(self, tokenizer: Any) -> list[TokenPair]:
        """(positive ids, negative ids) per pair; persona pairs through the tokenizer's chat template when it has one."""
        if self.personas is None or not _has_template(tokenizer):
            return [(tokenizer.encode(p), tokenizer.encode(n)) for p, n in self.texts()]
        heads = [tokenizer.chat_ids([{"role": "user", "content": self.template.format(persona=p)}])
                 for p in self.personas]
        out = []
        for s in self.suffixes:
            tail = tokenizer.encode(s, add_special_tokens=False)
            out.append((heads[0] + tail, heads[1] + tail))
        return out


def check_pair_count(pairs: PairSet, advice: str = "train on fewer pairs") -> None:
    """SteeringError past MAX_PAIRS, before anything is read from a model; `advice` says what to do."""
    if len(pairs) > MAX_PAIRS:
        raise SteeringError(f"the pair set {pairs.name!r} has {len(pairs):,} pairs; a steering vector is trained from "
                            f"at most {MAX_PAIRS:,} ({advice})")


def same_pair_numbers(pairs: Sequence[tuple[Any, Any]]) -> list[int]:
    """The numbers (from 1) of the pairs whose positive and negative sides are the same."""
    return [i for i, (p, q) in enumerate(pairs, 1) if p == q]


def check_distinct(pairs: Sequence[tuple[Any, Any]], name: str) -> None:
    """SteeringError naming the pairs whose two sides are the same text (or the same tokens): such a pair has no
    difference to learn from, and a set of them trains an all-zero vector that steers nothing."""
    same = same_pair_numbers(pairs)
    if not same:
        return
    shown = ", ".join(map(str, same[:5])) + (f" and {len(same) - 5:,} more" if len(same) > 5 else "")
    which = f"pair {shown} has" if len(same) == 1 else f"pairs {shown} have"
    raise SteeringError(f"{which} the same positive and negative prompt in {name!r}: a pair teaches the "
                        "difference between its two prompts, so make them differ (or remove the pair)")


def _has_template(tokenizer: TokenizerLike) -> bool:
    return tokenizer.has_chat_template


def builtin_pair_sets() -> dict[str, PairSet]:
    """The built-in sets by name ("happy-sad", "formal-casual", "concise-verbose", "calm-angry")."""
    return {name: PairSet(name, personas=personas, suffixes=builtin_pairs.SUFFIXES)
            for name, personas in builtin_pairs.PERSONAS.items()}


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise SteeringError(f"{path.name}: no such pair file ({path})")
    size = path.stat().st_size
    if size > MAX_PAIR_FILE_BYTES:
        raise SteeringError(f"{path.name} is {size >> 20} MiB; a pair file holds prompts (at most {MAX_PAIR_FILE_BYTES >> 20} MiB)")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise SteeringError(f"{path.name} is not UTF-8 text (byte {e.start}): save it as UTF-8") from e


def read_pairs_jsonl(path: str | os.PathLike[str]) -> PairSet:
    """A JSONL file of {"positive": text, "negative": text} lines (blank lines skipped)."""
    p = Path(path)
    pairs = []
    for n, line in enumerate(_read_text(p).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SteeringError(f"{p.name} line {n} is not JSON ({e.msg}); each line is "
                                '{"positive": "...", "negative": "..."}') from e
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str) and row[k].strip()
                                                for k in ("positive", "negative")):
            raise SteeringError(f'{p.name} line {n} needs non-empty "positive" and "negative" texts')
        pairs.append((row["positive"], row["negative"]))
    if not pairs:
        raise SteeringError(f"{p.name} holds no pairs; each line is " + '{"positive": "...", "negative": "..."}')
    return PairSet(p.stem, pairs=tuple(pairs))


def _prompt_lines(path: Path) -> list[str]:
    # One prompt a line; "\n" inside a line stands for a line break (as llama-cvector-generator's files).
    return [line.replace("\\n", "\n") for line in _read_text(path).splitlines() if line.strip()]


def read_pair_files(positive: str | os.PathLike[str], negative: str | os.PathLike[str]) -> PairSet:
    """Two text files, one prompt a line (blank lines skipped): the n-th lines are a pair."""
    pos_path, neg_path = Path(positive), Path(negative)
    pos, neg = _prompt_lines(pos_path), _prompt_lines(neg_path)
    for path, lines in ((pos_path, pos), (neg_path, neg)):
        if not lines:
            raise SteeringError(f"{path.name} is empty: it needs one prompt a line")
    if len(pos) != len(neg):
        raise SteeringError(f"{pos_path.name} has {len(pos)} prompts and {neg_path.name} {len(neg)}; "
                            "the n-th lines are a pair, so they need as many")
    return PairSet(f"{pos_path.stem}-{neg_path.stem}", pairs=tuple(zip(pos, neg)))


def read_pair_set(paths: Sequence[str | os.PathLike[str]]) -> PairSet:
    """One JSONL file, or a positive and a negative text file."""
    if len(paths) == 1:
        return read_pairs_jsonl(paths[0])
    if len(paths) == 2:
        return read_pair_files(paths[0], paths[1])
    raise SteeringError(f"give one JSONL pair file or two text files (positive, negative), not {len(paths)}")
