"""Constrained sampling for the research API: the token mask of a prefix, and samples weighted by it.

An SMC or importance-sampling loop (genlm-control style) proposes from the
model masked by a constraint; each step's proposal keeps only part of the
model's probability, and the log of that mass, summed over the steps, is the
sample's log importance weight against "the model conditioned on the
constraint". `constrained_sample` returns it with the sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.constraints import Constraint, ConstraintRun, start_run
from engine.sampling import SamplerChain, SamplerSettings
from engine.sampling.grammar import GrammarStage
from engine.tokenizer import TokenizerLike


@dataclass(frozen=True)
class ConstrainedSample:
    """One constrained sample.

    Attributes:
        token_ids: the generated tokens (an end token last when the answer ended).
        logprob: their total log-prob under the model (unmasked).
        log_weight: sum over the steps of log(mass the constraint kept): the sample's log
            importance weight (0 when the constraint removed nothing).
        complete: the constraint is satisfied (its grammar accepts the text).
        failure: why it stopped early (a dead end), else None.
    """

    token_ids: tuple[int, ...]
    logprob: float
    log_weight: float
    complete: bool
    failure: str | None = None


def run_for(
    constraint: Constraint, tokenizer: TokenizerLike, n_vocab: int, prefix_ids: Sequence[int] = ()
) -> ConstraintRun:
    """A run of `constraint` that has already read `prefix_ids` (ValueError if it does not allow them)."""
    run = start_run(constraint, tokenizer, n_vocab)
    for t in prefix_ids:
        run.accept(int(t))
        if run.failure:
            raise ValueError(f"the constraint does not allow this prefix: {run.failure}")
    return run


def allowed_mask(run: ConstraintRun, n_vocab: int) -> np.ndarray:
    """(V,) bool: the tokens the run allows next."""
    return run.allowed(np.zeros(n_vocab, dtype=np.float32))


def constrained_sample(
    next_logprobs: Callable[[list[int]], np.ndarray],
    tokenizer: TokenizerLike,
    n_vocab: int,
    prompt_ids: Sequence[int],
    constraint: Constraint,
    max_tokens: int,
    sampler: SamplerSettings,
) -> ConstrainedSample:
    """Ancestral sampling from the model masked by `constraint` (the `grammar` stage first in the chain)."""
    stage = GrammarStage(start_run(constraint, tokenizer, n_vocab))
    chain = SamplerChain(sampler, vocab=tokenizer, constraint=stage)
    ids, total = list(prompt_ids), 0.0
    out: list[int] = []
    eos = tokenizer.eos_token_ids
    for _ in range(max_tokens):
        lp = next_logprobs(ids + out)
        tok = chain.pick(lp, np.asarray(ids + out), top_n=0).token_id
        if stage.run.failure:
            break
        out.append(tok)
        total += float(lp[tok])
        if tok in eos:
            break
    run = stage.run
    return ConstrainedSample(tuple(out), total, run.log_mass_kept, run.failure is None and run.is_accepting(), run.failure)
