"""The prefix a batch of training prompts share (the chat template's opening, a persona): read once.

Both backends that read layer outputs for training (llama.cpp, torch) run this prefix one time and continue
every prompt from its cached state, instead of running it with each prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

MIN_SHARED = 8  # tokens: a shorter shared prefix is run with each prompt rather than reused


def shared_prefix_length(seqs: Sequence[Sequence[int]]) -> int:
    """Tokens every one of `seqs` begins with, leaving each at least its last token to run (0 below MIN_SHARED,
    or for a single prompt)."""
    n = min(len(s) for s in seqs) - 1
    first = seqs[0]
    for s in seqs[1:]:
        i = 0
        while i < n and s[i] == first[i]:
            i += 1
        n = i
    return n if n >= MIN_SHARED and len(seqs) > 1 else 0
