"""The llama.cpp backend against llama.cpp itself, against torch, and on bad input.

Oracles: llama-cpp-python's own `Llama` (greedy generation, logits) on the
same file, and the torch backend on the de-quantized default model.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from engine import ContextLengthError, EngineError, ModelLoadError  # noqa: E402
from engine.backend import prefill  # noqa: E402
from engine.backends.llamacpp import LlamaCppBackend  # noqa: E402
from engine.backends.llamacpp.placement import plan_gpu_layers  # noqa: E402
from engine.chat import ChatSession  # noqa: E402
from engine.decode.loop import generate_events  # noqa: E402
from engine.events import Done, TokenEvent  # noqa: E402
from engine.open_model import load_model  # noqa: E402
from engine.request import GenerationRequest  # noqa: E402
from engine.sampling import SamplerSettings  # noqa: E402

GREEDY = SamplerSettings(temperature=0)
PROMPTS = ["The capital of France is", "Once upon a time, 🐉 and 世界", "def add(a, b):"]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max()
    return x - np.log(np.exp(x).sum())


def our_tokens(backend, prompt_ids, n, sampler=GREEDY, **kw) -> tuple[list[int], list[TokenEvent]]:
    backend.trim_cache(0)
    req = GenerationRequest(prompt_ids=list(prompt_ids), sampler=sampler, max_new_tokens=n, ignore_eos=True, **kw)
    events = [e for e in generate_events(backend, req) if isinstance(e, TokenEvent)]
    return [e.token_id for e in events], events


def llama_reference(path, backend, **kw):
    """llama.cpp's own high-level API on the same file, with the same context shape and threads."""
    from llama_cpp import Llama

    return Llama(str(path), n_ctx=backend.n_ctx, n_batch=backend.n_batch, n_ubatch=backend.n_batch,
                 n_threads=backend.n_threads, n_threads_batch=backend.n_threads_batch, flash_attn=True, verbose=False, **kw)


@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    backend = LlamaCppBackend(tiny_gguf, spec=str(tiny_gguf), display_name="tiny", flash_attn=True)
    yield backend
    backend.close()


def test_greedy_equals_llamacpp_own_greedy_on_a_tiny_random_model(tiny, tiny_gguf):
    llm = llama_reference(tiny_gguf, tiny)
    for text in PROMPTS:
        ids = tiny.tokenizer.encode(text)
        ours, _ = our_tokens(tiny, ids, 32)
        llm.reset()
        theirs = []
        for token in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            theirs.append(int(token))
            if len(theirs) == 32:
                break
        assert ours == theirs, text


def test_greedy_equals_llamacpp_own_greedy_on_the_default_model(fresh_default_llamacpp):
    backend = fresh_default_llamacpp
    llm = llama_reference(backend.info.path, backend)
    for text in ["The capital of France is", "Water boils at"]:
        ids = backend.tokenizer.encode(text)
        ours, _ = our_tokens(backend, ids, 8)
        out = llm.create_completion(ids, max_tokens=8, temperature=0.0)
        assert backend.tokenizer.decode(ours).startswith(out["choices"][0]["text"]), text


def test_our_logprobs_are_the_softmax_of_llamacpps_logits(tiny, tiny_gguf):
    llm = llama_reference(tiny_gguf, tiny, logits_all=True)
    ids = tiny.tokenizer.encode(PROMPTS[1])
    _, events = our_tokens(tiny, ids, 8, sampler=SamplerSettings(temperature=0.8, seed=3), top_n=5)
    generated = [e.token_id for e in events]
    llm.reset()
    llm.eval(ids + generated)
    scores = np.asarray(llm.scores)  # (T, V): llama.cpp's logits at every position
    for step, event in enumerate(events):
        ref = log_softmax(scores[len(ids) + step - 1])
        assert event.logprob == pytest.approx(ref[event.token_id], abs=1e-4)
        for alt in event.top_model:
            assert alt.logprob == pytest.approx(ref[alt.token_id], abs=1e-4)


def test_seeded_sampling_is_reproducible(tiny):
    ids = tiny.tokenizer.encode(PROMPTS[0])
    settings = SamplerSettings(temperature=1.0, top_k=50, seed=1234)
    first, _ = our_tokens(tiny, ids, 24, sampler=settings)
    again, _ = our_tokens(tiny, ids, 24, sampler=settings)
    other, _ = our_tokens(tiny, ids, 24, sampler=settings.with_(seed=4321))
    assert first == again and first != other


def test_trimming_reuses_the_prefix_and_gives_the_same_logits(tiny):
    ids = tiny.tokenizer.encode("a prefix that is shared, then a branch")
    tiny.trim_cache(0)
    full = tiny.forward(ids)
    tiny.trim_cache(0)
    tiny.forward(ids[:10])
    before = tiny.tokens_evaluated
    logits, reused = prefill(tiny, ids)
    assert reused == 10 and tiny.tokens_evaluated - before == len(ids) - 10
    np.testing.assert_allclose(logits, full, atol=1e-4)
    assert list(tiny.cached_tokens()) == ids


def test_second_chat_turn_evaluates_only_its_new_tokens(fresh_default_llamacpp):
    backend = fresh_default_llamacpp
    session = ChatSession()
    for turn, question in enumerate(["What is 2+2?", "And 3+3?"]):
        before = backend.tokens_evaluated
        done = list(generate_events(backend, session.request(question, sampler=GREEDY, max_new_tokens=6)))[-1]
        assert isinstance(done, Done)
        stats = done.stats
        if turn == 1:
            assert stats.reused_tokens >= first_prompt
            # prefill runs only the tokens after the reused prefix; decoding runs each token but the last
            assert backend.tokens_evaluated - before == stats.prompt_tokens - stats.reused_tokens + stats.generated_tokens - 1
        first_prompt = stats.prompt_tokens
        session.add_turn(question, stats.text)


def test_cancel_between_prefill_chunks_keeps_what_ran(tiny):
    tiny.trim_cache(0)
    ids = tiny.tokenizer.encode("x" * 100)
    # Asked before each chunk, and polled from a watcher thread during one: true once two chunks are cached.
    logits, reused = prefill(tiny, ids, chunk=16, cancelled=lambda: len(tiny.cached_tokens()) >= 32)
    assert logits is None and reused == 0
    assert list(tiny.cached_tokens()) == ids[:32]  # two chunks ran before the cancel
    logits, reused = prefill(tiny, ids, chunk=16)
    assert logits is not None and reused == 32


def test_prompt_over_n_ctx_is_the_engines_context_error(tiny_gguf):
    backend = load_model(str(tiny_gguf), backend="llamacpp", n_ctx=64)
    try:
        assert backend.info.context_length == 64
        req = GenerationRequest(prompt_ids=[104] * 60, sampler=GREEDY, max_new_tokens=8)
        with pytest.raises(ContextLengthError, match="context length is 64"):
            list(generate_events(backend, req))
        with pytest.raises(ContextLengthError):
            backend.forward([104] * 65)
        assert backend.forward([104] * 8).shape == (backend.n_vocab,)  # still usable
    finally:
        backend.close()


def test_n_ctx_above_the_models_is_refused(tiny_gguf):
    with pytest.raises(ValueError, match=r"10,000 tokens is longer than the model's own \(256\); choose at most 256"):
        load_model(str(tiny_gguf), backend="llamacpp", n_ctx=10_000)


@pytest.mark.parametrize(
    "damage, needle",
    [
        (lambda raw: raw[: len(raw) - 5000], "truncated"),
        (lambda raw: raw[:300], "truncated"),
        (lambda raw: b"not a model at all\n" * 20, "not a GGUF file"),
        (lambda raw: raw[:4] + b"\xff" * 200 + raw[204:], "corrupt|truncated|version"),
    ],
    ids=["tail-cut", "header-cut", "not-gguf", "garbage-header"],
)
def test_damaged_files_give_a_clear_model_load_error(tiny_gguf, tmp_path, damage, needle):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(damage(tiny_gguf.read_bytes()))
    with pytest.raises(ModelLoadError, match=needle) as err:
        load_model(str(bad), backend="llamacpp")
    assert "\n" not in str(err.value)


def test_an_architecture_llamacpp_does_not_know_is_a_model_load_error(tmp_path):
    from tiny_gguf import write_tiny_llama_gguf

    path = tmp_path / "alien.gguf"
    write_tiny_llama_gguf(path)
    raw = path.read_bytes()
    # Same length, so every offset stays valid: only the architecture name changes.
    path.write_bytes(raw.replace(b"\x05\x00\x00\x00\x00\x00\x00\x00llama", b"\x05\x00\x00\x00\x00\x00\x00\x00xyzzy", 1))
    with pytest.raises(EngineError, match="xyzzy"):
        load_model(str(path), backend="llamacpp")


def test_the_default_model_selects_llamacpp_and_describes_the_file(fresh_default_llamacpp):
    from pathlib import Path

    from engine.backends.select import choose_backend

    assert choose_backend("auto", "default") == "llamacpp"
    info = fresh_default_llamacpp.info
    assert info.backend == "llamacpp" and info.quantization == "Q4_1"
    assert info.file_bytes == Path(info.path).stat().st_size
    assert info.context_length == 8192 and info.vocab_size == 49152
    assert "llama.cpp" in info.device and ("cpu" in info.device or "layers" in info.device)
    assert any(line.startswith("quantization:   Q4_1") for line in info.summary_lines())


@pytest.mark.model
def test_default_model_matches_torch_on_the_dequantized_weights(fresh_default_llamacpp, fresh_default_torch):
    """Mean KL per position <= 0.01 nats; top-1 equal wherever torch's top-1 is not a near tie."""
    text = "The quick brown fox jumps over the lazy dog. Paris is the capital of France, and Berlin is"
    import torch

    ids = fresh_default_torch.tokenizer.encode(text)[:30]
    with torch.inference_mode():  # every position's logits in one forward
        ref_all = fresh_default_torch.model(input_ids=torch.tensor([ids])).logits[0].float().numpy()  # (T, V)
    kls, mismatches = [], []
    for i, token in enumerate(ids):  # one token at a time on top of llama.cpp's cache: the decode path
        ours = log_softmax(fresh_default_llamacpp.forward([token]))
        ref = log_softmax(ref_all[i])
        kls.append(float((np.exp(ref) * (ref - ours)).sum()))
        top2 = np.sort(ref)[-2:]
        if ours.argmax() != ref.argmax() and top2[1] - top2[0] > 0.1:
            mismatches.append(i)
    assert np.mean(kls) <= 0.01, kls
    assert not mismatches


def test_gpu_layers_follow_the_offload_policy():
    plan = dict(n_layers=32, model_bytes=4_000, cache_bytes=1_000)
    assert plan_gpu_layers(None, gpu_build=False, free_gpu_bytes=None, **plan).n_gpu_layers == 0
    assert plan_gpu_layers("weights=50,50", gpu_build=False, free_gpu_bytes=None, **plan).n_gpu_layers == 0
    assert plan_gpu_layers(None, gpu_build=True, free_gpu_bytes=None, **plan).n_gpu_layers == 32
    half = plan_gpu_layers("weights=50,50 cache=0", gpu_build=True, free_gpu_bytes=None, **plan)
    assert half.n_gpu_layers == 16 and not half.offload_kqv
    assert plan_gpu_layers("auto", gpu_build=True, free_gpu_bytes=10_000, **plan).n_gpu_layers == 32
    # 2,500 free -> 2,250 usable at 5,000/32 bytes per layer (weights + cache) -> 14 layers
    assert plan_gpu_layers("auto", gpu_build=True, free_gpu_bytes=2_500, **plan).n_gpu_layers == 14


def test_cli_runs_llamacpp_and_reports_a_prompt_over_n_ctx_in_one_line(capsys, tiny_gguf):
    from engine import cli

    base = ["generate", "--model", str(tiny_gguf), "--backend", "llamacpp", "--temperature", "0"]
    assert cli.main([*base, "--prompt", "hello", "--max-new-tokens", "4"]) == 0
    assert cli.main([*base, "--n-ctx", "16", "--prompt", "x" * 20, "--max-new-tokens", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error:") and "context length is 16" in err


def test_model_parameters_leave_out_amx_buffers_only_on_amx_builds():
    """llama.cpp's AMX matmul crashes on multi-token prompts (ggml-org/llama.cpp#20824): builds that carry it
    load weights without the extra buffer types; other builds keep llama.cpp's defaults (repacked Q4_0 etc.)."""
    import llama_cpp

    from engine.backends.llamacpp import native

    assert native.amx_built() == (b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info())
    params = native.model_params(n_gpu_layers=3)
    assert params.n_gpu_layers == 3
    assert params.use_extra_bufts is (not native.amx_built())
    assert llama_cpp.llama_cpp.llama_model_default_params is native.model_params  # the session fixture's doing
