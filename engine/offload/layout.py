"""Where a transformers causal LM keeps its decoder layers, and the tensors of each.

We stream transformers' own layer modules rather than re-implementing any
architecture: all we need is the ModuleList of decoder layers and, per
layer, each parameter's owning submodule, so a tensor can be swapped in and
out of `submodule._parameters[attr]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from engine.errors import ModelLoadError

_LAYER_LIST_NAMES = ("layers", "h", "blocks", "layer")


@dataclass(frozen=True)
class LayerTensor:
    name: str  # full parameter name, e.g. "model.layers.3.mlp.up_proj.weight"
    module: nn.Module  # the submodule that owns it (e.g. the up_proj Linear)
    attr: str  # its key in module._parameters ("weight")
    shape: tuple[int, ...]
    dtype: torch.dtype  # the dtype the model computes this tensor in

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """('model.layers', the ModuleList) for a transformers causal LM; raises if there is no such list."""
    config = model.config.get_text_config()  # type: ignore[union-attr,operator]  # a transformers model's
    n = getattr(config, "num_hidden_layers", None)
    for name, module in model.named_modules():
        if (
            isinstance(module, nn.ModuleList)
            and len(module) > 0
            and (n is None or len(module) == n)
            and name.rsplit(".", 1)[-1] in _LAYER_LIST_NAMES
        ):
            return name, module
    raise ModelLoadError(
        f"offloading found no list of {n} decoder layers in {type(model).__name__}; this architecture is not supported"
    )


def layer_tensors(prefix: str, layers: nn.ModuleList) -> tuple[tuple[LayerTensor, ...], ...]:
    """Per layer, its parameters in registration order (the order placement walks)."""
    out = []
    for i, layer in enumerate(layers):
        tensors = []
        for rel, param in layer.named_parameters():
            owner_path, _, attr = rel.rpartition(".")
            owner = layer.get_submodule(owner_path) if owner_path else layer
            tensors.append(LayerTensor(f"{prefix}.{i}.{rel}", owner, attr, tuple(param.shape), param.dtype))
        out.append(tuple(tensors))
    return tuple(out)
