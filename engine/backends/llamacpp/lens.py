"""The layer view (logit lens) and attention on llama.cpp, through its eval callback (`cb_eval`).

As llama.cpp's eval-callback example does, a context made for the capture
gets `cb_eval` in its parameters. llama.cpp asks the callback about every
graph node before computing it (`ask`), and calls it again with the values
of each node it said yes to. We say yes to:

- `l_out-N`: layer N's output, (n_embd, tokens of the batch); the last
  layer's holds only the rows asked for as outputs;
- `kq_soft_max-N`: the attention weights (n_kv, tokens, heads), when
  llama.cpp runs attention unfused; with flash attention (llama.cpp's choice
  on the CPU) there is no such node, so the fused node's own inputs are read
  (Q, the KV cache's K, the mask, its scale and soft-cap) and softmax(QK)
  is recomputed from them, which is what the fused kernel does inside.

Layer outputs go through the final norm and unembedding from the GGUF
(`unembed.py`); the last layer's entry is the logits llama.cpp itself
computed. The capture context copies the backend's cached KV state for the
longest shared prefix (`llama_state_seq_get_data`), so the view of a token
of the answer just generated runs only the positions it looks at; this needs
the same attention layout as the backend's context, so flash attention is
left as llama.cpp chooses it (hence the two ways of reading attention).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import llama_cpp
import numpy as np

from engine.backends.llamacpp import native, unembed
from engine.backends.llamacpp.kv_share import reuse_backend_state
from engine.backends.llamacpp.ggml_tensor import Node, layer_of
from engine.lens import LayerCapture, check_positions, summarize, target_of

log = logging.getLogger(__name__)



class _Recorder:
    """Collects, during one `llama_decode`, the layer outputs and attention of the batch rows wanted.

    The callback runs on llama.cpp's compute thread inside `llama_decode`; exceptions cannot cross
    back through C, so the first one is kept and re-raised by `check()`.
    """

    def __init__(self, n_layers: int, attention: bool):
        self.n_layers = n_layers
        self.attention = attention
        self.armed = False
        self.rows: list[int] = []  # batch rows whose layers are read in the current decode
        self.n_tokens = 0
        self.hidden: dict[int, list[np.ndarray]] = {i: [] for i in range(n_layers)}  # layer -> (rows, n_embd) per decode
        # layer -> one (H, position + 1) array per row read, over positions 0..position (the query's own last)
        self.weights: dict[int, list[np.ndarray]] = {i: [] for i in range(n_layers)}
        self.row_positions: list[int] = []  # the position of each row of `rows`
        self.error: BaseException | None = None
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._on_node)

    def begin(self, n_tokens: int, rows: list[int], positions: list[int]) -> None:
        self.armed = bool(rows)
        self.n_tokens, self.rows, self.row_positions = n_tokens, rows, positions

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def _on_node(self, address: int, ask: bool, _user_data: Any) -> bool:
        if not self.armed or self.error is not None:
            return False
        try:
            node = Node(address)
            name = node.name
            wanted = name.startswith("l_out-") or (
                self.attention and (name.startswith("kq_soft_max-") or node.op == "FLASH_ATTN_EXT")
            )
            if ask or not wanted:
                return wanted
            if name.startswith("l_out-"):
                self._take_hidden(node)
            elif name.startswith("kq_soft_max-"):
                self._take_softmax(node)
            else:
                self._take_fused(node)
            return True
        except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread by check()
            self.error = e
            return False

    def _pick(self, values: np.ndarray, what: str) -> np.ndarray:
        """The wanted rows of a (..., rows, x) array holding either every batch token or only the outputs."""
        n = values.shape[-2]
        if n == self.n_tokens:
            return values[..., self.rows, :]
        if n == len(self.rows):
            return values
        if n > self.n_tokens:  # a padded mask-shaped row count
            return values[..., self.rows, :]
        raise RuntimeError(f"llama.cpp's {what} has {n} rows for a batch of {self.n_tokens}")

    def _take_hidden(self, node: Node) -> None:
        layer = layer_of(node.name)
        if layer is not None and layer < self.n_layers:
            self.hidden[layer].append(self._pick(node.values()[0, 0], node.name))  # (rows, n_embd)

    def _take_softmax(self, node: Node) -> None:
        layer = layer_of(node.name)
        if layer is not None and layer < self.n_layers:
            weights = self._pick(node.values()[0], node.name)  # (H, rows, n_kv)
            self._keep(layer, weights, node.src(1))

    def _keep(self, layer: int, weights: np.ndarray, mask_node: Node | None) -> None:
        """Store (H, rows, n_kv) weights over KV cells as weights over positions, one array per row.

        The cells a query sees (mask 0, not -inf) are, in cell order, the positions up to its own:
        all of them under causal attention, the last `window` under a sliding window (a cache whose
        older cells were dropped holds the later positions from cell 0 on). A cell beyond them is
        masked and carries no weight.
        """
        visible = None
        if mask_node is not None:
            visible = np.isfinite(mask_node.values()[0, 0][self.rows][:, : weights.shape[-1]])  # (rows, n_kv)
        for j, pos in enumerate(self.row_positions):
            row = np.zeros((weights.shape[0], pos + 1), dtype=np.float32)
            cells = np.flatnonzero(visible[j]) if visible is not None else np.arange(min(pos + 1, weights.shape[-1]))
            cells = cells[-(pos + 1):]
            row[:, pos + 1 - len(cells):] = weights[:, j, cells]
            self.weights[layer].append(row)

    def _take_fused(self, node: Node) -> None:
        """softmax(scale * Q K^T, soft-capped, + mask) from a FLASH_ATTN_EXT node's inputs."""
        q_node, k_node, mask_node = node.src(0), node.src(1), node.src(3)
        if q_node is None or k_node is None:
            return
        layer = layer_of(k_node.name)  # the cache's name ("cache_k_l3"): Q may be an unnamed node (Gemma scales it)
        if layer is None or layer >= self.n_layers:
            return
        scale, max_bias, softcap = node.op_param_floats(3)
        if max_bias != 0:
            raise NotImplementedError("attention with ALiBi slopes is not read by the layer view")
        q = self._pick(q_node.values()[0], q_node.name)  # (H, rows, d)
        k = k_node.values()[0]  # (H_kv, n_kv, d)
        group = q.shape[0] // k.shape[0]  # grouped-query attention: query heads per KV head
        scores = np.einsum("hrd,hkd->hrk", q, np.repeat(k, group, axis=0)) * scale  # (H, rows, n_kv)
        if softcap:
            scores = softcap * np.tanh(scores / softcap)
        if mask_node is not None:
            mask = mask_node.values()[0, 0]  # (tokens padded, n_kv)
            scores = scores + mask[self.rows][None, :, : scores.shape[-1]]
        scores -= scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores)
        self._keep(layer, weights / weights.sum(axis=-1, keepdims=True), mask_node)


def _capture_context(backend: Any, n_ctx: int, n_outputs: int, recorder: _Recorder) -> Any:
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = params.n_ubatch = backend.n_batch
    params.n_seq_max = 1
    params.n_outputs_max = n_outputs
    params.n_threads, params.n_threads_batch = backend.n_threads, backend.n_threads_batch
    params.offload_kqv = backend.gpu_plan.offload_kqv
    params.swa_full = True  # as the backend's context, so its KV state loads here
    params.no_perf = True
    params.cb_eval = recorder.callback
    ctx = llama_cpp.llama_init_from_model(backend.model, params)
    if not ctx:
        raise RuntimeError(f"llama.cpp could not create a context for the layer view: {native.take_recent_errors()}")
    return ctx


def capture_logits(
    backend: Any, token_ids: Sequence[int], positions: Sequence[int], attention: bool = False
) -> tuple[list[int], np.ndarray, np.ndarray, list[np.ndarray] | None]:
    """(positions, (P, L, n_embd) layer outputs, (P, V) llama.cpp's own logits, per position (L, H, p) attention).

    Runs on the backend's worker thread; the backend's own context and cache are only read.
    """
    ids, wanted = check_positions(token_ids, positions, backend.n_vocab)
    n_layers = int(llama_cpp.llama_model_n_layer(backend.model))
    reads = [p - 1 for p in wanted]  # the rows whose residual stream predicts each wanted token
    read_set = set(reads)
    first, end = reads[0], reads[-1] + 1
    recorder = _Recorder(n_layers, attention)
    n_ctx = max(end, len(backend.cached_tokens())) + 1
    ctx = _capture_context(backend, n_ctx, min(len(reads), backend.n_batch), recorder)
    batch = native.Batch(backend.n_batch)
    logits: list[np.ndarray] = []
    try:
        done = reuse_backend_state(backend, ctx, ids[:first])
        log.debug("layer view: reused %d cached tokens, running %d", done, end - done)
        # The prefix first, without outputs, then the rows read: the read row then meets the same kernels as a
        # decode step (one token after a prefill), not a batch's, so its values are the ones the model produced.
        spans = [(lo, min(stop, lo + backend.n_batch)) for start, stop in ((done, first), (first, end))
                 for lo in range(start, stop, backend.n_batch)]
        for lo, hi in spans:
            batch.clear()
            rows, row_positions = [], []
            for pos in range(lo, hi):
                out = pos in read_set
                index = batch.add(ids[pos], pos, 0, out)
                if out:
                    rows.append(index)
                    row_positions.append(pos)
            recorder.begin(hi - lo, rows, row_positions)
            native.decode(ctx, batch)
            recorder.check()
            logits.extend(native.logits_row(ctx, r, backend.n_vocab) for r in rows)
    finally:
        recorder.armed = False
        native.free_context(ctx, batch)
    missing = [i for i in range(n_layers) if not recorder.hidden[i]]
    if missing:
        raise RuntimeError(
            f"llama.cpp's graph for {backend.header.architecture or 'this model'} names no l_out-{missing[0]} "
            "tensor, so its layer outputs cannot be read"
        )
    hidden = np.stack([np.concatenate(recorder.hidden[i]) for i in range(n_layers)], axis=1)  # (P, L, n_embd)
    weights = None
    if attention:
        if any(not recorder.weights[i] for i in range(n_layers)):
            raise RuntimeError("llama.cpp's graph for this model shows no attention weights to read")
        weights = [np.stack([recorder.weights[i][j] for i in range(n_layers)]) for j in range(len(reads))]
    return wanted, hidden, np.stack(logits), weights


def layer_capture(
    backend: Any, token_ids: Sequence[int], positions: Sequence[int], *, top_k: int = 10, attention: bool = False
) -> list[LayerCapture]:
    """The layer view of each position (see engine.capabilities.LayerLens) on a llama.cpp backend."""
    wanted, hidden, real, weights = capture_logits(backend, token_ids, positions, attention)
    head = unembed.for_backend(backend)
    out = []
    for j, p in enumerate(wanted):
        layer_logits = head.logits(hidden[j])  # (L, V)
        layer_logits[-1] = real[j]  # the last entry is the model's own distribution, as llama.cpp computed it
        out.append(summarize(layer_logits, p, target_of(token_ids, p), top_k,
                             None if weights is None else weights[j].astype(np.float32)))
    return out
