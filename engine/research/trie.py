"""A token trie caching next-token logprobs and KV states by prefix (genlm-backend style).

Every node is a token prefix. A node may hold the normalized next-token
logprobs after that prefix (full vocabulary, float32) and the KV state of the
prefix. A request for a prefix that is cached returns at once; a request
extending a node with a KV state runs only the tokens past that node.

The whole cache is bounded: logprob rows and KV states share one byte budget
(`budget_bytes`), and the least recently used of them goes first. A row is
not small (Gemma 3's 262k-token vocabulary makes 1 MiB per prefix), so a
research loop over thousands of prefixes would otherwise grow without end.
KV states have a budget of their own as well (`kv_budget_bytes`). Nodes left
with nothing cached and no children are removed, so the tree itself stays
as small as what it caches.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# One node's own bookkeeping (the object, its entry in the parent's dict), counted against the budget: a
# long prefix is one node per token, and a cache of long prefixes must not hide its tree.
NODE_OVERHEAD_BYTES = 200


@dataclass(eq=False)
class Node:
    depth: int
    parent: "Node | None" = None
    token: int = -1
    children: dict[int, "Node"] = field(default_factory=dict)
    logprobs: np.ndarray | None = None  # (V,) float32
    state: Any = None  # the backend's KV state for the prefix ending here
    state_bytes: int = 0


class TokenTrie:
    """Prefix -> (logprobs, KV state), least recently used evicted past the byte budgets.

    Args:
        budget_bytes: the most the cached rows and KV states may hold together.
        state_nbytes: how many bytes a backend's KV state holds.
        kv_budget_bytes: the most the KV states may hold (None: as `budget_bytes`).
    """

    def __init__(self, budget_bytes: int, state_nbytes: Callable[[Any], int], kv_budget_bytes: int | None = None):
        if budget_bytes < 0 or (kv_budget_bytes is not None and kv_budget_bytes < 0):
            raise ValueError("cache budgets are byte counts, 0 or more")
        self.budget_bytes = int(budget_bytes)
        self.kv_budget_bytes = int(budget_bytes if kv_budget_bytes is None else kv_budget_bytes)
        self._state_nbytes = state_nbytes
        self.root = Node(0)
        # (id(node), "row" | "kv") -> node, oldest first: every cached row and KV state, in the order last used.
        self._lru: OrderedDict[tuple[int, str], Node] = OrderedDict()
        self.kv_bytes = 0
        self.row_bytes = 0
        self.nodes = 0  # besides the root

    @property
    def nbytes(self) -> int:
        """What the cache holds now: rows, KV states and the tree's nodes."""
        return self.kv_bytes + self.row_bytes + self.nodes * NODE_OVERHEAD_BYTES

    def __len__(self) -> int:
        """How many rows and KV states are cached."""
        return len(self._lru)

    def node(self, tokens: Sequence[int], create: bool = False) -> Node | None:
        n = self.root
        for t in tokens:
            child = n.children.get(t)
            if child is None:
                if not create:
                    return None
                child = n.children[t] = Node(n.depth + 1, n, t)
                self.nodes += 1
            n = child
        return n

    def cached_logprobs(self, tokens: Sequence[int]) -> np.ndarray | None:
        n = self.node(tokens)
        if n is None or n.logprobs is None:
            return None
        self._lru.move_to_end((id(n), "row"))
        return n.logprobs

    def deepest_state(self, tokens: Sequence[int]) -> tuple[int, Any]:
        """(length, state) of the longest prefix of `tokens` that has a KV state; (0, None) if none."""
        best_len, best, n = 0, None, self.root
        for t in tokens:
            child = n.children.get(t)
            if child is None:
                break
            n = child
            if n.state is not None:
                best_len, best = n.depth, n
        if best is None:
            return 0, None
        self._lru.move_to_end((id(best), "kv"))
        return best_len, best.state

    def store(self, tokens: Sequence[int], logprobs: np.ndarray, state: Any = None) -> None:
        """Cache `logprobs` (and `state`) for `tokens`; what does not fit the budget is not kept."""
        row = int(logprobs.nbytes)
        size = self._state_nbytes(state) if state is not None else 0
        if row + len(tokens) * NODE_OVERHEAD_BYTES > self.budget_bytes:  # not even this one row fits
            return
        n = self.node(tokens, create=True)
        assert n is not None
        if n.logprobs is None:
            self.row_bytes += row
        n.logprobs = logprobs
        self._lru[(id(n), "row")] = n
        self._lru.move_to_end((id(n), "row"))
        if state is not None and n.state is None and size <= self.kv_budget_bytes and row + size <= self.budget_bytes:
            n.state, n.state_bytes = state, size
            self.kv_bytes += size
            self._lru[(id(n), "kv")] = n
        self._evict()

    def _evict(self) -> None:
        while (self.nbytes > self.budget_bytes or self.kv_bytes > self.kv_budget_bytes) and self._lru:
            only_kv = self.nbytes <= self.budget_bytes  # over the KV budget alone: evict the oldest KV state
            key = next((k for k in self._lru if k[1] == "kv"), None) if only_kv else next(iter(self._lru))
            if key is None:
                break
            old = self._lru.pop(key)
            if key[1] == "kv":
                self.kv_bytes -= old.state_bytes
                old.state, old.state_bytes = None, 0
            else:
                self.row_bytes -= int(old.logprobs.nbytes) if old.logprobs is not None else 0
                old.logprobs = None
            self._prune(old)

    def _prune(self, n: Node) -> None:
        """Remove `n` and its ancestors while they hold nothing and lead nowhere."""
        while n.parent is not None and n.logprobs is None and n.state is None and not n.children:
            del n.parent.children[n.token]
            self.nodes -= 1
            n = n.parent

    def clear(self) -> None:
        self.root = Node(0)
        self._lru.clear()
        self.kv_bytes = 0
        self.row_bytes = 0
        self.nodes = 0
