"""What the server answers, said once: its endpoints and the fields each reads (for `logitlab-cli serve --help`
and the tests that hold docs/serve.md to the app's routes). What a served model can do is
`engine.serve.model_capabilities` (the server imports that one; this one imports the parsers, for help only).

docs/serve.md says what every endpoint and field does; tests/engine/test_serve_docs.py fails when the app
serves a route, or a parser takes a field, that the page does not name.
"""

from __future__ import annotations

import textwrap

from engine.serve.limits import MAX_PROMPTS

# (method, path, what it does here). Each /v1 route also answers without the prefix, as llama.cpp's server does.
ENDPOINTS: tuple[tuple[str, str, str], ...] = (
    ("GET", "/v1/models", "the model and its aliases, with what each can do (capabilities)"),
    ("POST", "/v1/chat/completions", "chat: messages, the sampler fields, logprobs, response_format, tools; "
                                     "streamed or whole"),
    ("POST", "/v1/completions", "text: prompt (text, token ids, or a list of up to "
                                f"{MAX_PROMPTS}); echo + logprobs and prompt_logprobs give the prompt's own "
                                "log-probs, max_tokens 0 only scores (lm-eval's loglikelihood)"),
    ("POST", "/v1/responses", "OpenAI's Responses API: input, instructions, previous_response_id, function "
                              "tools, include logprobs; streamed with its events"),
    ("POST", "/v1/messages", "Anthropic's Messages API: system, content blocks, tools (tool_use / tool_result); "
                             "its events and error shape"),
    ("POST", "/v1/messages/count_tokens", "Anthropic's: the prompt's token count with the model's template"),
    ("POST", "/tokenize", "llama.cpp's (content, add_special, with_pieces) and vLLM's (prompt, "
                          "add_special_tokens) names"),
    ("POST", "/detokenize", "token ids to text (content, and vLLM's prompt)"),
    ("GET", "/tokenizer_info", "vLLM's: special tokens and chat template (lm-eval's remote tokenizer)"),
    ("GET", "/props", "llama.cpp's: context size and default sampler settings"),
    ("GET", "/health", "ok while the server runs (needs no API key)"),
)


def endpoints_help(width: int = 110) -> str:
    """The endpoints as `serve --help` lists them."""
    rows = [textwrap.fill(what, width, initial_indent=f"  {method:<5}{path:<27}", subsequent_indent=" " * 34)
            for method, path, what in ENDPOINTS]
    return ("endpoints (each /v1 route also without /v1; every field and what it does: docs/serve.md):\n"
            + "\n".join(rows))


def fields_help(width: int = 110) -> str:
    """The fields each endpoint takes, by name (imports the parsers: only when help is asked for)."""
    from engine.serve.anthropic_api import COUNT_KEYS, MESSAGES_KEYS
    from engine.serve.parse import CHAT_KEYS, COMPLETION_KEYS, SAMPLER_KEYS
    from engine.serve.responses_api import RESPONSES_KEYS

    groups = (("/v1/chat/completions", CHAT_KEYS), ("/v1/completions", COMPLETION_KEYS),
              ("/v1/responses", RESPONSES_KEYS | {"ignore_eos"}), ("/v1/messages", MESSAGES_KEYS | {"ignore_eos"}),
              ("/v1/messages/count_tokens", COUNT_KEYS),
              ("sampler fields (chat, completions, responses, messages)", SAMPLER_KEYS))
    out = ["fields each endpoint reads (any other is a 400 that names it; a value it cannot honour is refused in "
           "words: docs/serve.md):"]
    for name, keys in groups:
        out.append(textwrap.fill(", ".join(sorted(keys)), width, initial_indent=f"  {name}: ",
                                 subsequent_indent="    "))
    return "\n".join(out)
