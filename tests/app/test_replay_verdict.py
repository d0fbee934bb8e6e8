"""Replay says whether an answer repeated and which recorded facts differ (issue 35 item 4), through the experiment
controller as the Replay window runs it, on the default model (llama.cpp); the answer's fingerprint is saved with it."""

from __future__ import annotations

import asyncio

import pytest

from engine import experiments
from engine.fingerprints.record import Fingerprint

from app.controllers.chat import ChatController
from app.controllers.engine_host import EngineHost
from app.controllers.experiment import ExperimentController
from app.state.answer_recipe import recipe_for
from app.state.conversation_list import Library
from app.state.settings import SettingsState
from app.state.database.store import Store


@pytest.fixture(scope="module")
def llamacpp_host():
    pytest.importorskip("llama_cpp")
    host = EngineHost()

    async def load() -> bool:
        return await host.load(None, "llamacpp")

    assert asyncio.run(load()), host.last_error
    yield host
    host.close()


@pytest.mark.slow
@pytest.mark.model
def test_an_answer_saves_its_fingerprint_and_replay_says_identical_then_diverged(llamacpp_host, store, db_path):
    library, settings = Library(store), SettingsState(store)
    settings.update_sampler(seed=5, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0)
    settings.set_max_new_tokens(16)
    answer = asyncio.run(ChatController(library, settings, llamacpp_host).send("Name three colours."))
    conv = library.current
    fp = Fingerprint.from_dict(answer.stats["fingerprint"])
    assert fp.backend == "llamacpp" and fp.seed == 5 and len(fp.model_sha256) == 64
    assert dict(fp.numerics)["n_threads"] >= 1
    reopened = Store(db_path)  # saved with the message: another connection reads it back
    try:
        again = Library(reopened).open(conv.id).messages[answer.id]
        assert Fingerprint.from_dict(again.stats["fingerprint"]) == fp
    finally:
        reopened.close()

    controller = ExperimentController(llamacpp_host)

    async def replay(sampler=None):
        run = controller.replay(conv, answer, sampler)
        await run.task
        return run

    same = asyncio.run(replay())
    assert same.error is None and same.verdict is not None
    assert same.verdict.kind == "identical" and same.verdict.max_logprob_diff == 0.0
    # Nothing that decides the numbers changed, unless the free cores did between the answer and its replay
    # (llama.cpp's threads are chosen per answer; its CPU floats are the same either way, hence 'identical').
    assert all(c.startswith(("n_threads ", "n_threads_batch ")) for c in same.verdict.fingerprint_changes)
    if same.verdict.fingerprint_changes:
        assert same.verdict.describe().startswith("identical; fingerprint differs: n_threads")
    else:
        assert same.verdict.describe() == "identical; fingerprint: no recorded difference"

    changed = asyncio.run(replay(recipe_for(conv, answer).sampler.with_(top_k=1)))
    v = changed.verdict
    assert v.kind == "diverged" and v.diverged_at == changed.diff.first_divergence
    assert "sampler.top_k 0 -> 1" in v.fingerprint_changes
    assert v.headline().startswith(f"diverged at token {v.diverged_at + 1} (")


@pytest.mark.slow
@pytest.mark.model
def test_an_old_answer_without_a_fingerprint_replays_and_says_so(llamacpp_host, store):
    library, settings = Library(store), SettingsState(store)
    settings.update_sampler(seed=9, temperature=0.8)
    settings.set_max_new_tokens(8)
    answer = asyncio.run(ChatController(library, settings, llamacpp_host).send("Say hi."))
    conv = library.current
    conv.update_message(answer, stats={k: v for k, v in answer.stats.items() if k != "fingerprint"})  # as before
    controller = ExperimentController(llamacpp_host)

    async def replay():
        run = controller.replay(conv, answer)
        await run.task
        return run

    run = asyncio.run(replay())
    assert run.verdict.kind == "identical" and run.verdict.fingerprint_changes is None
    assert run.verdict.fingerprint_text() == "fingerprint: not recorded for both runs"
    assert experiments.fingerprint_of(answer.stats) is None
