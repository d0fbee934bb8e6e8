"""Built-in chat templates, a pasted or file template, and which template a loaded model uses.

A model's chat template comes with it (a GGUF file's `tokenizer.chat_template`,
a Hugging Face folder's `tokenizer_config.json`). A base model has none; the
engine then renders the plain "User:/Assistant:" transcript, which a base model
continues poorly. Here a template can be chosen instead, as llama.cpp's
`--chat-template` does: a built-in by name, or any Jinja text (pasted in the
window, or a file on the command line). Every template, built-in or pasted, is
rendered by `engine.templates.render.render_chat_template` — the same sandbox,
time and size limits as a model's own.

The built-in texts are the models' own, copied from their `tokenizer_config.json`
(the source is named with each); tests/engine/test_chat_templates.py checks
that each renders what llama.cpp's `llama_chat_apply_template` renders for
that format.

Usage::

    from engine import Engine, template_choice
    engine = Engine.load("base-model.gguf")
    template_choice.use_chat_template(engine.tokenizer, "chatml")   # or a Jinja text, or None
    template_choice.template_in_use(engine.tokenizer).label         # "ChatML (built-in)"
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.templates.render import ChatTemplateError, render_chat_template
from engine.tokenizer import FALLBACK_TEMPLATE, TokenizerLike


@dataclass(frozen=True)
class BuiltinTemplate:
    """One built-in template: its short name (CLI and saved choices), its label and the model it is from."""

    name: str
    label: str
    source: str
    text: str


BUILTIN_TEMPLATES: dict[str, BuiltinTemplate] = {
    t.name: t
    for t in (
        BuiltinTemplate(
            "chatml", "ChatML", "teknium/OpenHermes-2.5-Mistral-7B tokenizer_config.json (Qwen, SmolLM, Hermes ...)",
            "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
        ),
        BuiltinTemplate(
            "llama3", "Llama 3", "meta-llama/Meta-Llama-3-8B-Instruct tokenizer_config.json",
            "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
            "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
            "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
            "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
        ),
        BuiltinTemplate(
            "gemma", "Gemma", "google/gemma-3-1b-it tokenizer_config.json (text part)",
            "{{ bos_token }}\n"
            "{%- if messages[0]['role'] == 'system' -%}\n"
            "    {%- if messages[0]['content'] is string -%}\n"
            "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
            "    {%- else -%}\n"
            "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
            "    {%- endif -%}\n"
            "    {%- set loop_messages = messages[1:] -%}\n"
            "{%- else -%}\n"
            "    {%- set first_user_prefix = \"\" -%}\n"
            "    {%- set loop_messages = messages -%}\n"
            "{%- endif -%}\n"
            "{%- for message in loop_messages -%}\n"
            "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
            "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
            "    {%- endif -%}\n"
            "    {%- if (message['role'] == 'assistant') -%}\n"
            "        {%- set role = \"model\" -%}\n"
            "    {%- else -%}\n"
            "        {%- set role = message['role'] -%}\n"
            "    {%- endif -%}\n"
            "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
            "    {%- if message['content'] is string -%}\n"
            "        {{ message['content'] | trim }}\n"
            "    {%- else -%}\n"
            "        {{ raise_exception(\"Invalid content type\") }}\n"
            "    {%- endif -%}\n"
            "    {{ '<end_of_turn>\n' }}\n"
            "{%- endfor -%}\n"
            "{%- if add_generation_prompt -%}\n"
            "    {{'<start_of_turn>model\n'}}\n"
            "{%- endif -%}\n",
        ),
        BuiltinTemplate(
            "mistral", "Mistral", "mistralai/Mixtral-8x7B-Instruct-v0.1 tokenizer_config.json (no system role)",
            "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
            "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
            "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
            "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
            "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}",
        ),
        BuiltinTemplate(
            "phi3", "Phi-3", "microsoft/Phi-3.5-mini-instruct tokenizer_config.json",
            "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
            "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
            "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
            "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}",
        ),
        BuiltinTemplate(
            "transcript", "Plain transcript (User:/Assistant:)", "Logit Lab's fallback for models without a template",
            FALLBACK_TEMPLATE,
        ),
    )
}

_SAMPLE = ({"role": "user", "content": "Hello"},)


@dataclass(frozen=True)
class TemplateInUse:
    """Which chat template a loaded model's chats are rendered with, in words for the window."""

    kind: str  # "own" (the model's) | "builtin" | "custom" (pasted or a file) | "fallback" (none: the transcript)
    label: str  # "the model's own", "ChatML (built-in)", "custom Jinja", "User:/Assistant: fallback"
    name: str = ""  # the built-in's name when kind is "builtin"

    @property
    def warning(self) -> str:
        """What the user should know ("" when nothing): a model without a template chats badly."""
        if self.kind != "fallback":
            return ""
        return ("This model has no chat template: chats are wrapped in a plain “User:/Assistant:” transcript, "
                "which a base model continues poorly. Use a notebook (File ▸ New notebook), or choose a template.")


def resolve_template(choice: str) -> tuple[str, str]:
    """(Jinja text, built-in name or "") for `choice`: a built-in's name, a template file's path, or Jinja text.

    Raises:
        ChatTemplateError: `choice` is none of these (the message lists the built-ins).
    """
    builtin = BUILTIN_TEMPLATES.get(choice.strip().lower())
    if builtin is not None:
        return builtin.text, builtin.name
    if "{{" in choice or "{%" in choice:
        return choice, ""
    path = Path(choice.strip()).expanduser()
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8"), ""
        except (OSError, UnicodeDecodeError) as e:
            raise ChatTemplateError(f"cannot read the chat template file {path}: {e}") from None
    names = ", ".join(BUILTIN_TEMPLATES)
    raise ChatTemplateError(f"{choice!r} is not a built-in chat template ({names}), a template file, or a Jinja template")


def check_template(text: str) -> None:
    """Render `text` once on a one-message chat, in the sandbox: a broken template is refused before it is used.

    Raises:
        ChatTemplateError: it does not compile, or fails on the sample chat (in words).
    """
    render_chat_template(text, {"messages": [dict(m) for m in _SAMPLE], "add_generation_prompt": True,
                                "bos_token": "", "eos_token": "", "tools": None, "documents": None})


SAMPLE_CHAT = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
)


def preview(text: str, *, bos_token: str = "<s>", eos_token: str = "</s>", time_limit_s: float = 1.0) -> str:
    """`text` rendered on `SAMPLE_CHAT` (system, user, assistant, user, then the answer's start), in the sandbox
    with a short time limit: what a person checks before choosing a template.

    A template without a system role is shown without the system message (it would refuse it).

    Raises:
        ChatTemplateError: the template is broken, or refuses even the chat without a system message.
    """
    variables = {"add_generation_prompt": True, "bos_token": bos_token, "eos_token": eos_token,
                 "tools": None, "documents": None}
    try:
        return render_chat_template(text, {**variables, "messages": [dict(m) for m in SAMPLE_CHAT]},
                                    time_limit_s=time_limit_s)
    except ChatTemplateError as e:
        if "refused this conversation" not in str(e):
            raise
    return render_chat_template(text, {**variables, "messages": [dict(m) for m in SAMPLE_CHAT[1:]]},
                                time_limit_s=time_limit_s)


def use_chat_template(tokenizer: TokenizerLike, choice: str | None) -> TemplateInUse:
    """Render this model's chats with `choice` from now on (None: the model's own, or the fallback).

    `choice` is as for `resolve_template`. The choice lives on the loaded model's tokenizer (every chat
    prompt, its count and the layer view go through `tokenizer.chat_ids`), until another is chosen.

    Raises:
        ChatTemplateError: `choice` is unknown, or the template is broken; the model keeps its template.
    """
    if choice is None or not choice.strip():
        tokenizer.template_override = None
        tokenizer.template_override_name = ""
        return template_in_use(tokenizer)
    text, name = resolve_template(choice)
    check_template(text)
    tokenizer.template_override = text
    tokenizer.template_override_name = name
    return template_in_use(tokenizer)


def template_in_use(tokenizer: TokenizerLike) -> TemplateInUse:
    """Which template `tokenizer.chat_text` renders with now."""
    if tokenizer.template_override:
        name = tokenizer.template_override_name
        if name in BUILTIN_TEMPLATES:
            return TemplateInUse("builtin", f"{BUILTIN_TEMPLATES[name].label} (built-in)", name)
        return TemplateInUse("custom", "custom Jinja template")
    guessed = tokenizer.guessed_template
    if guessed:  # a server that does not say its template: one is guessed from its vocabulary
        return TemplateInUse("builtin", f"{BUILTIN_TEMPLATES[guessed].label} (guessed)", guessed)
    if tokenizer.has_chat_template:
        return TemplateInUse("own", "the model's own")
    return TemplateInUse("fallback", "User:/Assistant: fallback (the model has none)")
