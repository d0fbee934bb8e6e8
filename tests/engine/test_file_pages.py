"""Dropping the resident pages of memory-mapped weights the lean step has copied (engine/backends/torch/file_pages.py)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from engine.backends.torch.file_pages import release_file_pages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise on /proc/self/maps: Linux")

MIB = 2**20


def _resident_bytes(path) -> int:
    """Rss of the mapping of `path` in this process, from /proc/self/smaps."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            first = line.split()[0]
            if "-" in first and not first.endswith(":"):  # a mapping's header line
                inside = line.rstrip().endswith(str(path))
            elif inside and first == "Rss:":
                total += int(line.split()[1]) * 1024
    return total


def test_pages_of_a_file_mapped_tensor_are_dropped_and_its_bytes_survive(tmp_path):
    path = tmp_path / "weights.bin"
    values = np.random.default_rng(0).standard_normal(4 * MIB, dtype=np.float32)  # 16 MiB
    values.tofile(path)
    # A private, writable map of the file: how transformers maps safetensors ("rw-p" in /proc/self/maps).
    mapped = torch.from_numpy(np.memmap(path, dtype=np.float32, mode="c"))
    expected = float(mapped.double().sum())
    assert _resident_bytes(path) >= 15 * MIB  # read once: resident

    dropped = release_file_pages([mapped[1000:]])  # a view: only whole pages inside it go
    assert 15 * MIB <= dropped < 16 * MIB
    assert _resident_bytes(path) <= MIB
    assert float(mapped.double().sum()) == expected  # read again: faulted back in from the file


def test_anonymous_memory_is_left_alone():
    weights = torch.arange(4 * MIB, dtype=torch.float32)
    assert release_file_pages([weights]) == 0
    assert float(weights[-1]) == 4 * MIB - 1
