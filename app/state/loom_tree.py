"""The loom's tree: an answer's branches as one token tree, with probabilities (Qt-free).

The store keeps every branch of an answer as a sibling assistant message (a
regeneration, a branch from an alternative, an edit's answer, the loom's N
continuations), each with its whole token record. The tree is built from
those records: answers that share their first k tokens share a node for
them, and a node ends where two answers part (a fork) or one ends. So the
tree never needs its own table: it is the conversation's branches seen
token by token, and it survives a restart with them.

Each node knows its run of tokens, the log-probability of the path from the
answer's start to its end (the model's, summed), and, at a fork, how much of
the model's probability its children's first tokens cover: the rest is the
mass no branch has explored yet. All children of a node continue the same
prefix, so their first tokens' `logprob`s are from one distribution.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from engine import TokenEvent, reasoning

from app.state.conversation import Conversation, Message
from app.state.records import alternatives_json, token_from_row

FORMAT = "logitlab-loom"
VERSION = 1
SHORT_CHARS = 32


@dataclass(eq=False)
class LoomNode:
    """A run of tokens shared by the answers in `message_ids` (the root: no tokens, the prompt)."""

    start: int  # index of the first token in the answers
    tokens: list[TokenEvent]
    message_ids: list[int]  # answers through this node, oldest first
    path_logprob: float  # model log-probability of tokens 0..end-1
    parent: LoomNode | None = None
    children: list[LoomNode] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # answers that end exactly here

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    @property
    def depth(self) -> int:
        return 0 if self.parent is None else self.parent.depth + 1

    @property
    def is_fork(self) -> bool:
        return len(self.children) >= 2

    @property
    def branch_prob(self) -> float:
        """The probability of this node's first token where it was chosen (1 for the root)."""
        return self.tokens[0].prob if self.tokens else 1.0

    @property
    def explored_mass(self) -> float:
        """The probability its children's first tokens hold together (0 for a leaf)."""
        return min(1.0, sum(c.branch_prob for c in self.children))

    @property
    def unexplored_mass(self) -> float | None:
        """At a fork, the probability no child has taken; None where the node is not a fork."""
        return max(0.0, 1.0 - self.explored_mass) if self.is_fork else None

    @property
    def min_prob(self) -> float:
        """The least likely token of the run (what colours a node: one unlikely token makes it unlikely)."""
        return min((t.prob for t in self.tokens), default=1.0)

    def text(self) -> str:
        return "".join(t.token_text for t in self.tokens)

    def short(self, limit: int = SHORT_CHARS) -> str:
        """The node's tokens in short, on one line."""
        text = self.text().replace("\n", "⏎").replace("\t", " ")
        return text if len(text) <= limit else text[: limit - 1] + "…"

    def walk(self):
        """This node and every node below it, depth first, children in order."""
        yield self
        for c in self.children:
            yield from c.walk()

    def find(self, message_id: int, index: int) -> "LoomNode | None":
        """The node holding token `index` of answer `message_id`."""
        for node in self.walk():
            if message_id in node.message_ids and node.start <= index < node.end:
                return node
        return None


def answer_group(conv: Conversation, message: Message) -> tuple[Message, list[Message]]:
    """The question `message` answers (or is) and all its answers, oldest first."""
    parent = message if message.role == "user" else conv.messages[message.parent_id]  # type: ignore[index]
    return parent, [m for m in conv.children(parent.id) if m.is_assistant]


def build_tree(conv: Conversation, answers: list[Message]) -> LoomNode:
    """The token tree of `answers` (siblings of one question)."""
    root = LoomNode(0, [], [m.id for m in answers], 0.0)
    for m in answers:
        _insert(root, m.id, conv.tokens(m))
    _recompute(root)
    return root


def _insert(root: LoomNode, message_id: int, tokens: list[TokenEvent]) -> None:
    node, i = root, 0
    while True:
        if i == len(tokens):
            node.ends.append(message_id)
            return
        child = next((c for c in node.children if c.tokens[0].token_id == tokens[i].token_id), None)
        if child is None:
            node.children.append(LoomNode(i, list(tokens[i:]), [message_id], 0.0, node, ends=[message_id]))
            return
        child.message_ids.append(message_id)
        j = 0  # how far the answer follows the child's run
        while j < len(child.tokens) and i + j < len(tokens) and child.tokens[j].token_id == tokens[i + j].token_id:
            j += 1
        if j < len(child.tokens):
            _split(child, j)
        node, i = child, i + j


def _split(node: LoomNode, at: int) -> None:
    """Cut `node` after `at` tokens: the tail becomes its only child, with its children and ends."""
    tail = LoomNode(node.start + at, node.tokens[at:], list(node.message_ids[:-1]), 0.0, node,
                    children=node.children, ends=node.ends)
    for c in tail.children:
        c.parent = tail
    node.tokens = node.tokens[:at]
    node.children = [tail]
    node.ends = []


def _recompute(node: LoomNode) -> None:
    base = node.parent.path_logprob if node.parent is not None else 0.0
    node.path_logprob = base + sum(t.logprob for t in node.tokens if math.isfinite(t.logprob))
    node.children.sort(key=lambda c: -c.branch_prob)  # likeliest branch first
    for c in node.children:
        _recompute(c)


def representative(conv: Conversation, node: LoomNode) -> Message:
    """The answer to open for `node`: the one shown now if it passes through, else the newest."""
    for mid in node.message_ids:
        m = conv.messages.get(mid)
        if m is not None and conv.active_child(m.parent_id) is m:
            return m
    return conv.messages[node.message_ids[-1]]


# -- export and import ------------------------------------------------------------------------


def _token_json(ev: TokenEvent) -> dict[str, Any]:
    return {
        "index": ev.index, "token_id": ev.token_id, "text": ev.text, "token_text": ev.token_text,
        "logprob": ev.logprob if math.isfinite(ev.logprob) else None,
        "sampler_logprob": ev.sampler_logprob if math.isfinite(ev.sampler_logprob) else None,
        "rank": ev.rank, "entropy": ev.entropy, "forced": ev.forced, "special": ev.special,
        "alternatives": json.loads(alternatives_json(ev)),
    }


def _token_from_json(d: dict[str, Any], index: int) -> TokenEvent:
    return token_from_row((
        index, int(d["token_id"]), str(d["text"]), str(d.get("token_text", d["text"])), d.get("logprob"),
        d.get("sampler_logprob"), int(d.get("rank", 0)), float(d.get("entropy", 0.0)), int(bool(d.get("forced"))),
        int(bool(d.get("special"))), json.dumps(d.get("alternatives") or {"m": [], "s": []}),
    ))


def _node_json(node: LoomNode) -> dict[str, Any]:
    return {
        "start": node.start, "text": node.text(), "token_ids": [t.token_id for t in node.tokens],
        "logprobs": [t.logprob if math.isfinite(t.logprob) else None for t in node.tokens],
        "path_logprob": node.path_logprob, "unexplored_mass": node.unexplored_mass,
        "answers": node.message_ids, "children": [_node_json(c) for c in node.children],
    }


def _prompt_messages(conv: Conversation, question: Message, answers: list[Message]) -> list[dict[str, str]]:
    """The messages the answers were generated from: earlier reasoning left out as their request says it was."""
    doc = next((m.request["reasoning"] for m in answers if m.request and m.request.get("reasoning")), None)
    return reasoning.prompt_history(conv.history(question), reasoning.ReasoningFormat.from_dict(doc))


def export_tree(conv: Conversation, message: Message) -> dict[str, Any]:
    """The tree of `message`'s answer group as JSON: the prompt, every answer whole (tokens, log-probs,
    alternatives, settings, seed) and the tree drawn from them."""
    question, answers = answer_group(conv, message)
    return {
        "format": FORMAT, "version": VERSION, "title": conv.title,
        "messages": _prompt_messages(conv, question, answers),
        "answers": [
            {
                "id": m.id, "branch_index": m.branch_index, "finish_reason": m.finish_reason,
                "request": m.request, "model": m.model,
                "seed": (m.stats or {}).get("seed"), "stats": m.stats,
                "tokens": [_token_json(t) for t in conv.tokens(m)],
            }
            for m in answers
        ],
        "tree": _node_json(build_tree(conv, answers)),
    }


class LoomImportError(ValueError):
    """The file is not a loom tree this version can read."""


def import_tree(library, doc: Any) -> tuple[Conversation, Message]:
    """A new conversation holding an exported tree: its prompt, then every answer as a branch.

    Returns the conversation and its question (the answers' parent). Raises LoomImportError in words.
    """
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise LoomImportError("this file is not a Logit Lab loom tree (its \"format\" is not \"logitlab-loom\")")
    if not isinstance(doc.get("version"), int) or doc["version"] > VERSION:
        raise LoomImportError(f"this loom tree has version {doc.get('version')!r}; this Logit Lab reads version {VERSION}")
    messages, answers = doc.get("messages"), doc.get("answers")
    if not isinstance(messages, list) or not isinstance(answers, list) or not answers:
        raise LoomImportError("this loom tree has no prompt or no answers")
    try:
        parsed = [[_token_from_json(t, i) for i, t in enumerate(a["tokens"])] for a in answers]
    except (KeyError, TypeError, ValueError) as e:
        raise LoomImportError(f"a token of this loom tree cannot be read ({type(e).__name__}: {e})") from None
    system = next((m.get("content", "") for m in messages if isinstance(m, dict) and m.get("role") == "system"), "")
    conv = library.new(system_prompt=system)
    parent = None
    for m in messages:
        if isinstance(m, dict) and m.get("role") in ("user", "assistant"):
            parent = conv.add_message(parent, m["role"], str(m.get("content", "")))
            if parent.is_assistant:
                conv.update_message(parent, finish_reason="eos")
    if parent is None or parent.role != "user":
        raise LoomImportError("this loom tree's prompt does not end with a user message")
    question = parent
    for a, tokens in zip(answers, parsed):
        answer = conv.add_message(question, "assistant", branch_index=a.get("branch_index"), request=a.get("request"),
                                  model=a.get("model"))
        conv.set_tokens(answer, tokens, "".join(t.text for t in tokens))
        stats = a.get("stats") if isinstance(a.get("stats"), dict) else ({"seed": a["seed"]} if a.get("seed") is not None else None)
        conv.update_message(answer, finish_reason=a.get("finish_reason") or "length", stats=stats)
    conv.flush()
    if doc.get("title"):
        conv.set_title(str(doc["title"]))
    return conv, question
