"""llama.cpp's control-vector GGUF: what `llama-cvector-generator` writes and `--control-vector` reads.

The format (llama.cpp common/common.cpp `common_control_vector_load_one`,
examples/cvector-generator): a GGUF whose `general.architecture` is
"controlvector", with `controlvector.model_hint` (the model's architecture)
and `controlvector.layer_count`, and one 1-D F32 tensor `direction.N` per
layer N >= 1 (llama.cpp puts `direction.N` at offset n_embd * (N - 1) of the
buffer `llama_set_adapter_cvec` reads from layer 1, so N is the decoder
layer whose output it is added to; there is no `direction.0`). We write
every layer 1..n_layer-1 and `layer_count` n_layer - 1, as the generator
does; `repeng`'s export reads the same way.

Reading checks everything llama.cpp checks (names, F32, 1-D, one width) and
what it does not (the architecture, NaN or infinite values, a truncated or
corrupt file) and refuses with one line naming the file, before anything is
applied.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from engine.steering.errors import SteeringError
from engine.steering.vector import MAX_VALUE, SteeringVector

log = logging.getLogger(__name__)

ARCH = "controlvector"
KEY_HINT = "controlvector.model_hint"
KEY_LAYERS = "controlvector.layer_count"
_DIRECTION = re.compile(r"^direction\.(\d+)$")
MAX_LAYERS = 4096  # far beyond any model; a bigger index is a corrupt or hostile file, not a model


def _field_value(reader: Any, key: str) -> Any:  # gguf's reader and field contents (gguf has no types)
    field = reader.fields.get(key)
    if field is None:
        return None
    try:
        return field.contents()
    except Exception:  # noqa: BLE001 - a malformed field reads as absent; the checks below say what is missing
        return None


def load_vector(path: str | os.PathLike[str], name: str | None = None) -> SteeringVector:
    """The control vector in `path`; SteeringError (one line naming the file) for anything unusable.

    `name` defaults to the file's stem.
    """
    from gguf import GGUFReader

    p = Path(path)
    label = p.name
    if not p.is_file():
        raise SteeringError(f"{label}: no such control-vector file ({p})")
    try:
        reader = GGUFReader(str(p))
    except Exception as e:  # noqa: BLE001 - gguf raises ValueError, IndexError, struct errors... on a bad file
        raise SteeringError(f"{label} is not a readable GGUF file (corrupt or truncated?): {e}") from e
    arch = _field_value(reader, "general.architecture")
    if arch != ARCH:
        what = f"a {arch!r} model file" if isinstance(arch, str) else "a GGUF without an architecture"
        raise SteeringError(f"{label} is {what}, not a control vector (general.architecture {ARCH!r})")
    hint = _field_value(reader, KEY_HINT)
    declared = _field_value(reader, KEY_LAYERS)
    rows: dict[int, np.ndarray] = {}
    for t in reader.tensors:
        m = _DIRECTION.match(t.name)
        if not m:
            raise SteeringError(f"{label} holds a tensor {t.name!r}; a control vector holds only direction.N tensors")
        layer = int(m.group(1))
        if layer == 0 or layer > MAX_LAYERS:
            raise SteeringError(f"{label} has {t.name}; control-vector layers run from 1 (llama.cpp has no direction.0)")
        if t.tensor_type.name != "F32":
            raise SteeringError(f"{label}: {t.name} is {t.tensor_type.name}, but control vectors are F32")
        if len([d for d in t.shape if d != 1]) > 1 or len(t.shape) > 1 and int(np.prod(t.shape)) != int(t.shape[0]):
            raise SteeringError(f"{label}: {t.name} has shape {tuple(int(d) for d in t.shape)}, not one row")
        try:
            data = np.array(t.data, dtype=np.float32).reshape(-1)
        except Exception as e:  # noqa: BLE001 - data past the end of a truncated file
            raise SteeringError(f"{label}: {t.name} cannot be read (truncated file?): {e}") from e
        if layer in rows:
            rows[layer] = rows[layer] + data  # llama.cpp adds repeated layers; do the same
        else:
            rows[layer] = data
    if not rows:
        raise SteeringError(f"{label} has no direction tensors")
    widths = {r.shape[0] for r in rows.values()}
    if len(widths) != 1:
        raise SteeringError(f"{label}: its directions have different widths {sorted(widths)}")
    for layer, row in sorted(rows.items()):
        if not np.isfinite(row).all():
            raise SteeringError(f"{label}: direction.{layer} holds NaN or infinite values")
        if (top := float(np.abs(row).max(initial=0.0))) > MAX_VALUE:
            raise SteeringError(f"{label}: direction.{layer} holds a value of {top:.3g}; a control vector's values "
                                f"stay within ±{MAX_VALUE:g} (trained ones within ±1), so steering with it would make "
                                "the model's numbers overflow: the file is damaged or not a steering direction")
    n_layer = max(rows) + 1
    if isinstance(declared, (int, np.integer)) and not isinstance(declared, bool) and 0 < int(declared) <= MAX_LAYERS:
        n_layer = max(n_layer, int(declared) + 1)
    return SteeringVector.from_layers(
        name or p.stem, rows, n_layer=n_layer, model_hint=hint if isinstance(hint, str) else "", source=str(p)
    )


def save_vector(vector: SteeringVector, path: str | os.PathLike[str]) -> Path:
    """Write `vector` as a llama.cpp control-vector GGUF, whole or not at all; returns the path."""
    from gguf import GGUFWriter

    target = Path(path)
    if target.is_dir():
        raise SteeringError(f"{target} is a folder; give a file name for the control vector (e.g. happy.gguf)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        writer = GGUFWriter(tmp, ARCH)
        writer.add_string(KEY_HINT, vector.model_hint)
        writer.add_int32(KEY_LAYERS, vector.n_layer - 1)
        for layer in range(1, vector.n_layer):
            writer.add_tensor(f"direction.{layer}", np.ascontiguousarray(vector.directions[layer], dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    log.info("wrote control vector %s (%d layers of width %d)", target, vector.n_layer - 1, vector.n_embd)
    return target
