"""Checks that compare logits from two devices (the GPU's and a host copy) work across devices.

No GPU here, so a tensor that behaves like one on another device stands in:
any op that mixes it with a host tensor raises as CUDA does ("Expected all
tensors to be on the same device"), and `.cpu()` brings it home. The loom's
first-use check of the lean step for rows compared `ours` (on cuda:0) with
`torch.from_numpy(theirs)` (on the host) and crashed exactly so.
"""

from __future__ import annotations

import pytest
import torch

from engine.backends.torch.compile import relative_logit_error


class OnAnotherDevice(torch.Tensor):
    """A tensor on a device other than the host's, as far as mixing goes."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") == "cpu":  # the copy to the host is a plain host tensor
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs).as_subclass(torch.Tensor)
        flat = list(args) + list(kwargs.values())
        if any(type(a) is torch.Tensor for a in flat) and any(isinstance(a, cls) for a in flat):
            raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices")
        return super().__torch_function__(func, types, args, kwargs)


def _elsewhere(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(OnAnotherDevice)


def test_the_stand_in_fails_as_a_second_device_does():
    with pytest.raises(RuntimeError, match="same device"):
        _ = _elsewhere(torch.ones(3)) - torch.ones(3)


def test_logits_on_two_devices_compare_on_the_host():
    theirs = torch.tensor([[1.0, -4.0, 2.0]])
    ours = _elsewhere(torch.tensor([[1.0, -4.0, 2.5]]))  # the lean step's logits, on the "GPU"
    assert relative_logit_error(ours, theirs) == pytest.approx(0.5 / 4.0)
    assert relative_logit_error(theirs, ours) == pytest.approx(0.5 / 4.0)


def test_half_precision_logits_compare_with_a_float32_host_copy():
    theirs = torch.tensor([[0.25, 0.5]])  # the runner's numpy logits are float32
    ours = _elsewhere(torch.tensor([[0.25, 0.75]], dtype=torch.bfloat16))
    assert relative_logit_error(ours, theirs) == pytest.approx(0.25)
