"""The torch backend's SamplesOnDevice: an answer's rows left on the model's device and sampled there.

On a GPU the numpy chain needs the whole (V,) row on the host every token (262k floats for Gemma 3, a copy
and a synchronisation), and its Python runs while the GPU waits; here the forward's row stays where the
model wrote it, `engine.sampling.torch_chain.TorchChain` runs the stages and the draw with torch ops there,
and only the token and its report (a few dozen numbers) cross, once (issue 49 item 1). The decode loop
(engine/decode/) asks for this per answer (`TorchBackend.device_rows`); an answer with banned strings or a
custom stage gets None and the numpy chain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from engine.sampling.torch_chain import OnDeviceChain, TorchChain

if TYPE_CHECKING:
    import torch

T = TypeVar("T")


class DeviceForwards(Protocol):
    """What these rows take of the torch backend (engine.backends.torch.backend.TorchBackend), named here so
    that this module needs nothing of the backend that makes it."""

    device: Any

    def forward_on_device(self, token_ids: Sequence[int]) -> torch.Tensor: ...

    def forward_on_device_during(self, token_ids: Sequence[int], work: Callable[[], T]) -> tuple[torch.Tensor, T]: ...


class TorchDeviceRows:
    """One answer's `DeviceRows` (engine.capabilities): its device chain and the backend's device forwards."""

    def __init__(self, backend: DeviceForwards, chain: TorchChain) -> None:
        self._backend = backend
        self.chain = OnDeviceChain(chain, backend.device)

    def forward(self, token_ids: Sequence[int]) -> torch.Tensor:
        return self._backend.forward_on_device(token_ids)

    def forward_during(self, token_ids: Sequence[int], work: Callable[[], T]) -> tuple[torch.Tensor, T]:
        return self._backend.forward_on_device_during(token_ids, work)
