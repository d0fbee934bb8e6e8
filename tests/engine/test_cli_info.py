"""`logitlab-cli info` names the chat template a model's chats use, or says it has none (issue 37 item 16)."""

from __future__ import annotations

import pytest

from engine.templates.choice import BUILTIN_TEMPLATES
from engine.cli.info import chat_template_line


class Tok:
    def __init__(self, template: str = "", override: str | None = None, override_name: str = ""):
        self.chat_template = template
        self.has_chat_template = bool(template)
        self.template_override = override
        self.template_override_name = override_name
        self.guessed_template = ""  # the chat-template facts every tokenizer has (engine.tokenizer.TokenizerLike)


def test_the_models_own_template_is_named_by_its_family():
    line = chat_template_line(Tok(BUILTIN_TEMPLATES["chatml"].text))
    assert line.startswith("chat template:  the model's own (ChatML, ") and "characters" in line
    assert "Gemma" in chat_template_line(Tok(BUILTIN_TEMPLATES["gemma"].text))


def test_a_model_without_a_template_says_so():
    line = chat_template_line(Tok(""))
    assert "none: the model has no chat template" in line and "--chat-template" in line


def test_a_chosen_template_is_named():
    assert "Llama 3 (built-in)" in chat_template_line(Tok("", BUILTIN_TEMPLATES["llama3"].text, "llama3")) or \
        "(built-in)" in chat_template_line(Tok("", BUILTIN_TEMPLATES["llama3"].text, "llama3"))
    assert "custom Jinja template" in chat_template_line(Tok("x", "{{ messages }}", ""))


@pytest.mark.model
def test_info_prints_the_default_models_template(capsys):
    pytest.importorskip("llama_cpp")
    from engine import cli

    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "chat template:  the model's own (ChatML" in out
