"""A token trie caching next-token logprobs and KV states by prefix (genlm-backend style).

Every node is a token prefix. A node may hold the normalized next-token
logprobs after that prefix (full vocabulary, float32) and the KV state of the
prefix. A request for a prefix that is cached returns at once; a request
extending a node with a KV state runs only the tokens past that node. KV
states are evicted least-recently-used once their bytes exceed the budget;
logprobs are small enough to keep until `clear`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(eq=False)
class Node:
    depth: int
    children: dict[int, "Node"] = field(default_factory=dict)
    logprobs: np.ndarray | None = None  # (V,) float32
    state: Any = None  # the backend's KV state for the prefix ending here
    state_bytes: int = 0


class TokenTrie:
    def __init__(self, kv_budget_bytes: int, state_nbytes: Callable[[Any], int]):
        self.kv_budget_bytes = kv_budget_bytes
        self._state_nbytes = state_nbytes
        self.root = Node(0)
        self._lru: OrderedDict[int, Node] = OrderedDict()  # id(node) -> node holding a state, oldest first
        self.kv_bytes = 0

    def node(self, tokens: Sequence[int], create: bool = False) -> Node | None:
        n = self.root
        for t in tokens:
            child = n.children.get(t)
            if child is None:
                if not create:
                    return None
                child = n.children[t] = Node(n.depth + 1)
            n = child
        return n

    def cached_logprobs(self, tokens: Sequence[int]) -> np.ndarray | None:
        n = self.node(tokens)
        return None if n is None else n.logprobs

    def deepest_state(self, tokens: Sequence[int]) -> tuple[int, Any]:
        """(length, state) of the longest prefix of `tokens` that has a KV state; (0, None) if none."""
        best_len, best, n = 0, None, self.root
        for t in tokens:
            n = n.children.get(t)
            if n is None:
                break
            if n.state is not None:
                best_len, best = n.depth, n
        if best is None:
            return 0, None
        self._lru.move_to_end(id(best))
        return best_len, best.state

    def store(self, tokens: Sequence[int], logprobs: np.ndarray, state: Any = None) -> None:
        n = self.node(tokens, create=True)
        assert n is not None
        n.logprobs = logprobs
        if state is not None and n.state is None:
            size = self._state_nbytes(state)
            if size <= self.kv_budget_bytes:
                n.state, n.state_bytes = state, size
                self.kv_bytes += size
                self._lru[id(n)] = n
                self._evict()

    def _evict(self) -> None:
        while self.kv_bytes > self.kv_budget_bytes and self._lru:
            _, old = self._lru.popitem(last=False)
            self.kv_bytes -= old.state_bytes
            old.state, old.state_bytes = None, 0

    def clear(self) -> None:
        self.root = Node(0)
        self._lru.clear()
        self.kv_bytes = 0
