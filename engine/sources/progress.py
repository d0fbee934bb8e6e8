"""How finding, downloading and converting a model say how far along they are: `ProgressCallback`, called with
(what is happening, the fraction done or None when unknown). A module of its own so the modules that report
progress (hub, default_model, gguf_convert) and the one that calls them (resolve) need not import each other."""

from __future__ import annotations

from collections.abc import Callable

ProgressCallback = Callable[[str, "float | None"], None]
