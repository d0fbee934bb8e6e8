"""Decode speed of our engine on llama.cpp vs llama-cpp-python's own `Llama`, same file, same threads, same run.

    python bench/llamacpp_decode.py [--model PATH.gguf] [--tokens 64] [--memory] [--torch]

Prints tok/s for: raw `Llama.generate` greedy (llama.cpp samples, C side),
ours greedy with no inspection (top_n=0), ours greedy with top-20 + entropy
per token (the app's default inspection); then `ratio_vs_llamacpp=X.XX`
(ours with inspection / raw). With `--memory`, it also measures peak
resident memory of a fresh process loading the GGUF on llama.cpp vs the
torch conversion path (one subprocess each) and prints
`rss_ratio_vs_torch=X.XX`. With `--torch`, the same inspected generation on
our torch backend (the converted float32 model) gives `speedup_vs_torch=X.XX`,
and a cold 2,000-token prefill on both gives `prefill_ratio_vs_torch=X.XX`
(llama.cpp tok/s / torch tok/s).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def ours(backend, prompt_ids: list[int], n: int, top_n: int) -> float:
    from engine.decode import generate_events
    from engine.events import Done
    from engine.request import GenerationRequest
    from engine.sampling import SamplerSettings

    backend.trim_cache(0)
    req = GenerationRequest(prompt_ids=prompt_ids, sampler=SamplerSettings(temperature=0), max_new_tokens=n,
                            ignore_eos=True, top_n=top_n)
    done = [e for e in generate_events(backend, req) if isinstance(e, Done)][0]
    return done.stats.decode_tokens_per_s


def raw_llamacpp(path: str, backend, prompt_ids: list[int], n: int) -> float:
    from llama_cpp import Llama

    from engine.backends.llamacpp.native import use_safe_defaults_for_llama_class

    use_safe_defaults_for_llama_class()  # the same model parameters as ours (no AMX weight buffers on AMX builds)

    llm = Llama(path, n_ctx=backend.n_ctx, n_batch=backend.n_batch, n_ubatch=backend.n_batch,
                n_threads=backend.n_threads, n_threads_batch=backend.n_threads, flash_attn=True, verbose=False)
    llm.reset()
    t_first, count = None, 0
    for _ in llm.generate(prompt_ids, temp=0.0, top_k=1, reset=True):
        count += 1
        if t_first is None:
            t_first = time.perf_counter()  # same as ours: decode time runs from the first token to the last
        if count == n:
            break
    rate = (count - 1) / (time.perf_counter() - t_first)
    llm.close()
    return rate


PEAK_RSS = """
import json, resource, sys
sys.path.insert(0, {root!r})
from engine.open_model import load_model
b = load_model({spec!r}, backend={backend!r})
ids = b.tokenizer.encode("The capital of France is")
b.forward(ids)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
try:  # Linux: ru_maxrss of a child starts at its parent's peak (fork), VmHWM is this program's own
    peak = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1]) * 1024
except (OSError, StopIteration):
    pass
print(json.dumps({{"peak_rss": peak}}))
"""


def prefill_rate(backend, n: int = 2000) -> float:
    ids = (backend.tokenizer.encode(PROMPT + " ") * (n // 10 + 1))[:n]
    from engine.backends.base import prefill

    backend.trim_cache(0)
    t0 = time.perf_counter()
    prefill(backend, ids)
    return n / (time.perf_counter() - t0)


def peak_rss(spec: str | None, backend: str) -> int:
    code = PEAK_RSS.format(root=str(Path(__file__).resolve().parents[1]), spec=spec, backend=backend)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_rss"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a .gguf file (default: the default model)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="best of N for each measurement")
    parser.add_argument("--memory", action="store_true", help="also compare peak RSS with the torch path")
    parser.add_argument("--torch", action="store_true", help="also decode and prefill on the torch backend")
    args = parser.parse_args()

    from engine.backends.llamacpp import LlamaCppBackend
    from engine.sources import resolve_spec

    source = resolve_spec(args.model)
    t0 = time.perf_counter()
    backend = LlamaCppBackend(source.path, spec=source.spec, display_name=source.name)
    print(f"model {source.name} ({backend.info.quantization}, {backend.info.file_bytes / 2**20:.1f} MiB), "
          f"loaded in {time.perf_counter() - t0:.2f} s; {backend.info.device}")
    prompt = backend.tokenizer.chat_ids([{"role": "user", "content": PROMPT}])
    best = {"raw": 0.0, "ours": 0.0, "ours_inspect": 0.0}
    for _ in range(args.repeats):  # interleaved, so a busy machine slows all three alike
        best["raw"] = max(best["raw"], raw_llamacpp(str(source.path), backend, prompt, args.tokens))
        best["ours"] = max(best["ours"], ours(backend, prompt, args.tokens, top_n=0))
        best["ours_inspect"] = max(best["ours_inspect"], ours(backend, prompt, args.tokens, top_n=20))
    print(f"llama.cpp Llama.generate greedy:        {best['raw']:.1f} tok/s")
    print(f"ours greedy, no inspection:             {best['ours']:.1f} tok/s")
    print(f"ours greedy, top-20 + entropy per token: {best['ours_inspect']:.1f} tok/s")
    from chat_turns import chat_ttft  # bench/ is the script's folder, first on sys.path

    print("chat time to first token, equal new input per turn:")
    ttfts = chat_ttft(backend)
    print(f"ttft turn5/turn1 = {ttfts[4] / ttfts[0]:.2f}")
    if args.torch:
        from engine.open_model import load_model

        torch_backend = load_model(args.model, backend="torch")
        torch_inspect = max(ours(torch_backend, prompt, args.tokens, top_n=20) for _ in range(args.repeats))
        print(f"ours on torch (float32), top-20 + entropy: {torch_inspect:.1f} tok/s")
        cpp_prefill = max(prefill_rate(backend) for _ in range(args.repeats))
        torch_prefill = max(prefill_rate(torch_backend) for _ in range(args.repeats))
        print(f"prefill 2,000 tokens cold: llama.cpp {cpp_prefill:.0f} tok/s, torch {torch_prefill:.0f} tok/s")
        print(f"speedup_vs_torch={best['ours_inspect'] / torch_inspect:.2f}")
        print(f"prefill_ratio_vs_torch={cpp_prefill / torch_prefill:.2f}")
        torch_backend.close()
    backend.close()
    if args.memory:
        ours_rss = peak_rss(args.model, "llamacpp")
        torch_rss = peak_rss(args.model, "torch")
        print(f"peak RSS: llamacpp {ours_rss / 2**20:.0f} MiB, torch (converted float32) {torch_rss / 2**20:.0f} MiB")
        print(f"rss_ratio_vs_torch={ours_rss / torch_rss:.2f}")
    print(f"ratio_vs_llamacpp={best['ours_inspect'] / best['raw']:.2f}")


if __name__ == "__main__":
    main()
