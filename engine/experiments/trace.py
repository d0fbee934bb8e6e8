"""JSONL traces: one header line, then one line per token, then one end line.

A trace file holds one or more runs back to back (a comparison writes one
run per column). Each run is::

    {"type": "header", "format": "logitlab.trace/1", "kind": "generation"|"score",
     "model": {...}, "backend": "torch", "settings": {...}|null, "seed": 42|null,
     "prompt_ids": [...], ...extra}
    {"type": "token", "index": 0, "token_id": 504, "text": " Paris", "token_text": " Paris",
     "logprob": -0.12, "rank": 0, "entropy": 1.3, "top_model": [[id, text, logprob], ...], ...}
    (an alternative that is part of a multi-byte character has a fourth entry: its bytes as hex)
    ...
    {"type": "end", ...}   (generation stats, or the score summary)

Generation token lines also carry `sampler_logprob`, `top_sampler`, `forced`,
`special` and `stages` (`[{"stage", "survivors", "mass_kept", "entropy", "top", "note"}]`
when recorded). Score token lines carry `surprisal_bits`. On request (`with_layer_views`), a token
line also carries `layers`: the layer view (logit lens) of the position that predicted it. Log-probs that are
-inf (a forced token the sampler had cut) are written as null.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from engine.events import GenerationStats, StageSnapshot, TokenEvent, TokenProb
from engine.experiments.score import ScoredToken, ScoreResult
from engine.model_info import ModelInfo
from engine.sampling.settings import SamplerSettings

if TYPE_CHECKING:
    from engine.lens import LayerCapture

TRACE_FORMAT = "logitlab.trace/1"
MODEL_FIELDS = ("name", "spec", "architecture", "parameters", "dtype", "context_length", "backend", "device")


def _lp_out(lp: float) -> float | None:
    return lp if math.isfinite(lp) else None


def _lp_in(lp: float | None) -> float:
    return -math.inf if lp is None else float(lp)


def _probs_out(probs: Sequence[TokenProb]) -> list[list[Any]]:
    # A piece of a multi-byte character (text U+FFFD) keeps its bytes, as hex, in a fourth entry.
    return [[p.token_id, p.text, _lp_out(p.logprob)] + ([p.token_bytes.hex()] if p.token_bytes else [])
            for p in probs]


def _probs_in(rows: Sequence[Sequence[Any]]) -> tuple[TokenProb, ...]:
    return tuple(TokenProb(int(r[0]), str(r[1]), _lp_in(r[2]), bytes.fromhex(r[3]) if len(r) > 3 else None)
                 for r in rows)


def model_dict(model: ModelInfo | dict[str, Any] | None) -> dict[str, Any]:
    if model is None:
        return {}
    if isinstance(model, dict):
        return {k: model.get(k) for k in MODEL_FIELDS if k in model}
    return {k: getattr(model, k) for k in MODEL_FIELDS}


def header(
    *,
    kind: str,
    model: ModelInfo | dict[str, Any] | None,
    prompt_ids: Sequence[int] | None,
    settings: SamplerSettings | dict[str, Any] | None = None,
    seed: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The first line of a run."""
    m = model_dict(model)
    if isinstance(settings, SamplerSettings):
        settings = settings.to_dict()
    return {
        "type": "header",
        "format": TRACE_FORMAT,
        "kind": kind,
        "model": m,
        "backend": m.get("backend"),
        "settings": settings,
        "seed": seed,
        "prompt_ids": None if prompt_ids is None else [int(t) for t in prompt_ids],
        **extra,
    }


def token_line(ev: TokenEvent) -> dict[str, Any]:
    d: dict[str, Any] = {
        "type": "token",
        "index": ev.index,
        "token_id": ev.token_id,
        "text": ev.text,
        "token_text": ev.token_text,
        "logprob": _lp_out(ev.logprob),
        "sampler_logprob": _lp_out(ev.sampler_logprob),
        "rank": ev.rank,
        "entropy": ev.entropy,
        "top_model": _probs_out(ev.top_model),
        "top_sampler": _probs_out(ev.top_sampler),
        "forced": ev.forced,
        "special": ev.special,
        "stages": None,
    }
    if ev.stages is not None:
        d["stages"] = [
            {"stage": s.stage, "survivors": s.survivors, "mass_kept": s.mass_kept, "entropy": s.entropy,
             "top": _probs_out(s.top), "note": s.note}
            for s in ev.stages
        ]
    return d


def event_from_line(d: dict[str, Any]) -> TokenEvent:
    """Inverse of `token_line`."""
    stages = None
    if d.get("stages") is not None:
        stages = tuple(
            StageSnapshot(s["stage"], int(s["survivors"]), float(s["mass_kept"]), float(s["entropy"]),
                          _probs_in(s["top"]), str(s.get("note", "")))
            for s in d["stages"]
        )
    return TokenEvent(
        index=int(d["index"]),
        token_id=int(d["token_id"]),
        text=d["text"],
        token_text=d["token_text"],
        logprob=_lp_in(d["logprob"]),
        sampler_logprob=_lp_in(d["sampler_logprob"]),
        rank=int(d["rank"]),
        entropy=float(d["entropy"]),
        top_model=_probs_in(d["top_model"]),
        top_sampler=_probs_in(d["top_sampler"]),
        stages=stages,
        forced=bool(d["forced"]),
        special=bool(d["special"]),
    )


def scored_line(t: ScoredToken) -> dict[str, Any]:
    return {
        "type": "token",
        "index": t.index,
        "token_id": t.token_id,
        "token_text": t.token_text,
        "logprob": _lp_out(t.logprob),
        "surprisal_bits": t.surprisal_bits if math.isfinite(t.logprob) else None,
        "rank": t.rank,
        "entropy": t.entropy,
        "top_model": _probs_out(t.top),
    }


def scored_from_line(d: dict[str, Any]) -> ScoredToken:
    """Inverse of `scored_line`."""
    return ScoredToken(
        index=int(d["index"]),
        token_id=int(d["token_id"]),
        token_text=d["token_text"],
        logprob=_lp_in(d["logprob"]),
        rank=int(d["rank"]),
        entropy=float(d["entropy"]),
        top=_probs_in(d["top_model"]),
    )


def stats_line(stats: GenerationStats | None, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"type": "end"}
    if stats is not None:
        d.update(stats.to_dict())
        d["token_ids"] = list(stats.token_ids)
    d.update(extra)
    return d


def generation_run(
    *,
    model: ModelInfo | dict[str, Any] | None,
    prompt_ids: Sequence[int] | None,
    settings: SamplerSettings | dict[str, Any] | None,
    seed: int | None,
    events: Sequence[TokenEvent],
    stats: GenerationStats | None = None,
    end: dict[str, Any] | None = None,
    **extra: Any,
) -> list[dict[str, Any]]:
    """All lines of one generation run."""
    tail = stats_line(stats, **(end or {}))
    return [header(kind="generation", model=model, prompt_ids=prompt_ids, settings=settings, seed=seed, **extra),
            *(token_line(e) for e in events), tail]


def score_run(result: ScoreResult, *, model: ModelInfo | dict[str, Any] | None, **extra: Any) -> list[dict[str, Any]]:
    """All lines of one scored text (the prompt ids are the whole scored sequence)."""
    end = {
        "type": "end",
        "scored_tokens": len(result.tokens),
        "context_tokens": result.context,
        # -inf / inf (a token outside a server's top N) are written as null, with the count of such tokens
        "total_logprob": _lp_out(result.total_logprob),
        "mean_surprisal_bits": _lp_out(result.mean_surprisal_bits),
        "perplexity": _lp_out(result.perplexity),
        "unknown_tokens": result.unknown_tokens,
    }
    return [header(kind="score", model=model, prompt_ids=result.token_ids, context=result.context, **extra),
            *(scored_line(t) for t in result.tokens), end]


def layer_view_dict(capture: "LayerCapture") -> dict[str, Any]:
    """A token line's optional `layers` value: the layer view (logit lens) of the position that predicted it.

    `{"position", "target_id", "first_top1_layer", "layers": [{"top": [[id, logprob], ...],
    "target_logprob", "target_rank"}, ...]}`, one entry per decoder layer in order.
    """
    return {
        "position": capture.position,
        "target_id": capture.target_id,
        "first_top1_layer": capture.first_top1_layer,
        "layers": [
            {"top": [[i, _lp_out(lp)] for i, lp in layer.top], "target_logprob": _lp_out(layer.target_logprob),
             "target_rank": layer.target_rank}
            for layer in capture.layers
        ],
    }


def with_layer_views(lines: Iterable[dict[str, Any]], captures: "dict[int, LayerCapture]") -> list[dict[str, Any]]:
    """A run's lines with the layer view added (key `layers`) to the token lines whose `index` is in `captures`.

    On request only: a layer view costs a forward with capture per token, so traces leave it out by default.
    """
    out = []
    for line in lines:
        if line.get("type") == "token" and line.get("index") in captures:
            line = {**line, "layers": layer_view_dict(captures[line["index"]])}
        out.append(line)
    return out


def dumps(line: dict[str, Any]) -> str:
    # allow_nan=False: -inf is mapped to null above; anything else non-finite is a bug worth seeing.
    return json.dumps(line, ensure_ascii=False, allow_nan=False)


def write_lines(out: IO[str], lines: Iterable[dict[str, Any]]) -> int:
    n = 0
    for line in lines:
        out.write(dumps(line) + "\n")
        n += 1
    return n


def write_trace(path: str | Path, lines: Iterable[dict[str, Any]]) -> int:
    """Write JSONL to `path`; returns the number of lines."""
    with open(path, "w", encoding="utf-8") as f:
        return write_lines(f, lines)


@dataclass
class TraceRun:
    header: dict[str, Any]
    tokens: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None

    def events(self) -> list[TokenEvent]:
        """Token lines as `TokenEvent`s: a generation run's as written, a score run's numbered from 0
        (as `ScoreResult.events()`: no sampler was involved)."""
        kind = self.header.get("kind")
        if kind == "score":
            return [t.as_event(i) for i, t in enumerate(self.scored_tokens())]
        if kind not in (None, "generation"):
            raise ValueError(f"a trace run of kind {kind!r} has no token events (known kinds: generation, score)")
        return [event_from_line(d) for d in self.tokens]

    def scored_tokens(self) -> list[ScoredToken]:
        """Token lines of a score run as `ScoredToken`s; ValueError naming the kind for another run."""
        kind = self.header.get("kind")
        if kind != "score":
            raise ValueError(f"scored_tokens() reads a score run; this run's kind is {kind!r}")
        return [scored_from_line(d) for d in self.tokens]


def read_trace(source: str | Path | Iterable[str]) -> list[TraceRun]:
    """Parse a trace (a path, or lines); raises ValueError on a malformed file."""
    lines = Path(source).read_text(encoding="utf-8").splitlines() if isinstance(source, (str, Path)) else source
    runs: list[TraceRun] = []
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            d = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"line {n} of the trace is not JSON: {e}") from None
        kind = d.get("type") if isinstance(d, dict) else None
        if kind == "header":
            if d.get("format") != TRACE_FORMAT:
                raise ValueError(f"line {n}: unknown trace format {d.get('format')!r}")
            runs.append(TraceRun(d))
        elif kind in ("token", "end"):
            if not runs or runs[-1].end is not None:
                raise ValueError(f"line {n}: a {kind} line outside a run (no header before it)")
            if kind == "token":
                runs[-1].tokens.append(d)
            else:
                runs[-1].end = d
        else:
            raise ValueError(f"line {n}: unknown line type {kind!r}")
    return runs
