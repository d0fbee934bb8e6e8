"""The model shapes the GPU figures are measured on (bench/gpu_figures.py, bench/gpu_gguf.py).

Random weights of real shapes, so nothing large need be downloaded: the
speed of a decode step depends on the shapes, not on what the weights say.
Every shape uses the default model's vocabulary (SmolLM2's tokenizer, 49,152
tokens). No torch import here: the llama.cpp script's environment has none.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    dtype: str  # the torch dtype the figures use ("float32", "bfloat16")
    vocab: int = 49152
    context: int = 8192
    rope_theta: float = 100000.0
    tie_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def parameters(self) -> int:
        kv = self.kv_heads * self.head_dim
        per_layer = self.hidden * (2 * self.hidden + 2 * kv) + 3 * self.hidden * self.intermediate + 2 * self.hidden
        head = 0 if self.tie_embeddings else self.vocab * self.hidden
        return self.vocab * self.hidden + self.layers * per_layer + self.hidden + head


# SmolLM2-135M-Instruct's own config (the default model), in float32 as the torch backend runs it on a CPU.
SMOLLM2_135M = Shape("smollm2-135m", hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3,
                     dtype="float32", tie_embeddings=True)
# A 1B Llama (Llama 3.2 1B's layer shapes: 16 layers, width 2048, 32 query / 8 KV heads) in bfloat16.
LLAMA_1B = Shape("llama-1b", hidden=2048, intermediate=8192, layers=16, heads=32, kv_heads=8, dtype="bfloat16",
                 rope_theta=500000.0)
# --quick: the same code paths in a second on a CPU.
TINY = Shape("tiny", hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, dtype="float32", context=512)

SHAPES = {s.name: s for s in (SMOLLM2_135M, LLAMA_1B, TINY)}
