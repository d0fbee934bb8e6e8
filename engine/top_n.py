"""The model's view of a step whose distribution is known only in part: a server's top N log-probs.

A server model's `forward` gives the N log-probs the server reported and -inf
elsewhere (`ModelInfo.reports_top_n` = N). The sampler chain must renormalise
over those N to draw from them; what the model said must not be. So a token
event from such a step is rewritten here: the token's and its alternatives'
log-probs as the server gave them, one "rest" entry (`events.rest_entry`)
with the probability it did not report, the entropy of reported + rest (a
lower bound of the model's), and stage notes saying what the sampler's view
was renormalised over.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from engine.events import TokenEvent, rest_entry

# The most alternatives per token OpenAI's chat API gives (`top_logprobs`), which servers copy: what the remote
# backend and proxy mode ask at most, and `serve --upstream-top-n`'s ceiling.
TOP_LOGPROBS_MAX = 20


def reported_view(event: TokenEvent, reported: np.ndarray, top_n: int) -> TokenEvent:
    """`event` (made by the decode loop from `reported`, a (V,) row of log-probs, -inf where unreported) with its
    model side as reported: not renormalised, with the rest."""
    lps = reported[np.isfinite(reported)].astype(np.float64)
    if lps.size == 0:
        return event
    probs = np.exp(lps)
    mass = float(probs.sum())
    shift = math.log(mass)  # the chain's log_softmax subtracted this from every reported log-prob
    rest = rest_entry(mass)
    entropy = float(-(probs * lps).sum()) + (-rest.prob * rest.logprob if rest else 0.0)
    top = tuple(dataclasses.replace(p, logprob=p.logprob + shift) for p in event.top_model)
    note = (f"top {top_n} from server, renormalised over them: they hold {min(mass, 1.0):.1%} "
            "of the model's probability (the rest was not reported)")
    stages = None if event.stages is None else tuple(dataclasses.replace(s, note=note) for s in event.stages)
    return dataclasses.replace(
        event,
        logprob=event.logprob + shift,
        top_model=top + ((rest,) if rest else ()),
        entropy=max(entropy, 0.0),
        stages=stages,
    )
