"""A lean single-token decode step for Llama-shaped models on the torch backend.

A decode step of a small model is not all arithmetic: on the default 135M
model (30 layers, CPU) transformers' forward takes ~32 ms, of which the
weight matmuls are ~22 ms; the rest is the small tensor ops around them
(norms, rope, masks, casts, views) and the Python that dispatches them. This
step runs the same arithmetic directly over the model's own weights, with
fewer ops:

- q/k/v are one matmul and gate/up one matmul. The fused weight is a single
  tensor and the model's own `q_proj.weight` etc. become views into it, so
  memory does not grow and transformers' forward (prefill, scoring, the
  research runners) reads the same bytes it read before;
- rotary embedding for q and k in one pass, cos/sin from the model's own
  rotary module (so every rope scaling type it implements is honoured);
- keys/values written straight into the `GrowingCache` buffers, and one
  scaled-dot-product call per layer over the filled part (a single query
  attends to every cached position: no mask is needed); past
  `GROUPED_ATTENTION_FROM` positions the query heads of a KV head go in as
  its queries, so long contexts read each KV head once;
- RMSNorm written as the model writes it (float32 statistics), so float32
  results equal transformers' bit for bit on the same kernels (below
  `GROUPED_ATTENTION_FROM` positions; within float rounding above);
- on the CPU in float32, each weight role (qkv, o, gate/up, down, head) is
  multiplied by whichever of torch's and oneDNN's kernels read it faster on
  this machine, timed once when the step is built (engine/backends/torch/linear.py).
  Where oneDNN is picked, logits differ from transformers' by rounding (~1e-6).

Only decoder layers of the known Llama shape qualify (Llama, Mistral, Qwen2:
norm -> attention -> residual -> norm -> gated MLP -> residual, no q/k
norms, no sliding window in the cache); anything else keeps transformers'
forward. `LeanDecodeStep.for_model` says why not, in the debug log. The
backend checks the first lean step of every model against transformers'
forward on the real cache before trusting it (see TorchBackend.forward).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from engine.backends.torch import linear as cpu_linear
from engine.backends.torch.file_pages import release_file_pages
from engine.backends.torch.cache import GrowingCache
from engine.backends.torch.compat import HFModel

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2"})
# From this many attended positions on, grouped-query attention runs the query heads that share a KV head
# as that head's queries (one SDPA over KV heads): with GQA, CPU SDPA re-reads a KV head's keys and values
# for each of its query heads, and at 3,000 positions (138 MB of float32 K/V per step on the default model)
# that made attention cost 2x what reading them once does (measured, cold caches: 646 vs 361 us a layer).
# Below it the two take the same time and transformers' call is kept, for bit-identical logits; above it
# the results differ from transformers' by float rounding (~1e-7).
GROUPED_ATTENTION_FROM = 512
# Attributes a decoder layer of one of those types has; a module with anything
# more (q_norm, pre_feedforward_layernorm, ...) computes something this step does not.
LAYER_CHILDREN = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
ATTENTION_CHILDREN = {"q_proj", "k_proj", "v_proj", "o_proj"}
MLP_CHILDREN = {"gate_proj", "up_proj", "down_proj", "act_fn"}
# The weights of a layer that the step multiplies, by role (each has a `<role>_bias` beside it); the head is the fifth.
LAYER_ROLES = ("qkv", "o", "gate_up", "down")


def _fuse(linears: list[torch.nn.Linear], copied: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several linears on the same input; the linears' own become views of it.

    The replaced weights are appended to `copied`: their memory-mapped pages are given back afterwards.
    """
    old = [m.weight.detach() for m in linears]
    weight = torch.cat(old)
    biases = [m.bias for m in linears]
    bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
    row = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight = torch.nn.Parameter(weight[row : row + n], requires_grad=False)
        if bias is not None:
            m.bias = torch.nn.Parameter(bias[row : row + n], requires_grad=False)
        row += n
    copied.extend(old)
    return weight, bias


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:  # torch's fused kernel: one op for LlamaRMSNorm's five, same float32 result
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    # LlamaRMSNorm's own sequence for half precision: statistics in float32, scaling in the model's dtype.
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class _Layer:
    """One decoder layer's weights, fused where two matmuls share an input."""

    def __init__(self, layer: HFModel, heads: int, kv_heads: int, head_dim: int, copied: list[torch.Tensor]) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.norm_in, self.eps_in = layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon
        self.norm_post = layer.post_attention_layernorm.weight
        self.eps_post = layer.post_attention_layernorm.variance_epsilon
        self.qkv, self.qkv_bias = _fuse([attn.q_proj, attn.k_proj, attn.v_proj], copied)
        self.o, self.o_bias = attn.o_proj.weight, attn.o_proj.bias
        self.gate_up, self.gate_up_bias = _fuse([mlp.gate_proj, mlp.up_proj], copied)
        self.down, self.down_bias = mlp.down_proj.weight, mlp.down_proj.bias
        self.act = mlp.act_fn
        self.scaling = float(attn.scaling)
        self.intermediate = mlp.gate_proj.weight.shape[0]
        self.rope_rows = (heads + kv_heads) * head_dim  # q and k: the columns that get the rotary embedding
        self.qk_heads, self.head_dim = heads + kv_heads, head_dim

    # The layer's arithmetic that the one-row step, the rows' step (lean_rows.py) and the fixed-shape step
    # (static_lean.py) share; each writes and reads its own cache around it.

    def rotated_qk(self, qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        """(B, H + KV, hd): the queries and keys of `qkv` (B, (H + 2 KV) * hd), the rotary embedding applied."""
        qk = qkv[:, : self.rope_rows].view(qkv.shape[0], self.qk_heads, self.head_dim)
        # rotate_half(x) * sin == roll(x, half) * (sin, first half negated): 4 ops, not 7; the same floats
        return qk * cos + torch.roll(qk, self.head_dim // 2, -1) * signed_sin

    def feed_forward(self, h: torch.Tensor, gate_up_linear: cpu_linear.Linear,
                     down_linear: cpu_linear.Linear) -> torch.Tensor:
        """`h` (B, D) with the layer's MLP of its post-attention norm added: the layer's second half."""
        x = rms_norm(h, self.norm_post, self.eps_post)
        gate_up = gate_up_linear(x, self.gate_up, self.gate_up_bias)
        mixed = self.act(gate_up[:, : self.intermediate]) * gate_up[:, self.intermediate :]
        return h + down_linear(mixed, self.down, self.down_bias)


class LeanDecodeStep:
    """`step(token_id, cache)`: logits (1, 1, V), shaped as transformers shapes them, for the token after
    `token_id`, which it appends to the cache."""

    def __init__(self, model: HFModel) -> None:
        cfg = model.config
        inner = model.model
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.norm, self.norm_eps = inner.norm.weight, inner.norm.variance_epsilon
        head = model.get_output_embeddings()
        self.head, self.head_bias = head.weight, head.bias
        copied: list[torch.Tensor] = []
        self.layers = [_Layer(layer, self.heads, self.kv_heads, self.head_dim, copied) for layer in inner.layers]
        # The copies just read the old weights: memory-mapped ones would otherwise stay resident.
        release_file_pages(copied)
        device = self.head.device
        self._ids = torch.zeros((1, 1), dtype=torch.long, device=device)
        self._position = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.verified = False  # set by the backend once a step matched transformers' forward
        self.rows_verified = False  # set by the batch runner once a step of rows (lean_rows.py) matched it
        self.kernels: dict[str, str] = {}
        self._linears: dict[str, cpu_linear.Linear] = {}
        self._kernel_mode: str | dict[str, str] = "auto"
        self._rows_linears: dict[int, dict[str, cpu_linear.Linear]] = {}  # by row bucket, timed on first use
        self.choose_kernels("auto")

    def weights_by_role(self) -> dict[str, tuple[list[torch.Tensor], list[torch.Tensor | None]]]:
        """{role: (weights, biases)} for LAYER_ROLES across the layers, and "head"."""
        groups = {role: ([getattr(layer, role) for layer in self.layers],
                         [getattr(layer, f"{role}_bias") for layer in self.layers]) for role in LAYER_ROLES}
        groups["head"] = ([self.head], [self.head_bias])
        return groups

    def choose_kernels(self, mode: str | dict[str, str] = "auto") -> dict[str, str]:
        """Set the matmul kernel of each weight role (LAYER_ROLES and "head"): "auto" times the candidates
        on this machine (cpu_linear.fastest, ~0.3 s for the default model); a kernel's name uses it for every
        role where it runs; a {role: name} mapping (an earlier return value) restores that choice.

        The step then counts as unverified again, so the backend checks its next use against transformers.
        """
        timings = {}
        for role, (weights, biases) in self.weights_by_role().items():
            name = mode.get(role, "torch") if isinstance(mode, dict) else mode
            if name == "auto":
                self.kernels[role], timings[role] = cpu_linear.fastest(weights, biases)
            elif name in cpu_linear.KERNELS:
                self.kernels[role] = name if name in cpu_linear.candidates(weights[0]) else "torch"
            else:
                raise ValueError(f"unknown kernel choice {name!r}: auto or one of {sorted(cpu_linear.KERNELS)}")
        self._linears = {role: cpu_linear.KERNELS[name] for role, name in self.kernels.items()}
        self._kernel_mode, self._rows_linears = mode, {}
        self.verified = self.rows_verified = False
        parts = []
        for role, name in self.kernels.items():
            measured = " vs ".join(f"{k} {seconds * 1e3:.2f} ms" for k, seconds in timings.get(role, {}).items())
            parts.append(f"{role} {name} ({measured})" if measured else f"{role} {name}")
        log.info("lean decode step kernels: %s", ", ".join(parts))
        return dict(self.kernels)

    def linears_for_rows(self, rows: int) -> dict[str, cpu_linear.Linear]:
        """The matmul kernel of each role for a step of `rows` rows (lean_rows.py): with "auto" kernels, timed
        once per model for the power of two at or above `rows` (at most 32); otherwise the one-row choice."""
        if rows == 1 or self._kernel_mode != "auto":
            return self._linears
        bucket = min(1 << (rows - 1).bit_length(), 32)
        if bucket not in self._rows_linears:
            chosen = {role: cpu_linear.fastest(weights, biases, rows=bucket)[0]
                      for role, (weights, biases) in self.weights_by_role().items()}
            log.info("lean step kernels for %d rows: %s", bucket, ", ".join(f"{r} {n}" for r, n in chosen.items()))
            self._rows_linears[bucket] = {role: cpu_linear.KERNELS[name] for role, name in chosen.items()}
        return self._rows_linears[bucket]

    @classmethod
    def for_model(cls, model: HFModel) -> LeanDecodeStep | None:
        """The lean step for `model`, or None (with the reason in the debug log) when its shape is not Llama's."""
        reason = cls._unsupported(model)
        if reason:
            log.debug("no lean decode step: %s", reason)
            return None
        return cls(model)

    @staticmethod
    def _unsupported(model: HFModel) -> str | None:
        cfg = model.config
        if getattr(cfg, "model_type", None) not in SUPPORTED_MODEL_TYPES:
            return f"model type {getattr(cfg, 'model_type', None)!r} is not one of {sorted(SUPPORTED_MODEL_TYPES)}"
        inner = getattr(model, "model", None)
        layers = getattr(inner, "layers", None)
        if layers is None or not all(hasattr(inner, a) for a in ("embed_tokens", "rotary_emb", "norm")):
            return "the model does not have the embed/layers/rotary/norm layout"
        if len(layers) != cfg.num_hidden_layers:
            return "the model runs a different number of layers than it holds"
        for layer in layers:
            children = {name for name, _ in layer.named_children()}
            if children != LAYER_CHILDREN:
                return f"a decoder layer has {sorted(children)}, not {sorted(LAYER_CHILDREN)}"
            attn = {name for name, _ in layer.self_attn.named_children()}
            mlp = {name for name, _ in layer.mlp.named_children()}
            if attn != ATTENTION_CHILDREN or mlp != MLP_CHILDREN:
                return f"attention has {sorted(attn)} and the MLP {sorted(mlp)}"
            a, m = layer.self_attn, layer.mlp
            fused_groups = ([a.q_proj, a.k_proj, a.v_proj], [m.gate_proj, m.up_proj])
            projections = [*fused_groups[0], a.o_proj, *fused_groups[1], m.down_proj]
            odd = [type(p).__name__ for p in projections if type(p) is not torch.nn.Linear]
            if odd:  # quantized or adapter layers hold other tensors than one dense weight
                return f"a projection is a {odd[0]}, not a plain Linear"
            if any(len({p.bias is None for p in group}) != 1 for group in fused_groups):
                return "some of the projections fused together have biases and some do not"
            if not all(hasattr(n, "variance_epsilon") for n in (layer.input_layernorm, layer.post_attention_layernorm)):
                return "a norm is not an RMSNorm"
        params = list(model.parameters())
        if len({p.device for p in params}) != 1 or len({p.dtype for p in params}) != 1:
            return "the weights are spread over several devices or dtypes"
        return None

    def rope(self, h: torch.Tensor, position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin with its first half negated), (1, 1, head_dim) each: the model's own rope at `position`
        (1, 1), in the form `_Layer.rotated_qk` takes."""
        cos, sin = self.rotary(h, position)
        half = self.head_dim // 2
        return cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)

    @torch.inference_mode()
    def step(self, token_id: int, cache: GrowingCache, steer: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (1, 1, V) after `token_id`; the caller has checked `cache.supports_static_step`.

        `steer` (n_layer, D): row i is added to layer i's output (steering, engine/backends/torch/steering.py),
        where the backend's hooks add it in transformers' forward.
        """
        layers = cache.attention_layers()
        position = layers[0].length
        self._ids.fill_(token_id)
        self._position.fill_(position)
        h = self.embed(self._ids)[0]  # (1, D)
        cos, signed_sin = self.rope(h, self._position)
        heads, kv_heads, hd = self.heads, self.kv_heads, self.head_dim
        grouped = position + 1 >= GROUPED_ATTENTION_FROM
        linears = self._linears
        qkv_linear, o_linear, gate_up_linear, down_linear = (linears[role] for role in LAYER_ROLES)
        for index, (weights, cached) in enumerate(zip(self.layers, layers)):
            x = rms_norm(h, weights.norm_in, weights.eps_in)
            qkv = qkv_linear(x, weights.qkv, weights.qkv_bias)  # (1, (H + 2 KV) * hd)
            qk = weights.rotated_qk(qkv, cos, signed_sin)
            cached._make_room(1)
            slot = cached.length - cached.start
            cached.keys.narrow(2, slot, 1).copy_(qk[:, heads:].unsqueeze(2))
            cached.values.narrow(2, slot, 1).copy_(qkv[:, weights.rope_rows :].view(1, kv_heads, 1, hd))
            keys, values = cached.keys[:, :, : slot + 1], cached.values[:, :, : slot + 1]
            if grouped and heads != kv_heads:
                # the query heads sharing a KV head as that head's queries: K/V are read once, not once per head
                grouped_q = qk[:, :heads].view(1, kv_heads, heads // kv_heads, hd)
                attn = F.scaled_dot_product_attention(grouped_q, keys, values, scale=weights.scaling)
            else:  # transformers' own call: the same floats
                attn = F.scaled_dot_product_attention(
                    qk[:, :heads].unsqueeze(2), keys, values, scale=weights.scaling, enable_gqa=heads != kv_heads
                )
            h = h + o_linear(attn.view(1, heads * hd), weights.o, weights.o_bias)
            h = weights.feed_forward(h, gate_up_linear, down_linear)
            if steer is not None:
                h = h + steer[index]
        for cached in layers:
            cached.length += 1
        return linears["head"](rms_norm(h, self.norm, self.norm_eps), self.head, self.head_bias).view(1, 1, -1)
