"""What a server reports is checked where it enters: token ids, log-probs and how many alternatives.

A server is another program, possibly broken or hostile. Its token ids size
arrays here (a row of the vocabulary per step: id 10⁹ would be a 4 GB row,
id 2⁴⁰ 4 TiB), its log-probs become the probabilities, ranks and entropies
the app shows, and its alternatives' count decides how much we parse.

Choice: an answer holding an impossible value is refused as a whole, with
the value quoted (a `ServerResponseError`; a streamed answer keeps the tokens
that came before it and ends with the error). Dropping only the bad entries
was the other way; it was not taken because the entries left would then be
shown as the server's distribution (its mass, the rest, the entropy, the
chosen token's rank) when the server said something else, and a server that
reports p = 5e21 or id 10⁹ is not one whose other numbers can be trusted.
Rounding is not a fault: a log-prob a hair above 0 (float error, up to
`LOGPROB_SLACK`) is read as 0, and -inf (probability 0) is a real value.
"""

from __future__ import annotations

import math
from typing import Any

from engine.backends.remote.errors import ServerResponseError

# Above every real vocabulary (Gemma's 262,144 is the largest common one) with room to spare, and small enough
# that a row of log-probs that wide is 8 MB.
MAX_TOKEN_ID = (1 << 21) - 1
LOGPROB_SLACK = 1e-3  # float rounding on the server: a log-prob this far above 0 is read as 0
EXTRA_ALTERNATIVES = 1  # vLLM adds the sampled token to the top N it was asked for


def token_id(value: Any, vocab_size: int = 0) -> int:
    """A token id as the server gave it, checked: an integer in [0, vocab_size) when the size is known, else
    in [0, MAX_TOKEN_ID]."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ServerResponseError(f"the server gave a token id that is not a number: {_shown(value)}")
    try:
        tid = int(value)
    except ValueError:
        raise ServerResponseError(f"the server gave a token id that is not a number: {_shown(value)}") from None
    limit = vocab_size - 1 if vocab_size > 0 else MAX_TOKEN_ID
    if not 0 <= tid <= limit:
        where = f"this model's vocabulary has {vocab_size:,} tokens" if vocab_size > 0 else f"no vocabulary has ids past {MAX_TOKEN_ID:,}"
        raise ServerResponseError(f"the server gave token id {tid:,}, which is impossible ({where}): its answer was refused")
    return tid


def logprob(value: Any, token: str = "") -> float:
    """A log-prob as the server gave it, checked: a number <= 0 (-inf allowed: probability 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ServerResponseError(f"the server gave{_for(token)} a log-prob that is not a number: {_shown(value)}")
    lp = float(value)
    if math.isnan(lp):
        raise ServerResponseError(f"the server gave{_for(token)} a log-prob that is not a number (p = nan): "
                                  "its answer was refused")
    if lp > LOGPROB_SLACK:
        p = "inf" if math.isinf(lp) else f"{math.exp(lp):.3g}" if lp < 700 else f"e^{lp:.4g}"
        raise ServerResponseError(f"the server gave{_for(token)} the log-prob {lp:.6g} (p = {p}), but a probability "
                                  "is at most 1: its answer was refused")
    return min(lp, 0.0)


def alternatives_count(count: int, asked: int | None) -> None:
    """A position's alternatives: no more than asked for (plus vLLM's sampled token); None: not checked."""
    if asked is not None and count > asked + EXTRA_ALTERNATIVES:
        raise ServerResponseError(f"the server gave {count:,} alternatives for one token where {asked} were asked "
                                  "for: its answer was refused")


def _for(token: str) -> str:
    return f" the token {token[:40]!r}" if token else ""


def _shown(value: Any) -> str:
    return repr(value)[:60]
