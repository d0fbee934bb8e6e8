"""The steering an answer records (`engine.steering.Steering.to_dict`), checked field by field (Qt-free).

An answer's request document keeps it under "steering": each vector's name,
content hash (sha256, 16 hex digits), model facts and strength, and the layer
range. A loom file is data from anywhere, so an imported answer's record is
checked before it is written: a strength that is not a finite number or is
beyond the engine's limit, a hash that is not one, a range that is empty are
refused in one line (`FieldError`), and nothing is written.
"""

from __future__ import annotations

import math
import re
from typing import Any

from engine import steering as steer

MAX_VECTORS = 64  # vectors in one answer's steering; the panel holds a handful
_HEX = re.compile(r"^[0-9a-f]{16}$")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def steering_record_problem(doc: Any) -> str | None:
    """What is wrong with a recorded steering, in words ("its request's steering ..."); None when it is right."""
    where = "its request's steering"
    if not isinstance(doc, dict):
        return f"{where} is not a mapping"
    vectors = doc.get("vectors")
    if not isinstance(vectors, list) or not vectors:
        return f"{where} has no list of vectors"
    if len(vectors) > MAX_VECTORS:
        return f"{where} names {len(vectors)} vectors (at most {MAX_VECTORS})"
    for i, v in enumerate(vectors, 1):
        at = f"{where}'s vector {i}"
        if not isinstance(v, dict):
            return f"{at} is not a mapping"
        if not isinstance(v.get("name"), str) or not v["name"].strip() or len(v["name"]) > 200:
            return f"{at} has no name (a text of up to 200 characters)"
        if not isinstance(v.get("sha256"), str) or not _HEX.match(v["sha256"]):
            return f"{at} ({v['name'][:40]!r}) has no content hash (16 hex digits)"
        s = v.get("strength")
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s):
            return f"{at} ({v['name'][:40]!r}) has a strength that is not a finite number ({s!r})"
        if abs(s) > steer.STRENGTH_LIMIT:
            return f"{at} ({v['name'][:40]!r}) has the strength {s:g}, beyond ±{steer.STRENGTH_LIMIT:g}"
        for key in ("n_layer", "n_embd"):
            if key in v and not (_is_int(v[key]) and 0 < v[key] < 1 << 20):
                return f"{at} ({v['name'][:40]!r}) has a {key} that is not a positive whole number"
        if "model_hint" in v and not isinstance(v["model_hint"], str):
            return f"{at} ({v['name'][:40]!r}) has a model_hint that is not a text"
    start, end = doc.get("layer_start"), doc.get("layer_end")
    for name, value in (("layer_start", start), ("layer_end", end)):
        if value is not None and not (_is_int(value) and 1 <= value < 1 << 20):
            return f"{where}'s {name} is {value!r}, not a layer number of 1 or more"
    if start is not None and end is not None and start > end:
        return f"{where}'s layer range {start}..{end} is empty"
    return None
