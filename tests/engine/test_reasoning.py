"""Reasoning (`<think>…</think>`): split from the answer, and kept out of the next prompt as the template wants.

The models are tiny GGUF files written in the test (tests/tiny_gguf.py) with
three kinds of template: one that drops earlier reasoning itself (as Qwen3's
does), one that does not (ChatML), one whose generation prompt opens the
reasoning (as DeepSeek-R1's does); and one whose vocabulary holds its own
markers as special tokens. The prompt text is what llama.cpp's tokenizer
renders from the messages we pass.
"""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")

from tiny_gguf import CHAT_TEMPLATE, write_tiny_llama_gguf  # noqa: E402

from engine.backends.llamacpp import LlamaCppBackend  # noqa: E402
from engine.chat import ChatSession  # noqa: E402
from engine.reasoning import (  # noqa: E402
    THINK,
    Markers,
    ReasoningFormat,
    content_token,
    prompt_format,
    prompt_history,
    split_reasoning,
)

# Qwen3's way (its template, reduced to the part that matters): an earlier answer keeps only what follows </think>.
DROPS_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{%- set content = message.content %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# DeepSeek-R1's way: the same, and the generation prompt opens the reasoning.
OPENS_TEMPLATE = DROPS_TEMPLATE.replace("{{- '<|im_start|>assistant\\n' }}{%- endif %}",
                                        "{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}")
SECRET = "the user seems to want a greeting"
ANSWER = f"<think>\n{SECRET}\n</think>\n\nHello there."


def _backend(tmp_path, name: str, **kw) -> LlamaCppBackend:
    path = write_tiny_llama_gguf(tmp_path / f"{name}.gguf", **kw)
    return LlamaCppBackend(path, spec=str(path), display_name=name)


@pytest.fixture
def models(tmp_path):
    made = {
        "drops": _backend(tmp_path, "drops", chat_template=DROPS_TEMPLATE),
        "chatml": _backend(tmp_path, "chatml", chat_template=CHAT_TEMPLATE),
        "opens": _backend(tmp_path, "opens", chat_template=OPENS_TEMPLATE),
        "own": _backend(tmp_path, "own", chat_template=CHAT_TEMPLATE, extra_specials=("[THINK]", "[/THINK]")),
    }
    yield made
    for backend in made.values():
        backend.close()


def _next_prompt(tokenizer, fmt: ReasoningFormat, answer: str = ANSWER) -> str:
    session = ChatSession(reasoning=fmt)
    session.add_turn("Hi", answer)
    return tokenizer.chat_text(session.request("Again").messages)


def test_each_template_is_read_from_what_it_renders(models):
    drops = prompt_format(models["drops"].tokenizer)
    assert drops.template_drops and not drops.starts_inside and drops.markers[0] == THINK and drops.from_model

    chatml = prompt_format(models["chatml"].tokenizer)
    assert not chatml.template_drops and not chatml.starts_inside and not chatml.from_model

    opens = prompt_format(models["opens"].tokenizer)
    assert opens.starts_inside and opens.template_drops

    own = prompt_format(models["own"].tokenizer)  # named by the vocabulary only: special tokens
    assert own.markers[0] == Markers("[THINK]", "[/THINK]") and own.from_model and THINK in own.markers


def test_reasoning_stays_out_of_the_next_prompt_whoever_drops_it(models):
    for name in ("drops", "chatml", "opens"):
        tok = models[name].tokenizer
        fmt = prompt_format(tok)
        prompt = _next_prompt(tok, fmt)
        assert SECRET not in prompt and "Hello there." in prompt, name
    # The template that drops it gets the answer as written (it decides); ChatML gets it without the thoughts.
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ANSWER}]
    assert prompt_history(history, prompt_format(models["drops"].tokenizer))[1]["content"] == ANSWER
    assert prompt_history(history, prompt_format(models["chatml"].tokenizer))[1]["content"] == "Hello there."
    # Without the split, ChatML would have carried the reasoning on (the check above can fail).
    assert SECRET in models["chatml"].tokenizer.chat_text(history + [{"role": "user", "content": "Again"}])


def test_an_answer_that_starts_inside_the_reasoning_is_split_at_its_close_marker(models):
    fmt = prompt_format(models["opens"].tokenizer)
    answer = f"{SECRET}\n</think>\n\nHello there."  # the prompt wrote <think>, the model only closes it
    split = split_reasoning(answer, fmt)
    assert (split.reasoning, split.content, split.finished) == (SECRET, "Hello there.", True)
    streaming = split_reasoning(SECRET[:10], fmt, complete=False)
    assert streaming.has_reasoning and not streaming.finished and streaming.content == ""
    assert SECRET not in _next_prompt(models["chatml"].tokenizer, ReasoningFormat(starts_inside=True), answer)


def test_the_models_own_markers_are_split(models):
    tok = models["own"].tokenizer
    fmt = prompt_format(tok)
    answer = f"[THINK]{SECRET}[/THINK]Hello there."
    assert split_reasoning(answer, fmt).reasoning == SECRET
    assert len(tok.encode("[/THINK]", add_special_tokens=False)) == 1
    assert SECRET not in _next_prompt(tok, fmt, answer)


def test_content_token_is_where_the_content_starts_in_the_tokens(models):
    tok = models["chatml"].tokenizer
    ids = tok.encode(ANSWER, add_special_tokens=False)
    pieces = [tok.token_text(i) for i in ids]
    assert "".join(pieces) == ANSWER
    split = split_reasoning(ANSWER)
    k = content_token(pieces, split)
    assert "".join(pieces[:k]).endswith("</think>")
    assert "".join(pieces[k:]).strip() == "Hello there."
    # While the answer streams inside the reasoning, every token so far belongs to the block.
    half = pieces[:10]
    assert content_token(half, split_reasoning("".join(half), complete=False)) == len(half)


def test_a_think_tag_in_the_middle_of_an_answer_is_text():
    text = "Close the block with </think> after <think> opens it."
    split = split_reasoning(text)
    assert not split.has_reasoning and split.content == text
    assert prompt_history([{"role": "assistant", "content": text}], ReasoningFormat())[0]["content"] == text
    # Even for a model that names its markers (a close marker alone ends a block its prompt opened).
    named = ReasoningFormat(from_model=True)
    assert not split_reasoning("Tags: write <think>x</think> first.", named).has_reasoning
    assert split_reasoning("thoughts</think>Answer.", named).content == "Answer."
    # A finished answer that is only "<thi" is text; a streaming one waits for the next token.
    assert split_reasoning("<thi").content == "<thi"
    assert split_reasoning("<thi", complete=False).pending


def test_a_saved_format_reads_back_and_a_missing_one_is_the_default():
    fmt = ReasoningFormat(markers=(Markers("[THINK]", "[/THINK]"), THINK), starts_inside=True, from_model=True)
    assert ReasoningFormat.from_dict(fmt.to_dict()) == fmt
    assert ReasoningFormat.from_dict(None) == ReasoningFormat()
    assert ReasoningFormat.from_dict({"markers": [["", "x"], 3]}).markers == (THINK,)


def test_the_cli_chat_reads_reasoning_the_way_its_model_writes_it(tmp_path, monkeypatch, capsys):
    """A model whose prompt opens the reasoning answers "thoughts</think>answer", and its template (ChatML
    here) keeps whatever it is given: the CLI passes only the answer. (The tiny model writes noise, so its
    answer is replaced by such a text.)"""
    import io

    from engine import cli

    gen_prompt = "{{ '<|im_start|>assistant\n' }}"
    assert gen_prompt in CHAT_TEMPLATE
    opens_keeps = CHAT_TEMPLATE.replace(gen_prompt, "{{ '<|im_start|>assistant\n<think>\n' }}")
    path = write_tiny_llama_gguf(tmp_path / "opens-keeps.gguf", chat_template=opens_keeps)
    requests = []
    real_request, real_add_turn = ChatSession.request, ChatSession.add_turn

    def request(self, user_text, **kw):
        made = real_request(self, user_text, **kw)
        requests.append(made.messages)
        return made

    monkeypatch.setattr(ChatSession, "request", request)
    monkeypatch.setattr(ChatSession, "add_turn", lambda self, text, _answer: real_add_turn(self, text, f"{SECRET}\n</think>\n\nShort."))
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\nAgain\n/quit\n"))
    code = cli.main(["chat", "--model", str(path), "--temperature", "0", "--max-new-tokens", "3"])
    assert code == 0, capsys.readouterr().err
    assert len(requests) == 2
    assert [m["content"] for m in requests[1] if m["role"] == "assistant"] == ["Short."]
