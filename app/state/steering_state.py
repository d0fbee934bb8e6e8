"""What the next answer is steered by: the user's vectors, a strength each, and one layer range (Qt-free).

The Steering panel shows and changes this; the chat controller reads
`steering()` when it builds a request, so a change applies from the next
answer on (never to one already streaming). Strengths start at 0 here; the
window restores the ones last set (`SteeringMemory`, app/state/settings.py),
and the panel shows them. A vector that does not fit the loaded model (another layer count or
width) stays listed with the engine's reason and is not applied.

Vectors the user loads or trains are kept in a folder of llama.cpp
control-vector files (`<data dir>/steering/`), so an answer steered last week
can be replayed after a restart: its record names each vector's content hash,
and `find` looks it up here.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

from engine import steering as steer

from app.state.observable import Signal

log = logging.getLogger(__name__)

SLIDER_LIMIT = 2.0  # the panel's sliders span -2..+2; the spin box takes exact values up to SPIN_LIMIT
SPIN_LIMIT = 10.0
FOLDER_NAME = "steering"


@dataclass(frozen=True)
class Row:
    """One vector in the panel: its strength, and why it cannot be applied to the loaded model ("" when it can)."""

    vector: steer.SteeringVector
    strength: float
    unfit: str


def check_strength(value: object) -> float:
    """`value` as a strength, or ValueError in words (not a number, NaN, beyond ±SPIN_LIMIT)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(str(value).strip())
        except ValueError:
            raise ValueError(f"the strength must be a number, got {value!r}") from None
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"the strength must be a finite number, got {number!r}")
    if abs(number) > SPIN_LIMIT:
        raise ValueError(f"the strength {number:g} is beyond ±{SPIN_LIMIT:g}; steering that hard only breaks the text")
    return number


class SteeringState:
    """The vectors (in the order added), their strengths, the layer range, and what the loaded model allows."""

    def __init__(self, folder: Path | None = None):
        self.folder = folder  # None: nothing kept between runs (tests, a temporary session)
        self._vectors: list[steer.SteeringVector] = []
        self._strength: dict[str, float] = {}  # digest -> strength
        self._known: dict[str, steer.SteeringVector] = {}  # every vector seen this session, by digest (replays)
        self.layer_start: int | None = None
        self.layer_end: int | None = None
        self.shape: steer.ResidualShape | None = None  # the loaded model's; None: unknown or cannot steer
        self.model_name = ""
        self.can_steer: bool | None = None  # None: no model yet
        self.changed = Signal()  # () the list, a strength, the range or the model changed
        if folder is not None:
            self._read_folder(folder)

    # -- reading ---------------------------------------------------------------------------

    def rows(self) -> list[Row]:
        return [Row(v, self._strength.get(v.digest, 0.0), self.unfit(v)) for v in self._vectors]

    @property
    def vectors(self) -> tuple[steer.SteeringVector, ...]:
        return tuple(self._vectors)

    def strength(self, vector: steer.SteeringVector) -> float:
        return self._strength.get(vector.digest, 0.0)

    def unfit(self, vector: steer.SteeringVector) -> str:
        """Why `vector` cannot steer the loaded model, in the engine's words; "" when it can (or no model is known)."""
        if self.shape is None:
            return ""
        try:
            vector.check_for(self.shape, self.model_name or "the loaded model")
        except steer.SteeringError as e:
            return str(e)
        return ""

    def steering(self) -> steer.Steering | None:
        """The steering for the next answer: the fitting vectors at a non-zero strength, the range; None for none.

        None (not an inactive Steering) when nothing is on, so an answer at strength 0 runs exactly as one
        without steering ever did."""
        if self.can_steer is False:
            return None
        entries = [steer.SteeringEntry(v, self._strength[v.digest]) for v in self._vectors
                   if self._strength.get(v.digest, 0.0) != 0.0 and not self.unfit(v)]
        if not entries:
            return None
        return steer.Steering(tuple(entries), self.layer_start, self.layer_end)

    def find(self, digest: str) -> steer.SteeringVector | None:
        """A vector seen this session or kept in the folder, by content hash (to run a recorded steering again)."""
        return self._known.get(digest)

    def steering_of(self, record: object) -> steer.Steering | None:
        """An answer's recorded steering (`Steering.to_dict`) back as a Steering; None when it had none.

        SteeringError in words when a vector it names is not available."""
        if not record:
            return None
        if not isinstance(record, dict):
            raise steer.SteeringError(f"a steering record must be a mapping, got {type(record).__name__}")
        found = steer.Steering.from_dict(record, self.find)
        return found if found.active else None

    # -- changing --------------------------------------------------------------------------

    def add(self, vector: steer.SteeringVector, *, keep: bool = True) -> steer.SteeringVector:
        """Add `vector` at strength 0 (a new name if its name is taken); refused in words when it does not fit
        the loaded model, and then nothing changes. The same numbers twice: the one already listed."""
        for v in self._vectors:
            if v.digest == vector.digest:
                return v
        problem = self.unfit(vector)
        if problem:
            raise steer.SteeringError(problem)
        names = {v.name for v in self._vectors}
        name, n = vector.name, 2
        while name in names:
            name, n = f"{vector.name} {n}", n + 1
        if name != vector.name:
            vector = vector.renamed(name)
        if keep:
            self._keep(vector)
        self._vectors.append(vector)
        self._known[vector.digest] = vector
        self._strength[vector.digest] = 0.0
        self.changed.emit()
        return vector

    def remove(self, vector: steer.SteeringVector) -> None:
        """Take `vector` out of the panel (its file stays, so answers it steered can still be replayed)."""
        if vector in self._vectors:
            self._vectors.remove(vector)
            self._strength.pop(vector.digest, None)
            self.changed.emit()

    def set_strength(self, vector: steer.SteeringVector, value: object) -> None:
        number = check_strength(value)
        if vector.digest not in self._strength:
            raise steer.SteeringError(f"no steering vector {vector.name!r} in the panel")
        if self._strength[vector.digest] != number:
            self._strength[vector.digest] = number
            self.changed.emit()

    def set_layers(self, start: int | None, end: int | None) -> None:
        """The layer range, both ends inclusive (None: llama.cpp's defaults); ValueError in words when empty."""
        if start is not None and end is not None and start > end:
            raise ValueError(f"the layer range {start}..{end} is empty: its start is after its end")
        steer.Steering((), start, end)  # the engine's own checks (layer numbers of 1 or more)
        if (start, end) != (self.layer_start, self.layer_end):
            self.layer_start, self.layer_end = start, end
            self.changed.emit()

    def set_model(self, shape: steer.ResidualShape | None, name: str, can_steer: bool) -> None:
        """The loaded model changed: what a vector must fit, and whether it can be steered at all (a server cannot)."""
        self.shape, self.model_name, self.can_steer = shape, name, can_steer
        self.changed.emit()

    # -- the folder ------------------------------------------------------------------------

    def _keep(self, vector: steer.SteeringVector) -> None:
        if self.folder is None:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / f"{_safe(vector.name)}-{vector.digest}.gguf"
            if not path.exists():
                steer.save_vector(vector, path)
        except (OSError, steer.SteeringError) as e:  # the vector still steers; only a restart forgets it
            log.warning("could not keep steering vector %r in %s: %s", vector.name, self.folder, e)

    def _read_folder(self, folder: Path) -> None:
        if not folder.is_dir():
            return
        for path in sorted(folder.glob("*.gguf")):
            name = path.stem.rsplit("-", 1)[0] or path.stem
            try:
                vector = steer.load_vector(path, name=name)
            except steer.SteeringError as e:
                log.warning("skipping steering vector file %s: %s", path, e)
                continue
            self.add(vector, keep=False)


def _safe(name: str) -> str:
    """A file-name-safe form of a vector's name."""
    kept = "".join(c if c.isalnum() or c in "-_." else "_" for c in name.strip())
    return kept[:60] or "vector"
