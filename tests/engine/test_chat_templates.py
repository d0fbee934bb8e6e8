"""Built-in chat templates render what llama.cpp renders for their format; a chosen template is used and named.

The oracle is llama.cpp's own `llama_chat_apply_template` (its C++ formats, not a
Jinja engine), called through llama-cpp-python's low-level API. llama.cpp leaves
BOS to the tokenizer, so the built-ins are rendered with an empty `bos_token`.
"""

from __future__ import annotations

import ctypes

import pytest

from engine.templates import choice as template_choice
from engine.templates.render import ChatTemplateError, render_chat_template
from engine.templates.choice import BUILTIN_TEMPLATES, resolve_template, template_in_use, use_chat_template

llama_cpp = pytest.importorskip("llama_cpp")

SYSTEM = {"role": "system", "content": "Be brief."}
TURNS = [
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "What is 2+2?\nAnswer in words."},
]
# Our name -> llama.cpp's name for the same format (Mixtral's template is llama.cpp's "llama2" format).
ORACLE_NAMES = {"chatml": "chatml", "llama3": "llama3", "gemma": "gemma", "mistral": "llama2", "phi3": "phi3"}
HAS_SYSTEM_ROLE = {"chatml", "llama3", "gemma", "phi3"}  # Mixtral's template refuses a system message


def llama_cpp_render(name: str, messages: list[dict[str, str]], add_assistant: bool) -> str:
    chat = (llama_cpp.llama_chat_message * len(messages))()
    keep = []  # the bytes must outlive the call
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        chat[i].role, chat[i].content = role, content
    buf = ctypes.create_string_buffer(16384)
    n = llama_cpp.llama_chat_apply_template(name.encode(), chat, len(messages), add_assistant, buf, len(buf))
    assert 0 <= n <= len(buf), f"llama.cpp does not know the format {name!r}"
    return buf.raw[:n].decode()


def ours(name: str, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    return render_chat_template(BUILTIN_TEMPLATES[name].text, {
        "messages": messages, "add_generation_prompt": add_generation_prompt,
        "bos_token": "", "eos_token": "</s>", "tools": None, "documents": None,
    })


@pytest.mark.parametrize("name", sorted(ORACLE_NAMES))
@pytest.mark.parametrize("with_system", [False, True])
def test_each_builtin_renders_what_llama_cpp_renders_for_its_format(name, with_system):
    if with_system and name not in HAS_SYSTEM_ROLE:
        pytest.skip("the model's template has no system role")
    messages = ([SYSTEM] if with_system else []) + TURNS
    for n in (1, 3):  # one question; a longer conversation
        expected = llama_cpp_render(ORACLE_NAMES[name], messages[: n + with_system], add_assistant=True)
        assert ours(name, messages[: n + with_system], True) == expected


def test_mistral_builtin_refuses_a_system_message_as_the_model_does():
    with pytest.raises(ChatTemplateError, match="refused this conversation"):
        ours("mistral", [SYSTEM] + TURNS, True)


def test_resolve_accepts_a_name_a_file_or_jinja_and_names_the_builtins_otherwise(tmp_path):
    assert resolve_template("ChatML") == (BUILTIN_TEMPLATES["chatml"].text, "chatml")
    jinja = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    assert resolve_template(jinja) == (jinja, "")
    path = tmp_path / "mine.jinja"
    path.write_text(jinja, encoding="utf-8")
    assert resolve_template(str(path)) == (jinja, "")
    with pytest.raises(ChatTemplateError, match="chatml, llama3, gemma, mistral, phi3"):
        resolve_template("vicuna")


@pytest.fixture(scope="module")
def smollm2():
    from engine.backends.llamacpp import LlamaCppBackend
    from engine.sources.default_model import default_model_path

    backend = LlamaCppBackend(default_model_path(), spec="default", display_name="SmolLM2")
    yield backend
    backend.close()


@pytest.mark.model
def test_chatml_builtin_renders_what_the_default_models_own_template_renders(smollm2):
    tok = smollm2.tokenizer
    messages = [SYSTEM] + TURNS  # SmolLM2's own adds a default system prompt only when none is given
    assert template_in_use(tok).kind == "own"
    own = tok.chat_ids(messages)
    try:
        chosen = use_chat_template(tok, "chatml")
        assert chosen.kind == "builtin" and chosen.label == "ChatML (built-in)"
        assert tok.chat_ids(messages) == own
    finally:
        use_chat_template(tok, None)
    assert template_in_use(tok).kind == "own"


@pytest.mark.model
def test_a_pasted_template_is_used_and_a_broken_one_is_refused_keeping_the_last(smollm2):
    tok = smollm2.tokenizer
    try:
        chosen = use_chat_template(tok, "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}")
        assert chosen.kind == "custom"
        assert tok.chat_text([{"role": "user", "content": "hi"}]) == "<<hi>>"
        with pytest.raises(ChatTemplateError, match="not valid Jinja"):
            use_chat_template(tok, "{% for m in messages %}unclosed")
        assert tok.chat_text([{"role": "user", "content": "hi"}]) == "<<hi>>"
        # A pasted template runs in the same sandbox, with the same time limit, as a model's own.
        with pytest.raises(ChatTemplateError, match="sandbox"):
            use_chat_template(tok, "{{ messages.__class__.__mro__ }}")
    finally:
        use_chat_template(tok, None)


def test_a_model_without_a_template_is_named_fallback_with_a_warning(tiny_gguf_without_template):
    tok = tiny_gguf_without_template.tokenizer
    used = template_in_use(tok)
    assert used.kind == "fallback" and "no chat template" in used.warning
    assert tok.chat_text([{"role": "user", "content": "hi"}]) == "User: hi\nAssistant:"
    chosen = use_chat_template(tok, "gemma")
    assert chosen.kind == "builtin" and chosen.warning == ""
    assert tok.chat_text([{"role": "user", "content": "hi"}]).endswith("<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n")


@pytest.fixture(scope="module")
def tiny_gguf_without_template(tmp_path_factory):
    from tiny_gguf import write_tiny_llama_gguf

    from engine.backends.llamacpp import LlamaCppBackend

    path = write_tiny_llama_gguf(tmp_path_factory.mktemp("no-template") / "base.gguf", chat_template="")
    backend = LlamaCppBackend(path, spec=str(path), display_name="base")
    backend.path = path
    yield backend
    backend.close()


def test_the_module_is_part_of_the_public_api():
    import engine

    assert engine.templates.choice is template_choice and "template_choice" in engine.__all__


def test_cli_chat_template_option_renders_chats_with_a_file_or_refuses_in_one_line(capsys, tmp_path, tiny_gguf_without_template):
    from engine import cli

    model = str(tiny_gguf_without_template.path)
    template = tmp_path / "bare.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}", encoding="utf-8")
    args = ["generate", "--model", model, "--chat", "--prompt", "hello world", "--max-new-tokens", "1", "--temperature", "0"]

    def prompt_tokens(extra: list[str]) -> int:
        assert cli.main(args + extra) == 0
        err = capsys.readouterr().err
        return int(err.split("; prompt ")[1].split(" ")[0])

    bare = len(tiny_gguf_without_template.tokenizer.encode("hello world", add_special_tokens=False))
    assert prompt_tokens(["--chat-template", str(template)]) == bare
    assert prompt_tokens([]) > bare  # the User:/Assistant: fallback
    code = cli.main(args + ["--chat-template", "vicuna"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code != 0 and len(errors) == 1 and "not a built-in chat template" in errors[0]


@pytest.mark.slow  # seconds on two cores (junit times, 2026-12-04)
def test_a_servers_guessed_template_is_named_and_a_chosen_one_renders_in_the_sandbox(llama_server_url):
    pytest.importorskip("llama_cpp.server", reason="needs llama-cpp-python[server] (the test extra)")
    from engine.backends.remote import RemoteBackend

    backend = RemoteBackend.connect(llama_server_url)
    try:
        tok = backend.tokenizer
        used = template_in_use(tok)  # SmolLM2's vocabulary has <|im_start|>: ChatML is guessed, and said so
        assert used.kind == "builtin" and used.label == "ChatML (guessed)"
        assert use_chat_template(tok, "llama3").label == "Llama 3 (built-in)"
        assert tok.chat_text([{"role": "user", "content": "hi"}]).startswith(
            "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>")
        with pytest.raises(ChatTemplateError, match="sandbox"):
            use_chat_template(tok, "{{ messages.__class__.__mro__ }}")
        use_chat_template(tok, None)
        assert template_in_use(tok).label == "ChatML (guessed)"
    finally:
        backend.close()
