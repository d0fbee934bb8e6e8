"""Load settings (threads, context, GPU layers, batch size): checked in words, honoured by llama.cpp, refused elsewhere."""

from __future__ import annotations

import pytest

from engine.runtime_settings import RuntimeSettings


def test_settings_check_themselves_and_say_every_problem():
    with pytest.raises(ValueError) as err:
        RuntimeSettings(n_threads=0, n_gpu_layers=-2, n_batch="64")  # type: ignore[arg-type]
    message = str(err.value)
    assert "threads (n_threads) must be from 1 to 512, got 0" in message
    assert "GPU layers (n_gpu_layers) must be at least -1 (-1: all layers), got -2" in message
    assert "batch size (n_batch) must be a whole number, got '64'" in message
    with pytest.raises(ValueError, match="whole number"):
        RuntimeSettings(n_ctx=True)  # type: ignore[arg-type]
    assert RuntimeSettings().load_kwargs() == {}
    assert RuntimeSettings(n_threads=3, n_gpu_layers=-1).load_kwargs() == {"n_threads": 3, "n_gpu_layers": -1}


def test_settings_for_a_backend_that_does_not_use_them_are_refused_before_loading():
    from engine.open_model import load_model

    with pytest.raises(ValueError, match="n_threads: .*llama.cpp models .*runs on torch"):
        load_model(None, backend="torch", n_threads=2)  # the default model would be converted first


def test_llamacpp_leaves_a_cpu_free_for_other_programs():
    pytest.importorskip("llama_cpp")
    from engine.backends.llamacpp.threads import choose_threads

    assert choose_threads(physical=2, logical=2) == 1  # a 2-core VM: one core for everything else
    assert choose_threads(physical=8, logical=8) == 7
    assert choose_threads(physical=8, logical=16) == 8  # SMT: the siblings take the other programs
    assert choose_threads(physical=4, logical=10) == 4  # Apple Silicon: the performance cores of 4P+6E
    assert choose_threads(physical=1, logical=1) == 1


def test_gpu_layers_as_asked():
    pytest.importorskip("llama_cpp")
    from engine.backends.llamacpp.placement import layers_as_asked

    assert layers_as_asked(-1, 30, gpu_build=True).n_gpu_layers == 30
    assert layers_as_asked(100, 30, gpu_build=True).n_gpu_layers == 30
    plan = layers_as_asked(0, 30, gpu_build=True)
    assert plan.n_gpu_layers == 0 and not plan.offload_kqv
    cpu = layers_as_asked(12, 30, gpu_build=False)
    assert cpu.n_gpu_layers == 0 and "CPU build" in cpu.reason


def test_llamacpp_runs_with_the_settings_asked_for(tiny_gguf):
    pytest.importorskip("llama_cpp")
    import llama_cpp

    from engine.backends.llamacpp.threads import default_threads
    from engine.open_model import load_model

    backend = load_model(str(tiny_gguf), n_threads=1, n_threads_batch=2, n_ctx=128, n_batch=32, n_gpu_layers=0)
    try:
        assert (llama_cpp.llama_n_threads(backend.ctx), llama_cpp.llama_n_threads_batch(backend.ctx)) == (1, 2)
        assert llama_cpp.llama_n_batch(backend.ctx) == 32 and backend.info.context_length == 128
        assert backend.gpu_plan.n_gpu_layers == 0
        assert "1 decode thread, 2 for prompts" in backend.info.device
        before = backend.tokens_evaluated
        assert backend.forward([104] * 70).shape == (backend.n_vocab,)  # 70 tokens in batches of 32
        assert backend.tokens_evaluated - before == 70
    finally:
        backend.close()
    backend = load_model(str(tiny_gguf))
    try:
        expected = (default_threads(), default_threads())
        assert (llama_cpp.llama_n_threads(backend.ctx), llama_cpp.llama_n_threads_batch(backend.ctx)) == expected
    finally:
        backend.close()
    backend = load_model(str(tiny_gguf), n_threads=2)
    try:
        assert llama_cpp.llama_n_threads_batch(backend.ctx) == 2  # the prompt's follow, as in llama.cpp
    finally:
        backend.close()
    with pytest.raises(ValueError, match="either n_gpu_layers or offload"):
        load_model(str(tiny_gguf), n_gpu_layers=2, offload="weights=50,50")


def test_cli_flags_reach_the_model_and_bad_values_are_one_line(capsys, tiny_gguf):
    pytest.importorskip("llama_cpp")
    from engine import cli

    base = ["info", "--model", str(tiny_gguf)]
    assert cli.main([*base, "--threads", "1", "--threads-batch", "2", "--batch-size", "16", "--ctx-size", "64"]) == 0
    out = capsys.readouterr().out
    assert "1 decode thread, 2 for prompts" in out and "context length: 64" in out
    for flags, needle in [(["--threads", "0"], "threads (n_threads) must be from 1 to 512"),
                          (["--n-gpu-layers", "-3"], "GPU layers (n_gpu_layers) must be at least -1"),
                          (["--batch-size", "0"], "batch size (n_batch) must be at least 1")]:
        assert cli.main([*base, *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
