"""Reasoning in an answer: `<think>…</think>` (or the model's own markers), split from what the model says.

Reasoning models write their thoughts between two markers before the answer
proper. Three things about a model decide how to read them, and all three
come from the model itself, never from its name:

- **which markers**: the pairs its chat template names (a template that
  strips reasoning from history spells its close marker), then pairs its
  vocabulary holds as single tokens, then `<think>`/`</think>`;
- **whether an answer starts inside the reasoning**: templates such as
  DeepSeek-R1's end the generation prompt with the open marker, so the answer
  holds only the close marker;
- **whether the template drops the reasoning of earlier turns itself**
  (Qwen3, DeepSeek-R1 do: `content.split('</think>')[-1]`): found by
  rendering a probe conversation, so any template that does it is seen to.

`prompt_history` then keeps reasoning out of the next turn's prompt: it
leaves the messages alone when the template drops it, and drops it itself
otherwise. `split_reasoning` and `content_token` tell a view which part of
an answer (text and tokens) is the thinking.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.tokenizer import TokenizerLike

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Markers:
    """The open and close marker of a reasoning block."""

    open: str
    close: str


THINK = Markers("<think>", "</think>")
# Pairs seen in the wild, the most common first. Which one a model uses comes from its template or vocabulary.
KNOWN_MARKERS: tuple[Markers, ...] = (
    THINK,
    Markers("<thinking>", "</thinking>"),
    Markers("<reasoning>", "</reasoning>"),
    Markers("<seed:think>", "</seed:think>"),
    Markers("[THINK]", "[/THINK]"),
    Markers("◁think▷", "◁/think▷"),
    Markers("<|START_THINKING|>", "<|END_THINKING|>"),
    Markers("<|begin_of_thought|>", "<|end_of_thought|>"),
)
_PROBE_REASONING = "Probe reasoning 7f3a."
_PROBE_ANSWER = "Probe answer 7f3a."


@dataclass(frozen=True)
class ReasoningFormat:
    """How one model writes reasoning (see the module docstring). The default: `<think>` only, nothing assumed.

    Attributes:
        markers: the pairs to look for, the model's own first.
        starts_inside: the generation prompt opens the reasoning, so an answer begins inside it.
        template_drops: the chat template leaves the reasoning of earlier assistant turns out itself.
        from_model: the model's template or vocabulary named the markers (a close marker alone then
            ends a reasoning block that the answer did not open: the generation prompt may have).
    """

    markers: tuple[Markers, ...] = (THINK,)
    starts_inside: bool = False
    template_drops: bool = False
    from_model: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (saved with an answer, so its view reads it the same way later)."""
        return {
            "markers": [[m.open, m.close] for m in self.markers],
            "starts_inside": self.starts_inside,
            "template_drops": self.template_drops,
            "from_model": self.from_model,
        }

    @classmethod
    def from_dict(cls, doc: Any) -> "ReasoningFormat":
        """The format `to_dict` wrote; the default for anything else (an answer saved before this existed)."""
        if not isinstance(doc, dict):
            return cls()
        pairs = tuple(
            Markers(p[0], p[1]) for p in doc.get("markers") or ()
            if isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(s, str) and s for s in p)
        )
        return cls(
            markers=pairs or (THINK,),
            starts_inside=bool(doc.get("starts_inside")),
            template_drops=bool(doc.get("template_drops")),
            from_model=bool(doc.get("from_model")),
        )


DEFAULT_FORMAT = ReasoningFormat()


@dataclass(frozen=True)
class ReasoningSplit:
    """An answer text cut into its reasoning and its content.

    Attributes:
        reasoning: the text between the markers (without them and the newlines around it).
        content: what the model says after the reasoning (the whole text when there is none).
        has_reasoning: the answer holds a reasoning block (perhaps still being written).
        finished: the close marker has come (always True without reasoning).
        content_offset: where `content`'s part of the text starts (just after the close marker;
            0 without reasoning; the text's length while the reasoning is still open).
        pending: the text so far is only the beginning of an open marker ("<thi"): not shown yet.
    """

    reasoning: str
    content: str
    has_reasoning: bool
    finished: bool
    content_offset: int
    pending: bool = False


def split_reasoning(text: str, fmt: ReasoningFormat = DEFAULT_FORMAT, *, complete: bool = True) -> ReasoningSplit:
    """Split an answer into reasoning and content.

    `complete=False` while the answer streams: a text that is only the beginning of an open marker
    ("<thi") is then `pending` rather than content. A block opens only at the very start of the answer (after whitespace): a `<think>` further
    down is something the model wrote about, not a block. A close marker with no open marker
    before it closes a block the generation prompt opened, when the model names its markers or
    its prompt ends inside the reasoning.
    """
    stripped = text.lstrip()
    lead = len(text) - len(stripped)
    for m in fmt.markers:
        if stripped.startswith(m.open):
            return _after_open(text, lead + len(m.open), m)
    if fmt.starts_inside or fmt.from_model:
        for m in fmt.markers:
            close = text.find(m.close)
            if close >= 0 and m.open not in text[:close]:  # "see <think>x</think>" mid-answer is text
                return _closed(text, 0, close, m)
        if fmt.starts_inside:
            return ReasoningSplit(text.strip(), "", True, False, len(text))
    if not complete and stripped and any(m.open.startswith(stripped) for m in fmt.markers):
        return ReasoningSplit("", "", False, False, len(text), pending=True)
    return ReasoningSplit("", text, False, True, 0)


def _after_open(text: str, start: int, m: Markers) -> ReasoningSplit:
    close = text.find(m.close, start)
    if close < 0:
        return ReasoningSplit(text[start:].strip(), "", True, False, len(text))
    return _closed(text, start, close, m)


def _closed(text: str, start: int, close: int, m: Markers) -> ReasoningSplit:
    end = close + len(m.close)
    return ReasoningSplit(text[start:close].strip(), text[end:].lstrip(), True, True, end)


def content_token(pieces: Sequence[str], split: ReasoningSplit) -> int:
    """The index of the first token of the content: tokens before it make the reasoning block.

    `pieces` are the tokens' texts, whose concatenation is the answer text that was split. The token
    that holds the end of the close marker stays in the block; while the reasoning is open (or the
    text is only the start of a marker) every token is in it; without reasoning none is.
    """
    if not split.has_reasoning and not split.pending:
        return 0
    if not split.finished:
        return len(pieces)
    offset = 0
    for i, piece in enumerate(pieces):
        if offset >= split.content_offset:
            return i
        offset += len(piece)
    return len(pieces)


def prompt_history(messages: Sequence[dict[str, str]], fmt: ReasoningFormat) -> list[dict[str, str]]:
    """The messages to render for the next turn: earlier answers' reasoning left out, as the template wants.

    A template that drops reasoning itself gets the messages as they are (it decides, e.g. Qwen3 keeps
    the thoughts of a tool-calling turn in progress); for any other template the reasoning is cut here.
    """
    if fmt.template_drops:
        return [dict(m) for m in messages]
    out = []
    for m in messages:
        m = dict(m)
        if m.get("role") == "assistant" and isinstance(m.get("content"), str):
            split = split_reasoning(m["content"], fmt)
            if split.has_reasoning:
                m["content"] = split.content
        out.append(m)
    return out


def template_source(tokenizer: TokenizerLike) -> str:
    """The chat template text a tokenizer renders with, or "" when it has none or does not say."""
    override = tokenizer.template_override  # one the user chose (engine.templates.choice)
    if isinstance(override, str) and override:
        return override
    text = getattr(tokenizer, "chat_template", None)
    if isinstance(text, str):
        return text
    hf = getattr(tokenizer, "hf", None)
    if hf is not None and getattr(hf, "chat_template", None):
        try:
            text = hf.get_chat_template()
        except (ValueError, TypeError):  # several named templates and none is the default
            return ""
        return text if isinstance(text, str) else ""
    return ""


def markers_in_template(template: str) -> tuple[Markers, ...]:
    """The known pairs whose close marker the template spells (it splits or writes reasoning with it)."""
    return tuple(m for m in KNOWN_MARKERS if m.close in template)


def markers_in_vocabulary(tokenizer: Any) -> tuple[Markers, ...]:
    """The known pairs that are single tokens of the vocabulary (added or special tokens), both ends."""

    def one_token(marker: str) -> bool:
        try:
            ids = tokenizer.encode(marker, add_special_tokens=False)
            return len(ids) == 1 and tokenizer.decode(ids) == marker
        except Exception:  # noqa: BLE001 - a tokenizer that cannot say is one without these tokens
            return False

    return tuple(m for m in KNOWN_MARKERS if one_token(m.open) and one_token(m.close))


def prompt_format(tokenizer: Any, *, vocabulary: bool = True) -> ReasoningFormat:
    """How the model behind `tokenizer` writes reasoning, and whether its template keeps it out of history.

    Renders the model's template twice (sandboxed, as every render): a generation prompt, to see
    whether it opens the reasoning, and a probe conversation, to see whether it drops an earlier
    answer's reasoning. `vocabulary=False` skips the vocabulary look-up (a server's tokenizer asks
    over HTTP). A template that fails to render tells nothing: the defaults stand.
    """
    named = markers_in_template(template_source(tokenizer))
    if vocabulary:
        named += tuple(m for m in markers_in_vocabulary(tokenizer) if m not in named)
    markers = named + ((THINK,) if THINK not in named else ())
    starts_inside = template_drops = False
    try:
        prompt = tokenizer.chat_text([{"role": "user", "content": "Hi"}], add_generation_prompt=True).rstrip()
        starts_inside = any(prompt.endswith(m.open) for m in markers)
    except Exception as e:  # noqa: BLE001 - the template's own failure is reported when the prompt is rendered
        log.debug("generation prompt probe failed: %s", e)
    first = markers[0]
    probe = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": f"{first.open}\n{_PROBE_REASONING}\n{first.close}\n\n{_PROBE_ANSWER}"},
        {"role": "user", "content": "Again"},
    ]
    try:
        rendered = tokenizer.chat_text(probe, add_generation_prompt=True)
        template_drops = _PROBE_REASONING not in rendered and _PROBE_ANSWER in rendered
    except Exception as e:  # noqa: BLE001 - as above
        log.debug("history probe failed: %s", e)
    return ReasoningFormat(markers=markers, starts_inside=starts_inside, template_drops=template_drops,
                           from_model=bool(named))
