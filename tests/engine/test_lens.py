"""The layer view (logit lens) and attention (engine.capabilities.LayerLens) on torch, llama.cpp and MLX.

Oracles: torch's view equals transformers' own hidden states put through the
final norm and head by hand; llama.cpp's view of the default GGUF agrees with
torch's on the same weights de-quantized (the default torch fixture is that
GGUF converted); MLX agrees with torch.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from engine.capabilities import LayerLens, MissingCapabilityError, require
from engine.lens import log_softmax

PROMPT = "The capital of France is Paris. The capital of Germany is Berlin, and the capital of Italy is"
# Quantization error of the default Q4_1 model, relative to the largest logit: llama.cpp's head is Q8_0 and
# multiplies activations quantized to 8 bits, our numpy head multiplies float32 activations by the
# de-quantized Q8_0 matrix; measured ~0.5% of the largest logit, allowed 2%.
HEAD_TOLERANCE = 0.02
# torch runs the de-quantized weights in float32, llama.cpp the Q4_1 ones with 8-bit activations: the
# final log-probs of the likely tokens differ by about 0.1 nat; allowed 0.5.
FINAL_LOGPROB_TOLERANCE = 0.5


@pytest.fixture(scope="module")
def prompt_ids(default_torch) -> list[int]:
    return list(default_torch.tokenizer.encode(PROMPT))


def _positions(ids: list[int]) -> list[int]:
    return [3, len(ids) // 2, len(ids) - 1, len(ids)]  # the last: the next token after the prompt


def _direct_transformers(model, ids: list[int], positions: list[int]) -> np.ndarray:
    """(P, L, V) log-probs: hidden_states[i] -> final norm -> lm_head, the last layer the model's logits.

    transformers 5 returns L + 1 hidden states, the last one already through the final norm.
    """
    with torch.no_grad():
        out = model(torch.tensor([ids[: max(positions)]]), output_hidden_states=True)
        rows = [p - 1 for p in positions]
        per_layer = [model.lm_head(model.model.norm(h[0, rows])) for h in out.hidden_states[1:-1]]
        per_layer.append(out.logits[0, rows])
        logits = torch.stack(per_layer, dim=1)
    return log_softmax(logits.float().numpy())


@pytest.mark.slow
def test_torch_layer_view_equals_transformers(fresh_default_torch, prompt_ids):
    backend = fresh_default_torch
    positions = _positions(prompt_ids)
    captures = require(backend, LayerLens, "test").layer_capture(prompt_ids, positions, top_k=5)
    expected = _direct_transformers(backend.model, prompt_ids, positions)
    n_layers = backend.model.config.num_hidden_layers
    assert [c.position for c in captures] == positions
    for capture, want in zip(captures, expected):
        assert capture.n_layers == n_layers == want.shape[0]
        target = capture.target_id
        for layer, row in zip(capture.layers, want):
            ids = [t for t, _ in layer.top]
            assert ids == list(np.argsort(-row, kind="stable")[:5])
            # 1e-5, relative: the same float32 products batched differently round differently (~4e-6)
            np.testing.assert_allclose([lp for _, lp in layer.top], row[ids], rtol=1e-5, atol=1e-5)
            assert layer.target_logprob == pytest.approx(float(row[target]), rel=1e-5, abs=1e-5)
            assert layer.target_rank == int((row > row[target]).sum())
    # the target is the token at the position when the ids reach it, else the model's own top-1
    assert captures[0].target_id == prompt_ids[3]
    assert captures[-1].target_id == int(np.argmax(expected[-1, -1]))
    assert backend.cached_tokens() == []  # the decode path's cache is not touched


def test_torch_attention_rows(fresh_default_torch, prompt_ids):
    p = len(prompt_ids)
    capture = fresh_default_torch.layer_capture(prompt_ids, [p], attention=True)[0]
    cfg = fresh_default_torch.model.config
    assert capture.attention.shape == (cfg.num_hidden_layers, cfg.num_attention_heads, p)
    np.testing.assert_allclose(capture.attention.sum(axis=-1), 1.0, atol=1e-5)
    assert capture.attention_mean().shape == (cfg.num_hidden_layers, p)
    assert fresh_default_torch.model.config._attn_implementation != "eager"  # switched back after the pass


def test_llamacpp_layer_view_agrees_with_torch(fresh_default_llamacpp, default_torch, prompt_ids):
    positions = _positions(prompt_ids)
    ours = fresh_default_llamacpp.layer_capture(prompt_ids, positions, top_k=5)
    theirs = default_torch.layer_capture(prompt_ids, positions, top_k=5)
    for a, b in zip(ours, theirs):
        assert a.n_layers == b.n_layers == 30
        for i, (x, y) in enumerate(zip(a.layers, b.layers)):
            shared = {t for t, _ in x.top} & {t for t, _ in y.top}
            assert len(shared) >= 3, f"position {a.position}, layer {i}: top-5 overlap {len(shared)}"
        assert a.layers[-1].top[0][0] == b.layers[-1].top[0][0]
        np.testing.assert_allclose([lp for _, lp in a.layers[-1].top[:3]], [lp for _, lp in b.layers[-1].top[:3]],
                                   atol=FINAL_LOGPROB_TOLERANCE)


def test_llamacpp_head_matches_its_own_logits(fresh_default_llamacpp, prompt_ids):
    """The de-quantized norm and head applied to the last layer's output (l_out) give llama.cpp's logits."""
    from engine.backends.llamacpp import unembed
    from engine.backends.llamacpp.lens import capture_logits

    wanted, hidden, real, _ = capture_logits(fresh_default_llamacpp, prompt_ids, _positions(prompt_ids))
    head = unembed.for_backend(fresh_default_llamacpp)
    ours = head.logits(hidden[:, -1])  # (P, V)
    scale = np.abs(real).max(axis=-1)
    assert (np.abs(ours - real).max(axis=-1) <= HEAD_TOLERANCE * scale).all()
    assert (ours.argmax(axis=-1) == real.argmax(axis=-1)).all()


def test_llamacpp_attention_agrees_with_torch(fresh_default_llamacpp, default_torch, prompt_ids):
    p = len(prompt_ids)
    ours = fresh_default_llamacpp.layer_capture(prompt_ids, [p - 2, p], attention=True)
    theirs = default_torch.layer_capture(prompt_ids, [p - 2, p], attention=True)
    for a, b in zip(ours, theirs):
        assert a.attention.shape == b.attention.shape == (30, 9, a.position)
        np.testing.assert_allclose(a.attention.sum(axis=-1), 1.0, atol=1e-3)
        np.testing.assert_allclose(a.attention_mean(), b.attention_mean(), atol=0.05)


def test_llamacpp_reuses_the_cached_prefix(fresh_default_llamacpp, prompt_ids, caplog):
    """A view after the model has run the text copies its KV state: the same answer as running it all."""
    backend = fresh_default_llamacpp
    p = len(prompt_ids)
    with caplog.at_level(logging.DEBUG, logger="engine.backends.llamacpp.lens"):
        cold = backend.layer_capture(prompt_ids, [p], top_k=5, attention=True)[0]
        backend.forward(prompt_ids)
        warm = backend.layer_capture(prompt_ids, [p], top_k=5, attention=True)[0]
    runs = [r.getMessage() for r in caplog.records if r.getMessage().startswith("layer view: reused")]
    assert runs == [f"layer view: reused 0 cached tokens, running {p}", f"layer view: reused {p - 1} cached tokens, running 1"]
    assert list(backend.cached_tokens()) == prompt_ids  # the backend's own cache is only read
    for x, y in zip(cold.layers, warm.layers):
        assert [t for t, _ in x.top] == [t for t, _ in y.top]
        np.testing.assert_allclose([lp for _, lp in x.top], [lp for _, lp in y.top], atol=1e-3)
    np.testing.assert_allclose(cold.attention, warm.attention, atol=1e-3)


def test_bad_positions_are_refused_in_words(fresh_default_llamacpp, prompt_ids):
    with pytest.raises(ValueError, match="outside 1..") as e:
        fresh_default_llamacpp.layer_capture(prompt_ids, [len(prompt_ids) + 1])
    assert "index of a predicted token" in str(e.value)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        fresh_default_llamacpp.layer_capture([1, 10**7], [1])


def test_remote_models_say_they_have_no_layer_view():
    from engine.backends.remote.backend import RemoteBackend

    assert not hasattr(RemoteBackend, "layer_capture")
    remote = object.__new__(RemoteBackend)  # the class as loaded, without a server: only its type is asked
    with pytest.raises(MissingCapabilityError, match="the layer view needs a model that can show what each"):
        require(remote, LayerLens, "the layer view")


@pytest.mark.slow
def test_language_model_layer_logprobs(default_torch, prompt_ids):
    from engine.research import LanguageModel

    lm = LanguageModel(default_torch)
    layers = lm.layer_logprobs(prompt_ids, top_k=4)
    assert len(layers) == default_torch.model.config.num_hidden_layers
    for entry in layers:
        assert len(entry) == 4
        assert [lp for _, lp in entry] == sorted((lp for _, lp in entry), reverse=True)
    own = lm.next_token_logprobs_sync(prompt_ids)
    best = np.argsort(-own)[:4]
    assert [t for t, _ in layers[-1]] == list(best)
    np.testing.assert_allclose([lp for _, lp in layers[-1]], own[best], atol=1e-4)
    middle = lm.layer_logprobs(prompt_ids, position=5, top_k=2)
    assert len(middle) == len(layers) and all(len(e) == 2 for e in middle)


@pytest.mark.model
def test_cli_lens_table_and_trace(tmp_path, capsys):
    from engine.cli.main import main
    from engine.experiments.trace import read_trace

    trace = tmp_path / "lens.jsonl"
    assert main(["lens", "--prompt", "The capital of Germany is", "--top-k", "3", "--output", str(trace)]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line[:5].strip().isdigit()]
    assert [int(r[:5]) for r in rows] == list(range(30))
    assert "Berlin" in rows[-1] and out[0].startswith("position 5: target ' Berlin'")
    (run,) = read_trace(trace)
    assert run.header["kind"] == "lens" and run.header["prompt_ids"] and len(run.tokens) == 1
    view = run.tokens[0]["layers"]
    assert len(view["layers"]) == 30 and all(len(layer["top"]) == 3 for layer in view["layers"])
    assert view["first_top1_layer"] == next(i for i, layer in enumerate(view["layers"]) if layer["target_rank"] == 0)
    json.dumps(view)  # plain JSON values only


@pytest.mark.model
def test_cli_lens_refuses_a_bad_position(capsys):
    from engine.cli.main import main

    assert main(["lens", "--prompt", "Hello", "--position", "0"]) == 2
    assert "--position must be at least 1" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.mlx
def test_mlx_layer_view_agrees_with_torch(default_model_folder, default_torch, prompt_ids):
    pytest.importorskip("mlx_lm")
    from engine.backends.mlx.backend import MlxBackend

    backend = MlxBackend(default_model_folder, spec="default", display_name="SmolLM2-135M-Instruct")
    try:
        positions = _positions(prompt_ids)
        ours = backend.layer_capture(prompt_ids, positions, top_k=5, attention=True)
        theirs = default_torch.layer_capture(prompt_ids, positions, top_k=5, attention=True)
    finally:
        backend.close()
    for a, b in zip(ours, theirs):
        assert a.target_id == b.target_id and a.n_layers == b.n_layers
        for x, y in zip(a.layers, b.layers):
            assert x.top[0][0] == y.top[0][0]
            assert x.target_logprob == pytest.approx(y.target_logprob, abs=1e-3)
        np.testing.assert_allclose(a.attention, b.attention, atol=1e-4)


def test_traces_carry_the_layer_view_on_request(fresh_default_llamacpp, prompt_ids, tmp_path):
    from engine.experiments import score
    from engine.experiments.trace import read_trace, score_run, with_layer_views, write_trace

    result = score(fresh_default_llamacpp, prompt_ids, top_n=2)
    lines = score_run(result, model=fresh_default_llamacpp.info)
    token_lines = [line for line in lines if line["type"] == "token"]
    picked = token_lines[-1]["index"]  # a scored token's index is its position in the ids: what the lens takes
    capture = fresh_default_llamacpp.layer_capture(result.token_ids, [picked], top_k=3)[0]
    # the last layer is the model's own distribution: the scored log-prob (scoring runs batch kernels: 1e-2)
    assert capture.layers[-1].target_logprob == pytest.approx(result.tokens[-1].logprob, abs=1e-2)
    write_trace(tmp_path / "t.jsonl", with_layer_views(lines, {picked: capture}))
    (run,) = read_trace(tmp_path / "t.jsonl")
    assert [("layers" in t) for t in run.tokens] == [t["index"] == picked for t in token_lines]
    view = run.tokens[-1]["layers"]
    assert view["target_id"] == run.tokens[-1]["token_id"] == capture.target_id
    assert [layer["target_rank"] for layer in view["layers"]] == [p.target_rank for p in capture.layers]
    assert view["layers"][-1]["top"][0][0] == capture.layers[-1].top[0][0]
