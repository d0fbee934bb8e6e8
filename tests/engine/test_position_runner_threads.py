"""Scoring's position runners take their threads as an answer does (issue 35 item 3): the cores other programs
leave free when the runner is made. Before, torch scored on every core whatever else ran (set once at load), and
on a 2-core machine with one core busy its barriers waited on that core: 1,000 positions of the default model
took 8-17 s on 2 threads where 1 thread took 4.5-4.9 s (bench/model_diff.py's text)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # two tiny backends loaded: a few seconds


def test_llamacpp_position_runner_uses_the_free_cores(tiny_gguf):
    llama_cpp = pytest.importorskip("llama_cpp")
    from engine.backends.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend(tiny_gguf, spec="tiny", display_name="tiny", n_ctx=64)
    try:
        free = {"cores": 2}
        backend._threads_per_answer.now = lambda: free["cores"]  # what the free cores would say now
        for expected in (2, 1):
            free["cores"] = expected
            runner = backend.position_runner(8)
            try:
                assert int(llama_cpp.llama_n_threads_batch(runner.ctx)) == expected
                assert int(llama_cpp.llama_n_threads(runner.ctx)) == expected
                assert sum(c.shape[0] for c in runner.position_logits([1, 2, 3, 4])) == 4  # and it scores
                # A runner kept for many calls (LanguageModel's, made at load) follows the free cores per call.
                free["cores"] = 3 - expected
                assert sum(c.shape[0] for c in runner.position_logits([1, 2, 3])) == 3
                assert int(llama_cpp.llama_n_threads(runner.ctx)) == 3 - expected
            finally:
                runner.close()
    finally:
        backend.close()


def test_torch_position_runner_uses_the_free_cores(tiny_llama_folder):
    torch = pytest.importorskip("torch")
    from engine.backends.torch.backend import TorchBackend

    before = torch.get_num_threads()
    backend = TorchBackend(tiny_llama_folder, spec="tiny", display_name="tiny", device="cpu")
    try:
        counts = iter([1, 2, 1])
        backend._threads_per_answer.now = lambda: next(counts)
        for expected in (1, 2, 1):
            runner = backend.position_runner(4)
            assert torch.get_num_threads() == expected
            assert sum(c.shape[0] for c in runner.position_logits([1, 2, 3, 4])) == 4
    finally:
        backend.close()
        torch.set_num_threads(before)
