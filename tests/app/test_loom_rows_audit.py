"""The loom's Audit rows (issue 35 item 4): the loom's batched children rerun one by one as single answers, on
the default model (llama.cpp, CPU): every row's log-probs must come out exactly the same (0, not "small")."""

from __future__ import annotations

import asyncio

import pytest

from engine.fingerprints.record import Fingerprint

from app.controllers.chat import ChatController
from app.controllers.engine_host import EngineHost
from app.controllers.loom_audit import audit_question, loom_children
from app.controllers.loom import LoomController
from app.state.conversation_list import Library
from app.state.settings import SettingsState


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
def test_audit_of_the_loom_rows_on_llamacpp_reports_exactly_zero(llamacpp_host, store):
    library, settings = Library(store), SettingsState(store)
    settings.update_sampler(temperature=0.9, top_k=40, seed=21)
    settings.set_max_new_tokens(10)
    loom = LoomController(ChatController(library, settings, llamacpp_host))

    async def go():
        answer = await loom.chat.send("Write one sentence about the sea.")
        children = await loom.continuations(answer, 2, 4, max_new_tokens=8)
        audit = await audit_question(llamacpp_host, library.current, answer)
        return answer, children, audit

    answer, children, audit = asyncio.run(go())
    conv = library.current
    assert loom_children(conv, answer) == children  # the chat's own answer is no loom row
    fp = Fingerprint.from_dict(children[0].stats["fingerprint"])  # a loom row carries its fingerprint too
    assert dict(fp.extras)["loom_rows"] == 4 and fp.seed == children[0].stats["seed"]
    assert [r.seed for r in audit.rows] == [c.stats["seed"] for c in children]
    assert audit.max_logprob_diff == 0.0 and audit.all_identical, audit.lines()
    assert all(r.verdict.tokens == len(conv.tokens(c)) - 2 for r, c in zip(audit.rows, children))
    for r in audit.rows:
        # the rerun is a single answer, not a row of four; the thread count follows the free cores per answer
        # (engine/backends/llamacpp/threads.py), so on a busy machine it may differ too, and the audit says so
        changes = set(r.verdict.fingerprint_changes)
        batched = "decoded as one of 4 rows of a batch -> alone"
        assert batched in changes
        assert all(c.startswith(("n_threads ", "n_threads_batch ")) for c in changes - {batched})
    assert audit.lines()[-1] == "4 rows; largest |Δ log-prob| 0; every row identical"


@pytest.mark.slow
@pytest.mark.model
def test_audit_without_loom_rows_says_what_to_do(llamacpp_host, store):
    library, settings = Library(store), SettingsState(store)
    settings.set_max_new_tokens(4)
    answer = asyncio.run(ChatController(library, settings, llamacpp_host).send("Hi."))
    with pytest.raises(ValueError, match="Continue ×N"):
        asyncio.run(audit_question(llamacpp_host, library.current, answer))
