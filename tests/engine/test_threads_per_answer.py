"""Threads chosen for each answer from the cores other programs leave free (issue 37 item 15): every physical
core on an idle machine, one fewer per core a busy program takes; llama.cpp's context gets the count before
each answer's prompt, and a count the user chose is left alone."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from engine.cpu_load import CpuSample, LoadMonitor, others_busy, read_sample, threads_for


def test_idle_gets_every_core_and_each_busy_core_costs_one():
    assert threads_for(physical=2, logical=2, busy=0.03) == 2  # an idle 2-core machine: both cores
    assert threads_for(physical=2, logical=2, busy=1.0) == 1  # a busy loop on one core
    assert threads_for(physical=2, logical=2, busy=0.4) == 1  # a program squeezed to 40 % of a core still has it
    assert threads_for(physical=2, logical=2, busy=2.0) == 1  # never none
    assert threads_for(physical=8, logical=8, busy=3.1) == 5
    assert threads_for(physical=8, logical=16, busy=4.0) == 8  # SMT: the siblings take the other programs
    assert threads_for(physical=4, logical=10, busy=0.0) == 4  # Apple-like 4P+6E: the performance cores


def test_other_programs_work_is_all_cpu_time_less_this_process():
    a = CpuSample(at=10.0, busy_s=100.0, own_s=5.0)
    b = CpuSample(at=11.0, busy_s=101.9, own_s=6.0)  # 1.9 CPU-seconds in a second, 1.0 of them ours
    assert others_busy(a, b) == pytest.approx(0.9)
    assert others_busy(a, CpuSample(11.0, 101.0, 6.0)) == 0.0  # only our own work: the machine is idle for us
    assert others_busy(a, a) == 0.0


def _cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time (/proc/PID/stat fields 14 and 15)."""
    import os

    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.slow
@pytest.mark.skipif(read_sample() is None, reason="no /proc/stat (not Linux)")
def test_a_busy_program_is_seen_and_our_own_work_is_not():
    import os

    monitor = LoadMonitor(every_s=0.1, window_s=0.6)
    time.sleep(0.7)
    own0, t0 = sum(os.times()[:2]), time.monotonic()
    while time.monotonic() - t0 < 0.8:  # this process spinning: our own work, not another program's
        pass
    own_share = (sum(os.times()[:2]) - own0) / (time.monotonic() - t0)
    quiet = monitor.others_busy()
    # Counted as others' work, ours would push the reading to every CPU's worth; it stays below by our share.
    assert quiet is not None and quiet <= os.cpu_count() - own_share + 0.25, (quiet, own_share)

    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        c0, t0 = _cpu_seconds(spinner.pid), time.monotonic()
        time.sleep(0.8)
        busy = monitor.others_busy()
        child_share = (_cpu_seconds(spinner.pid) - c0) / (time.monotonic() - t0)
    finally:
        spinner.kill()
        spinner.wait()
    # Whatever else runs on this machine, the other program's share of a core is in the reading.
    assert busy is not None and busy >= 0.7 * child_share, (busy, child_share)


def test_llamacpp_sets_the_threads_before_each_answer(tiny_gguf):
    llama_cpp = pytest.importorskip("llama_cpp")
    from engine.backend import prefill
    from engine.backends.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend(tiny_gguf, spec="tiny", display_name="tiny", n_ctx=64)
    try:
        counts = iter([2, 1, 2])
        backend._threads_per_answer.now = lambda: next(counts)  # what the free cores would say, answer by answer
        for expected in (2, 1, 2):
            backend.trim_cache(0)
            prefill(backend, [1, 2, 3])
            assert int(llama_cpp.llama_n_threads(backend.ctx)) == expected
            assert int(llama_cpp.llama_n_threads_batch(backend.ctx)) == expected
    finally:
        backend.close()
    fixed = LlamaCppBackend(tiny_gguf, spec="tiny", display_name="tiny", n_ctx=64, n_threads=1)
    try:
        assert fixed._threads_per_answer is None  # the user's count stays
        prefill(fixed, [1, 2, 3])
        assert int(llama_cpp.llama_n_threads(fixed.ctx)) == 1
    finally:
        fixed.close()


def test_torch_on_the_cpu_sets_its_threads_before_each_answer(tiny_llama_folder):
    torch = pytest.importorskip("torch")
    from engine.backend import prefill
    from engine.backends.torch.backend import TorchBackend

    before = torch.get_num_threads()
    backend = TorchBackend(tiny_llama_folder, spec="tiny", display_name="tiny", device="cpu")
    try:
        counts = iter([1, 2, 1])
        backend._threads_per_answer.now = lambda: next(counts)
        for expected in (1, 2, 1):
            prefill(backend, [1, 2, 3])
            assert torch.get_num_threads() == expected
    finally:
        backend.close()
        torch.set_num_threads(before)


def test_torch_with_a_count_chosen_keeps_it_at_every_answer(tiny_llama_folder):
    """A fixed `n_threads` is not the free cores' choice, and it is set again at each answer and scoring run:
    torch's count is per process, so another model (or anything else) may have changed it in between."""
    torch = pytest.importorskip("torch")
    from engine.backend import prefill
    from engine.backends.torch.backend import TorchBackend

    before = torch.get_num_threads()
    backend = TorchBackend(tiny_llama_folder, spec="tiny", display_name="tiny", device="cpu", n_threads=1)
    try:
        assert backend._threads_per_answer is None and torch.get_num_threads() == 1
        for other in (2, 3):
            torch.set_num_threads(other)  # another model's answer, in the same process
            prefill(backend, [1, 2, 3])
            assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        backend.position_runner(8).close()
        assert torch.get_num_threads() == 1
    finally:
        backend.close()
        torch.set_num_threads(before)
