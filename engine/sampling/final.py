"""`final_distribution`: the distribution a draw used, as one (V,) row of log-probs.

For research code that wants the numbers behind a pick, not a pick's top N: what every stage (custom
stages included) left, in the chain's order, that the seeded draw then sampled from.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from engine.sampling.chain import SamplerChain
from engine.sampling.dry import Vocabulary
from engine.sampling.settings import SamplerSettings


def final_distribution(
    logits: np.ndarray,
    history: Sequence[int] | np.ndarray = (),
    sampler: SamplerSettings | SamplerChain | None = None,
    *,
    vocab: Vocabulary | None = None,
    banned: Collection[int] = (),
) -> np.ndarray:
    """(V,) float32 log-probs the draw for this row uses: -inf for every token a stage removed.

    Args:
        logits: (V,) the model's raw logits (or log-probs) for the next token.
        history: the token ids so far, prompt included (penalties, DRY and custom stages read it).
        sampler: the settings (a fresh chain, seeded by them), or a chain in the middle of a run: this is
            then one step of that run (its random stream, mirostat's mu and a grammar's parser move on, as
            a pick would). None: `SamplerSettings()`, the model's own distribution.
        vocab: the tokenizer, for settings that need one (DRY's breakers, a logit bias given as text).
        banned: tokens not allowed here, removed before every stage.

    Greedy settings (temperature 0) give log-prob 0 at the token greedy takes and -inf elsewhere. With a
    fresh chain seeded `s`, `SamplerChain(settings).pick(...)` draws its token from exactly this row.
    """
    if isinstance(sampler, SamplerChain):
        chain = sampler
    else:
        chain = SamplerChain(sampler if sampler is not None else SamplerSettings(), vocab)
    return chain.choose(logits, np.asarray(history, dtype=np.int64), banned=banned).final_distribution()
