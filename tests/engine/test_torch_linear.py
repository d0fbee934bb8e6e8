"""Choosing the matmul kernel of the lean decode step (engine/backends/torch/linear.py).

The choice is a timing, so these tests make one candidate clearly slower (a
sleep per call) and check the other is picked; a kernel that fails or gives
another result must never be picked; oneDNN's kernel, where this torch has
it, must equal torch's up to rounding.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

from engine.backends.torch import linear as cpu_linear

# An argument transformers has announced it will remove (`past_key_values` -> `cache`, ...) is an error here, so a
# rename inside the admitted transformers range fails these tests rather than a user's model a release later.
pytestmark = pytest.mark.filterwarnings("error:.*(is deprecated|will be removed).*:FutureWarning")

ONEDNN = "onednn" in cpu_linear.candidates(torch.zeros(1, dtype=torch.float32))


def _weights(n=4, rows=256, cols=128, bias=False):
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(rows, cols, generator=gen) for _ in range(n)]
    biases = [torch.randn(rows, generator=gen) if bias else None for _ in range(n)]
    return weights, biases


def _sleepy(x, weight, bias):
    time.sleep(0.002)  # 2 ms per call: far beyond any timing noise on these small weights
    return F.linear(x, weight, bias)


def test_the_faster_kernel_is_picked(monkeypatch):
    weights, biases = _weights()
    monkeypatch.setitem(cpu_linear.KERNELS, "other", F.linear)
    monkeypatch.setitem(cpu_linear.KERNELS, "torch", _sleepy)
    pick, seconds = cpu_linear.fastest(weights, biases, names=["torch", "other"])
    assert pick == "other"
    # The sleeps are in the sweep it timed (a lower bound, whatever else the machine is doing).
    assert seconds["torch"] >= 4 * 0.002 * 0.9 and seconds["torch"] > seconds["other"]


def test_torch_is_kept_when_the_other_is_slower(monkeypatch):
    weights, biases = _weights(bias=True)
    monkeypatch.setitem(cpu_linear.KERNELS, "other", _sleepy)
    pick, seconds = cpu_linear.fastest(weights, biases, names=["torch", "other"])
    assert pick == "torch" and set(seconds) == {"torch", "other"}


@pytest.mark.parametrize("broken", ["wrong", "raises"])
def test_a_kernel_that_fails_or_disagrees_is_never_picked(monkeypatch, broken):
    def wrong(x, weight, bias):
        return F.linear(x, weight, bias) * 1.01  # fast, but not the same product

    def raises(x, weight, bias):
        raise RuntimeError("this build cannot run that")

    weights, biases = _weights()
    monkeypatch.setitem(cpu_linear.KERNELS, "torch", _sleepy)  # so only the check can keep the other out
    monkeypatch.setitem(cpu_linear.KERNELS, "other", {"wrong": wrong, "raises": raises}[broken])
    assert cpu_linear.fastest(weights, biases, names=["torch", "other"]) == ("torch", {})


def test_only_torch_for_half_precision_or_other_devices():
    assert cpu_linear.candidates(torch.zeros(2, 2, dtype=torch.bfloat16)) == ["torch"]
    assert cpu_linear.candidates(torch.zeros(2, 2, dtype=torch.float16)) == ["torch"]
    assert cpu_linear.candidates(torch.zeros(2, 2, device="meta")) == ["torch"]


@pytest.mark.skipif(not ONEDNN, reason="this torch build has no oneDNN linear")
@pytest.mark.parametrize("bias", [False, True])
def test_onednn_equals_torch_up_to_rounding(bias):
    weights, biases = _weights(n=1, rows=3072, cols=576, bias=bias)
    x = torch.randn(1, 576, generator=torch.Generator().manual_seed(1))
    ours = cpu_linear.onednn_linear(x, weights[0], biases[0])
    reference = F.linear(x, weights[0], biases[0])
    # sums of 576 products summed in another order: rounding, relative to the largest output (~80 here)
    assert ours.shape == reference.shape
    assert float((ours - reference).abs().max()) <= 1e-6 * float(reference.abs().max())
    pick, seconds = cpu_linear.fastest(weights, biases)
    assert pick in {"torch", "onednn"} and set(seconds) == {"torch", "onednn"}  # both timed, either may win


def test_timing_leaves_torchs_random_state_alone():
    """Loading a model times the kernels; sampling code seeded before the load must see the same numbers."""
    weights, biases = _weights()
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    cpu_linear.fastest(weights, biases, names=["torch", "onednn"] if ONEDNN else ["torch", "torch"])
    assert torch.equal(torch.rand(3), expected)
