"""Sampling experiments: score a text, compare settings side by side, replay with a change, JSONL traces.

Pure engine code (numpy, no Qt): the app and the CLI build on it.
"""

from engine.experiments.compare import (
    MAX_COLUMNS,
    ColumnStats,
    CompareColumn,
    CompareResult,
    column_stats,
    compare,
    distinct_n,
    first_divergence,
    repeated_ngrams,
    run_column,
    with_shared_seed,
)
from engine.experiments.batch_score import ScoreItem, pair_ids, read_items, score_items, score_on_runner
from engine.experiments.replay import (
    ReplayVerdict,
    TokenDiff,
    as_recorded,
    changed_fields,
    fingerprint_of,
    replay_settings,
    replay_verdict,
    token_diff,
)
from engine.experiments.model_diff import BackendThread, compare_models
from engine.experiments.model_diff_types import ModelDiff, PositionDiff, SpanDiff, SpanModelDiff
from engine.experiments.model_diff_vocab import VocabularyCheck, compare_vocabularies
from engine.experiments.score import ScoredToken, ScoreResult, score, score_ids, score_step_by_step, text_ids
from engine.experiments.trace import (
    TRACE_FORMAT,
    TraceRun,
    event_from_line,
    generation_run,
    read_trace,
    score_run,
    token_line,
    write_lines,
    write_trace,
)

__all__ = [
    "BackendThread",
    "ModelDiff",
    "PositionDiff",
    "SpanDiff",
    "SpanModelDiff",
    "VocabularyCheck",
    "compare_models",
    "compare_vocabularies",
    "MAX_COLUMNS",
    "TRACE_FORMAT",
    "ColumnStats",
    "CompareColumn",
    "CompareResult",
    "ScoreItem",
    "ScoreResult",
    "ScoredToken",
    "ReplayVerdict",
    "TokenDiff",
    "TraceRun",
    "changed_fields",
    "column_stats",
    "compare",
    "distinct_n",
    "event_from_line",
    "first_divergence",
    "fingerprint_of",
    "generation_run",
    "read_trace",
    "pair_ids",
    "read_items",
    "repeated_ngrams",
    "replay_settings",
    "replay_verdict",
    "as_recorded",
    "run_column",
    "score",
    "score_ids",
    "score_items",
    "score_on_runner",
    "score_step_by_step",
    "score_run",
    "text_ids",
    "token_diff",
    "token_line",
    "with_shared_seed",
    "write_lines",
    "write_trace",
]
