"""Devices: spelling checked without torch; CUDA asked for where it cannot be used fails in words.

These run on CPU-only torch and on the CUDA build of torch without a driver:
`torch.cuda.is_available()` is the only CUDA call the checks make, and it is
patched where a test needs the answer to be "no".
"""

from __future__ import annotations

import pytest
import torch

from engine.devices import check_device_name, require_available
from engine.errors import UsageError


@pytest.mark.parametrize("text, normal", [("cpu", "cpu"), ("CUDA", "cuda"), ("cuda:1", "cuda:1"), (" mps ", "mps")])
def test_device_names_are_normalised(text, normal):
    assert check_device_name(text) == normal


@pytest.mark.parametrize("text", ["bogus", "cuda:", "cuda:x", "gpu", "cpu:3", "meta", ""])
def test_unknown_device_names_are_refused_in_words(text):
    with pytest.raises(UsageError, match="unknown device"):
        check_device_name(text)


def test_cuda_without_a_usable_gpu_is_refused_before_anything_touches_cuda(monkeypatch):
    from engine.backends.torch.backend import pick_device

    def no_cuda_call(*_a, **_k):
        raise AssertionError("a CUDA call was made although CUDA is not available")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name in ("device_count", "current_device", "get_device_name", "mem_get_info"):
        monkeypatch.setattr(torch.cuda, name, no_cuda_call)
    with pytest.raises(UsageError, match=r"'cuda' is not available.*--device cpu"):
        pick_device("cuda")
    with pytest.raises(UsageError, match="not available"):
        require_available(torch.device("cuda", 0))
    assert pick_device(None).type == "cpu"  # automatic choice falls back to the CPU without a word
    from engine.offload.auto import free_memory

    with pytest.raises(UsageError, match="not available"):
        free_memory("cuda")


def test_the_cpu_is_accepted_where_cuda_is_refused(monkeypatch):
    """The same check that refuses CUDA without a GPU lets the CPU through, and the CPU is what gets picked."""
    from engine.backends.torch.backend import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError):
        require_available(torch.device("cuda"))
    require_available(torch.device("cpu"))  # raises UsageError if the CPU were refused too
    assert pick_device("cpu") == torch.device("cpu") and pick_device(None) == torch.device("cpu")
