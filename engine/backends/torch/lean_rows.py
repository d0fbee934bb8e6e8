"""The lean decode step for several rows at once: one token per row, every row at the same position.

The loom's N continuations and beam search step N rows that share a prefix
and advance together, through the torch batch runner (engine/backends/torch/
runner.py), whose cache is transformers' `DynamicCache`. transformers'
forward spends a large part of such a step on the small ops around the
matmuls (on the default model, 8 rows: ~65 ms a step, ~46 ms of it in the
matmuls). This runs the same arithmetic as `LeanDecodeStep.step` over the
model's own (fused) weights, for a (B,) batch of tokens:

- no padding and one shared position (the runner checks), so one rotary
  embedding serves every row and no attention mask is needed (a single query
  attends to every cached position of its own row);
- keys and values go into the cache through `DynamicCache.update`, as
  transformers' attention puts them, so the runner's `reorder` and a later
  transformers forward read the same cache;
- attention is transformers' own SDPA call (`enable_gqa`); each matmul runs on
  the kernel the lean step timed fastest for that many rows on this machine
  (`LeanDecodeStep.linears_for_rows`).

The runner checks its first use per model against transformers' forward
(`TorchRunner._lean_rows`), as the backend does for the one-row step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache

from engine.backends.torch.lean import LAYER_ROLES, LeanDecodeStep, rms_norm


@torch.inference_mode()
def step_rows(lean: LeanDecodeStep, tokens: torch.Tensor, position: int, cache: Cache) -> torch.Tensor:
    """(B, V) float logits after each row's token in `tokens` (B,), all rows at `position`; appends to `cache`."""
    b = tokens.shape[0]
    h = lean.embed(tokens)  # (B, D)
    pos = torch.full((1, 1), position, dtype=torch.long, device=tokens.device)
    cos, signed_sin = lean.rope(h, pos)
    heads, kv_heads, hd = lean.heads, lean.kv_heads, lean.head_dim
    linears = lean.linears_for_rows(b)  # the kernels timed for this many rows
    qkv_linear, o_linear, gate_up_linear, down_linear = (linears[role] for role in LAYER_ROLES)
    for index, weights in enumerate(lean.layers):
        x = rms_norm(h, weights.norm_in, weights.eps_in)
        qkv = qkv_linear(x, weights.qkv, weights.qkv_bias)  # (B, (H + 2 KV) * hd)
        qk = weights.rotated_qk(qkv, cos, signed_sin)
        new_keys = qk[:, heads:].unsqueeze(2)  # (B, KV, 1, hd)
        new_values = qkv[:, weights.rope_rows :].reshape(b, kv_heads, 1, hd)
        keys, values = cache.update(new_keys, new_values, index)  # (B, KV, T, hd)
        attn = F.scaled_dot_product_attention(
            qk[:, :heads].unsqueeze(2), keys, values, scale=weights.scaling, enable_gqa=heads != kv_heads
        )  # (B, H, 1, hd)
        h = h + o_linear(attn.reshape(b, heads * hd), weights.o, weights.o_bias)
        h = weights.feed_forward(h, gate_up_linear, down_linear)
    return linears["head"](rms_norm(h, lean.norm, lean.norm_eps), lean.head, lean.head_bias)
