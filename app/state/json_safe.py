"""Standard JSON for exports: no `NaN`, `Infinity` or `-Infinity` tokens, and a way back.

Python's `json` writes a non-finite float as `-Infinity`, which is not JSON:
other tools refuse the file. A token ban (a logit bias of -inf) is ordinary
data, so exports spell such values in standard JSON instead, and our own
importers read them back:

- a ban in a `logit_bias` list (`[[id or text, -inf], ...]`) is written `false`,
  the way llama.cpp's server spells a ban (`SamplerSettings` reads it back as -inf);
- any other non-finite number is written as the string "-inf", "inf" or "nan"
  (`number_in` turns such a string back into the float where a number belongs);
- token log-probs of -inf are `null` already (app/state/database/records.py, the trace format).
"""

from __future__ import annotations

import json
import math
from typing import Any

NON_FINITE = {"-inf": -math.inf, "inf": math.inf, "nan": math.nan}


def _spell(x: float) -> str:
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def json_safe(value: Any) -> Any:
    """`value` (JSON-like) with every non-finite float spelled in standard JSON (see the module doc)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else _spell(value)
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out[k] = _logit_bias_out(v) if k == "logit_bias" else json_safe(v)
        return out
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _logit_bias_out(value: Any) -> Any:
    def ban(bias: Any) -> Any:
        return False if isinstance(bias, float) and bias == -math.inf else json_safe(bias)

    if isinstance(value, (list, tuple)):
        return [[p[0], ban(p[1])] if isinstance(p, (list, tuple)) and len(p) == 2 else json_safe(p) for p in value]
    if isinstance(value, dict):
        return {k: ban(v) for k, v in value.items()}
    return json_safe(value)


def number_in(value: Any) -> Any:
    """A number as `json_safe` wrote it: the strings "-inf", "inf", "nan" become floats; anything else as is."""
    if isinstance(value, str) and value in NON_FINITE:
        return NON_FINITE[value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """`json.dumps` of `json_safe(value)`, refusing anything non-standard that is left."""
    return json.dumps(json_safe(value), allow_nan=False, **kwargs)
