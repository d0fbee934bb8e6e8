"""llama.cpp's own samplers as oracles, through llama-cpp-python's low-level API.

`apply(sampler, x)` runs a `llama_sampler` on one row of logits the way
llama.cpp does (a `llama_token_data_array` in token-id order, unsorted) and
returns the surviving (ids, logits). llama.cpp drops a removed token from
the array (top-k, top-p, ...) or sets its logit to -inf (top-nσ); both count
as removed here. `compare` checks that our stage kept the same tokens and
gives the same distribution (softmax over the survivors) to 1e-6.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable

import llama_cpp as L
import numpy as np

TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")], align=False)
assert TOKEN_DATA.itemsize == ctypes.sizeof(L.llama_token_data)


class Sampler:
    """A llama_sampler that frees itself."""

    def __init__(self, ptr) -> None:
        assert ptr, "llama.cpp refused the sampler's parameters"
        self.ptr = ptr

    def accept(self, tokens: Iterable[int]) -> "Sampler":
        for t in tokens:
            L.llama_sampler_accept(self.ptr, int(t))
        return self

    def __del__(self) -> None:
        if getattr(self, "ptr", None):
            L.llama_sampler_free(self.ptr)
            self.ptr = None


def chain(*samplers: Sampler) -> Sampler:
    c = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    for s in samplers:
        L.llama_sampler_chain_add(c, s.ptr)
        s.ptr = None  # the chain owns it now
    return Sampler(c)


def apply(sampler: Sampler, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Run `sampler` on `x`; return (surviving ids, their logits, the selected id or -1)."""
    n = x.size
    arr = (L.llama_token_data * n)()
    data = np.frombuffer(arr, dtype=TOKEN_DATA)
    data["id"] = np.arange(n)
    data["logit"] = x
    data["p"] = 0.0
    cur = L.llama_token_data_array(data=arr, size=n, selected=-1, sorted=False)
    L.llama_sampler_apply(sampler.ptr, ctypes.byref(cur))
    # XTC moves the data pointer forward instead of copying: read from where it points now.
    start = (ctypes.cast(cur.data, ctypes.c_void_p).value - ctypes.addressof(arr)) // TOKEN_DATA.itemsize
    view = data[start : start + cur.size]
    selected = int(view["id"][cur.selected]) if cur.selected >= 0 else -1
    keep = view["logit"] > -np.inf
    return view["id"][keep].copy(), view["logit"][keep].copy(), selected


def softmax_of(ids: np.ndarray, logits: np.ndarray) -> dict[int, float]:
    z = logits.astype(np.float64)
    p = np.exp(z - z.max())
    p /= p.sum()
    return dict(zip(ids.tolist(), p.tolist()))


def ours_as_dist(scores: np.ndarray) -> dict[int, float]:
    ids = np.flatnonzero(scores > -np.inf)
    return softmax_of(ids, scores[ids])


def compare(ours: np.ndarray, theirs: tuple[np.ndarray, np.ndarray, int], may_differ: Iterable[int] = (), atol: float = 1e-6) -> None:
    """Same survivors (but for `may_differ`, tokens at a float-rounding boundary) and distributions within atol."""
    mine = ours_as_dist(ours)
    other = softmax_of(theirs[0], theirs[1])
    allowed = set(may_differ)
    only_mine = set(mine) - set(other) - allowed
    only_theirs = set(other) - set(mine) - allowed
    assert not only_mine and not only_theirs, (
        f"survivors differ: {len(mine)} ours vs {len(other)} llama.cpp; only ours {sorted(only_mine)[:10]}, "
        f"only llama.cpp {sorted(only_theirs)[:10]}"
    )
    if set(mine) != set(other):  # a boundary token kept by one side: compare the rest, renormalized
        common = set(mine) & set(other)
        zm = sum(mine[t] for t in common)
        zo = sum(other[t] for t in common)
        mine = {t: mine[t] / zm for t in common}
        other = {t: other[t] / zo for t in common}
    worst = max(abs(mine[t] - other[t]) for t in mine)
    assert worst <= atol, f"distributions differ by {worst:.3g}"


def mass_boundary(x: np.ndarray, p: float, typical: bool, tol: float = 2e-4) -> set[int]:
    """Tokens where the mass before them, in the stage's order, is within `tol` of `p`.

    llama.cpp adds the probabilities in float32, we in float64; over tens of thousands of tokens the sums
    part by up to ~1e-4 (seen: 18,047 vs 18,049 tokens kept on a flat row), so a token whose preceding
    mass is that close to p may be kept by one side only. Only flat rows have tokens that small at the cut.
    """
    finite = np.isfinite(x)
    z = np.where(finite, x.astype(np.float64), -np.inf)
    m = z[finite].max()
    logp = z - (m + np.log(np.exp(z[finite] - m).sum()))
    prob = np.exp(logp)
    if typical:
        ent = -(prob[finite] * logp[finite]).sum()
        key = np.where(finite, np.abs(-logp - ent), np.inf)
    else:
        key = -z
    order = np.argsort(key, kind="stable")
    before = np.cumsum(prob[order]) - prob[order]
    near = (np.abs(before - p) <= tol) | (np.abs(before + prob[order] - p) <= tol)
    edge = key[order[near]]
    # llama.cpp orders by its float32 key: tokens whose keys are that close to an edge token's may swap with it.
    close = np.zeros(x.size, dtype=bool)
    for k in edge:
        close |= np.abs(key - k) <= 3e-4  # llama.cpp's float32 entropy over 49k tokens is off by ~1e-4, twice that between two keys
    return set(order[near].tolist()) | set(np.flatnonzero(close).tolist())


class Vocab:
    """The default GGUF's vocabulary (vocab_only), for DRY's breakers and logit bias texts."""

    def __init__(self, path: str) -> None:
        L.llama_backend_init()
        params = L.llama_model_default_params()
        params.vocab_only = True
        self.model = L.llama_model_load_from_file(path.encode(), params)
        assert self.model, f"llama.cpp could not read {path}"
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n = int(L.llama_vocab_n_tokens(self.vocab))

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp server's tokenization of a logit bias text (common_tokenize, no special tokens)."""
        raw = text.encode()
        ids = (L.llama_token * (len(raw) + 4))()
        n = L.llama_tokenize(self.vocab, raw, len(raw), ids, len(ids), False, False)
        return list(ids[:n])

    def close(self) -> None:
        L.llama_model_free(self.model)
