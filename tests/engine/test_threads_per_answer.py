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


def test_a_reading_over_the_last_stretch_leaves_out_a_burst_before_it(monkeypatch):
    """`ThreadsPerAnswer.during` reads only the last stretch: a client's start-up half a second ago (one core for
    0.5 s) still fills the answer-start reading of the last second, not the quarter second since."""
    from engine import cpu_load
    from engine.cpu_load import ThreadsPerAnswer

    monkeypatch.setattr(cpu_load, "read_sample", lambda: None)  # no sampling thread: the samples are these
    monitor = LoadMonitor(every_s=0.25, window_s=1.0)
    monitor._samples.extend([CpuSample(0.0, 0.0, 0.0), CpuSample(0.25, 0.25, 0.0), CpuSample(0.5, 0.5, 0.0),
                             CpuSample(0.75, 0.5, 0.0)])
    monkeypatch.setattr(cpu_load, "read_sample", lambda: CpuSample(1.0, 0.5, 0.0))
    assert monitor.others_busy() == pytest.approx(0.5)  # the last second: the burst is in it
    assert monitor.others_busy(0.25) == 0.0 and monitor.others_busy(0.5) == 0.0
    free = ThreadsPerAnswer(fallback=1, physical=2, logical=2)
    free.monitor = monitor
    assert free.now() == 1  # an answer starting now: the burst takes a core
    assert free.during(0.25) == 2  # a quarter second in: both
    # Nothing to read (not Linux, or a span too short): an answer starts on the fallback, one under way keeps its
    # count rather than falling back to it mid-answer.
    monkeypatch.setattr(cpu_load, "read_sample", lambda: None)
    assert free.now() == 1 and free.during(0.25) is None


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


def test_llamacpp_follows_the_free_cores_between_decode_steps_with_the_same_floats(monkeypatch):
    """An answer's count is read again between its decode steps (issue 47): a client that imported its libraries
    in the second before its request no longer holds a whole answer to one thread, and a program that starts
    mid-answer takes its core back. llama.cpp's CPU floats do not depend on the count, so the logits of steps
    that changed threads are the ones a single count gives, bit for bit; the fingerprint keeps the count the
    answer started on."""
    llama_cpp = pytest.importorskip("llama_cpp")
    import numpy as np

    from engine.backend import prefill
    from engine.backends.llamacpp import LlamaCppBackend
    from engine.backends.llamacpp import threads as llamacpp_threads
    from engine.sources import resolve_spec

    monkeypatch.setattr(llamacpp_threads, "RECHOOSE_EVERY_S", 0.0)  # every decode step looks again
    source = resolve_spec(None)
    backend = LlamaCppBackend(source.path, spec="default", display_name=source.name, n_ctx=256)
    try:
        free = backend._threads_per_answer
        asked: list[float] = []
        prompt = backend.tokenizer.encode("The lighthouse keeper opened the bottle and read")
        steps = backend.tokenizer.encode(" a message from a ship that had sunk long ago")

        def answer(start: int, during: list[int]) -> tuple[list[np.ndarray], list[int]]:
            free.now = lambda: start  # what the second before the answer said
            readings = iter(during)
            free.during = lambda window_s: (asked.append(window_s), next(readings))[1]
            backend.trim_cache(0)
            logits, _ = prefill(backend, prompt)
            rows, counts = [logits], [int(llama_cpp.llama_n_threads(backend.ctx))]
            for token in steps[:len(during)]:
                rows.append(backend.forward([token]))
                counts.append(int(llama_cpp.llama_n_threads(backend.ctx)))
            return rows, counts

        moving, counts = answer(1, [2, 2, 1, 2])
        assert counts == [1, 2, 2, 1, 2]  # the prompt on the start's count, each step on the reading before it
        assert int(llama_cpp.llama_n_threads_batch(backend.ctx)) == 2  # the prompt's count follows the decode's
        assert asked == [0.0] * 4  # the reading over the last stretch only, not the second before the answer
        assert dict(backend.numeric_facts().settings)["n_threads"] == 1  # the count the answer started on
        held, counts = answer(1, [1, 1, 1, 1])
        assert counts == [1] * 5
        _, counts = answer(2, [None, None])  # nothing measured mid-answer: the count stays
        assert counts == [2, 2, 2]
        for a, b in zip(moving, held, strict=True):
            np.testing.assert_array_equal(a, b)
        asked.clear()
        backend.forward(steps[:3])  # several tokens at once (a prompt's chunk): no reading
        assert asked == []
    finally:
        backend.close()


def test_the_batch_runner_rows_follow_the_free_cores_between_steps_with_the_same_floats(monkeypatch,
                                                                                         default_llamacpp):
    """The rows of a batch (served answers that share one, the loom, beam search) re-read the free cores between
    their steps as a single answer does, and their logits are the same floats whatever the count."""
    llama_cpp = pytest.importorskip("llama_cpp")
    import numpy as np

    from engine.backends.llamacpp import threads as llamacpp_threads

    monkeypatch.setattr(llamacpp_threads, "RECHOOSE_EVERY_S", 0.0)
    tok = default_llamacpp.tokenizer
    prompts = [tok.encode("The keeper of the lighthouse"), tok.encode("A message in a bottle said")]
    steps = [tok.encode(" and then")[:1] * 2, tok.encode(" it was")[:1] * 2, tok.encode(" late")[:1] * 2]
    free = default_llamacpp._threads_per_answer
    if free is None:
        pytest.skip("the shared default model was loaded with a thread count")
    monkeypatch.setattr(free, "now", lambda: 1)

    def rows(during: list[int]) -> tuple[list[np.ndarray], list[int]]:
        readings = iter(during)
        monkeypatch.setattr(free, "during", lambda window_s: next(readings))
        runner = default_llamacpp.batch_runner()
        try:
            out, counts = [runner.start(prompts)], []
            for s in steps:
                out.append(runner.step(s))
                counts.append(int(llama_cpp.llama_n_threads(runner.ctx)))
            return out, counts
        finally:
            runner.close()

    moving, counts = rows([2, 1, 2])
    assert counts == [2, 1, 2]
    held, counts = rows([1, 1, 1])
    assert counts == [1, 1, 1]
    for a, b in zip(moving, held, strict=True):
        np.testing.assert_array_equal(a, b)


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
