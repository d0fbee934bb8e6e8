"""Offload: decode speed and memory with weights resident vs streamed.

    python bench/offload.py [--model SPEC] [--new-tokens 32] [--rounds 3] [--device cpu|cuda]

CPU (always): the default model fully resident (`from_pretrained`, as the
torch backend loads it today), then through the offload loader with all
layers in RAM, half on disk, all on disk (with and without prefetch overlap).

Memory: one child process per configuration (peak RSS is a process-wide
high-water mark): load, decode a few tokens, report VmHWM, the part of it
after imports, and the executor's high-water mark of decoder-layer weights
held, in layers.

Speed: one child process with every configuration loaded, decode rounds
interleaved (A, B, C, A, B, C, ...) so load from other programs on a shared
machine hits all alike; greedy, prefill excluded, median over rounds.

CUDA (when available or --device cuda): measured host-to-device bandwidth;
tokens/s with 50% of the weights in CPU memory against the link-bound limit
(bytes moved per token / bandwidth; goal: within 1.3x) and against
accelerate's device_map offload of the same share of layers; the
GPU-resident model as the ceiling. Children never run in parallel.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "Write a detailed, friendly explanation of how rainbows form, covering sunlight and water droplets."
# (label, how to load, torch threads relative to the usable cores: 0 = all, -1 = leave one to the prefetch thread)
CPU_CONFIGS = [
    ("resident (from_pretrained)", "from_pretrained", 0),
    ("offload, all in RAM", "weights=0,100", 0),
    ("offload, 50% on disk", "weights=0,50", 0),
    ("offload, 50% on disk, no overlap", "weights=0,50 overlap=off", 0),
    ("offload, all on disk", "weights=0,0", 0),
    ("offload, all on disk, no overlap", "weights=0,0 overlap=off", 0),
    ("offload, all on disk, 1 core left to prefetch", "weights=0,0", -1),
]
CUDA_CONFIGS = [
    ("GPU resident", "from_pretrained", 0),
    ("offload, 50% in CPU memory", "weights=50,50", 0),
    ("offload, 50% in CPU memory, no overlap", "weights=50,50 overlap=off", 0),
    ("accelerate device_map, 50% of layers on cpu", "accelerate", 0),
]


# --- child side: one configuration ----------------------------------------------------------------


def proc_status() -> dict[str, int]:
    """VmHWM / VmRSS / RssAnon / RssFile in bytes (Linux); ru_maxrss as a fallback for the peak."""
    out = {}
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(rest.split()[0]) * 1024
    if "VmHWM" not in out:
        from engine.backend import process_peak_rss_bytes

        out["VmHWM"] = process_peak_rss_bytes()
    return out


def decode(model, cache_factory, prompt_ids, n: int, device) -> tuple[float, list[int]]:
    """Greedy: prefill, then n tokens one forward each; tokens/s over the n-1 after the first."""
    import torch

    from engine.backends.torch.compat import with_cache

    cache = cache_factory()
    x = torch.tensor([prompt_ids], device=device)
    tokens, times = [], []
    with torch.inference_mode():
        for _ in range(n):
            out = model(input_ids=x, **with_cache(model, cache), use_cache=True, logits_to_keep=1)
            token = int(out.logits[0, -1].argmax())  # a host sync per token, as the engine's decode loop has
            times.append(time.perf_counter())
            tokens.append(token)
            x = torch.tensor([[token]], device=device)
    return (n - 1) / (times[-1] - times[0]), tokens


def h2d_bandwidth(device) -> float:
    """Bytes/s of a pinned 256 MiB host-to-device copy, best of 5."""
    import torch

    src = torch.empty(256 * 2**20, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty_like(src, device=device)
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize(device)
        t = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t)
    return src.numel() / best


def accelerate_model(folder: Path, dtype, device):
    """The same model through accelerate's dispatch: the second half of the decoder layers offloaded to CPU.

    accelerate offloads whole modules, so "50% of the weights" is half of the
    layers; it copies each offloaded layer in when the layer is called, with
    no prefetch. The device_map is derived from the model's own module names.
    """
    from itertools import chain

    from transformers import AutoModelForCausalLM

    from engine.offload import build_empty
    from engine.offload.layout import decoder_layers

    empty = build_empty(folder, dtype)
    prefix, layers = decoder_layers(empty)
    gpu = device.index or 0
    device_map: dict[str, int | str] = {}
    for name, _ in chain(empty.named_parameters(remove_duplicate=False), empty.named_buffers()):
        owner = name.rpartition(".")[0]
        if owner.startswith(prefix + "."):
            i = int(owner[len(prefix) + 1 :].split(".")[0])
            device_map[f"{prefix}.{i}"] = gpu if i < len(layers) // 2 else "cpu"
        else:
            device_map[owner] = gpu
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, device_map=device_map).eval()


class Loaded:
    """One configuration in a child process: the model, how to make its cache, its offload handle if any."""

    def __init__(self, how: str, folder: Path, device, dtype):
        from transformers import AutoModelForCausalLM, DynamicCache

        from engine.offload import load_offloaded, parse_offload

        t = time.perf_counter()
        self.handle = None
        if how == "from_pretrained":
            self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).to(device).eval()
        elif how == "accelerate":
            self.model = accelerate_model(folder, dtype, device)
        else:
            self.model, self.handle = load_offloaded(folder, parse_offload(how), device=device, dtype=dtype)
        self.load_s = time.perf_counter() - t
        config = self.model.config
        self.new_cache = self.handle.new_cache if self.handle else (lambda: DynamicCache(config=config))


def child_setup(args: argparse.Namespace):
    import torch

    from engine.backends.torch.backend import pick_dtype
    from engine.sources import materialize, resolve_spec
    from engine.quiet import quiet_third_party
    from engine.tokenizer import Tokenizer

    quiet_third_party()
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    folder = materialize(resolve_spec(args.model))
    prompt_ids = Tokenizer.from_folder(folder).chat_ids([{"role": "user", "content": PROMPT}])
    return device, pick_dtype(None, device), folder, prompt_ids


def set_threads(delta: int) -> None:
    import torch

    from engine.backends.torch.backend import usable_cores

    torch.set_num_threads(max(1, usable_cores() + delta))


def child_memory(args: argparse.Namespace) -> dict:
    """Load one configuration, decode a little, report this process's memory and the executor's count."""
    import torch

    set_threads(0)
    device, dtype, folder, prompt_ids = child_setup(args)
    result: dict = {"after_imports": proc_status()}
    run = Loaded(args.config, folder, device, dtype)
    result["load_s"] = run.load_s
    _, result["tokens"] = decode(run.model, run.new_cache, prompt_ids, args.memory_tokens, device)
    result["end"] = proc_status()
    if run.handle is not None:
        report = run.handle.report()
        per_layer = run.handle.placement.total_bytes / len(run.handle.placement.tiers)
        result.update(
            report=report.summary(),
            layer_bytes=per_layer,
            num_layers=report.num_layers,
            residency_peak_layers=run.handle.residency.peak / per_layer,
        )
    if device.type == "cuda":
        result["peak_gpu_bytes"] = torch.cuda.max_memory_allocated(device)
    return result


def child_speed(args: argparse.Namespace) -> dict:
    """Every configuration loaded at once; decode rounds interleaved across them."""
    device, dtype, folder, prompt_ids = child_setup(args)
    configs = CPU_CONFIGS if device.type == "cpu" else CUDA_CONFIGS
    loaded: dict[str, Loaded | None] = {}
    for _, how, _ in configs:
        if how not in loaded:
            try:
                loaded[how] = Loaded(how, folder, device, dtype)
            except Exception as e:  # e.g. the GPU-resident reference does not fit a large --model
                print(f"could not load {how}: {type(e).__name__}: {e}", file=sys.stderr)
                loaded[how] = None
    speeds: dict[str, list[float]] = {label: [] for label, _, _ in configs}
    tokens: dict[str, list[int]] = {}
    for label, how, threads in configs:  # warm-up: allocator, caches, kernels
        if loaded[how] is not None:
            set_threads(threads)
            decode(loaded[how].model, loaded[how].new_cache, prompt_ids, 4, device)
    for _ in range(args.rounds):
        for label, how, threads in configs:
            if loaded[how] is None:
                continue
            set_threads(threads)
            tps, tokens[label] = decode(loaded[how].model, loaded[how].new_cache, prompt_ids, args.new_tokens, device)
            speeds[label].append(tps)
    result: dict = {"speeds": speeds, "tokens": tokens}
    if device.type == "cuda":
        ours = loaded["weights=50,50"]
        result["h2d_bytes_per_s"] = h2d_bandwidth(device)
        result["streamed_bytes_per_token"] = ours.handle.report().streamed_bytes_per_token
    return result


# --- parent side: run the children one at a time -------------------------------------------------


def child(args: argparse.Namespace, mode: str, device: str, config: str = "") -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--config", config, "--device", device,
           "--new-tokens", str(args.new_tokens), "--rounds", str(args.rounds),
           "--memory-tokens", str(args.memory_tokens)]
    if args.model:
        cmd += ["--model", args.model]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{mode} {config} failed:\n{proc.stderr[-3000:]}")


def mib(n: float) -> str:
    return f"{n / 2**20:6.0f} MiB"


def report(args: argparse.Namespace, device: str) -> None:
    configs = CPU_CONFIGS if device == "cpu" else CUDA_CONFIGS
    print(f"== {device}: speed ({args.new_tokens} new tokens, {args.rounds} interleaved rounds, median) ==")
    speed = child(args, "speed", device)
    reference = next(iter(speed["tokens"].values()))
    for label, _, _ in configs:
        runs = speed["speeds"][label]
        if not runs:
            print(f"{label:46} did not load")
            continue
        same = "" if speed["tokens"][label] == reference else "  TOKENS DIFFER"
        print(f"{label:46} {statistics.median(runs):6.2f} tok/s  (rounds: {', '.join(f'{x:.2f}' for x in runs)}){same}")
    if device == "cuda":
        bw, moved = speed["h2d_bytes_per_s"], speed["streamed_bytes_per_token"]
        limit = bw / moved
        ours = statistics.median(speed["speeds"]["offload, 50% in CPU memory"])
        acc = speed["speeds"]["accelerate device_map, 50% of layers on cpu"]
        print(f"host-to-device {bw / 1e9:.1f} GB/s, {moved / 2**20:.0f} MiB moved per token "
              f"-> link-bound limit {limit:.2f} tok/s")
        print(f"ours (50% in CPU memory) is {limit / ours:.2f}x below the link limit (goal <= 1.3x)")
        if acc:
            print(f"ours vs accelerate device_map: {ours / statistics.median(acc):.2f}x")

    print(f"== {device}: memory (one process per configuration, {args.memory_tokens} tokens each) ==")
    print(f"{'configuration':46} {'peak RSS':>10} {'- imports':>10} {'load':>6}  layers held (peak)")
    seen = set()
    for label, how, _ in configs:
        if how in seen:
            continue
        seen.add(how)
        r = child(args, "memory", device, how)
        peak, base = r["end"]["VmHWM"], r["after_imports"]["VmRSS"]
        held = f"{r['residency_peak_layers']:.2f} of {r['num_layers']}" if "report" in r else "all"
        gpu = f"  peak GPU {mib(r['peak_gpu_bytes'])}" if "peak_gpu_bytes" in r else ""
        print(f"{label:46} {mib(peak)} {mib(peak - base)} {r['load_s']:5.1f}s  {held}{gpu}")
        if "report" in r:
            print(f"    {r['report']}; layer {r['layer_bytes'] / 2**20:.1f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--memory-tokens", type=int, default=16)
    ap.add_argument("--device", default=None, help="cpu, cuda, or both when omitted and a GPU is present")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--config", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        result = child_memory(args) if args.child == "memory" else child_speed(args)
        print("RESULT " + json.dumps(result))
        return
    if args.device in (None, "cpu"):
        report(args, "cpu")
    if args.device == "cuda" or (args.device is None and _has_cuda()):
        report(args, "cuda")


def _has_cuda() -> bool:
    import torch  # the parent loads no model; this only asks the driver

    return torch.cuda.is_available()


if __name__ == "__main__":
    main()
