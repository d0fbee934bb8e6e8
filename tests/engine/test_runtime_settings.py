"""Load settings (threads, context, GPU layers, batch size): checked in words, honoured by llama.cpp, refused elsewhere."""

from __future__ import annotations

import pytest

from engine.runtime_settings import RuntimeSettings


def test_settings_check_themselves_and_say_every_problem():
    with pytest.raises(ValueError) as err:
        RuntimeSettings(n_threads=0, n_gpu_layers=-2, n_batch="64")  # type: ignore[arg-type]
    message = str(err.value)
    assert "threads (n_threads) must be from 1 to 512, got 0" in message
    assert "GPU layers (n_gpu_layers) must be from -1 to 9,999 (-1: all layers), got -2" in message
    assert "batch size (n_batch) must be a whole number, got '64'" in message
    with pytest.raises(ValueError, match="whole number"):
        RuntimeSettings(n_ctx=True)  # type: ignore[arg-type]
    assert RuntimeSettings().load_kwargs() == {}
    assert RuntimeSettings(n_threads=3, n_gpu_layers=-1).load_kwargs() == {"n_threads": 3, "n_gpu_layers": -1}


@pytest.mark.model
def test_settings_for_a_backend_that_does_not_use_them_are_refused_before_loading():
    from engine.open_model import load_model

    with pytest.raises(ValueError, match="n_ctx: .*llama.cpp models .*runs on torch, which takes only n_threads"):
        load_model(None, backend="torch", n_threads=2, n_ctx=512)  # the default model would be converted first


def test_torch_takes_the_cpu_threads_and_holds_them_for_every_answer(tiny_llama_folder):
    """`--threads` / the runtime dialog's threads reach torch on the CPU: the count holds whatever the
    machine's load, and the dialog is told it can set threads and why it cannot set the rest."""
    import torch

    from engine.decode.loop import generate_events
    from engine.events import Done
    from engine.open_model import load_model
    from engine.request import GenerationRequest
    from engine.sampling import SamplerSettings

    before = torch.get_num_threads()
    backend = load_model(str(tiny_llama_folder), backend="torch", n_threads=1)
    try:
        facts = backend.info.runtime
        assert facts.takes == ("n_threads",) and facts.in_use.n_threads == 1 and "(1 thread)" in backend.info.device
        assert facts.why_not("n_threads") is None and "torch chooses it" in (facts.why_not("n_ctx") or "")
        torch.set_num_threads(2)  # another model, or a library, changes the process's count
        request = GenerationRequest(prompt_ids=[1, 5, 9], sampler=SamplerSettings(temperature=0), max_new_tokens=2)
        events = list(generate_events(backend, request))
        assert isinstance(events[-1], Done) and torch.get_num_threads() == 1
        assert dict(backend.numeric_facts().settings)["n_threads"] == 1
    finally:
        backend.close()
        torch.set_num_threads(before)


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
    from engine.cpu_load import read_sample
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
        # No count chosen: each answer takes the free cores, and the device says so rather than the load's count.
        if read_sample() is not None:  # Linux: the free cores can be measured
            assert "as cores are free" in backend.info.device
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
                          (["--n-gpu-layers", "-3"], "GPU layers (n_gpu_layers) must be from -1 to 9,999"),
                          (["--batch-size", "0"], "batch size (n_batch) must be from 1 to 65,536")]:
        assert cli.main([*base, *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err


# -- the default context: the model's, capped so its KV cache fits a memory budget -------------------

GIB = 1 << 30


def test_default_context_is_the_models_when_its_cache_fits_the_budget():
    from engine.runtime_settings import choose_context

    choice = choose_context(8192, None, kv_bytes_per_token=23_040, available_bytes=8 * GIB)  # the default model
    assert (choice.n_ctx, choice.trained, choice.capped) == (8192, 8192, "")
    assert choice.kv_bytes == 8192 * 23_040
    asked = choose_context(8192, 1024, kv_bytes_per_token=23_040, available_bytes=8 * GIB)
    assert (asked.n_ctx, asked.capped) == (1024, "")
    unknown = choose_context(0, None, kv_bytes_per_token=0, available_bytes=8 * GIB)  # a file that says nothing
    assert unknown.n_ctx == unknown.trained == 4096


def test_default_context_is_capped_by_the_fixed_budget_and_by_a_share_of_available_memory():
    from engine.runtime_settings import KV_BUDGET_BYTES, MIN_DEFAULT_CTX, choose_context, kv_budget_bytes

    # Gemma 3 270M: 18,432 bytes a token; 32k would take 576 MiB, more than the fixed budget even with 64 GiB free.
    gemma = choose_context(32_768, None, kv_bytes_per_token=18_432, available_bytes=64 * GIB)
    assert gemma.n_ctx == 16_384 and gemma.kv_bytes <= KV_BUDGET_BYTES
    assert "capped from the model's 32,768 tokens" in gemma.capped and "576 MiB" in gemma.capped
    # An 8B Llama 3 (128 KiB a token, 128k context) on a machine with 1 GiB available: a quarter of it.
    assert kv_budget_bytes(1 * GIB) == GIB // 4
    llama = choose_context(131_072, None, kv_bytes_per_token=131_072, available_bytes=1 * GIB)
    assert llama.n_ctx == MIN_DEFAULT_CTX  # 2,048 x 128 KiB = 256 MiB fits exactly
    # Never below the floor, even where the floor's cache is over the budget ...
    huge = choose_context(131_072, None, kv_bytes_per_token=1 << 20, available_bytes=1 * GIB)
    assert huge.n_ctx == MIN_DEFAULT_CTX and huge.capped
    # ... and never above the model's own.
    short = choose_context(1024, None, kv_bytes_per_token=1 << 20, available_bytes=1 * GIB)
    assert short.n_ctx == 1024
    # A file claiming a 4-billion-token context for a tiny model: the budget, not gigabytes.
    absurd = choose_context(2**32 - 1, None, kv_bytes_per_token=256, available_bytes=16 * GIB)
    assert absurd.kv_bytes <= KV_BUDGET_BYTES and absurd.n_ctx < 2**32 - 1


def test_a_context_longer_than_the_models_is_refused_in_words():
    from engine.runtime_settings import choose_context

    with pytest.raises(ValueError, match="longer than the model's own \\(8,192\\); choose at most 8,192"):
        choose_context(8192, 10_000, kv_bytes_per_token=1, available_bytes=GIB)


def test_runtime_facts_say_why_a_setting_cannot_be_chosen():
    from engine.runtime_settings import NOT_TAKEN, RuntimeFacts, RuntimeSettings

    none_taken = RuntimeFacts()
    assert all(none_taken.why_not(name) == NOT_TAKEN for name in RuntimeSettings.names())
    assert none_taken.summary() == ""
    facts = RuntimeFacts(
        in_use=RuntimeSettings(n_ctx=16_384), trained_context=32_768, kv_cache_bytes=288 << 20,
        takes=("n_ctx", "n_threads"), reasons=(("n_gpu_layers", "CPU only"),),
    )
    assert facts.why_not("n_ctx") is None
    assert facts.why_not("n_gpu_layers") == "CPU only"
    assert facts.why_not("n_batch") == NOT_TAKEN
    assert facts.summary() == "KV cache 288 MiB for 16,384 tokens (model: 32,768)"
    assert RuntimeSettings.from_dict({"n_ctx": 512, "stray": 1}) == RuntimeSettings(n_ctx=512)


def test_llamacpp_caps_a_files_absurd_context_and_reports_what_it_runs_with(tmp_path):
    """A file claiming a 4-billion-token context allocated gigabytes for a 1 MB model; now the budget at most."""
    pytest.importorskip("llama_cpp")
    import llama_cpp
    from tiny_gguf import write_tiny_llama_gguf

    from engine.backends.llamacpp.gguf_header import kv_bytes_per_token, read_header
    from engine.open_model import load_model
    from engine.runtime_settings import KV_BUDGET_BYTES

    path = write_tiny_llama_gguf(tmp_path / "absurd.gguf", n_ctx=2**32 - 1)
    per_token = kv_bytes_per_token(read_header(path))
    assert per_token == 2 * 2 * (16 + 16) * 2  # 2 layers, 2 KV heads of 16 dims, keys and values, float16
    backend = load_model(str(path), n_threads=1)
    try:
        facts = backend.info.runtime
        assert backend.n_ctx == facts.in_use.n_ctx == backend.info.context_length
        assert backend.n_ctx * per_token <= KV_BUDGET_BYTES
        assert facts.kv_cache_bytes == backend.n_ctx * per_token
        assert facts.trained_context == 2**32 - 1
        assert "capped from the model's 4,294,967,295 tokens" in facts.context_note
        # What llama.cpp allocated for keys and values is what the facts say (it rounds up to 256 cells).
        assert int(llama_cpp.llama_n_ctx(backend.ctx)) * per_token <= KV_BUDGET_BYTES + 256 * per_token
        assert facts.in_use.n_threads == 1 and facts.in_use.n_batch == 512
        assert facts.why_not("n_ctx") is None and facts.why_not("n_threads") is None
        if not llama_cpp.llama_supports_gpu_offload():
            assert "CPU only" in facts.why_not("n_gpu_layers")
        assert any(line.startswith("memory:         KV cache") for line in backend.info.summary_lines())
    finally:
        backend.close()
