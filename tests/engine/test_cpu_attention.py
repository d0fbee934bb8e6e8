"""The CPU attention kernel (engine/backends/cpu_attention.py): torch's attention within float rounding,
or not used at all, with the reason in the log.

The kernel is compiled here with the machine's C compiler; CI's machines have one (llama-cpp-python
is built from source there too).
"""

from __future__ import annotations

import logging
import subprocess

import pytest
import torch
import torch.nn.functional as F

from engine.backends import cpu_attention
from engine.backends.cpu_attention import DecodeAttention


@pytest.fixture
def kernel(attention_kernel) -> DecodeAttention:
    return attention_kernel


def _cache(kv_heads: int, n: int, dim: int, capacity: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values as a GrowingCache holds them: the first n rows of (1, KV, capacity, D) buffers."""
    keys = torch.randn(1, kv_heads, capacity, dim, generator=generator)
    values = torch.randn(1, kv_heads, capacity, dim, generator=generator)
    return keys[:, :, :n], values[:, :, :n]


@pytest.mark.parametrize(
    ("kv_heads", "group", "dim", "n", "pieces"),
    [
        (3, 3, 64, 3000, None),  # the default model's shape at 3,000 positions, pieces as the product cuts them
        (3, 3, 64, 700, 4),
        (3, 3, 64, 1, None),
        (2, 4, 128, 513, 3),  # the other head size with a fixed loop
        (1, 1, 80, 257, 2),  # one head, one query (multi-head attention), any other head size
        (4, 16, 16, 5, 7),  # more pieces than positions: empty pieces must not count
    ],
)
def test_kernel_matches_torch_attention(kernel, kv_heads, group, dim, n, pieces):
    generator = torch.Generator().manual_seed(n)
    keys, values = _cache(kv_heads, n, dim, n + 29, generator)
    q = torch.randn(1, kv_heads, group, dim, generator=generator) * 4  # sharp softmaxes too
    theirs = F.scaled_dot_product_attention(q, keys, values, scale=dim**-0.5)
    ours = kernel(q, keys, values, dim**-0.5, pieces=pieces)
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, atol=2e-6, rtol=1e-5)


def test_pieces_merge_to_the_same_result_whatever_the_cut(kernel):
    """Cutting a head's positions into pieces only changes rounding, not the answer."""
    generator = torch.Generator().manual_seed(0)
    keys, values = _cache(3, 1000, 64, 1024, generator)
    q = torch.randn(1, 3, 3, 64, generator=generator)
    whole = kernel(q, keys, values, 0.125, pieces=1)
    for pieces in (2, 5, 12):
        torch.testing.assert_close(kernel(q, keys, values, 0.125, pieces=pieces), whole, atol=1e-6, rtol=1e-6)


def test_shapes_it_does_not_take_are_refused(kernel):
    keys = torch.zeros(1, 2, 8, 64)
    assert DecodeAttention.takes_cache(keys, keys, 2, 3, 64)
    assert not DecodeAttention.takes_cache(keys, keys, 2, cpu_attention.MAX_GROUP + 1, 64)
    assert not DecodeAttention.takes_cache(keys.half(), keys.half(), 2, 3, 64)
    assert not DecodeAttention.takes_cache(keys, keys.transpose(2, 3).contiguous().transpose(2, 3), 2, 3, 64)
    big = torch.zeros(1, 1, 4, cpu_attention.MAX_DIM + 1)
    assert not DecodeAttention.takes_cache(big, big, 1, 1, cpu_attention.MAX_DIM + 1)
    with pytest.raises(ValueError, match="head size 257"):
        kernel(torch.zeros(1, 1, 1, 257), big.new_zeros(1, 1, 4, 257), big.new_zeros(1, 1, 4, 257), 1.0)


def test_it_runs_on_torchs_threads(kernel):
    """Built with OpenMP, and its OpenMP is the runtime torch's kernels run on: one pool of threads, as many
    as torch uses, not a second pool competing with torch's for the same cores."""
    assert kernel.threaded
    assert cpu_attention.openmp_runtime(kernel.library) == cpu_attention.torch_openmp_runtime() is not None


def test_load_checks_and_returns_it_here(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="engine.backends.cpu_attention"):
        loaded = cpu_attention.load(tmp_path)
    assert loaded is not None, caplog.text
    assert cpu_attention.agrees_with_torch(loaded) is None


def test_a_wrong_kernel_is_not_used(kernel, monkeypatch):
    real = DecodeAttention.__call__
    monkeypatch.setattr(DecodeAttention, "__call__", lambda self, *a, **k: real(self, *a, **k) * 1.001)
    assert "from torch's" in cpu_attention.agrees_with_torch(kernel)


def test_a_second_build_comes_from_the_cache(tmp_path, monkeypatch):
    first = cpu_attention.build(tmp_path)
    assert first is not None and first.parent == tmp_path / "kernels"

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(subprocess, "run", no_compiler)
    assert cpu_attention.build(tmp_path) == first


@pytest.mark.parametrize(("compiler", "says"), [("/nonexistent/cc", "No such file"), ("false", "1")])
def test_without_a_working_compiler_it_says_why_and_torch_attention_stays(tmp_path, monkeypatch, caplog,
                                                                          compiler, says):
    monkeypatch.setenv("CC", compiler)
    with caplog.at_level(logging.INFO, logger="engine.backends.cpu_attention"):
        assert cpu_attention.load(tmp_path) is None
    assert f"not built with {compiler}" in caplog.text and says in caplog.text
    assert not list((tmp_path / "kernels").glob("*.so"))


def test_no_compiler_at_all(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(cpu_attention.shutil, "which", lambda name: None)
    with caplog.at_level(logging.INFO, logger="engine.backends.cpu_attention"):
        assert cpu_attention.build(tmp_path) is None
    assert "no C compiler" in caplog.text


def test_the_switch_turns_it_off(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(cpu_attention.ENV_SWITCH, "0")
    with caplog.at_level(logging.INFO, logger="engine.backends.cpu_attention"):
        assert cpu_attention.load(tmp_path) is None
    assert f"{cpu_attention.ENV_SWITCH}=0" in caplog.text
    assert not (tmp_path / "kernels").exists()


def test_a_compiler_without_openmp_gives_a_one_thread_kernel_that_is_not_used(tmp_path, monkeypatch, caplog):
    """As clang without libomp: the OpenMP flag sets are refused (and remembered), the next one builds a
    kernel that runs on one thread, and load() keeps torch's attention while torch runs on several."""
    calls = tmp_path / "calls"
    fake = tmp_path / "cc-without-openmp"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{calls}"\n'
        'for arg in "$@"; do [ "$arg" = "-fopenmp" ] && { echo "unsupported option -fopenmp" >&2; exit 1; }; done\n'
        'exec cc "$@"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    path = cpu_attention.build(tmp_path)
    assert path is not None and not DecodeAttention(path).threaded
    assert len(list((tmp_path / "kernels").glob("*.failed"))) == 2
    assert len(calls.read_text().splitlines()) == 3
    assert cpu_attention.build(tmp_path) == path
    assert len(calls.read_text().splitlines()) == 3  # neither the refused flags nor the built one compiled again
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    with caplog.at_level(logging.INFO, logger="engine.backends.cpu_attention"):
        assert cpu_attention.load(tmp_path) is None
    assert "built without OpenMP" in caplog.text


def test_the_shared_kernel_is_built_aside_and_checked_on_the_thread_that_first_asks(isolated_cache, monkeypatch):
    """The build thread only compiles and loads (no torch work beside the decode thread's); the first get()
    checks the kernel against torch on the caller's thread, once."""
    import threading

    checks = []
    real = cpu_attention.agrees_with_torch
    monkeypatch.setattr(cpu_attention, "agrees_with_torch",
                        lambda kernel: checks.append(threading.current_thread()) or real(kernel))
    shared = cpu_attention._Shared()
    assert shared.get() is None  # not started
    shared.start()
    shared._thread.join(60)
    assert checks == [] and list((isolated_cache / "kernels").glob("*.so"))
    kernel = shared.get()
    assert kernel is not None and checks == [threading.current_thread()]
    assert shared.get() is kernel and shared.wait() is kernel and len(checks) == 1
