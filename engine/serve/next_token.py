"""A one-token answer taken from the scoring pass's last position: lm-eval's echo requests, without a second prefill.

lm-eval's `local-completions` asks each prompt's own log-probs (`echo: true, logprobs: 1`) and one answer token
(`max_tokens: 1`). The scoring pass already runs the whole prompt; one more position in its last forward gives
the logits of the token after it (`batch_score.each_score_and_next`). The answer is chosen from that row by the
decode loop's own per-token code (`engine.decode.row.AnswerRow`: the request's sampler chain over the prompt's
history, its stop strings and end of sequence, its report of the token with the top-N the server records), so
it is the answer the decode loop would give, up to float32 rounding of a context of another size (the same
bound as the scores themselves). Before this each answer ran as a request of its own and computed its prompt a
second time: a served log-likelihood run cost 1.6x the same scores in-process (bench/serve_eval.py).

Only answers the decode loop would take in one step come here (`answers_from_scores`): one token, one choice,
no tools or constraint (their grammar), no banned strings (a step back needs another forward), no forced
tokens or replayed cache schedule, nothing steered; every other answer still runs through the decode loop.
The answer is recorded like any other (the sinks are told its start, its token and its end; the window and
`--record-dir` show it), its fingerprint saying where its logits came from.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from engine.backend import Backend
from engine.capabilities import PositionRunners
from engine.decode.row import AnswerRow
from engine.events import GenerationStats, TokenEvent
from engine.fingerprints.taking import fingerprint_for
from engine.request import GenerationRequest
from engine.serve.parse import ServedRequest

# What the fingerprint adds: a replay decodes the prompt and may round its last logits otherwise.
FINGERPRINT_NOTE = {"next_token_from": "the scoring pass's last position (one forward with the prompt's scores)"}


def answers_from_scores(backend: Backend, read: Sequence[ServedRequest]) -> bool:
    """Whether every prompt's answer can be taken from its scoring pass (module docstring)."""
    return isinstance(backend, PositionRunners) and all(_one_step(r) for r in read)


def _one_step(r: ServedRequest) -> bool:
    g = r.generation
    return (r.max_tokens == 1 and r.n == 1 and len(r.prompt_ids) >= 2 and not g.tools and g.constraint is None
            and not g.sampler.banned_strings and not g.forced_tokens and not g.assistant_prefix
            and g.cache_schedule is None and not g.server_sampling and (g.steering is None or not g.steering.active)
            and list(g.prompt_ids or ()) == list(r.prompt_ids))


def answer_token(backend: Backend, request: GenerationRequest, prompt: Sequence[int], logits: np.ndarray,
                 t0: float) -> tuple[list[TokenEvent], GenerationStats]:
    """The request's one answer token chosen from `logits` (the row after `prompt`), as the decode loop reports
    it: its event (none when it was refused) and the answer's stats with its fingerprint."""
    row = AnswerRow.start(backend, request, list(prompt), t0)
    taken = row.take(row.choose(logits), logits)
    events = [row.event(taken)] if taken is not None else []
    stats = row.stats()
    fp = fingerprint_for(backend, request, stats.seed, stats)
    return events, replace(stats, fingerprint=replace(fp, extras={**fp.extras, **FINGERPRINT_NOTE}))


def now() -> float:
    """The clock `AnswerRecord` times answers with."""
    return time.perf_counter()
