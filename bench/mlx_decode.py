"""MLX decode speed with our inspection on vs `mlx_lm.stream_generate` on the same model, same process.

    python bench/mlx_decode.py [--model SPEC] [--new-tokens 128] [--rounds 3] [--preset NAME [--record-stages]]

Both greedy (or both with a preset of the window: its temperature, top-k,
top-p, min-p, XTC and repetition penalty, given to mlx-lm's `make_sampler`
and `make_logits_processors`), both ignore EOS, both timed the same way:
tokens after the first over the time after the first, the two runs of a
round in alternating order. Ours computes top-20 alternatives + entropy per
token with our numpy sampler (and, with `--record-stages`, every stage),
building each token's report while MLX computes the next one
(`mx.async_eval`); mlx-lm samples on device. Last line: ratio_vs_mlx_lm=X.XX
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402
from mlx_lm import load as mlx_load  # noqa: E402
from mlx_lm import stream_generate  # noqa: E402

from engine.backends.mlx.backend import MlxBackend  # noqa: E402
from engine.decode.loop import generate_events  # noqa: E402
from engine.sources import materialize, resolve_spec  # noqa: E402
from engine.quiet import quiet_third_party  # noqa: E402
from engine.request import GenerationRequest  # noqa: E402
from engine.sampling.settings import SamplerSettings  # noqa: E402

PROMPT = "Write a detailed, friendly explanation of how rainbows form, covering sunlight, droplets and refraction."


def ours(backend: MlxBackend, prompt_ids: list[int], n: int, settings: SamplerSettings, record: bool) -> float:
    backend.trim_cache(0)
    req = GenerationRequest(prompt_ids=tuple(prompt_ids), sampler=settings, max_new_tokens=n, top_n=20,
                            ignore_eos=True, record_stages=record)
    stats = list(generate_events(backend, req))[-1].stats
    assert stats.generated_tokens == n
    return stats.decode_tokens_per_s


def theirs(model, tokenizer, prompt_ids: list[int], n: int, settings: SamplerSettings) -> float:
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    s = settings
    sampler = make_sampler(temp=s.temperature, top_p=s.top_p if s.top_p < 1 else 0.0, min_p=s.min_p, top_k=s.top_k,
                           xtc_probability=s.xtc_probability, xtc_threshold=s.xtc_threshold)
    processors = make_logits_processors(repetition_penalty=s.repetition_penalty if s.repetition_penalty != 1 else None,
                                        repetition_context_size=s.penalty_last_n)
    times = [time.perf_counter() for _ in stream_generate(model, tokenizer, prompt_ids, max_tokens=n, sampler=sampler,
                                                          logits_processors=processors)]
    assert len(times) == n, len(times)
    return (n - 1) / (times[-1] - times[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--preset", default="Greedy", help="a preset of the window (Greedy, Balanced, Creative)")
    ap.add_argument("--record-stages", action="store_true", help="record every stage, as the window does")
    args = ap.parse_args()
    from app.state.settings import BUILTIN_PRESETS

    settings = BUILTIN_PRESETS[args.preset].with_(seed=1234)
    quiet_third_party()
    source = resolve_spec(args.model)
    folder = materialize(source)
    backend = MlxBackend(folder, spec=source.spec, display_name=source.name)
    model, tokenizer = mlx_load(str(folder))
    tokenizer.eos_token_ids = set()  # run the full length, as ours does with ignore_eos
    prompt_ids = backend.tokenizer.chat_ids([{"role": "user", "content": PROMPT}])
    print(f"model {source.name}, vocab {backend.info.vocab_size}, mlx {mx.__version__} on {mx.default_device()}")
    print(f"prompt {len(prompt_ids)} tokens, {args.new_tokens} new tokens, {args.rounds} rounds after a warm-up")
    what = f"{args.preset}, top-20 + entropy" + (", stages recorded" if args.record_stages else "")
    ours(backend, prompt_ids, 8, settings, args.record_stages)
    theirs(model, tokenizer, prompt_ids, 8, settings)
    a, b = [], []
    for r in range(args.rounds):  # alternating order, so a drifting machine slows both alike
        if r % 2:
            b.append(theirs(model, tokenizer, prompt_ids, args.new_tokens, settings))
        a.append(ours(backend, prompt_ids, args.new_tokens, settings, args.record_stages))
        if not r % 2:
            b.append(theirs(model, tokenizer, prompt_ids, args.new_tokens, settings))
        print(f"round {r + 1}: ours {a[-1]:.1f} tok/s ({what}), mlx_lm.stream_generate {b[-1]:.1f} tok/s")
    print(f"ours median {statistics.median(a):.1f} tok/s, mlx_lm median {statistics.median(b):.1f} tok/s")
    print(f"ratio_vs_mlx_lm={statistics.median(a) / statistics.median(b):.2f}")


if __name__ == "__main__":
    main()
