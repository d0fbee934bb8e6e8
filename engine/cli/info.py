"""`logitlab-cli info`'s chat template line: which template the model's chats are rendered with, or that it has none.

A llama.cpp user reads "chat template" the way llama-server's log prints it: the template the model
file carries, and which family it is (ChatML, Llama 3, Gemma, ...), so a wrong or missing template is
seen before a chat goes strangely.
"""

from __future__ import annotations

from engine.templates.choice import template_in_use
from engine.tokenizer import TokenizerLike

# Markers that name a template family: the first one found in a template's text names it.
FAMILIES: tuple[tuple[str, str], ...] = (
    ("<|im_start|>", "ChatML"),
    ("<|start_header_id|>", "Llama 3"),
    ("<start_of_turn>", "Gemma"),
    ("[INST]", "Mistral/Llama 2 [INST]"),
    ("<|user|>", "Phi-3 / Zephyr"),
    ("<|start|>", "Harmony (gpt-oss)"),
    ("<｜User｜>", "DeepSeek"),
    ("<|turn>", "Gemma 4"),
)


def template_family(text: str) -> str:
    """The family a template's text belongs to, from its markers ("" when none is recognised)."""
    return next((name for marker, name in FAMILIES if marker in text), "")


def chat_template_line(tokenizer: TokenizerLike) -> str:
    """One `info` line: "chat template:  the model's own (ChatML, 1,234 characters)" or that it has none."""
    used = template_in_use(tokenizer)
    label = "chat template:  "
    if used.kind == "fallback":
        return (label + "none: the model has no chat template, so chats use a plain User:/Assistant: transcript "
                "(choose one with --chat-template)")
    own = getattr(tokenizer, "chat_template", None) or getattr(getattr(tokenizer, "hf", None), "chat_template", None)
    text = tokenizer.template_override or own or ""
    if not isinstance(text, str):  # a tokenizer whose template is not one text (a dict of named templates)
        text = ""
    facts = ", ".join(f for f in (template_family(text), f"{len(text):,} characters" if text else "") if f)
    return label + used.label + (f" ({facts})" if facts and used.kind != "builtin" else "")
