"""The lean step in fixed shapes (static_lean.py): transformers' logits, through spans and buffer growth, and
one compiled graph for a whole answer.

The fast tests run the fixed-shape step eagerly (what torch.compile traces) against transformers' forward on
a DynamicCache, and its build's check with a stand-in compiler; the slow one compiles it with inductor and
counts the graphs dynamo made over 600 tokens.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from engine.backends.torch import compile as compile_step
from engine.backends.torch import compile_failures
from engine.backends.torch import linear as cpu_linear
from engine.backends.torch.cache import GrowingCache
from engine.backends.torch.lean import LeanDecodeStep
from engine.backends.torch.static_lean import SPAN_FLOOR, StaticLeanStep, attention_span


def _tiny_llama(name: str, layers: int = 2) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.config._name_or_path = name
    return model


@pytest.fixture
def private_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LOGITLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_failures, "_seen", {})
    return tmp_path


def _walk(model, step, tokens: int, grow_step: int = 64) -> tuple[float, GrowingCache, list[int]]:
    """Greedy `tokens` steps of `step` in the cache's fixed-shape mode beside transformers' own forward on a
    DynamicCache: (the largest relative logit difference, the fixed-shape cache, the capacity after each step)."""
    ours, theirs = GrowingCache(model.config, grow_step=grow_step), DynamicCache(config=model.config)
    worst, capacities = 0.0, []
    with torch.inference_mode():
        prompt = torch.tensor([[1, 2, 3, 4, 5]])
        model(input_ids=prompt, past_key_values=ours, use_cache=True)
        want = model(input_ids=prompt, past_key_values=theirs, use_cache=True).logits[:, -1:]
        for _ in range(tokens):
            token = want[:, -1].argmax(-1, keepdim=True)
            with ours.static_step():
                got = step(model, token, ours)
            want = model(input_ids=token, past_key_values=theirs, use_cache=True).logits
            worst = max(worst, compile_step.relative_logit_error(got, want))
            capacities.append(ours.attention_layers()[0].capacity)
    return worst, ours, capacities


def test_the_span_is_the_power_of_two_above_the_position():
    assert [attention_span(p) for p in (0, SPAN_FLOOR - 1, SPAN_FLOOR, 255, 256, 1000)] == [
        SPAN_FLOOR, SPAN_FLOOR, 2 * SPAN_FLOOR, 256, 512, 1024]


def test_the_fixed_shape_step_gives_transformers_logits_through_spans_and_growth():
    model = _tiny_llama("tiny-static-lean")
    step = StaticLeanStep(LeanDecodeStep.for_model(model))
    worst, cache, capacities = _walk(model, step, 300)
    assert worst < 1e-5
    assert cache.get_seq_length() == 305
    # Spans 128, 256 and 512 were read; the buffer grew each time one would have covered it whole.
    assert len(set(capacities)) >= 3
    for position, capacity in enumerate(capacities, start=5):
        assert capacity > attention_span(position)


def test_the_build_checks_the_fixed_shape_step_and_refuses_a_wrong_position(private_cache_dir, monkeypatch):
    model = _tiny_llama("tiny-static-lean-check")
    lean = LeanDecodeStep.for_model(model)

    def position_off_by_one(core):
        return lambda ids, position, span, keys, values: core(ids, position + 1, span, keys, values)

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)  # the eager core: the check passes
    good = compile_step.CompiledDecodeStep(model, lean=StaticLeanStep(lean))
    assert good.wait(60), good.error
    assert good.form == "the lean step's arithmetic"
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: position_off_by_one(fn))
    model.config._name_or_path = "tiny-static-lean-off-by-one"  # another model: the failure is its own
    bad = compile_step.CompiledDecodeStep(model, lean=StaticLeanStep(lean))
    assert not bad.wait(60)
    assert "compiled logits differ from eager" in str(bad.error)


@pytest.mark.skipif("onednn" not in cpu_linear.candidates(torch.zeros(1)), reason="no oneDNN linear in this torch")
def test_the_compilable_onednn_kernel_is_onednns_linear():
    x, weight, bias = torch.randn(1, 64), torch.randn(96, 64), torch.randn(96)
    assert torch.equal(cpu_linear.COMPILABLE_KERNELS["onednn"](x, weight, bias), cpu_linear.onednn_linear(x, weight, bias))
    assert torch.equal(cpu_linear.COMPILABLE_KERNELS["onednn"](x, weight, None), cpu_linear.onednn_linear(x, weight, None))


def _compiler_available() -> bool:
    import shutil

    return any(shutil.which(c) for c in ("cc", "gcc", "clang"))


@pytest.mark.slow  # inductor's build of a 2-layer step: ~20-40 s on two cores
@pytest.mark.skipif(not _compiler_available(), reason="torch.compile (inductor) needs a C compiler on the CPU")
def test_one_compiled_graph_serves_a_whole_answer(private_cache_dir):
    """Spans 128 to 1,024 and the buffer growing from 64 slots: no recompile (each would stall an answer)."""
    from torch._dynamo.utils import counters

    model = _tiny_llama("tiny-static-lean-inductor")
    lean = LeanDecodeStep.for_model(model)
    lean.choose_kernels("onednn")  # oneDNN's op inside the graph where this torch has it; torch's otherwise
    built = compile_step.CompiledDecodeStep(model, lean=StaticLeanStep(lean))
    assert built.wait(600), built.error
    graphs = counters["stats"]["unique_graphs"]
    worst, cache, capacities = _walk(model, built.step, 600)
    assert counters["stats"]["unique_graphs"] == graphs
    assert worst < 1e-4
    assert capacities[0] < capacities[-1] and attention_span(cache.get_seq_length() - 1) == 1024
