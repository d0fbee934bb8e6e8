"""llama.cpp's own decode loop with its own sampler chain, through llama-cpp-python's low-level API.

The peer that bench/llamacpp_decode.py measures the app against: per token one
`llama_decode` of a one-token batch and one `llama_sampler_sample` on a
`llama_sampler_chain` built from the same `SamplerSettings` (penalties,
top-nσ, top-k, typical, top-p, min-p, XTC, temperature, then `dist`; greedy
when the temperature is 0), with the prompt accepted into the chain first, as
llama.cpp's server does, so the penalties see the same history as ours.
Nothing crosses into Python per token but the token id: this is the loop a C
program would run.
"""

from __future__ import annotations

from collections.abc import Iterator

import llama_cpp as L

from engine.sampling import SamplerSettings


def build_chain(settings: SamplerSettings, n_vocab: int, seed: int):
    """A `llama_sampler_chain` doing what `settings` asks, in its order; raises on a stage it cannot map."""
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    s = settings

    def add(sampler) -> None:
        L.llama_sampler_chain_add(chain, sampler)

    for name in s.order:
        if name == "penalties":
            if s.penalty_last_n != 0 and (s.repetition_penalty != 1 or s.presence_penalty or s.frequency_penalty):
                add(L.llama_sampler_init_penalties(n_vocab, s.penalty_last_n, s.repetition_penalty,
                                                   s.frequency_penalty, s.presence_penalty))
        elif name == "top_n_sigma":
            if s.top_n_sigma > 0:
                add(L.llama_sampler_init_top_n_sigma(s.top_n_sigma))
        elif name == "top_k":
            if s.top_k > 0:
                add(L.llama_sampler_init_top_k(s.top_k))
        elif name == "typical_p":
            if s.typical_p < 1:
                add(L.llama_sampler_init_typical(s.typical_p, 0))
        elif name == "top_p":
            if s.top_p < 1:
                add(L.llama_sampler_init_top_p(s.top_p, 0))
        elif name == "min_p":
            if s.min_p > 0:
                add(L.llama_sampler_init_min_p(s.min_p, 0))
        elif name == "xtc":
            if s.xtc_probability > 0:
                add(L.llama_sampler_init_xtc(s.xtc_probability, s.xtc_threshold, 0, seed))
        elif name == "temperature":
            if s.temperature > 0 and (s.temperature != 1 or s.dynatemp_range > 0):
                add(L.llama_sampler_init_temp_ext(s.temperature, s.dynatemp_range, s.dynatemp_exponent))
        elif _is_on(name, s):
            raise ValueError(f"the reference loop has no llama.cpp sampler mapped for the stage {name!r}")
    add(L.llama_sampler_init_greedy() if s.greedy else L.llama_sampler_init_dist(seed))
    return chain


def _is_on(name: str, s: SamplerSettings) -> bool:
    """Whether a stage the reference does not map would run in our chain (then the comparison is unfair)."""
    return {
        "grammar": False,  # a constraint is a request's, not a preset's
        "logit_bias": bool(s.logit_bias),
        "dry": s.dry_multiplier > 0 and s.dry_penalty_last_n != 0,
        "smoothing": s.smoothing_factor > 0,
        "mirostat": s.mirostat != 0,
        "adaptive_p": s.adaptive_target >= 0,
    }.get(name, True)


def decode_steps(llm, prompt_ids: list[int], n: int, settings: SamplerSettings, seed: int) -> Iterator[int]:
    """Generate `n` tokens after `prompt_ids` on `llm` (a `llama_cpp.Llama`), yielding each token once chosen.

    The cache is cleared first, so each run prefills the prompt anew. Between two tokens: one
    `llama_decode` of the last token, one `llama_sampler_sample`.
    """
    ctx = llm.ctx
    L.llama_memory_clear(L.llama_get_memory(ctx), True)
    chain = build_chain(settings, llm.n_vocab(), seed)
    try:
        for t in prompt_ids:
            L.llama_sampler_accept(chain, t)
        n_batch = llm.n_batch
        for lo in range(0, len(prompt_ids), n_batch):
            part = prompt_ids[lo : lo + n_batch]
            arr = (L.llama_token * len(part))(*part)
            if L.llama_decode(ctx, L.llama_batch_get_one(arr, len(part))) != 0:
                raise RuntimeError("llama_decode failed on the prompt")
        one = (L.llama_token * 1)()
        batch = L.llama_batch_get_one(one, 1)
        for i in range(n):
            if i:
                if L.llama_decode(ctx, batch) != 0:
                    raise RuntimeError("llama_decode failed (the context is full?)")
            token = L.llama_sampler_sample(chain, ctx, -1)  # applies the chain, draws, accepts the token
            one[0] = token
            yield token
    finally:
        L.llama_sampler_free(chain)
