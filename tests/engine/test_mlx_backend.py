"""MLX parity with torch: same logits, same greedy tokens, same seeded samples, and real prefix reuse.

Runs for real on Linux CPU through `mlx[cpu]` (the README test command installs it).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mlx_lm")

from engine.backend import prefill  # noqa: E402
from engine.backends.mlx.backend import MlxBackend  # noqa: E402
from engine.decode.loop import generate_events  # noqa: E402
from engine.events import Done  # noqa: E402
from engine.request import GenerationRequest  # noqa: E402
from engine.sampling.settings import SamplerSettings  # noqa: E402

pytestmark = pytest.mark.mlx
GREEDY = SamplerSettings(temperature=0.0)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - (x.max() + np.log(np.exp(x - x.max()).sum()))


def _tokens(backend, **kwargs) -> tuple[int, ...]:
    done = list(generate_events(backend, GenerationRequest(**kwargs)))[-1]
    assert isinstance(done, Done)
    return done.stats.token_ids


@pytest.fixture(scope="module")
def tiny_mlx(tiny_llama_folder):
    backend = MlxBackend(tiny_llama_folder, spec=str(tiny_llama_folder), display_name="tiny-llama")
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def default_mlx(default_model_folder):
    backend = MlxBackend(default_model_folder, spec="default", display_name="SmolLM2-135M-Instruct")
    yield backend
    backend.close()


def test_info_matches_torch(tiny_mlx, tiny_torch):
    for field in ("parameters", "vocab_size", "context_length", "architecture"):
        assert getattr(tiny_mlx.info, field) == getattr(tiny_torch.info, field), field
    assert tiny_mlx.info.backend == "mlx"


@pytest.mark.parametrize("text", ["hello world", "The quick brown fox jumps over the lazy dog. " * 4, "1 2 3"])
def test_next_token_logprobs_match_torch(tiny_mlx, tiny_torch, text):
    ids = tiny_torch.tokenizer.encode(text)
    tiny_mlx.trim_cache(0)
    tiny_torch.trim_cache(0)
    a, _ = prefill(tiny_mlx, ids)
    b, _ = prefill(tiny_torch, ids)
    np.testing.assert_allclose(_log_softmax(a), _log_softmax(b), atol=1e-4)


def test_32_greedy_tokens_identical(tiny_mlx, tiny_torch):
    kwargs = dict(prompt="Once upon a time", sampler=GREEDY, max_new_tokens=32, ignore_eos=True)
    assert _tokens(tiny_mlx, **kwargs) == _tokens(tiny_torch, **kwargs)


def test_seeded_samples_identical(tiny_mlx, tiny_torch):
    s = SamplerSettings(temperature=0.8, top_p=0.95, top_k=50, seed=42)
    kwargs = dict(prompt="In a village", sampler=s, max_new_tokens=32, ignore_eos=True)
    ours = _tokens(tiny_mlx, **kwargs)
    assert ours == _tokens(tiny_torch, **kwargs)
    assert len(set(ours)) > 3  # really sampled, not collapsed to one token


@pytest.mark.slow
@pytest.mark.parametrize(
    "prompt",
    ["The capital of France is", "def fibonacci(n):", "The three primary colours are"],
)
def test_default_model_same_greedy_continuation(default_mlx, default_torch, prompt):
    kwargs = dict(prompt=prompt, sampler=GREEDY, max_new_tokens=16)
    default_torch.trim_cache(0)
    assert _tokens(default_mlx, **kwargs) == _tokens(default_torch, **kwargs)


@pytest.mark.slow
def test_second_turn_prefills_only_new_tokens(default_mlx, monkeypatch):
    from engine.backend import common_prefix_len

    default_mlx.trim_cache(0)
    first = [{"role": "user", "content": "What is 2+2?"}]
    done1 = list(generate_events(default_mlx, GenerationRequest(messages=tuple(first), sampler=GREEDY, max_new_tokens=16)))[-1]
    second = first + [{"role": "assistant", "content": done1.stats.text}, {"role": "user", "content": "And 3+3?"}]
    prompt2 = default_mlx.tokenizer.chat_ids(second)
    shared = common_prefix_len(default_mlx.cached_tokens(), prompt2)
    assert shared >= done1.stats.prompt_tokens  # the whole first prompt, and the answer, are still valid

    ran: list[int] = []
    real_forward = default_mlx.forward
    real_during = default_mlx.forward_during  # the decode steps (the next forward while a token's report is built)
    monkeypatch.setattr(default_mlx, "forward", lambda ids: (ran.append(len(ids)), real_forward(ids))[1])
    monkeypatch.setattr(default_mlx, "forward_during", lambda ids, work: (ran.append(len(ids)), real_during(ids, work))[1])
    done2 = list(generate_events(default_mlx, GenerationRequest(messages=tuple(second), sampler=GREEDY, max_new_tokens=8)))[-1]
    prefilled = sum(ran) - (done2.stats.generated_tokens - 1)  # decode runs one token per step after the first
    assert done2.stats.reused_tokens == shared
    assert prefilled == len(prompt2) - shared == done2.stats.prefilled_tokens


@pytest.mark.slow
def test_replay_on_mlx_gives_identical_tokens_and_shows_where_a_change_mattered(default_mlx):
    """Issue 12's replay on the MLX backend: same seed and settings -> the same ids; a changed knob -> a diff
    whose first divergence is a step where the survivors changed (one uniform draw per step)."""
    from engine.experiments import run_column, token_diff

    def run(settings):
        request = GenerationRequest(prompt="Once upon a time", sampler=settings, max_new_tokens=16,
                                    record_stages=True, top_n=1, ignore_eos=True)
        return run_column(default_mlx, request)

    base = SamplerSettings(temperature=1.3, top_p=0.95, seed=1234)
    a, b = run(base), run(base)
    assert a.token_ids == b.token_ids and token_diff(a.token_ids, b.token_ids).identical
    lowered = run(base.with_(top_p=0.3))
    d = token_diff(a.token_ids, lowered.token_ids)
    assert not d.identical, "top_p 0.95 -> 0.3 at temperature 1.3 should matter somewhere in 16 tokens"
    i = d.first_divergence
    assert a.events[i].stages[-1].survivors != lowered.events[i].stages[-1].survivors
