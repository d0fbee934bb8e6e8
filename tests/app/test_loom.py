"""The loom: N continuations, auto-expand and step mode through the Qt-free controller on the default model;
the tree, its persistence and its JSON; the Loom panel in the real window on the mock model."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from engine import TokenEvent, TokenProb

from app.controllers.chat import ChatController
from app.controllers.engine_host import EngineHost
from app.controllers.loom import ExpandSettings, LoomController
from app.state.conversation_list import Library
from app.state.loom_tree import LoomImportError, answer_group, build_tree, export_tree, import_tree
from app.state.settings import SettingsState
from app.state.database.store import Store
from qt_helpers import send

QUESTION = "Write one sentence about the sea."


@pytest.fixture(scope="module")
def default_host():
    """The default model on llama.cpp, loaded once for the module."""
    pytest.importorskip("llama_cpp")
    host = EngineHost()

    async def load() -> bool:
        return await host.load(None, "llamacpp")

    assert asyncio.run(load()), host.last_error
    yield host
    host.close()


def _loom(host, store, **sampler) -> tuple[LoomController, Library]:
    library, settings = Library(store), SettingsState(store)
    settings.update_sampler(**{"temperature": 0.9, "top_k": 40, "seed": 21, **sampler})
    settings.set_max_new_tokens(12)
    return LoomController(ChatController(library, settings, host)), library


def test_the_loom_controller_loads_no_qt():
    code = "import sys, app.controllers.loom, app.state.loom_tree; print(sorted(m for m in sys.modules if 'PySide' in m))"
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.model
def test_n_continuations_are_siblings_in_the_tree_and_survive_a_restart(default_host, store, db_path):
    # The settings this tree was drawn under before the defaults became llama.cpp's (no repetition penalty):
    # with the penalty the four seeds part at the first free token, which the assertions below rely on.
    loom, library = _loom(default_host, store, repetition_penalty=1.1)

    async def go():
        answer = await loom.chat.send(QUESTION)
        children = await loom.continuations(answer, 3, 4, max_new_tokens=6)
        return answer, children

    answer, children = asyncio.run(go())
    conv = library.current
    original = conv.tokens(answer)
    assert len(children) == 4 and not loom.busy
    assert conv.path()[-1] is answer  # the answer the user looked at stays on screen
    seeds = [c.stats["seed"] for c in children]
    assert seeds == [seeds[0] + r for r in range(4)]  # each child its own seed
    for row, child in enumerate(children):
        tokens = conv.tokens(child)
        assert [t.token_id for t in tokens[:3]] == [t.token_id for t in original[:3]]  # the kept prefix
        assert 3 < len(tokens) <= 9 and [t.index for t in tokens] == list(range(len(tokens)))
        assert child.branch_index == 3 and child.request["loom"] == {"mode": "sample", "n": 4, "row": row}
        assert child.finish_reason in ("length", "eos", "stop")

    # The tree, from a database opened afresh: one node for the shared 3 tokens, forking into the branches.
    conv_id = conv.id
    store.close()
    reopened = Library(Store(db_path)).open(conv_id)
    question, answers = answer_group(reopened, reopened.messages[answer.id])
    root = build_tree(reopened, answers)
    (trunk,) = root.children
    assert trunk.end == 3 and trunk.is_fork and len(trunk.message_ids) == 5
    firsts = {}
    for m in answers:
        ev = reopened.tokens(m)[3]
        firsts[ev.token_id] = ev.prob
    assert len(trunk.children) == len(firsts)  # children that drew the same token share a node
    assert trunk.unexplored_mass == pytest.approx(max(0.0, 1 - sum(firsts.values())))
    leaf = next(n for n in root.walk() if answer.id in n.ends)
    assert leaf.path_logprob == pytest.approx(sum(t.logprob for t in reopened.tokens(reopened.messages[answer.id])))

    # Export and import: the same tree in a new conversation, with each answer's seed and settings.
    doc = json.loads(json.dumps(export_tree(reopened, reopened.messages[answer.id])))
    assert {a["seed"] for a in doc["answers"]} >= set(seeds)
    fresh = Library(Store(":memory:"))
    conv2, question2 = import_tree(fresh, doc)
    answers2 = [m for m in conv2.children(question2.id)]
    assert question2.content == QUESTION
    root2 = build_tree(conv2, answers2)
    shape = lambda n: (tuple(t.token_id for t in n.tokens), round(n.path_logprob, 4), [shape(c) for c in n.children])  # noqa: E731
    assert shape(root2) == shape(root)
    assert [a.stats["seed"] for a in answers2] == [a.stats["seed"] for a in answers]
    with pytest.raises(LoomImportError, match="not a Logit Lab loom tree"):
        import_tree(fresh, {"answers": []})


def test_beam_children_are_the_likeliest_continuations_marked_forced(default_host, store):
    loom, library = _loom(default_host, store)

    async def go():
        answer = await loom.chat.send(QUESTION)
        return answer, await loom.continuations(answer, 2, 3, mode="beam", max_new_tokens=5)

    answer, children = asyncio.run(go())
    conv = library.current
    assert len(children) == 3 and [c.request["loom"]["mode"] for c in children] == ["beam"] * 3
    means = []
    for child in children:
        new = conv.tokens(child)[2:]
        assert new and all(t.forced for t in new)  # chosen by the search, and the record says so
        means.append(sum(t.logprob for t in new) / len(new))
    assert means == sorted(means, reverse=True)  # best first
    assert len({tuple(t.token_id for t in conv.tokens(c)) for c in children}) == 3


@pytest.mark.slow
@pytest.mark.model
def test_auto_expand_opens_forks_within_its_budget_and_stops(default_host, store):
    loom, library = _loom(default_host, store)
    progress: list[tuple[int, int]] = []
    loom.progress.connect(lambda done, total: progress.append((done, total)))
    how = ExpandSettings(entropy=0.5, depth=2, budget=40, children=2, tokens=5)

    async def go():
        answer = await loom.chat.send(QUESTION)
        return answer, await loom.auto_expand(answer, 0, how)

    answer, made = asyncio.run(go())
    conv = library.current
    assert made and len(made) % 2 == 0
    new_tokens = sum(len(conv.tokens(c)) - c.branch_index for c in made)
    assert new_tokens <= how.budget
    assert progress[0] == (0, 40) and progress[-1][0] == min(new_tokens, 40)
    for c in made:  # every fork it opened was one the settings open: entropy at least the threshold there
        assert conv.tokens(c)[c.branch_index].entropy >= how.entropy

    # Stop at once: the run ends before a second fork.
    async def stopped():
        task = asyncio.ensure_future(loom.auto_expand(answer, 0, ExpandSettings(entropy=0.0, budget=400, children=2, tokens=5)))
        while not loom.busy:
            await asyncio.sleep(0)
        loom.stop()
        return await task

    assert len(asyncio.run(stopped())) <= 2


def _event(entropy: float, probs: list[float]) -> TokenEvent:
    top = tuple(TokenProb(i, f"t{i}", math.log(p)) for i, p in enumerate(probs))
    return TokenEvent(0, 0, "t0", "t0", top[0].logprob, top[0].logprob, 0, entropy, top, top)


def test_auto_expand_opens_forks_by_entropy_or_by_min_p():
    by_entropy = ExpandSettings(entropy=1.0)
    assert by_entropy.opens(_event(1.2, [0.9, 0.05])) and not by_entropy.opens(_event(0.8, [0.5, 0.4]))
    by_min_p = ExpandSettings(min_p=0.5)  # the entropy no longer matters: two alternatives at half the best's
    assert by_min_p.opens(_event(0.1, [0.5, 0.3, 0.2])) and not by_min_p.opens(_event(3.0, [0.6, 0.25, 0.15]))


def test_expand_settings_refuse_what_cannot_run():
    with pytest.raises(ValueError, match="from 2 to 16"):
        ExpandSettings(children=1)
    with pytest.raises(ValueError, match="min-p must be in"):
        ExpandSettings(min_p=1.5)


@pytest.mark.model
def test_step_mode_waits_for_the_pick_then_goes_on_when_left(default_host, store):
    loom, library = _loom(default_host, store)
    shown = []
    loom.step_waiting.connect(shown.append)
    loom.set_stepping(True)

    async def go():
        task = asyncio.ensure_future(loom.chat.send(QUESTION))
        while len(shown) < 1:
            await asyncio.sleep(0.01)
        first = shown[0]
        await asyncio.sleep(0.2)
        assert len(shown) == 1 and not task.done()  # it waits for the user
        loom.pick(first.top_model[2].token_id)  # the third most likely
        while len(shown) < 2:
            await asyncio.sleep(0.01)
        loom.pick(None)  # Enter: the sampler's own pick
        while len(shown) < 3:
            await asyncio.sleep(0.01)
        loom.set_stepping(False)  # leave step mode: the model goes on by itself
        return first, await asyncio.wait_for(task, 60)

    first, answer = asyncio.run(go())
    tokens = library.current.tokens(answer)
    assert tokens[0].token_id == first.top_model[2].token_id and tokens[0].forced and tokens[0].rank == 2
    assert tokens[1].token_id == shown[1].token_id and not tokens[1].forced
    assert len(tokens) == 12 or answer.finish_reason == "eos"


# -- the window (mock model) ---------------------------------------------------------------------


def test_loom_panel_continues_from_a_token_opens_nodes_and_steps_by_keyboard(qtbot, window):
    send(qtbot, window, "hello there")
    conv = window.library.current
    answer = conv.path()[-1]
    view = window.loom_view
    window.loom_dock.raise_()
    window.selection.set(answer.id, 2)
    view.n_spin.setValue(3)
    view.tokens_spin.setValue(4)
    window.inspector.continue_button.click()  # the inspector's "N continuations here"
    qtbot.waitUntil(lambda: len(conv.children(answer.parent_id)) == 4 and not window.loom.busy, timeout=15000)
    view.rebuild()
    rows = view.items()
    assert rows[0].text(0) == "4 answers"
    fork = next(r for r in rows if r.data(0, Qt.ItemDataRole.UserRole).is_fork)
    # The children branch at token 2; they may share a few tokens after it (unseeded draws from a peaked mock).
    assert fork.data(0, Qt.ItemDataRole.UserRole).end >= 2 and fork.text(2).endswith("%")
    assert fork.background(0).color().isValid()

    # Keyboard: down to a leaf that is not the answer shown, Enter opens it in the chat.
    view.tree.setFocus()
    view.tree.setCurrentItem(fork)
    target = None
    for _ in range(len(rows)):
        qtbot.keyClick(view.tree, Qt.Key.Key_Down)
        node = view.current_node()
        if node is not None and not node.children and answer.id not in node.message_ids:
            target = node
            break
    assert target is not None
    qtbot.keyClick(view.tree, Qt.Key.Key_Return)
    shown = conv.path()[-1]
    assert shown.id in target.message_ids and window.selection.message_id == shown.id
    assert window.selection.index == target.start

    # Step mode: the answer waits; "2" takes the second most likely token; unticking lets it go on.
    view.step_panel.toggle.setChecked(True)
    window.on_regenerate(shown)
    qtbot.waitUntil(lambda: view.step_panel.waiting is not None, timeout=15000)
    preview = view.step_panel.waiting
    qtbot.keyClick(view.step_panel.choices, Qt.Key.Key_2)
    qtbot.waitUntil(lambda: view.step_panel.waiting is not None and view.step_panel.waiting.index == 1, timeout=15000)
    view.step_panel.toggle.setChecked(False)
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=15000)
    newest = conv.path()[-1]
    assert conv.tokens(newest)[0].token_id == preview.top_model[1].token_id

    # Stop while a distribution waits: the answer ends as stopped, and the panel's list goes away.
    view.step_panel.toggle.setChecked(True)
    window.on_regenerate(newest)
    qtbot.waitUntil(lambda: view.step_panel.waiting is not None, timeout=15000)
    window.controller.stop()
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=15000)
    assert conv.path()[-1].finish_reason == "cancelled" and not conv.tokens(conv.path()[-1])
    assert view.step_panel.waiting is None and view.step_panel.choices.count() == 0


def test_loom_export_import_in_the_window(qtbot, window, tmp_path):
    send(qtbot, window, "hello there")
    path = tmp_path / "tree.json"
    window.loom_view.export_to(path)
    before = len(window.library.summaries())
    window.loom_view.import_from(path)
    assert len(window.library.summaries()) == before + 1
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="cannot be read as JSON"):
        window.loom_view.import_from(bad)
