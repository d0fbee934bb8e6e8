"""Batch generation (FlexLLMGen `OptLM.generate` shape): one batched forward per step for all rows.

The output is one (B, W + max_new_tokens) array: each prompt right-aligned in the first W columns, then
what the row generated. Every cell that holds no token is `PAD` (-1), never a token id: a real pad id
would read as text (SmolLM2's pad id 2 is its `<|im_end|>`, an end-of-sequence token). A row stops at the
model's end-of-sequence tokens by default (kept, then `PAD`); `Generation.lengths` says how many tokens
each row generated.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.capabilities import BatchRunner
from engine.decode.loop import check_context
from engine.errors import ContextLengthError
from engine.sampling import SamplerChain, SamplerSettings
from engine.sampling.dry import Vocabulary


PAD = -1  # an output cell without a token (before a short prompt, after a stop): no token has this id


@dataclass(frozen=True)
class Generation:
    """`LanguageModel.generate_output`: the ids, the model's log-probs of the generated tokens, per-row lengths.

    Attributes:
        sequences: (B, prompt_width + max_new_tokens) int64; prompts right-aligned, `PAD` (-1) where no token is.
        logprobs: (B, max_new_tokens) float32 model log-probs of the generated tokens; NaN after a row stopped.
        lengths: (B,) how many tokens each row generated, its stop token included.
        prompt_width: columns before the generated ones (the longest prompt).
    """

    sequences: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    prompt_width: int

    @classmethod
    def from_arrays(cls, sequences: np.ndarray, logprobs: np.ndarray) -> "Generation":
        lengths = (~np.isnan(logprobs)).sum(axis=1).astype(np.int64)  # a generated token's log-prob is a number
        return cls(sequences, logprobs, lengths, sequences.shape[1] - logprobs.shape[1])

    def generated(self, row: int) -> list[int]:
        """The ids row `row` generated, its stop token included, no padding."""
        start = self.prompt_width
        return [int(t) for t in self.sequences[row, start : start + int(self.lengths[row])]]


def stop_ids(stop: int | Iterable[int] | None, eos_token_ids: Iterable[int]) -> set[int]:
    """The ids that end a row: `stop` when given (`()`: none, run to max_new_tokens), else end-of-sequence."""
    if stop is None:
        return {int(t) for t in eos_token_ids}
    if isinstance(stop, (int, np.integer)):
        return {int(stop)}
    return {int(t) for t in stop}


def settings_for(
    sampler: SamplerSettings | None, seed: int | None, *, temperature: float = 1.0, top_k: int = 0,
    top_p: float = 1.0, greedy: bool = False,
) -> SamplerSettings:
    """The settings a run samples with: `sampler` (its own seed, else `seed`), or the simple knobs.

    ValueError when both are given: a temperature beside a `SamplerSettings` would be silently ignored.
    """
    if sampler is None:
        return SamplerSettings(temperature=0.0 if greedy else temperature, top_k=top_k, top_p=top_p, seed=seed)
    if not isinstance(sampler, SamplerSettings):
        raise TypeError(f"sampler must be a SamplerSettings, got {type(sampler).__name__}")
    if (temperature, top_k, top_p) != (1.0, 0, 1.0):
        raise ValueError("give either sampler=SamplerSettings(...) or temperature/top_k/top_p, not both "
                         "(put them in the SamplerSettings)")
    return sampler if sampler.seed is not None else sampler.with_(seed=seed)


def as_rows(inputs: np.ndarray | Sequence[Sequence[int]]) -> list[list[int]]:
    rows = [list(map(int, r)) for r in (inputs.tolist() if isinstance(inputs, np.ndarray) else inputs)]
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("every input row needs at least one token")
    return rows


def check_rows_fit(rows: Sequence[Sequence[int]], max_new_tokens: int, context_length: int) -> None:
    """ContextLengthError naming the first row whose prompt plus `max_new_tokens` exceeds the context (0 = unknown)."""
    for i, row in enumerate(rows):
        try:
            check_context(len(row), max_new_tokens, context_length)
        except ContextLengthError as e:
            raise ContextLengthError(f"prompt {i}: {e}" if len(rows) > 1 else str(e)) from None


def generate_batch(
    runner: BatchRunner,
    inputs: np.ndarray | Sequence[Sequence[int]],
    *,
    max_new_tokens: int = 32,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    stop: int | Sequence[int] | None = None,
    seed: int | None = None,
    pad_id: int = 0,
    context_length: int = 0,
    eos_token_ids: Iterable[int] = (),
    sampler: SamplerSettings | None = None,
    vocab: Vocabulary | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(B, prompt_len + max_new_tokens) ids and (B, max_new_tokens) model logprobs of the generated tokens.

    Prompts are right-aligned after `PAD` (-1) cells. A row that emits a stop id (`stop`, or by default one of
    `eos_token_ids`; `stop=()` never stops) keeps it and has `PAD` after it; the loop ends early once every
    row has stopped. `pad_id` is what the runner is fed for a stopped row (a real id; its output is ignored).
    `sampler` (a `SamplerSettings`: every stage) replaces `do_sample`/`temperature`/`top_k`/`top_p`; its seed,
    when set, replaces `seed`; `vocab` (the tokenizer) serves DRY's sequence breakers. Row r samples with seed
    `seed + r`, so a row's tokens do not depend on which other rows share the batch.
    Every row is checked against `context_length` (the model's; 0 = unchecked) before any forward pass.
    """
    rows = as_rows(inputs)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    check_rows_fit(rows, max_new_tokens, context_length)
    if sampler is not None and do_sample:
        raise ValueError("do_sample goes with temperature/top_k/top_p; a sampler=SamplerSettings(...) samples "
                         "unless its temperature is 0")
    settings = settings_for(sampler, seed, temperature=temperature, top_k=top_k, top_p=top_p,
                            greedy=sampler is None and not do_sample)
    # A fresh SeedSequence draws its entropy as one int.
    base_seed = settings.seed if settings.seed is not None else int(np.random.SeedSequence().entropy % 2**62)  # type: ignore[operator]  # numpy: int | Sequence | None
    chains = [SamplerChain(settings.with_(seed=base_seed + r), vocab) for r in range(len(rows))]
    width = max(len(r) for r in rows)
    out = np.full((len(rows), width + max_new_tokens), PAD, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, width - len(r) : width] = r
    stops = stop_ids(stop, eos_token_ids)
    logprobs = np.full((len(rows), max_new_tokens), np.nan, dtype=np.float32)  # NaN where a row had stopped
    done = np.zeros(len(rows), dtype=bool)
    logits = runner.start(rows)  # (B, V)
    for step in range(max_new_tokens):
        tokens = [pad_id] * len(rows)
        for i, chain in enumerate(chains):
            if done[i]:
                continue
            history = out[i, width - len(rows[i]) : width + step]
            pick = chain.pick(logits[i], history, top_n=0)
            tokens[i] = pick.token_id
            out[i, width + step] = tokens[i]
            logprobs[i, step] = pick.logprob
            done[i] = tokens[i] in stops
        if done.all() or step == max_new_tokens - 1:
            break
        logits = runner.step(tokens)  # finished rows feed a pad; their outputs are ignored
    return out, logprobs
