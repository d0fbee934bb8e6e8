"""The experiment controller without a window: compare, replay (and its refusal on another model), score.

Qt-free: plain `asyncio.run`, a real store, the real default model (SmolLM2-135M-Instruct on llama.cpp),
and for "another model" a tiny random-weight Llama built by the session fixture.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from pathlib import Path

import pytest

from engine import SamplerSettings, experiments

from app.controllers.chat import ChatController
from app.controllers.engine_host import EngineHost
from app.controllers.experiment import ExperimentController
from app.state.answer_recipe import recipe_for
from app.state.conversation_list import Library
from app.state.settings import SettingsState


@pytest.fixture(scope="module")
def default_host():
    """The default model on llama.cpp, loaded once for the module (the engine lives on its own thread)."""
    pytest.importorskip("llama_cpp")
    host = EngineHost()

    assert _load(host, None, "llamacpp"), host.last_error
    yield host
    host.close()


def _load(host: EngineHost, spec: str | None, backend: str) -> bool:
    async def load() -> bool:
        return await host.load(spec, backend)

    return asyncio.run(load())


def test_the_controller_loads_no_qt():
    """In a fresh interpreter (this one has Qt from the window tests' fixtures): no Qt module comes with it."""
    code = "import sys, app.controllers.experiment; print(sorted(m for m in sys.modules if 'PySide' in m or 'qasync' in m))"
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.model
def test_compare_same_seed_columns_agree_until_the_settings_part_them(default_host, store):
    controller = ExperimentController(default_host, Library(store))
    base = SettingsState(store).options.sampler.with_(temperature=0.0, seed=11)
    hot = base.with_(temperature=2.5, top_k=0, top_p=1.0, min_p=0.0)
    messages = ({"role": "user", "content": "Write one sentence about the sea."},)
    started: list[int] = []
    streamed: dict[int, int] = {}

    async def go():
        run = controller.compare(messages, [base, base, hot], max_new_tokens=16)
        run.column_started.connect(started.append)
        run.tokens.connect(lambda i, batch: streamed.__setitem__(i, streamed.get(i, 0) + len(batch)))
        assert controller.runs == {run}
        await run.task
        return run

    run = asyncio.run(go())
    assert run.error is None and not run.running and not controller.runs
    a, b, c = run.columns
    assert started == [0, 1, 2] and streamed == {i: len(col.events) for i, col in enumerate(run.columns)}
    assert a.token_ids and a.token_ids == b.token_ids  # the same settings and seed: the same tokens
    assert b.stats.prefilled_tokens == 1  # the prompt came from the KV cache: only its last token ran again
    assert run.divergence is not None and run.divergence == experiments.first_divergence([a.token_ids, c.token_ids])
    assert c.token_ids[: run.divergence] == a.token_ids[: run.divergence]
    assert c.summary.length == len(c.events) and c.model["name"] == "SmolLM2-135M-Instruct"

    (conv, user), answer = controller.take_into_chat(c, None, "Write one sentence about the sea.")
    assert user.content == "Write one sentence about the sea." and answer.parent_id == user.id
    assert [t.token_id for t in conv.tokens(answer)] == c.token_ids
    assert answer.request["sampler"]["temperature"] == 2.5 and answer.stats["seed"] == 11
    assert answer.model["backend"] == "llamacpp"


def _answer(host: EngineHost, store, text: str, **sampler):
    """An answer made by the chat controller on `host`'s model, as the window makes them."""
    library, settings = Library(store), SettingsState(store)
    settings.update_sampler(**sampler)
    settings.set_max_new_tokens(16)
    chat = ChatController(library, settings, host)
    answer = asyncio.run(chat.send(text))
    assert answer.finish_reason not in (None, "error", "cancelled"), answer.stats
    return library.current, answer


@pytest.mark.slow
@pytest.mark.model
def test_replay_reproduces_an_answer_and_a_change_shows_where_it_mattered(default_host, store):
    conv, answer = _answer(default_host, store, "Name three colours.", seed=5, temperature=1.0, top_k=0, top_p=1.0,
                           min_p=0.0, repetition_penalty=1.0)
    original = [t.token_id for t in conv.tokens(answer)]
    controller = ExperimentController(default_host)

    async def replay(settings=None):
        run = controller.replay(conv, answer, settings)
        await run.task
        return run

    same = asyncio.run(replay())
    assert same.error is None and same.result.token_ids == original and same.diff.identical
    assert same.changed == {}

    greedy = recipe_for(conv, answer).sampler.with_(top_k=1)
    changed = asyncio.run(replay(greedy))
    assert changed.changed == {"top_k": (0, 1)} and changed.result.settings.seed == 5
    assert all(t.rank == 0 for t in changed.result.events if not t.special)  # top-k 1 keeps the model's first choice
    d = changed.diff  # at temperature 1 the seed's draws did not all land on the top token: they part somewhere
    assert not d.identical and original[: d.first_divergence] == changed.result.token_ids[: d.first_divergence]
    assert original[d.first_divergence] != changed.result.token_ids[d.first_divergence]

    kept = controller.keep_replay(changed, conv, answer)
    assert kept.parent_id == answer.parent_id and [t.token_id for t in conv.tokens(kept)] == changed.result.token_ids
    assert kept.request["sampler"]["top_k"] == 1 and kept.model["name"] == "SmolLM2-135M-Instruct"


@pytest.mark.slow
@pytest.mark.model
def test_replay_on_another_model_is_refused_naming_the_model_that_made_the_answer(
        default_host, store, tiny_llama_folder):
    conv, answer = _answer(default_host, store, "Say hello.", seed=9)
    original = [t.token_id for t in conv.tokens(answer)]
    controller = ExperimentController(default_host)
    recipe = recipe_for(conv, answer)
    assert controller.model_mismatch(recipe) is None

    async def load_tiny_and_replay():
        assert await default_host.load(str(tiny_llama_folder), "torch"), default_host.last_error
        assert default_host.info.name == tiny_llama_folder.name
        reason = controller.model_mismatch(recipe)
        run = controller.replay(conv, answer)
        await run.task
        return reason, run

    try:
        reason, run = asyncio.run(load_tiny_and_replay())
        # Refused before any token: the message names the answer's model and the loaded one.
        assert run.error == reason and "SmolLM2-135M-Instruct (llamacpp" in reason and f"{tiny_llama_folder.name} (torch" in reason
        assert "Load SmolLM2-135M-Instruct" in reason
        assert run.other_model == answer.model and run.result.events == [] and run.diff is None

        async def load_back_and_replay():
            await controller.load_model_of(recipe)
            again = controller.replay(conv, answer)
            await again.task
            return again

        again = asyncio.run(load_back_and_replay())
        assert default_host.info.name == "SmolLM2-135M-Instruct" and default_host.info.backend == "llamacpp"
        assert again.error is None and again.diff.identical and again.result.token_ids == original
    finally:
        if default_host.info.backend != "llamacpp":  # leave the module's host as it found it
            _load(default_host, None, "llamacpp")


@pytest.mark.model
def test_an_answer_cannot_be_loaded_back_when_it_never_said_which_model_made_it(default_host, store):
    conv, answer = _answer(default_host, store, "Hi.", seed=1)
    conv.update_message(answer, model=None)  # answers saved before models were recorded
    recipe = recipe_for(conv, answer)
    controller = ExperimentController(default_host)
    assert controller.model_mismatch(recipe) is None  # nothing to compare against: replay on what is loaded
    with pytest.raises(ValueError, match="does not record which model"):
        asyncio.run(controller.load_model_of(recipe))


@pytest.mark.model
def test_score_reads_text_on_the_worker_thread_and_stops_when_asked(default_host):
    controller = ExperimentController(default_host)
    text = "The quick brown fox jumps over the lazy dog."

    async def score(stop_at_once: bool = False):
        run = controller.score(text)
        if stop_at_once:
            run.cancel()
        await run.task
        return run

    run = asyncio.run(score())
    result = run.result
    assert run.error is None and len(result.tokens) == len(result.token_ids) - result.context >= 8
    assert math.isfinite(result.perplexity) and result.perplexity > 1
    assert text.startswith(run.context_text) and run.context_text  # the first token only serves as context

    stopped = asyncio.run(score(stop_at_once=True))
    assert stopped.error is None and len(stopped.result.tokens) < len(result.tokens)

    with pytest.raises(ValueError, match="first"):
        controller.score("   ")


@pytest.mark.model
def test_stop_all_stops_every_run_under_way(default_host):
    controller = ExperimentController(default_host)
    messages = ({"role": "user", "content": "Count from one to a hundred."},)

    async def go():
        run = controller.compare(messages, [SamplerSettings(seed=1), SamplerSettings(seed=1)], max_new_tokens=400)
        while not run.columns[0].events:
            await asyncio.sleep(0.01)
        controller.stop_all()
        await run.task
        return run

    run = asyncio.run(go())
    first, second = run.columns
    assert first.stats.finish_reason == "cancelled" and len(first.events) < 400
    assert second.stats is None  # stopped runs start no further column
