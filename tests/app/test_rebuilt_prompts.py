"""Every place that rebuilds a conversation's prompt from its history does it as the chat does: earlier answers'
reasoning left out the way the model's template wants (`engine.reasoning`), and the Sampling panel's structured
output passed on (or, where the engine cannot apply it, said in words). The answers with reasoning are made here
(the mock model does not reason); runs go through the real window on the mock model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine import Constraint, GenerationStats, SamplerSettings, TokenEvent, TokenProb, reasoning

import app.controllers.experiment as experiment_controller
from app.actions.experiments import open_compare
from app.state.answer_recipe import recipe_for
from app.state.context_usage import ContextCounter
from app.state.conversation_list import Library
from app.state.loom_tree import export_tree
from qt_helpers import run_task

SECRET = " a long secret plan that the next prompt must not hold"
ANSWER = "<think>" + SECRET + "</think>The answer."


def _events(text: str) -> list[TokenEvent]:
    pieces = [text[i:i + 4] for i in range(0, len(text), 4)]
    out = []
    for i, piece in enumerate(pieces):
        alts = (TokenProb(i + 1, piece, -0.2, None),)
        out.append(TokenEvent(index=i, token_id=i + 1, text=piece, token_text=piece, logprob=-0.2,
                              sampler_logprob=-0.1, rank=0, entropy=0.7, top_model=alts, top_sampler=alts))
    return out


def _chat_with_reasoning(conv):
    """user → an answer that reasoned → a second question; returns the second question."""
    first = conv.add_message(None, "user", "plan it")
    answer = conv.add_message(first, "assistant")
    conv.set_tokens(answer, _events(ANSWER), ANSWER)
    conv.update_message(answer, finish_reason="eos")
    return conv.add_message(answer, "user", "and then?")


class _ChatTokenizer:
    """A template that renders every message whole (it drops no reasoning itself): one id per byte."""

    chat_template = ""
    template_override = None  # the chat-template facts every tokenizer has (engine.tokenizer.TokenizerLike)
    template_override_name = guessed_template = ""

    def chat_text(self, messages, add_generation_prompt: bool = False) -> str:
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def chat_ids(self, messages, add_generation_prompt: bool = False) -> list[int]:
        return list(self.chat_text(messages, add_generation_prompt).encode())

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode())

    def decode(self, ids) -> str:
        return bytes(ids).decode()


def test_the_context_count_leaves_earlier_reasoning_out_as_the_send_does(store):
    conv = Library(store).new()
    question = _chat_with_reasoning(conv)
    tok = _ChatTokenizer()
    sent = reasoning.prompt_history(conv.history(question), reasoning.prompt_format(tok))
    assert SECRET not in str(sent)  # what the chat sends (app/controllers/chat.py)
    used = ContextCounter().used(conv, tok)
    assert used == len(tok.chat_ids(sent, add_generation_prompt=True))


def test_the_loom_export_holds_the_prompt_the_answers_were_made_from(store):
    conv = Library(store).new()
    question = _chat_with_reasoning(conv)
    answer = conv.add_message(question, "assistant", request={"reasoning": reasoning.DEFAULT_FORMAT.to_dict()})
    conv.set_tokens(answer, _events("Next."), "Next.")
    conv.update_message(answer, finish_reason="eos")
    messages = export_tree(conv, answer)["messages"]
    assert [m["content"] for m in messages if m["role"] == "assistant"] == ["The answer."]
    # A template that drops reasoning itself gets the messages whole, as it got them.
    dropping = replace(reasoning.DEFAULT_FORMAT, template_drops=True)
    conv.update_message(answer, request={"reasoning": dropping.to_dict()})
    assert [m["content"] for m in export_tree(conv, answer)["messages"] if m["role"] == "assistant"] == [ANSWER]


@pytest.fixture
def requests(monkeypatch) -> list:
    """The requests the experiment runs hand to the engine."""
    seen: list = []

    class Spy(experiment_controller.TokenStream):
        def __init__(self, engine, request, *args, **kwargs):
            seen.append(request)
            super().__init__(engine, request, *args, **kwargs)

    monkeypatch.setattr(experiment_controller, "TokenStream", Spy)
    return seen


def test_compare_from_a_chat_leaves_reasoning_out_and_holds_the_constraint_through_replay(qtbot, window, requests, closing):
    conv = window.library.current
    _chat_with_reasoning(conv)
    constraint = Constraint.regex(r"(yes|no)\.")
    window.settings.set_options(replace(window.settings.options, constraint=constraint))
    view = open_compare(window.context)
    closing(view)
    assert "structured output (regular expression)" in view.prompt_note.text()
    view.max_tokens.setValue(4)
    run_task(qtbot, view.run())
    assert requests and all(r.constraint == constraint for r in requests)
    for r in requests:
        assert [m["content"] for m in r.messages if m["role"] == "assistant"] == ["The answer."]

    # (The mock model has no byte vocabulary for a grammar: the run fails in words; the request is what counts here.)

    # Taken into the chat, a column's answer saves its constraint and reasoning: a replay holds it to both.
    column = experiment_controller.ColumnResult(
        SamplerSettings(seed=3), 4, (), events=_events("yes."), constraint=constraint,
        stats=GenerationStats("eos", 20, 0, 2, 0.1, 10.0, 0.2, 0, 3, "yes.", (1, 2)),
        reasoning_format=reasoning.DEFAULT_FORMAT)
    window.settings.set_options(replace(window.settings.options, constraint=None))  # the panel's no longer counts
    (conv, _question), answer = view._experiments.take_into_chat(column, view._anchor, "")
    assert Constraint.from_dict(answer.request["constraint"]) == constraint
    recipe = recipe_for(conv, answer)
    assert recipe.constraint == constraint and recipe.request().constraint == constraint
    assert [m["content"] for m in recipe.messages if m["role"] == "assistant"] == ["The answer."]


@pytest.mark.slow
def test_the_loom_leaves_reasoning_out_and_holds_each_child_to_the_constraint(qtbot, window, monkeypatch):
    import app.controllers.loom as loom_controller

    seen: list = []
    real = loom_controller.loom.continuation_events

    def spy(backend, request, *args, **kwargs):
        seen.append(request)
        # The mock model has no byte vocabulary for a matcher: it runs the children unconstrained here.
        return real(backend, replace(request, constraint=None), *args, **kwargs)

    monkeypatch.setattr(loom_controller.loom, "continuation_events", spy)
    conv = window.library.current
    question = _chat_with_reasoning(conv)
    answer = conv.add_message(question, "assistant")
    conv.set_tokens(answer, _events("Then more."), "Then more.")
    conv.update_message(answer, finish_reason="eos")
    constraint = Constraint.regex(r"(yes|no)\.")
    window.settings.set_options(replace(window.settings.options, constraint=constraint))
    children = run_task(qtbot, window.loom_view.continuations_at(answer, 1))
    assert children and seen
    (request,) = seen
    assert [m["content"] for m in request.messages if m["role"] == "assistant"] == ["The answer."]
    # The engine holds each child to it (tests/engine/test_continuations.py); the children's documents record it,
    # so a replay holds them to it too.
    assert request.constraint == constraint
    assert all(Constraint.from_dict(c.request["constraint"]) == constraint for c in children)


def test_the_notebook_passes_the_constraint_on_and_saves_it_with_the_part(qtbot, window, monkeypatch):
    from qt_helpers import answered

    seen: list = []
    engine = window.host.engine
    submit = engine.submit

    def spy(request, on_event, **kwargs):  # the loaded engine, remembering each request it is given
        seen.append(request)
        return submit(request, on_event, **kwargs)

    monkeypatch.setattr(engine, "submit", spy)
    constraint = Constraint.regex(r"(yes|no)\.")
    window.settings.set_options(replace(window.settings.options, constraint=constraint))
    window.new_notebook()
    window.notebook.editor.setPlainText("Is the sky blue?")
    window.notebook.generate_button.click()
    qtbot.waitUntil(lambda: bool(seen) and answered(window), timeout=15000)
    (request,) = seen
    assert request.prompt == "Is the sky blue?" and request.constraint == constraint
    part = window.library.current.path()[-1]
    assert Constraint.from_dict(part.request["constraint"]) == constraint  # so a replay holds it too
