"""Steering on the torch backend: a direction added to chosen decoder layers' outputs, as llama.cpp's control vectors.

A forward hook on every decoder layer (transformers' `model.layers[i]`)
adds row i of the steering's combined (n_layer, n_embd) tensor to the
layer's output, at every position, exactly where llama.cpp adds
`direction.i` (`build_cvec` before `l_out-i`). The hooks are live only
inside the backend's own forward (`SteeringHooks.applied`), so the batch
and position runners that share the model (research API, loom, scoring)
keep computing the unsteered model. Layer outputs for training are read by
the same hooks (a prefix the prompts share runs once). The lean decode step skips the
layers' modules, so it gets the same tensor and adds each row itself
(lean.py); the compiled CUDA step is not used while steering.

When the steering changes, the KV cache is dropped (a steered prefix's keys
and values are not an unsteered one's), as on llama.cpp.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from engine.backends.torch.compat import with_cache
from engine.lens import check_positions
from engine.steering.settings import Steering, SteeringKey, key_of
from engine.steering.shape import ResidualShape
from engine.steering.shared_prefix import shared_prefix_length

log = logging.getLogger(__name__)

STATES_BATCH = 16  # prompts per forward when reading layer outputs


def decoder_layers(model: Any) -> Sequence[torch.nn.Module]:
    """The model's decoder layers in order (transformers' `model.model.layers`, or the decoder's)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None and hasattr(model, "get_decoder"):
        layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise RuntimeError(f"{type(model).__name__} has no list of decoder layers to steer")
    return list(layers)


def _with_hidden(output: Any, hidden: torch.Tensor) -> Any:
    if isinstance(output, tuple):
        return (hidden, *output[1:])
    return hidden


def _hidden_of(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


class SteeringHooks:
    """Forward hooks on the decoder layers that add `add[i]` to layer i's output while `applied` is in force."""

    def __init__(self, model: Any):
        self.add: torch.Tensor | None = None  # (n_layer, n_embd) in the model's dtype and device
        self.capture: dict[int, torch.Tensor] | None = None  # layer -> its output, while reading states
        self._handles = [layer.register_forward_hook(self._hook(i)) for i, layer in enumerate(decoder_layers(model))]

    def _hook(self, index: int) -> Callable[[Any, Any, Any], Any]:
        def hook(_module: Any, _inputs: Any, output: Any) -> Any:
            add = self.add
            if add is not None:
                output = _with_hidden(output, _hidden_of(output) + add[index])
            if self.capture is not None:
                self.capture[index] = _hidden_of(output)
            return output

        return hook

    @contextlib.contextmanager
    def applied(self, add: torch.Tensor | None) -> Iterator[None]:
        before = self.add
        self.add = add
        try:
            yield
        finally:
            self.add = before

    @contextlib.contextmanager
    def capturing(self) -> Iterator[dict[int, torch.Tensor]]:
        self.capture = {}
        try:
            yield self.capture
        finally:
            self.capture = None

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


class TorchSteering:
    """`Steerable` and `ResidualStates` for `TorchBackend` (mixed in; state kept under `_steering_*`)."""

    model: Any
    device: torch.device

    def _hooks(self) -> SteeringHooks:
        hooks = getattr(self, "_steering_hooks", None)
        if hooks is None:
            hooks = self._steering_hooks = SteeringHooks(self.model)
        return hooks

    def residual_shape(self) -> ResidualShape:
        cfg = self.model.config.get_text_config()
        return ResidualShape(int(cfg.num_hidden_layers), int(cfg.hidden_size), str(getattr(cfg, "model_type", "") or ""))

    def current_steering(self) -> Steering | None:
        return getattr(self, "_steering_now", None)

    def steering_key(self) -> SteeringKey | None:
        return key_of(self.current_steering())

    def steering_tensor(self) -> torch.Tensor | None:
        """What the backend's own forwards add per layer now: (n_layer, n_embd), None when unsteered."""
        return getattr(self, "_steering_add", None)

    def _tensor_for(self, steering: Steering | None) -> torch.Tensor | None:
        if steering is None or not steering.active:
            return None
        combined = steering.combined(self.residual_shape())  # checks fit first
        dtype = next(self.model.parameters()).dtype
        return torch.from_numpy(combined).to(device=self.device, dtype=dtype)

    def set_steering(self, steering: Steering | None) -> None:
        if steering is not None and not steering.active:
            steering = None
        if key_of(steering) == self.steering_key():
            return
        add = self._tensor_for(steering)  # raises before anything changes
        if add is not None:
            self._hooks()
        self._steering_now, self._steering_add = steering, add
        self.trim_cache(0)  # type: ignore[attr-defined]  # (CachedTokens) the old prefix was computed otherwise
        log.debug("torch steering: %s", steering.describe() if steering else "none")

    @contextlib.contextmanager
    def steered(self) -> Iterator[None]:
        """The backend's own forward under its steering (the hooks add nothing outside this)."""
        add = self.steering_tensor()
        if add is None:
            yield
            return
        with self._hooks().applied(add):
            yield

    @torch.inference_mode()
    def steered_logits(self, token_ids: Sequence[int], positions: Sequence[int], steering: Steering | None) -> np.ndarray:
        vocab = int(self.model.config.get_text_config().vocab_size)
        ids, wanted = check_positions(token_ids, positions, vocab)
        add = self._tensor_for(steering)
        end = wanted[-1]  # rows 0..end-1 predict tokens 1..end
        x = torch.tensor([ids[:end]], dtype=torch.long, device=self.device)
        context = self._hooks().applied(add) if add is not None else contextlib.nullcontext()
        with context:
            logits = self.model(input_ids=x, use_cache=False).logits[0]  # (end, V)
        rows = torch.tensor([p - 1 for p in wanted], device=logits.device)
        return logits.index_select(0, rows).float().cpu().numpy()

    @torch.inference_mode()
    def last_token_states(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
        shape = self.residual_shape()
        seqs = [[int(t) for t in s] for s in sequences]
        if not seqs or any(not s for s in seqs):
            raise ValueError("every sequence needs at least one token")
        out = np.empty((len(seqs), shape.n_layer, shape.n_embd), dtype=np.float32)
        hooks = self._hooks()
        body = getattr(self.model, "model", self.model)
        # A prefix every prompt shares (a pair set's chat template and persona) runs once; each batch continues
        # from copies of its keys and values, so only the prompts' own tokens run per batch.
        shared = shared_prefix_length(seqs)
        prefix_cache = None
        if shared:
            from transformers import DynamicCache

            prefix_cache = DynamicCache(config=self.model.config)
            with hooks.applied(None):
                body(input_ids=torch.tensor([seqs[0][:shared]], device=self.device), use_cache=True,
                     **with_cache(body, prefix_cache))
        for lo in range(0, len(seqs), STATES_BATCH):
            group = [s[shared:] for s in seqs[lo : lo + STATES_BATCH]]
            width = max(len(s) for s in group)
            ids = torch.zeros((len(group), width), dtype=torch.long, device=self.device)
            mask = torch.zeros((len(group), shared + width), dtype=torch.long, device=self.device)
            mask[:, :shared] = 1
            for j, s in enumerate(group):  # right padding: each prompt's positions are its own
                ids[j, : len(s)] = torch.tensor(s)
                mask[j, shared : shared + len(s)] = 1
            kwargs: dict[str, Any] = {"use_cache": False}
            if prefix_cache is not None:
                import copy

                cache = copy.deepcopy(prefix_cache)
                cache.batch_repeat_interleave(len(group))
                kwargs = {"use_cache": True, **with_cache(body, cache)}
            last = torch.tensor([len(s) - 1 for s in group], device=self.device)
            rows = torch.arange(len(group), device=self.device)
            with hooks.applied(None), hooks.capturing() as captured:
                body(input_ids=ids, attention_mask=mask, **kwargs)
            for layer in range(shape.n_layer):
                out[lo : lo + len(group), layer] = captured[layer][rows, last].float().cpu().numpy()
        return out


