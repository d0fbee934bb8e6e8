"""attach(): put a model's decoder layers under an offload policy and install the streaming executor.

Works on a fully loaded model (its streamed weights are freed) and on one
built with meta parameters (`load.build_empty`), whose resident weights are
then read from the checkpoint. Parameters are matched to checkpoint tensors
by name, so the checkpoint must be the model's own safetensors files.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from engine.devices import require_available
from engine.errors import ModelLoadError
from engine.offload.checkpoint import Checkpoint
from engine.offload.executor import OffloadHandle
from engine.offload.layout import LayerTensor, decoder_layers, layer_tensors
from engine.offload.placement import Tier, place
from engine.offload.policy import OffloadPolicy
from engine.offload.transfer import Source, load_tensor

log = logging.getLogger(__name__)


def checkpoint_key(checkpoint: Checkpoint, name: str, base_prefix: str) -> str | None:
    """The checkpoint key holding parameter `name` (base models are often saved without their prefix)."""
    candidates = [name]
    if base_prefix and name.startswith(base_prefix + "."):
        candidates.append(name[len(base_prefix) + 1 :])
    elif base_prefix:
        candidates.append(f"{base_prefix}.{name}")
    return next((k for k in candidates if k in checkpoint), None)


def _key_or_fail(checkpoint: Checkpoint, name: str, base_prefix: str) -> str:
    key = checkpoint_key(checkpoint, name, base_prefix)
    if key is None:
        raise ModelLoadError(
            f"offloading reads weights by parameter name, and {name} is not in {checkpoint.folder}'s safetensors files"
        )
    return key


def _set(module: nn.Module, attr: str, t: torch.Tensor) -> None:
    module._parameters[attr] = nn.Parameter(t, requires_grad=False)


def _materialize_resident(model: nn.Module, checkpoint: Checkpoint, device: torch.device, layer_prefix: str) -> int:
    """Put every non-layer parameter and buffer on the device (loading meta ones); return their bytes."""
    base = getattr(model, "base_model_prefix", "")
    # Tied parameters (lm_head.weight is embed_tokens.weight) are one object under several names:
    # replace each object once and put the new one under all of its names.
    names: dict[int, list[str]] = {}
    params: dict[int, nn.Parameter] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if not name.startswith(layer_prefix + "."):
            names.setdefault(id(param), []).append(name)
            params[id(param)] = param
    missing = []
    for pid, param in params.items():
        if param.device.type == "meta":
            key = next((k for n in names[pid] if (k := checkpoint_key(checkpoint, n, base)) is not None), None)
            if key is None:
                missing.extend(names[pid])
                continue
            new = nn.Parameter(load_tensor(checkpoint, key, device, param.dtype), requires_grad=False)
        elif param.device != device:
            new = nn.Parameter(param.detach().to(device), requires_grad=False)
        else:
            continue
        for name in names[pid]:
            owner_path, _, attr = name.rpartition(".")
            model.get_submodule(owner_path)._parameters[attr] = new
    if missing:
        # A transformers method (nn.Module's __getattr__ types it as a Tensor, hence the ignore):
        model.tie_weights()  # type: ignore[operator]  # stored once under the other name of a tie the model did not make at build
        still = [n for n, p in model.named_parameters(remove_duplicate=False)
                 if p.device.type == "meta" and not n.startswith(layer_prefix + ".")]
        if still:
            raise ModelLoadError(f"offloading found no weights for {', '.join(still)} in {checkpoint.folder}")
    for module in model.modules():
        for bname, buf in list(module._buffers.items()):
            if buf is not None and buf.device != device and buf.device.type != "meta":
                module._buffers[bname] = buf.to(device)
    return sum(
        p.numel() * p.element_size() for n, p in model.named_parameters() if not n.startswith(layer_prefix + ".")
    )


def _home(t: LayerTensor, tier: Tier, current: torch.Tensor, checkpoint: Checkpoint, key: str,
          device: torch.device, pin: bool) -> torch.Tensor | None:
    """The tensor a resident or host-tier weight keeps for good (None for disk): loaded if `current` is meta."""
    if tier is Tier.DISK:
        return None
    target = device if tier is Tier.GPU else torch.device("cpu")
    if current.device.type == "meta":
        return load_tensor(checkpoint, key, target, t.dtype, pin=pin and tier is Tier.CPU)
    out = current.detach().to(target)
    if pin and tier is Tier.CPU and not out.is_pinned():
        out = out.pin_memory()
    return out


def attach(
    model: nn.Module,
    folder: Path | Checkpoint,
    policy: OffloadPolicy,
    *,
    device: torch.device | str | None = None,
) -> OffloadHandle:
    """Offload `model`'s decoder layers by `policy`, streaming from `folder`'s safetensors; returns the handle.

    `model` may be fully loaded (its streamed weights are freed) or built on
    the meta device (`load.build_empty`; resident weights are then read from
    the checkpoint). Weights keep the dtypes the model already has. `device`
    is the compute device (default: where the embeddings are, else CPU).
    """
    checkpoint = folder if isinstance(folder, Checkpoint) else Checkpoint(Path(folder))
    try:
        if device is None:
            emb = model.get_input_embeddings().weight  # type: ignore[operator]  # transformers' method
            device = emb.device if emb.device.type != "meta" else torch.device("cpu")
        device = torch.device(device)
        require_available(device)  # below: current_device(), streams and pinned memory, all of which need a driver
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        prefix, layers = decoder_layers(model)
        tensors = layer_tensors(prefix, layers)
        placement = place([[t.nbytes for t in ts] for ts in tensors], policy)
        resident_bytes = _materialize_resident(model, checkpoint, device, prefix)
        pin = policy.pin_cpu_weights and device.type == "cuda" and torch.cuda.is_available()
        base = getattr(model, "base_model_prefix", "")
        streamed: dict[int, tuple[Source, ...]] = {}
        params = dict(model.named_parameters())
        for i, (ts, tiers) in enumerate(zip(tensors, placement.tiers)):
            srcs = []
            for t, tier in zip(ts, tiers):
                key = _key_or_fail(checkpoint, t.name, base)
                home = _home(t, tier, params[t.name], checkpoint, key, device, pin)
                if tier is Tier.GPU or (tier is Tier.CPU and device.type == "cpu"):
                    assert home is not None  # only the disk tier has no home
                    _set(t.module, t.attr, home)  # resident for good: compute reads it in place
                else:
                    srcs.append(Source(t, key, home))  # host copy (CPU tier on a GPU) or None (disk)
            if srcs:
                streamed[i] = tuple(srcs)
        handle = OffloadHandle(model, checkpoint, policy, placement, device, streamed, resident_bytes)
        permanent = placement.total_bytes - sum(s.tensor.nbytes for srcs in streamed.values() for s in srcs)
        handle.install(layers, permanent)
    except BaseException:
        if not isinstance(folder, Checkpoint):
            checkpoint.close()
        raise
    log.info("offload %s on %s: %s", policy.spec(), device, placement.describe())
    return handle
