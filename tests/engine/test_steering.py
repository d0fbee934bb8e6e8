"""Steering (issue 33): the settings value and its record, applying it on llama.cpp, torch and MLX, the cache's
exactness when it changes, what it did to a token (steering_effect, the unsteered shadow), training, refusals.

Fast tests run on a tiny random-weight Llama (a GGUF for llama.cpp, a HF folder for torch and MLX); the
default model is used where a trained vector must mean something.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine.backend import prefill
from engine.capabilities import MissingCapabilityError, ResidualStates, Steerable
from engine.decode.loop import generate_events
from engine.events import Done
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings
from engine.steering import (
    PairSet,
    ResidualShape,
    Steering,
    SteeringEntry,
    SteeringError,
    SteeringVector,
    builtin_pair_sets,
    steering_effect,
    train_vector,
    unsteered_shadow,
)
from engine.steering.train import directions_from_states
from tiny_gguf import write_tiny_llama_gguf

GREEDY = SamplerSettings(temperature=0.0)
LAYERS = 4  # the tiny GGUF's decoder layers: 1..3 can be steered


def random_vector(shape: ResidualShape, seed: int = 0, scale: float = 1.0, name: str = "rand") -> SteeringVector:
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((shape.n_layer, shape.n_embd)).astype(np.float32) * scale
    rows[0] = 0
    return SteeringVector(name, rows, model_hint=shape.model_hint)


@pytest.fixture(scope="module")
def tiny_llamacpp(tmp_path_factory):
    pytest.importorskip("llama_cpp")
    from engine.backends.llamacpp import LlamaCppBackend

    path = write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", layers=LAYERS)
    backend = LlamaCppBackend(path, spec=str(path), display_name="tiny", n_threads=1)
    yield backend
    backend.close()


@pytest.fixture
def tiny_cpp(tiny_llamacpp):
    tiny_llamacpp.set_steering(None)
    tiny_llamacpp.trim_cache(0)
    return tiny_llamacpp


# --- the settings value -----------------------------------------------------------------------------------


def test_settings_refuse_bad_values_in_words():
    v = random_vector(ResidualShape(3, 8))
    for strength, words in ((float("nan"), "finite number"), (float("inf"), "finite number"), ("abc", "finite number"),
                            (True, "finite number"), (1e9, "keep it within")):
        with pytest.raises(SteeringError, match=words):
            Steering((SteeringEntry(v, strength),))  # type: ignore[arg-type]
    other = random_vector(ResidualShape(4, 8))
    with pytest.raises(SteeringError, match="different models"):
        Steering.of((v, 1.0), (other, 1.0))
    with pytest.raises(SteeringError, match="empty"):
        Steering.of((v, 1.0), layer_start=3, layer_end=2)
    with pytest.raises(SteeringError, match="1 or more"):
        Steering.of((v, 1.0), layer_start=0)
    bad = np.ones((3, 8), dtype=np.float32)
    with pytest.raises(SteeringError, match="layer 0"):
        SteeringVector("x", bad)
    bad[0] = 0
    bad[2, 3] = np.nan
    with pytest.raises(SteeringError, match="NaN or infinite values at layer 2"):
        SteeringVector("x", bad)


def test_zero_strength_and_no_entries_mean_no_steering():
    v = random_vector(ResidualShape(3, 8))
    assert not Steering().active and Steering().key() is None
    assert not Steering.of((v, 0.0)).active and Steering.of((v, 0.0)).key() is None
    assert Steering.of((v, 0.5)).key() == Steering.of((v, 0.5)).key()
    assert Steering.of((v, 0.5)).key() != Steering.of((v, 0.25)).key()
    assert Steering.of((v, 0.5)).key() != Steering.of((v, 0.5), layer_end=1).key()


def test_record_names_vectors_by_hash_not_numbers():
    shape = ResidualShape(30, 576, "llama")
    v = random_vector(shape, name="happy")
    s = Steering.of((v, 0.8), layer_start=5, layer_end=20)
    record = s.to_dict()
    assert record == {"vectors": [{"name": "happy", "sha256": v.digest, "n_layer": 30, "n_embd": 576,
                                   "model_hint": "llama", "strength": 0.8}], "layer_start": 5, "layer_end": 20}
    import json

    assert len(json.dumps(record)) < 300  # names, not 17,000 floats
    assert Steering.from_dict(record, {v.digest: v}) == s
    with pytest.raises(SteeringError, match="'happy' .*is not loaded"):
        Steering.from_dict(record, {})
    # The same numbers under another name hash alike; other numbers do not.
    assert v.renamed("joy").digest == v.digest
    assert random_vector(shape, seed=1).digest != v.digest


def test_combined_is_zero_outside_the_range():
    shape = ResidualShape(6, 4)
    v = SteeringVector("ones", np.vstack([np.zeros((1, 4)), np.ones((5, 4))]))
    w = SteeringVector("twos", np.vstack([np.zeros((1, 4)), 2 * np.ones((5, 4))]))
    combined = Steering.of((v, 0.5), (w, -1.0), layer_start=2, layer_end=4).combined(shape)
    assert np.allclose(combined[2:5], -1.5) and not combined[[0, 1, 5]].any()
    with pytest.raises(SteeringError, match="made for a model with 6 layers of width 4; this model has 6 layers of width 8"):
        Steering.of((v, 1.0)).combined(ResidualShape(6, 8))


def test_request_takes_only_a_steering_value():
    with pytest.raises(SteeringError, match="must be an engine.steering.Steering"):
        GenerationRequest(prompt="x", steering={"happy": 1.0})  # type: ignore[arg-type]


# --- refusals where a model cannot steer ------------------------------------------------------------------


def test_a_model_without_the_capability_refuses_before_anything_runs():
    from engine.backends.mock import MockBackend

    backend = MockBackend()
    v = random_vector(ResidualShape(3, 8))
    request = GenerationRequest(prompt="hello", max_new_tokens=3, steering=Steering.of((v, 1.0)))
    with pytest.raises(MissingCapabilityError, match="steering .*needs a model that can add a direction"):
        list(generate_events(backend, request))
    assert backend.cached_tokens() == []  # nothing ran
    # No steering, or zero strength, runs as always on a model without it.
    done = list(generate_events(backend, GenerationRequest(prompt="hello", max_new_tokens=2,
                                                           steering=Steering.of((v, 0.0)))))[-1]
    assert isinstance(done, Done) and done.stats.generated_tokens == 2


def test_a_server_model_refuses_steering_in_words():
    from engine.worker import events_for

    class ServerLike:  # makes its own events, as the remote backend does (OwnEvents)
        called = False

        class info:
            name, backend = "some-server-model", "remote"

        def events(self, request, cancel):
            ServerLike.called = True
            return iter(())

    v = random_vector(ResidualShape(3, 8))
    request = GenerationRequest(prompt="hello", steering=Steering.of((v, 1.0)))
    with pytest.raises(MissingCapabilityError, match="some-server-model .*cannot"):
        events_for(ServerLike(), request, threading.Event())
    assert not ServerLike.called


# --- llama.cpp ----------------------------------------------------------------------------------------------


def test_llamacpp_is_steerable_and_steering_moves_the_logits(tiny_cpp):
    assert isinstance(tiny_cpp, Steerable) and isinstance(tiny_cpp, ResidualStates)
    shape = tiny_cpp.residual_shape()
    assert (shape.n_layer, shape.n_embd, shape.model_hint) == (LAYERS, 64, "llama")
    ids = tiny_cpp.tokenizer.encode("the cat sat on the mat")
    s = Steering.of((random_vector(shape), 2.0))
    plain = tiny_cpp.steered_logits(ids, [len(ids)], None)[0]
    steered = tiny_cpp.steered_logits(ids, [len(ids)], s)[0]
    assert np.abs(plain - steered).max() > 0.1
    assert np.allclose(tiny_cpp.forward(ids), plain, atol=1e-4)  # (a batch split otherwise: rounding)
    tiny_cpp.set_steering(s)
    assert np.allclose(tiny_cpp.forward(ids), steered, atol=1e-4)  # the backend's own context, llama_set_adapter_cvec
    # A layer range outside every direction steers nothing at all.
    only_layer_1 = random_vector(shape).directions.copy()
    only_layer_1[2:] = 0
    unsteered = Steering.of((SteeringVector("l1", only_layer_1), 2.0), layer_start=2)
    assert np.allclose(tiny_cpp.steered_logits(ids, [len(ids)], unsteered)[0], plain, atol=1e-5)


def test_llamacpp_cache_is_dropped_only_when_the_steering_changes(tiny_cpp):
    shape = tiny_cpp.residual_shape()
    ids = tiny_cpp.tokenizer.encode("a long enough prompt to be worth caching, " * 3)
    v = random_vector(shape)
    prefill(tiny_cpp, ids)
    assert len(tiny_cpp.cached_tokens()) == len(ids)
    tiny_cpp.set_steering(Steering.of((v, 1.0)))
    assert tiny_cpp.cached_tokens() == []  # computed unsteered: not reused under the vector
    prefill(tiny_cpp, ids)
    tiny_cpp.set_steering(Steering.of((v.renamed("same numbers"), 1.0)))  # an equal key keeps the cache
    assert len(tiny_cpp.cached_tokens()) == len(ids)
    tiny_cpp.set_steering(Steering.of((v, 0.5)))
    assert tiny_cpp.cached_tokens() == []
    prefill(tiny_cpp, ids)
    tiny_cpp.set_steering(Steering.of((v, 0.0)))  # zero strength is no steering: dropped again
    assert tiny_cpp.cached_tokens() == [] and tiny_cpp.current_steering() is None


def test_llamacpp_answers_after_a_change_of_steering_equal_fresh_ones(tiny_cpp):
    """The decode loop's prefix reuse never hands a steered answer an unsteered prefix, nor the reverse."""
    shape = tiny_cpp.residual_shape()
    s = Steering.of((random_vector(shape, scale=0.5), 1.5))
    prompt = "one two three four five six seven eight nine ten"

    def answer(steering):
        done = list(generate_events(tiny_cpp, GenerationRequest(prompt=prompt, sampler=GREEDY, max_new_tokens=12,
                                                                 steering=steering)))[-1]
        return done.stats

    plain_first = answer(None)
    steered = answer(s)
    assert steered.reused_tokens == 0
    steered_again = answer(s)
    assert steered_again.reused_tokens > 0 and steered_again.token_ids == steered.token_ids
    plain_again = answer(None)
    assert plain_again.reused_tokens == 0 and plain_again.token_ids == plain_first.token_ids
    assert steered.token_ids != plain_first.token_ids
    tiny_cpp.trim_cache(0)
    tiny_cpp.set_steering(None)
    assert answer(s).token_ids == steered.token_ids  # fresh, from an empty cache


def test_a_vector_for_another_model_is_refused_and_nothing_changes(tiny_cpp):
    shape = tiny_cpp.residual_shape()
    good = Steering.of((random_vector(shape), 1.0))
    tiny_cpp.set_steering(good)
    ids = tiny_cpp.tokenizer.encode("keep this cache")
    prefill(tiny_cpp, ids)
    for wrong in (ResidualShape(shape.n_layer, shape.n_embd * 2), ResidualShape(shape.n_layer + 2, shape.n_embd)):
        with pytest.raises(SteeringError, match=f"this model has {shape.n_layer} layers of width {shape.n_embd}"):
            tiny_cpp.set_steering(Steering.of((random_vector(wrong, name="other"), 1.0)))
        assert tiny_cpp.current_steering() == good and list(tiny_cpp.cached_tokens()) == ids
    request = GenerationRequest(prompt="hi", max_new_tokens=4,
                                steering=Steering.of((random_vector(ResidualShape(9, 64), name="other"), 1.0)))
    with pytest.raises(SteeringError, match="'other' was made for a model with 9 layers"):
        list(generate_events(tiny_cpp, request))
    assert list(tiny_cpp.cached_tokens()) == ids


def test_steering_effect_and_the_shadow_leave_the_chat_cache_alone(tiny_cpp):
    shape = tiny_cpp.residual_shape()
    s = Steering.of((random_vector(shape), 1.0))
    ids = tiny_cpp.tokenizer.encode("the quick brown fox jumps over the lazy dog and runs")
    tiny_cpp.set_steering(s)
    prefill(tiny_cpp, ids)
    cached = list(tiny_cpp.cached_tokens())
    effect = steering_effect(tiny_cpp, ids, 8, s, top_k=5, full=True)
    shadow = unsteered_shadow(tiny_cpp, ids, 6, s)
    assert list(tiny_cpp.cached_tokens()) == cached and tiny_cpp.current_steering() == s
    assert effect.position == 8 and effect.token_id == ids[8]
    for row in (effect.steered_logprobs, effect.unsteered_logprobs):
        assert row is not None and abs(np.exp(row.astype(np.float64)).sum() - 1) < 1e-4
    p, q = effect.steered_logprobs.astype(np.float64), effect.unsteered_logprobs.astype(np.float64)
    assert effect.kl == pytest.approx(float((np.exp(p) * (p - q)).sum()), rel=1e-4) and effect.kl > 0
    assert effect.unsteered_rank == int((q > q[ids[8]]).sum())
    assert all(r.delta > 0 for r in effect.risers) and all(f.delta < 0 for f in effect.fallers)
    assert len(effect.steered_top) == 5 and effect.steered_top[0][1] >= effect.steered_top[-1][1]
    # The shadow scores positions 6.. in one pass each way; its position 8 is the effect's.
    assert shadow.positions == tuple(range(6, len(ids)))
    j = shadow.positions.index(8)
    assert shadow.kl[j] == pytest.approx(effect.kl, rel=1e-3, abs=1e-5)
    assert shadow.unsteered_logprob[j] == pytest.approx(effect.unsteered_logprob, abs=1e-3)  # batch shapes: rounding
    assert shadow.unsteered_rank[j] == effect.unsteered_rank
    # ... and the backend's next forward still continues the steered cache as before.
    assert np.allclose(tiny_cpp.forward([ids[0]]), tiny_cpp.steered_logits(ids + [ids[0]], [len(ids) + 1], s)[0], atol=1e-4)


def test_steering_effect_refuses_an_inactive_steering(tiny_cpp):
    v = random_vector(tiny_cpp.residual_shape())
    with pytest.raises(ValueError, match="changes nothing"):
        steering_effect(tiny_cpp, [1, 2, 3], 2, Steering.of((v, 0.0)))


def test_layer_outputs_read_together_equal_those_read_alone(tiny_cpp):
    tok = tiny_cpp.tokenizer
    heads = "a shared beginning of every prompt here: "
    prompts = [tok.encode(heads + tail) for tail in ("one", "two two", "three three three")] + [tok.encode("alone")]
    together = tiny_cpp.last_token_states(prompts)
    alone = np.stack([tiny_cpp.last_token_states([p])[0] for p in prompts])
    assert together.shape == (4, LAYERS, 64)
    # Prompts with a shared prefix (run once, then shared): as alone. Prompts batched together: llama.cpp's
    # kernels for a batch of another size round otherwise (measured up to 2e-3 here on values up to 4.6).
    assert np.allclose(tiny_cpp.last_token_states(prompts[:3]), alone[:3], atol=1e-5)
    assert np.allclose(together, alone, atol=5e-3)
    assert np.abs(together[0] - together[1]).max() > 1e-3


# --- torch and MLX --------------------------------------------------------------------------------------------


def test_torch_steering_in_transformers_and_the_lean_step(tiny_torch):
    shape = tiny_torch.residual_shape()
    assert (shape.n_layer, shape.n_embd) == (2, 64)
    s = Steering.of((random_vector(shape), 1.0))
    ids = tiny_torch.tokenizer.encode("the cat sat on the mat")
    plain = tiny_torch.steered_logits(ids, [len(ids)], None)[0]
    steered = tiny_torch.steered_logits(ids, [len(ids)], s)[0]
    assert np.abs(plain - steered).max() > 0.1
    tiny_torch.set_steering(s)
    assert np.allclose(tiny_torch.forward(ids[:-1]), tiny_torch.steered_logits(ids, [len(ids) - 1], s)[0], atol=1e-4)
    one = tiny_torch.forward(ids[-1:])  # one token: the lean step where the model has one
    assert np.allclose(one, steered, atol=1e-4)
    assert tiny_torch.lean is None or tiny_torch.lean.verified  # the lean step's own check agreed under steering
    two = tiny_torch.forward([ids[0]])
    assert np.allclose(two, tiny_torch.steered_logits(ids + [ids[0]], [len(ids) + 1], s)[0], atol=1e-4)
    # The runners sharing the model stay unsteered.
    runner = tiny_torch.batch_runner()
    assert np.allclose(runner.start([ids])[0], plain, atol=1e-4)
    tiny_torch.set_steering(None)
    assert tiny_torch.cached_tokens() == []
    assert np.allclose(tiny_torch.forward(ids), plain, atol=1e-4)


def test_mlx_steering(tiny_llama_folder):
    pytest.importorskip("mlx_lm")
    from engine.backends.mlx.backend import MlxBackend

    backend = MlxBackend(tiny_llama_folder, spec=str(tiny_llama_folder), display_name="tiny-llama")
    try:
        shape = backend.residual_shape()
        s = Steering.of((random_vector(shape), 1.0))
        ids = backend.tokenizer.encode("the cat sat on the mat")
        plain = backend.steered_logits(ids, [len(ids)], None)[0]
        steered = backend.steered_logits(ids, [len(ids)], s)[0]
        assert np.abs(plain - steered).max() > 0.1
        backend.set_steering(s)
        backend.forward(ids[:-1])
        assert np.allclose(backend.forward(ids[-1:]), steered, atol=1e-4)
        assert type(backend.model.layers[0]).__name__ != "_Steered"  # put back after the forward was built
        states = backend.last_token_states([ids])
        assert states.shape == (1, 2, 64)
    finally:
        backend.close()


def test_torch_and_llamacpp_read_the_same_layer_outputs(tiny_torch, tiny_llama_folder):
    """Training reads layer i's output where steering adds to it: after the layer, before the final norm."""
    ids = tiny_torch.tokenizer.encode("the cat sat on the mat")
    states = tiny_torch.last_token_states([ids, ids[:3]])
    import torch

    with torch.no_grad():
        out = tiny_torch.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    assert np.allclose(states[0, 0], out.hidden_states[1][0, -1].numpy(), atol=1e-5)  # layer 0's output
    assert not np.allclose(states[0, 1], out.hidden_states[2][0, -1].numpy(), atol=1e-3)  # transformers': after the norm
    assert np.allclose(states[1, 0], tiny_torch.last_token_states([ids[:3]])[0, 0], atol=1e-5)  # padding is ignored


def test_torch_reads_prompts_with_a_shared_prefix_as_it_reads_them_alone(tiny_torch):
    tok = tiny_torch.tokenizer
    heads = "a shared beginning of every prompt here, long enough to be run once: "
    prompts = [tok.encode(heads + tail) for tail in ("one", "two two", "three three three")]
    together = tiny_torch.last_token_states(prompts)
    alone = np.stack([tiny_torch.last_token_states([p])[0] for p in prompts])
    assert np.allclose(together, alone, atol=1e-4)
    assert np.abs(together[0] - together[2]).max() > 1e-3


# --- training ----------------------------------------------------------------------------------------------------


def test_pca_and_mean_recover_a_planted_direction_with_the_positive_sign():
    rng = np.random.default_rng(0)
    n, layers, width = 24, 3, 32
    truth = rng.standard_normal(width)
    truth /= np.linalg.norm(truth)
    base = rng.standard_normal((n, layers, width))
    size = rng.uniform(2, 4, size=(n, 1))
    positive = base + 0.5 * size[:, :, None] * truth + 0.05 * rng.standard_normal((n, layers, width))
    negative = base - 0.5 * size[:, :, None] * truth + 0.05 * rng.standard_normal((n, layers, width))
    for method in ("pca", "mean"):
        d = directions_from_states(positive, negative, method)
        assert not d[0].any()
        for layer in (1, 2):
            assert d[layer] @ truth > 0.98  # the planted direction, pointing toward the positives
        flipped = directions_from_states(negative, positive, method)
        assert flipped[1] @ truth < -0.98
    with pytest.raises(SteeringError, match="unknown training method"):
        directions_from_states(positive, negative, "umap")


def test_training_on_llamacpp_separates_positives_from_negatives(tiny_cpp):
    pairs = PairSet("mine", pairs=tuple((f"yes yes yes {i}", f"no no no {i}") for i in range(6)))
    seen = []
    v = train_vector(tiny_cpp, pairs, progress=lambda done, total: seen.append((done, total)))
    assert (v.n_layer, v.n_embd, v.model_hint) == (LAYERS, 64, "llama") and v.layers() == (1, 2, 3)
    assert seen[-1] == (12, 12) and "6 pairs of mine" in v.source
    tok = tiny_cpp.tokenizer
    pos = tiny_cpp.last_token_states([tok.encode(p) for p, _ in pairs.pairs])
    neg = tiny_cpp.last_token_states([tok.encode(q) for _, q in pairs.pairs])
    for layer in v.layers():
        assert np.mean(pos[:, layer] @ v.directions[layer] > neg[:, layer] @ v.directions[layer]) > 0.5
    with pytest.raises(SteeringError, match="empty"):
        train_vector(tiny_cpp, PairSet("none"))
    from engine.errors import GenerationCancelled

    with pytest.raises(GenerationCancelled):
        train_vector(tiny_cpp, pairs, cancelled=lambda: True)


def test_builtin_pair_sets_use_the_chat_template(default_model_folder):
    from engine.tokenizer import Tokenizer

    tok = Tokenizer.from_folder(default_model_folder)
    sets = builtin_pair_sets()
    assert {"happy-sad", "formal-casual", "concise-verbose"} <= set(sets)
    happy = sets["happy-sad"].limited(32)
    assert len(happy) == 32
    pairs = happy.token_pairs(tok)
    pos_text, neg_text = tok.decode(pairs[0][0]), tok.decode(pairs[0][1])
    assert "extremely happy" in pos_text and "extremely sad" in neg_text and "<|im_start|>assistant" in pos_text
    assert pos_text.endswith("I") and neg_text.endswith("I")


# --- the Engine and the research API -----------------------------------------------------------------------


def test_engine_and_language_model_entry_points(tiny_torch):
    from engine.engine import Engine
    from engine.research.lm import LanguageModel

    shape = tiny_torch.residual_shape()
    s = Steering.of((random_vector(shape), 1.0))
    ids = tiny_torch.tokenizer.encode("the cat sat on the mat")
    lm = LanguageModel(tiny_torch)
    try:
        full = lm.steering_effect(ids, None, s)  # the next token after the ids, both whole distributions
        assert full.position == len(ids) and full.steered_logprobs is not None
        assert full.unsteered_logprobs is not None and full.unsteered_logprobs.shape == full.steered_logprobs.shape
    finally:
        lm._executor.shutdown()  # not lm.close(): the fixture closes the backend
    engine = Engine.from_backend(tiny_torch)
    try:
        assert engine.residual_shape() == shape
        effect = engine.steering_effect(ids, 3, s, top_k=4)
        assert effect.kl > 0 and effect.steered_logprobs is None and len(effect.unsteered_top) == 4
        shadow = engine.unsteered_shadow(ids, 2, s)
        assert len(shadow.kl) == len(ids) - 2
        vector = engine.train_steering_vector(PairSet("p", pairs=(("good good", "bad bad"), ("fine", "awful"))),
                                              name="v")
        assert vector.name == "v" and vector.n_layer == 2
        stats = engine.complete(GenerationRequest(prompt="hi", max_new_tokens=3, sampler=GREEDY, steering=s))
        assert stats.generated_tokens == 3
    finally:
        engine.close()


# --- the command line --------------------------------------------------------------------------------------------


def test_cli_trains_a_vector_and_generates_with_it(tmp_path, capsys):
    """`steer train` writes llama.cpp's control-vector GGUF; generate's llama.cpp flags steer the answer."""
    pytest.importorskip("llama_cpp")
    from cli_checks import run_cli

    from engine.steering import load_vector

    model = write_tiny_llama_gguf(tmp_path / "tiny.gguf", layers=LAYERS)
    pos, neg = tmp_path / "pos.txt", tmp_path / "neg.txt"
    pos.write_text("yes yes yes\nsure thing\nof course\n")
    neg.write_text("no no no\nnever ever\nnot at all\n")
    out = tmp_path / "yes.gguf"
    assert run_cli(["steer", "train", "-m", str(model), "-t", "1", "--positive-file", str(pos), "--negative-file", str(neg),
                    "--output", str(out), "--method", "mean"]) == 0
    assert "3 pairs, mean" in capsys.readouterr().err
    vector = load_vector(out)
    assert (vector.n_layer, vector.n_embd, vector.name) == (LAYERS, 64, "yes")

    def generate(*flags: str) -> str:
        assert run_cli(["generate", "-m", str(model), "-t", "1", "-p", "the cat", "-n", "8", "--temp", "0",
                        "--ignore-eos", *flags]) == 0
        return capsys.readouterr().out

    plain = generate()
    assert generate("--control-vector-scaled", str(out), "0") == plain
    steered = generate("--control-vector-scaled", f"{out}:40")
    assert steered != plain
    assert generate("--control-vector", str(out), "--control-vector", str(out), "--control-vector", str(out),
                    "--control-vector", str(out)) != plain


def test_loom_continuations_under_steering_are_the_steered_answers(tiny_cpp):
    """The loom's batch runner carries no control vector: a steered request's children ran unsteered, in
    silence. They now run one after another through the decode loop, each the steered answer of its seed."""
    from engine.loom.continuations import continuation_events, row_seeds

    shape = tiny_cpp.residual_shape()
    s = Steering.of((random_vector(shape, scale=0.5), 1.5))
    request = GenerationRequest(prompt="one two three four", sampler=SamplerSettings(temperature=1.0, seed=7),
                                max_new_tokens=8, steering=s)
    rows: dict[int, list[int]] = {}
    for row_event in continuation_events(tiny_cpp, request, 3):
        if isinstance(row_event.event, Done):
            rows[row_event.row] = list(row_event.event.stats.token_ids)
    for row, seed in enumerate(row_seeds(request, 3)):
        def answer(steering):
            req = GenerationRequest(prompt=request.prompt, sampler=request.sampler.with_(seed=seed),
                                    max_new_tokens=8, steering=steering)
            return list(list(generate_events(tiny_cpp, req))[-1].stats.token_ids)

        assert rows[row] == answer(s), row
        assert rows[row] != answer(None), row  # steering changes this answer: the check above means something
    with pytest.raises(ValueError, match="control vector"):
        list(continuation_events(tiny_cpp, request, 3, mode="beam"))
