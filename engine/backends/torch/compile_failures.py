"""Models whose compiled decode step failed its check or its build: reported once, never built again.

A build takes a minute on a GPU and a failed one changes nothing on the next
try with the same weights, torch and transformers. So a failure is kept per
model (its folder, class, dtype, device kind and the two libraries' versions) and form of the step
in this process and in a small JSON file in the user cache dir, and the next
load of that model skips the build with one debug line instead of a warning.
A new torch or transformers is a new key; deleting the file
(`<cache>/compile-failures.json`, `LOGITLAB_CACHE_DIR` or the user cache dir)
tries every model again.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import torch

from engine.backends.torch.compat import HFModel

log = logging.getLogger(__name__)

FILE_NAME = "compile-failures.json"
_lock = threading.Lock()
_seen: dict[str, str] = {}  # this process's failures, key -> reason (also when the file cannot be written)


def model_key(model: HFModel, form: str = "") -> str:
    """What identifies a compiled step's outcome: the model's folder and class, dtype, device kind, versions, and
    the step's form (compile.CompiledDecodeStep.form: transformers' forward or the lean step's arithmetic are two
    different graphs, and one failing says nothing of the other)."""
    import transformers

    param = next(model.parameters())
    folder = str(getattr(model.config, "_name_or_path", "") or "")
    parts = [folder, type(model).__name__, str(param.dtype).removeprefix("torch."), param.device.type,
             f"torch {torch.__version__}", f"transformers {transformers.__version__}"]
    return "|".join([*parts, form] if form else parts)


def _path() -> Path | None:
    try:
        from engine.sources.cache_dir import cache_root

        return cache_root() / FILE_NAME
    except OSError:
        return None


def _load(path: Path | None) -> dict[str, str]:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def known_failure(key: str) -> str | None:
    """The reason an earlier build for `key` failed (this process or an earlier one), else None."""
    with _lock:
        return _seen.get(key) or _load(_path()).get(key)


def remember_failure(key: str, reason: str) -> None:
    """Keep `reason` for `key`, so no later load of the same model builds the step again."""
    with _lock:
        _seen[key] = reason
        path = _path()
        if path is None:
            return
        data = _load(path)
        data[key] = reason
        try:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
            tmp.replace(path)
        except OSError as e:  # remembered for this process only
            log.debug("could not keep the compile failure in %s: %s", path, e)
