"""The prefix a batch of training prompts share (the chat template's opening, a persona): read once.

Both backends that read layer outputs for training (llama.cpp, torch) run this prefix one time and continue
every prompt from its cached state, instead of running it with each prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.backend import shared_prefix_length as common_shared_prefix

MIN_SHARED = 8  # tokens: a shorter shared prefix is run with each prompt rather than reused


def shared_prefix_length(seqs: Sequence[Sequence[int]]) -> int:
    """Tokens every one of `seqs` begins with, leaving each at least its last token to run (0 below MIN_SHARED,
    or for a single prompt)."""
    return common_shared_prefix(seqs, MIN_SHARED)
