"""The research runner for a model on an OpenAI-compatible server (the `remote` backend).

A server gives no logits, only its top-N log-probs per position (N as large
as it allows, see `RemoteBackend.top_n`). So each row's "logits" are those N
log-probs with -inf everywhere else; `LanguageModel` normalizes rows, which
renormalizes over the N (the same truncated distribution "we sample" mode
uses). Greedy picks and rankings inside the top N are exact; the probability
of a token outside it is 0 here, not its true (small) value.

There is no KV cache on our side: a row is its token list, one
`max_tokens=1` request per row and step, and the server's own prefix cache
makes a repeated prefix cheap. Identical rows in one call (beam search starts
with copies of the prompt) are asked once. Rows go to the server concurrently
when it takes token-id prompts and names alternatives by id (vLLM, SGLang,
llama.cpp); text-prompt servers (llama-cpp-python) get them one at a time,
since their alternatives are mapped to ids through the shared tokenizer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from engine.backends.remote.tokenizer import check_server_token_ids

log = logging.getLogger(__name__)

# Servers do not report their vocabulary size; rows must have one width for the whole run (the token trie
# stacks them), so they get one that holds every common vocabulary (Gemma's 262,144 included).
REMOTE_VOCAB = 1 << 18
PARALLEL_KINDS = ("vllm", "sglang", "llama.cpp")  # token-id prompts and alternatives by id: no tokenizer calls
MAX_PARALLEL = 8


class RemoteRunner:
    """`start`/`step`/`reorder`/`forward_rows` over a `RemoteBackend`, as the local runners offer them."""

    def __init__(self, backend: Any, pad_id: int = 0, vocab: int = REMOTE_VOCAB):
        from engine.backends.remote import UnsupportedByServerError

        if not backend.caps.we_sample_ok:
            raise UnsupportedByServerError(
                f"{backend.client.options.host} gives no token log-probs or has no tokenize endpoint, "
                "so the research APIs cannot run on it"
            )
        self.backend = backend
        self.pad_id = pad_id
        self.vocab = max(vocab, backend.vocab_size)
        self.forward_calls = 0
        self.reused_prompt_tokens: tuple[int, ...] = ()  # what a server caches of a prompt, it does not say
        self._rows: list[list[int]] = []
        parallel = backend.caps.token_prompts and backend.caps.kind in PARALLEL_KINDS
        self._pool = ThreadPoolExecutor(MAX_PARALLEL, thread_name_prefix="logitlab-remote") if parallel else None

    # --- one row --------------------------------------------------------------------

    def _prompt(self, ids: Sequence[int]) -> str | list[int]:
        b = self.backend
        check_server_token_ids(ids, b.caps.n_vocab, "prompt token id")  # sent as they are, or decoded
        if b.caps.token_prompts:
            return list(ids)
        text = b.tokenizer.text_for(ids)
        if b.tokenizer.encode(text) != list(ids):
            # A text-only server reads this text as other tokens: the answer is for its reading.
            log.warning("%s takes text prompts only and tokenizes this prompt differently from the ids given; "
                        "the log-probs are for its own tokenization", b.client.options.host)
        return text

    def _row_logits(self, ids: tuple[int, ...]) -> np.ndarray:
        from engine.backends.remote.step import next_token_top

        b = self.backend
        top = next_token_top(b.client, b.caps.model, self._prompt(ids), b.top_n, b.tokenizer, b.caps.kind)
        row = np.full(self.vocab, -np.inf, dtype=np.float32)  # (V,)
        for tid, _text, lp in top:  # best first: text-keyed duplicates keep the larger
            if tid >= self.vocab:
                raise ValueError(f"the server named token id {tid}, beyond the {self.vocab:,} ids a remote row holds")
            if np.isfinite(lp) and row[tid] == -np.inf:
                row[tid] = lp
        return row

    def _forward(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """(B, V) float32: each row's server top-N log-probs, -inf elsewhere."""
        self.forward_calls += 1
        keys = [tuple(int(t) for t in r) for r in rows]
        unique = list(dict.fromkeys(keys))
        if self._pool is not None and len(unique) > 1:
            got = dict(zip(unique, self._pool.map(self._row_logits, unique)))
        else:
            got = {k: self._row_logits(k) for k in unique}
        return np.stack([got[k] for k in keys])

    # --- the runner moves ---------------------------------------------------------------

    def start(self, prompts: Sequence[Sequence[int]]) -> np.ndarray:
        self._rows = [list(p) for p in prompts]  # no padding: each request carries its own row
        self.reused_prompt_tokens = (0,) * len(prompts)
        return self._forward(self._rows)

    def step(self, tokens: Sequence[int]) -> np.ndarray:
        # Finished rows of a batch also step (they are fed a pad and their output is ignored): one request
        # each, as a local batch computes them too.
        for row, t in zip(self._rows, tokens):
            row.append(int(t))
        return self._forward(self._rows)

    def reorder(self, rows: Sequence[int]) -> None:
        self._rows = [list(self._rows[i]) for i in rows]

    def supports_row_states(self) -> bool:
        return False  # nothing to keep between calls: the server caches prefixes itself

    def forward_rows(self, rows: Sequence[tuple[Any, Sequence[int]]], keep_states: bool = True) -> tuple[np.ndarray, list[None]]:
        """Rows given whole (no states: `supports_row_states` is False), one request each."""
        return self._forward([toks for _, toks in rows]), [None] * len(rows)

    @staticmethod
    def state_nbytes(state: Any) -> int:
        return 0

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
