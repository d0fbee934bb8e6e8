"""The compiled decode step's build: it yields to the foreground, its check is a real one, a failure is final.

The fast tests stand in for torch.compile with eager functions (a correct
one, one with a cache position off by one, one that is simply wrong), so
they need no C compiler; the slow one compiles a bfloat16 model with inductor
on the CPU and requires that the check accepts it.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch

from engine.backends.torch import compile as compile_step
from engine.backends.torch import compile_failures
from engine.backends.torch.cache import GrowingCache
from engine.backends.torch.foreground import ForegroundGate, yielding_to_foreground

# An argument transformers has announced it will remove (`past_key_values` -> `cache`, ...) is an error here, so a
# rename inside the admitted transformers range fails these tests rather than a user's model a release later.
pytestmark = pytest.mark.filterwarnings("error:.*(is deprecated|will be removed).*:FutureWarning")


def _wait_until(condition, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def _noop() -> None:
    pass


def test_background_work_pauses_while_the_foreground_runs_steps():
    gate = ForegroundGate(hold_s=0.2)
    progress, done = [0], threading.Event()

    def work():
        with yielding_to_foreground(gate):
            while not done.is_set():
                progress[0] += 1
                _noop()  # a Python call, where the pause takes hold (torch.compile's tracing makes millions)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    try:
        _wait_until(lambda: progress[0] > 1000)
        gate.touch()
        time.sleep(0.05)  # the thread reaches its next call and stops there
        before = progress[0]
        for _ in range(10):  # the foreground steps for 0.3 s
            gate.touch()
            time.sleep(0.03)
        assert progress[0] - before <= 1
        _wait_until(lambda: progress[0] > before + 1000)  # quiet for hold_s: it goes on
    finally:
        done.set()
        thread.join(5)
    assert not thread.is_alive()


def _tiny_llama(dtype: torch.dtype, name: str, layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.config._name_or_path = name
    return model.to(dtype)


@pytest.fixture
def private_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LOGITLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_failures, "_seen", {})
    return tmp_path


def _stand_in_compiler(monkeypatch, make_step):
    """torch.compile replaced by `make_step(fn)`: the build then checks whatever step that returns."""
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: make_step(fn))


def _position_off_by_one(fn):
    def step(model, ids, cache):  # the static step's write position (and so its rotary position) one too far
        cache._position.add_(1)
        try:
            return fn(model, ids, cache)
        finally:
            cache._position.sub_(1)

    return step


@pytest.mark.slow  # seconds on two cores (junit times, 2026-12-04)
def test_a_correct_step_passes_the_check(private_cache_dir, monkeypatch):
    _stand_in_compiler(monkeypatch, lambda fn: fn)  # the eager function in the static step's fixed-shape mode
    built = compile_step.CompiledDecodeStep(_tiny_llama(torch.bfloat16, "tiny-correct"))
    assert built.wait(60), built.error
    built.close()


def test_a_cache_position_off_by_one_fails_the_bfloat16_check(private_cache_dir, monkeypatch):
    model = _tiny_llama(torch.bfloat16, "tiny-off-by-one")
    _stand_in_compiler(monkeypatch, _position_off_by_one)
    built = compile_step.CompiledDecodeStep(model)
    assert not built.wait(60)
    assert "compiled logits differ from eager" in str(built.error)


def test_a_failed_build_is_reported_once_and_not_tried_again(private_cache_dir, monkeypatch, caplog):
    model = _tiny_llama(torch.float32, "tiny-broken-compiler")
    builds = []

    def broken(fn):
        builds.append(fn)
        return lambda m, ids, cache: fn(m, ids, cache) + 1.0  # logits off by a whole unit

    _stand_in_compiler(monkeypatch, broken)
    with caplog.at_level(logging.WARNING, logger=compile_step.__name__):
        first = compile_step.CompiledDecodeStep(model)
        assert not first.wait(60)
        again = compile_step.CompiledDecodeStep(model)  # the same model loaded again
        assert not again.wait(1)
    assert len(builds) == 1
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    assert "earlier build" in str(again.error)
    monkeypatch.setattr(compile_failures, "_seen", {})  # a new process: the failure is kept on disk
    assert compile_failures.known_failure(compile_failures.model_key(model, first.form))
    other = _tiny_llama(torch.float32, "another-model")
    assert compile_failures.known_failure(compile_failures.model_key(other, first.form)) is None
    # The other form of the step is another graph: its build is still tried.
    assert first.form == "transformers' forward"
    assert compile_failures.known_failure(compile_failures.model_key(model, "the lean step's arithmetic")) is None


def _compiler_available() -> bool:
    import shutil

    return any(shutil.which(c) for c in ("cc", "gcc", "clang"))


@pytest.mark.slow
@pytest.mark.every_python  # dynamo reads this Python minor's own bytecode: CI builds it on each
@pytest.mark.skipif(not _compiler_available(), reason="torch.compile (inductor) needs a C compiler on the CPU")
def test_inductor_compiled_bfloat16_step_passes_the_check(private_cache_dir):
    """bf16 kernels round differently from eager's; the check tells that from a wrong position (test above).
    One layer: the build (paused-at-every-call tracing, ~1.6x slower than without) stays within minutes here."""
    # Not faster: one layer and a 512-token vocabulary already; what is left is inductor's build, the test's point.
    model = _tiny_llama(torch.bfloat16, "tiny-inductor", layers=1)
    built = compile_step.CompiledDecodeStep(model)
    assert built.wait(800), built.error or "still building after 800 s"
    cache = GrowingCache(model.config)
    with torch.inference_mode():
        compile_step._logits(model, torch.tensor([[5, 6, 7]]), cache)
        with cache.static_step():
            logits = built.step(model, torch.tensor([[8]]), cache)
    assert logits.shape == (1, 1, 512)
