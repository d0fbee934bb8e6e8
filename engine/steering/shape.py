"""The facts a steering vector must match: how many decoder layers a model has and how wide its residual is."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ResidualShape:
    """A model's residual stream: `n_layer` decoder layers, each output `n_embd` wide.

    `model_hint` is the model's architecture as llama.cpp names it ("llama", "gemma3"), written into a
    control-vector file's `controlvector.model_hint` and shown when a vector is refused; "" when unknown.
    """

    n_layer: int
    n_embd: int
    model_hint: str = ""

    def describe(self) -> str:
        hint = f" ({self.model_hint})" if self.model_hint else ""
        return f"{self.n_layer} layers of width {self.n_embd}{hint}"
