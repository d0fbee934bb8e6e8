"""Chat templates rendered in a jinja2 sandbox with a time and a size limit, for every tokenizer.

A chat template is code that comes with the model (a GGUF file's
`tokenizer.chat_template`, a Hugging Face folder's `tokenizer_config.json`).
The sandbox stops it from reaching Python's internals; it does not stop a
template that loops `range(100000)` inside `range(100000)`, or that doubles a
string forty times. Here a render also stops:

- after `TIME_LIMIT_S` seconds: it renders in a child process
  (`engine.templates.process`) that is killed when it has not answered a
  second after the limit, whatever it is doing (a long C call holding the
  GIL, a loop inside a library filter). Inside that process a trace function
  looks at the clock on every line the compiled template runs, so the common
  runaway loop ends right at the limit and the process lives on;
- before any text or list it builds, or its output, passes `MAX_CHARS`
  characters: `+`, `*`, `**`, `%`, `~`, filters, method calls and output are
  checked before the big value is made, not after (and the renderer process
  may not grow by more than `engine.templates.process.MEMORY_LIMIT_BYTES`).

Any failure (a syntax error, the template's own `raise_exception`, a sandbox
refusal, a limit) is one `ChatTemplateError` saying what happened, in words.
The variables follow transformers' `apply_chat_template` (`trim_blocks`,
`lstrip_blocks`, `loopcontrols`, its `tojson`, `raise_exception`,
`strftime_now` and `{% generation %}`), so a GGUF file and its Hugging Face
original render the same prompt.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from engine.templates.sandbox import (  # noqa: F401  (the public names live on here for callers)
    MAX_CHARS, TIME_LIMIT_S, ChatTemplateError, RanOutOfTime, _overtime_message, render_in_this_process,
)

# One in-process render at a time (where no renderer process can start): two runaway renders (the
# status bar's count and a send) would take turns with the GIL and leave the UI thread almost none of it.
_render_lock = threading.Lock()
# Templates that ran past their time limit, with the error they gave: run again they would cost the
# limit again on every keystroke, and a template that loops once is not one to trust.
_overtime: dict[tuple[str, float], str] = {}


def render_chat_template(
    template: str,
    variables: Mapping[str, Any],
    *,
    time_limit_s: float | None = None,
    max_chars: int | None = None,
) -> str:
    """Render a model's chat template with `variables` (messages, add_generation_prompt, special tokens...).

    It renders in the renderer process (`engine.templates.process`), which is killed when it overruns
    `time_limit_s`: no template can hold this process past its limit. `time_limit_s` and `max_chars`
    default to the module's `TIME_LIMIT_S` and `MAX_CHARS`. `variables` are plain values (text, numbers,
    lists, dicts, None): they are copied to that process.

    Raises:
        ChatTemplateError: the template is not valid Jinja, raised an error of its own (e.g. roles
            must alternate), did something the sandbox forbids, or ran past `time_limit_s` or
            `max_chars`. The message says which, for a person.
    """
    from engine.templates import process as template_process

    time_limit_s = TIME_LIMIT_S if time_limit_s is None else time_limit_s
    max_chars = MAX_CHARS if max_chars is None else max_chars
    if (known := _overtime.get((template, time_limit_s))) is not None:
        raise ChatTemplateError(known)
    try:
        outcome = template_process.renderer().render(template, variables, time_limit_s, max_chars)
    except template_process.RendererUnavailable:
        with _render_lock:
            try:
                return render_in_this_process(template, variables, time_limit_s=time_limit_s, max_chars=max_chars)
            except RanOutOfTime as e:
                _overtime[(template, time_limit_s)] = str(e)
                raise
    if outcome.text is not None:
        return outcome.text
    message = outcome.error or _overtime_message(time_limit_s)
    if outcome.overtime:
        _overtime[(template, time_limit_s)] = message
    raise ChatTemplateError(message)
