"""A branch or Continue inside a tool call or a structured answer: the grammar (and a call's reader) start after
the kept tokens.

A request's `assistant_prefix` is the part of the answer kept before the branch point (it joins the prompt and
gets no events). With tools, the kept part may end inside a call: the grammar (engine.tools.constraint) must
be where it was after those tokens, or it would ask for the call's opener again in the middle of its arguments,
and the call's reader (engine.tools.tracker) must have read them, or the new tokens' positions and the call's
end would be wrong. A request's own constraint (a JSON schema, a regex) is followed the same way, or a branch in
the middle of a JSON object would be asked for a fresh object there. `kept_text` is the kept part as the answer's text had it; `follow_kept` moves the grammar
past the kept tokens, or says in words that they are not text or a call the tools allow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.constraints.matcher import ConstraintRun
from engine.tokenizer import StreamDetokenizer


def kept_text(tok: Any, prompt: Sequence[int], prefix: Sequence[int]) -> str:
    """The kept tokens' text, detokenized after the prompt before them as the answer's own stream was (a
    character the kept part ends inside of comes with the first new token, as the answer's stream sends it)."""
    if not prefix:
        return ""
    ends_with_it = list(prompt[len(prompt) - len(prefix):]) == list(prefix)  # the decode loop's prompt does
    before = list(prompt[: len(prompt) - len(prefix)]) if ends_with_it else list(prompt)
    detok = StreamDetokenizer(tok, context_ids=before)
    return "".join(detok.add(int(t)) for t in prefix)


def follow_kept(run: ConstraintRun, prefix: Sequence[int], *, tools: bool = True) -> None:
    """Move the grammar past the kept tokens; where one does not fit, the run fails saying which.

    `tools`: the grammar is the tools' (engine.tools.constraint); False: the request's own constraint (a JSON
    schema, a regex, a grammar), which a branch inside a structured answer must continue the same way.
    """
    for i, token in enumerate(prefix):
        run.accept(int(token))
        if run.failure is not None:
            if tools:
                run.fail(f"the answer's kept part is not text or a call the tools allow (its token {i}, id {int(token)}, "
                         "does not fit the tools' grammar): the branch cannot continue it under the tools; branch from "
                         "an earlier token or turn the tools off")
            else:
                run.fail(f"the answer's kept part does not fit the structured output ({run.constraint.label}: its "
                         f"token {i}, id {int(token)}, is not allowed there): the branch cannot continue it under that "
                         "constraint; branch from an earlier token or turn the structured output off")
            return
