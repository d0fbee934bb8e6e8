"""Beam search, a numpy port of transformers' vectorized `_beam_search` (v5) for one prompt.

Kept step-for-step equal to transformers (top 2*num_beams candidates, finished
hypotheses scored `sum_logprobs / generated_len ** length_penalty`, the same
early-stopping heuristic) so that its output can be tested against
`model.generate(num_beams=...)` on the same weights.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engine.decode.loop import check_context

NEG = -1.0e9


@dataclass(frozen=True)
class BeamResult:
    token_ids: tuple[int, ...]  # prompt + generated
    generated: tuple[int, ...]
    score: float  # length-normalised log-probability


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def _topk(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries, largest first (stable on ties)."""
    return np.argsort(-x, kind="stable")[:k]


class BeamRunner(Protocol):
    """What beam search uses of a `BatchRunner` (engine.capabilities): a prompt's start, a step per row, a reorder."""

    def start(self, prompts: Sequence[Sequence[int]]) -> np.ndarray: ...

    def step(self, tokens: Sequence[int]) -> np.ndarray: ...

    def reorder(self, rows: Sequence[int]) -> None: ...


def beam_search(
    runner: BeamRunner,
    prompt: Sequence[int],
    *,
    num_beams: int = 4,
    max_new_tokens: int = 32,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    num_return_sequences: int = 1,
    eos_token_ids: Sequence[int] = (),
    pad_id: int = 0,
    context_length: int = 0,
    cancelled: Callable[[], bool] | None = None,
) -> list[BeamResult]:
    """The best `num_return_sequences` beams; the prompt is checked against `context_length` (0 = unchecked) first.

    `cancelled`: asked before every forward after the first; when it says yes the search stops and returns [].
    """
    _check_beam_args(num_beams, num_return_sequences, early_stopping)
    prompt = list(prompt)
    check_context(len(prompt), max_new_tokens, context_length)  # before the first forward: a long prompt fails now
    p, nb, max_length = len(prompt), num_beams, len(prompt) + max_new_tokens
    eos = np.asarray(sorted(set(eos_token_ids)), dtype=np.int64)
    keep = max(2, 1 + len(eos)) * nb  # candidates per step: enough that nb stay alive after EOS hits
    top_mask = np.arange(keep) < nb

    running = np.full((nb, max_length), pad_id, dtype=np.int64)
    running[:, :p] = prompt
    running_scores = np.full(nb, NEG, dtype=np.float64)
    running_scores[0] = 0.0  # all beams start identical: only one may expand at first
    finished = running.copy()
    finished_scores = np.full(nb, NEG, dtype=np.float64)
    is_finished = np.zeros(nb, dtype=bool)
    heuristic_open = True
    cur = p

    # The prompt once, its cache shared by every beam (a long prompt is not computed nb times)
    logits = np.repeat(runner.start([prompt]), nb, axis=0)  # (nb, V)
    runner.reorder([0] * nb)
    while True:
        logprobs = _log_softmax(logits.astype(np.float64)) + running_scores[:, None]  # (nb, V)
        vocab = logprobs.shape[1]
        flat = logprobs.reshape(-1)
        cand = _topk(flat, keep)
        cand_scores = flat[cand]
        src_beam, token = cand // vocab, cand % vocab
        cand_seqs = running[src_beam].copy()
        cand_seqs[:, cur] = token
        hits = np.isin(token, eos) | (cur + 1 >= max_length)

        # Next running beams: the best candidates that did not finish.
        alive = cand_scores + hits * NEG
        nxt = _topk(alive, nb)
        running, running_scores, parents = cand_seqs[nxt], alive[nxt], src_beam[nxt]

        # Finished hypotheses: candidates among the top nb that hit a stop, length-normalised.
        norm = cand_scores / ((cur + 1 - p) ** length_penalty)
        if is_finished.all() and early_stopping is True:
            norm = norm + NEG
        if not heuristic_open:
            norm = norm + NEG
        norm = norm + (~(hits & top_mask)) * NEG
        merged_seqs = np.concatenate([finished, cand_seqs])
        merged_scores = np.concatenate([finished_scores, norm])
        merged_fin = np.concatenate([is_finished, hits & top_mask])
        best = _topk(merged_scores, nb)
        finished, finished_scores, is_finished = merged_seqs[best], merged_scores[best], merged_fin[best]

        cur += 1
        heuristic_open = heuristic_open and _can_improve(running_scores[0], finished_scores, is_finished,
                                                         (max_length if early_stopping == "never" and length_penalty > 0.0
                                                          else cur) - p, length_penalty)
        if not heuristic_open or (is_finished.all() and early_stopping is True) or hits.all():
            break
        if cancelled is not None and cancelled():
            return []
        runner.reorder(parents.tolist())
        logits = runner.step(running[:, cur - 1].tolist())

    return _results(prompt, finished[:num_return_sequences], finished_scores[:num_return_sequences], eos)


def _check_beam_args(num_beams: int, num_return_sequences: int, early_stopping: bool | str) -> None:
    if num_beams < 1 or not 1 <= num_return_sequences <= num_beams:
        raise ValueError("need num_beams >= 1 and 1 <= num_return_sequences <= num_beams")
    if early_stopping not in (True, False, "never"):
        raise ValueError("early_stopping must be True, False or 'never'")


def _can_improve(best_running_score: float, finished_scores: np.ndarray, is_finished: np.ndarray, best_len: int,
                 length_penalty: float) -> bool:
    """Whether the best running beam, at the best length it can reach, can still beat the worst finished one
    (transformers' heuristic); a slot not yet filled can always be improved."""
    worst_finished = finished_scores.min() if is_finished.all() else NEG
    return bool(best_running_score / (best_len**length_penalty) > worst_finished)


def _results(prompt: list[int], seqs: np.ndarray, scores: np.ndarray, eos: np.ndarray) -> list[BeamResult]:
    """The finished beams as results; generated tokens run up to the first EOS (kept), like transformers' output."""
    p, stops = len(prompt), set(eos.tolist())
    results = []
    for seq, score in zip(seqs, scores):
        gen = seq[p:].tolist()
        for j, t in enumerate(gen):
            if t in stops:
                gen = gen[: j + 1]
                break
        results.append(BeamResult(tuple(prompt + gen), tuple(gen), float(score)))
    return results
