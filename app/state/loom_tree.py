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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import TokenEvent, reasoning, write_text_atomic

from app.state.conversation import Conversation, Message
from app.state.json_safe import dumps as json_dumps
from app.state.loom_import import FORMAT, VERSION, LoomImportError, import_loom_file, import_tree, read_loom_file
from app.state.database.records import alternatives_json

SHORT_CHARS = 32
MAX_EXPORT_DEPTH = 200  # levels of the "tree" summary written; deeper forks are in the answers (the import reads those)


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
        n, node = 0, self.parent
        while node is not None:  # a loop: an imported tree may be thousands of forks deep
            n, node = n + 1, node.parent
        return n

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

    def walk(self) -> Iterator[LoomNode]:
        """This node and every node below it, depth first, children in order (a stack, not recursion:
        an imported tree may be thousands of forks deep)."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def find(self, message_id: int, index: int) -> "LoomNode | None":
        """The node holding token `index` of answer `message_id`."""
        for node in self.walk():
            if message_id in node.message_ids and node.start <= index < node.end:
                return node
        return None


def answer_group(conv: Conversation, message: Message) -> tuple[Message, list[Message]]:
    """The question `message` answers (or is) and all its answers, oldest first."""
    parent = message if message.role == "user" else conv.messages[message.parent_id]  # type: ignore[index]  # an answer has a parent
    return parent, [m for m in conv.children(parent.id) if m.is_assistant]


def build_tree(conv: Conversation, answers: list[Message]) -> LoomNode:
    """The token tree of `answers` (siblings of one question)."""
    for root in grow_tree(conv, answers):
        pass
    return root


def grow_tree(conv: Conversation, answers: list[Message]) -> Iterator[LoomNode]:
    """`build_tree` an answer at a time: the root after each answer is in, and last the finished root. A big
    group (thousands of answers, hundreds of thousands of tokens to read) is then built between a window's
    events instead of freezing it."""
    root = LoomNode(0, [], [m.id for m in answers], 0.0)
    for m in answers:
        _insert(root, m.id, conv.tokens(m))
        yield root
    _recompute(root)
    yield root


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


def _recompute(top: LoomNode) -> None:
    for node in top.walk():  # parents before children: each adds its run to its parent's path
        base = node.parent.path_logprob if node.parent is not None else 0.0
        node.path_logprob = base + sum(t.logprob for t in node.tokens if math.isfinite(t.logprob))
        node.children.sort(key=lambda c: -c.branch_prob)  # likeliest branch first


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


def _node_json(root: LoomNode) -> dict[str, Any]:
    """The tree as nested JSON, built without recursion and cut at `MAX_EXPORT_DEPTH` levels (a node whose
    children were left out says how many): JSON readers refuse documents nested much deeper."""

    def one(node: LoomNode) -> dict[str, Any]:
        return {
            "start": node.start, "text": node.text(), "token_ids": [t.token_id for t in node.tokens],
            "logprobs": [t.logprob if math.isfinite(t.logprob) else None for t in node.tokens],
            "path_logprob": node.path_logprob, "unexplored_mass": node.unexplored_mass,
            "answers": node.message_ids, "children": [],
        }

    top = one(root)
    stack = [(root, top, 0)]
    while stack:
        node, doc, level = stack.pop()
        if node.children and level >= MAX_EXPORT_DEPTH:
            doc["children_left_out"] = len(node.children)
            continue
        for c in node.children:
            child = one(c)
            doc["children"].append(child)
            stack.append((c, child, level + 1))
    return top


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


def write_loom_file(path: str | Path, conv: Conversation, message: Message) -> None:
    """Export `message`'s tree to `path` as standard JSON (a banned token's bias is `false`, other non-finite
    numbers strings such as "-inf": app/state/json_safe.py), written whole or not at all."""
    text = json_dumps(export_tree(conv, message), ensure_ascii=False, indent=1)
    write_text_atomic(path, text)


# The import lives in app/state/loom_import.py (it checks a whole file before writing any of it).
__all__ = ["FORMAT", "VERSION", "LoomImportError", "LoomNode", "answer_group", "build_tree", "export_tree",
           "import_loom_file", "import_tree", "read_loom_file", "representative", "write_loom_file"]
