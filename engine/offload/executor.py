"""The layer-streaming executor: forward hooks on transformers' decoder layers.

`attach` (engine.offload.apply) places every decoder-layer tensor by the
policy, keeps the resident tiers resident, replaces the streamed ones by
shape-only meta placeholders and installs this handle's hooks. On each
decoder layer i that has streamed tensors:

  pre-hook:  take layer i's fetch (prefetched, or fetched now), bind it into
             the modules, start fetching the next streamed layer (wrapping
             to the first, so the next token's first layer loads while the
             LM head and sampling run);
  post-hook: put the placeholders back and release layer i.

So at most two layers' streamed weights are held: the one computing and the
one arriving (on a GPU each fetch also waits until the decode stream is done
with the layer before, so the host thread running ahead of the GPU cannot
pile up more). `model(...)` is called exactly as before, with any
transformers cache; only the weights move. The handle holds per-model state
(which layer is bound, which fetch is in flight), nothing about a request.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

import torch
from torch import nn
from transformers import DynamicCache

from engine.offload.buffers import BufferPool
from engine.offload.checkpoint import Checkpoint
from engine.offload.kv_cache import make_kv_cache
from engine.offload.layout import LayerTensor
from engine.offload.placement import Placement, Tier, cache_host_layers
from engine.offload.policy import OffloadPolicy
from engine.offload.report import OffloadReport
from engine.offload.residency import Residency
from engine.offload.transfer import Fetched, Source, bind, fetch, load_tensor, release, unbind

log = logging.getLogger(__name__)


def placeholder(t: LayerTensor) -> nn.Parameter:
    """A shape-only stand-in for a streamed weight between turns: counted by parameters(), never allocated."""
    return nn.Parameter(torch.empty(t.shape, dtype=t.dtype, device="meta"), requires_grad=False)


class OffloadHandle:
    """What `attach` installed on a model. `close()` removes it (the model is unusable after, unless restored).

    Do not `.to()` the model while attached: streamed parameters are meta
    placeholders between turns. One forward at a time (the engine's worker
    thread already guarantees that).
    """

    def __init__(
        self,
        model: nn.Module,
        checkpoint: Checkpoint,
        policy: OffloadPolicy,
        placement: Placement,
        device: torch.device,
        streamed: dict[int, tuple[Source, ...]],
        resident_bytes: int,
    ):
        self.model = model
        self.checkpoint = checkpoint
        self.policy = policy
        self.placement = placement
        self.device = device
        self.residency = Residency()
        self._streamed = streamed  # layer -> its streamed tensors; layers absent here are fully resident
        self._placeholders = {i: tuple(placeholder(s.tensor) for s in srcs) for i, srcs in streamed.items()}
        order = sorted(streamed)
        self._next = {i: order[(k + 1) % len(order)] for k, i in enumerate(order)}  # wraps to the first
        self._bound: dict[int, Fetched] = {}
        self._pending: dict[int, Future[Fetched]] = {}
        self._resident_bytes = resident_bytes
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" and streamed else None
        self._released_at: torch.cuda.Event | None = None  # decode stream, after the last released layer
        self._buffers = BufferPool()
        self._worker = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="offload-prefetch")
            if policy.overlap and streamed
            else None
        )
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []
        self.closed = False

    # --- what callers use ------------------------------------------------------

    def new_cache(self) -> DynamicCache:
        """A fresh KV cache for this model: a DynamicCache, with CPU-resident layers when the policy says so."""
        return make_kv_cache(self.model.config, self.policy, self.device)

    def recommended_threads(self, cores: int) -> int:
        """Torch threads to compute with on `cores` cores.

        On the CPU, a prefetch thread copying a layer shares the cores with
        torch's threads; with one torch thread per core, the thread that gets
        descheduled holds up every parallel region. Measured on 2 cores, all
        layers on disk: 9.9 tok/s with 2 threads and overlap, 14.1 with 1
        thread and overlap, 14.4 with 2 threads and no overlap.
        """
        if self.device.type == "cpu" and self._worker is not None:
            return max(1, cores - 1)
        return cores

    def report(self) -> OffloadReport:
        p = self.placement
        if self.device.type == "cuda":
            streamed = p.bytes_on(Tier.CPU) + p.bytes_on(Tier.DISK)
        else:
            streamed = p.bytes_on(Tier.DISK)
        n = len(p.tiers)
        host_cache = cache_host_layers(n, self.policy.cache_gpu_percent) if self.device.type == "cuda" else ()
        return OffloadReport(
            policy=self.policy.spec(),
            device=str(self.device),
            gpu_bytes=p.bytes_on(Tier.GPU),
            cpu_bytes=p.bytes_on(Tier.CPU),
            disk_bytes=p.bytes_on(Tier.DISK),
            resident_bytes=self._resident_bytes,
            streamed_bytes_per_token=streamed,
            cache_host_layers=len(host_cache),
            num_layers=n,
        )

    def close(self, restore: bool = False) -> None:
        """Remove the hooks and release streamed weights; with `restore`, load them all onto the device first."""
        if self.closed:
            return
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for i in list(self._pending):
            try:
                self._release(i, self._pending.pop(i).result())
            except Exception as e:  # a failed prefetch has nothing to release
                log.debug("prefetch of layer %d had failed: %s", i, e)
        for i in list(self._bound):
            self._release(i, self._bound.pop(i))
        if self._worker is not None:
            self._worker.shutdown(wait=True)
        self._buffers.clear()
        if restore:
            for srcs in self._streamed.values():
                for s in srcs:
                    t = s.host.to(self.device) if s.host is not None else load_tensor(
                        self.checkpoint, s.key, self.device, s.tensor.dtype
                    )
                    s.tensor.module._parameters[s.tensor.attr] = nn.Parameter(t, requires_grad=False)
        self.checkpoint.close()
        self.closed = True

    # --- the hooks -------------------------------------------------------------

    def _fetch(self, i: int, after: torch.cuda.Event | None) -> Fetched:
        # Counted before the bytes arrive, so the high-water mark never under-reports.
        nbytes = sum(s.tensor.nbytes for s in self._streamed[i])
        self.residency.add(nbytes)
        try:
            return fetch(self._streamed[i], self.checkpoint, self.device, self._stream, self._buffers, after)
        except BaseException:
            self.residency.remove(nbytes)
            raise

    def _release(self, i: int, fetched: Fetched) -> None:
        unbind(self._streamed[i], self._placeholders[i])
        release(fetched, self._buffers)
        self.residency.remove(fetched.nbytes)
        if self._stream is not None:
            self._released_at = torch.cuda.Event()
            self._released_at.record(torch.cuda.current_stream(self.device))

    def _before(self, i: int, module: nn.Module, args: object) -> None:
        nxt = self._next[i]
        # Left over from a forward interrupted between hooks, or a prefetch for a layer that never ran.
        for j in [j for j in self._bound if j != i]:
            self._release(j, self._bound.pop(j))
        for j in [j for j in self._pending if j not in (i, nxt)]:
            self._release(j, self._pending.pop(j).result())
        if i not in self._bound:
            pending = self._pending.pop(i, None)
            fetched = pending.result() if pending is not None else self._fetch(i, self._released_at)
            bind(self._streamed[i], fetched)
            self._bound[i] = fetched
        if self._worker is not None and nxt != i and nxt not in self._pending and nxt not in self._bound:
            self._pending[nxt] = self._worker.submit(self._fetch, nxt, self._released_at)

    def _after(self, i: int, module: nn.Module, args: object, output: object) -> None:
        fetched = self._bound.pop(i, None)
        if fetched is not None:
            self._release(i, fetched)

    def install(self, layers: nn.ModuleList, permanent_bytes: int) -> None:
        """Swap the placeholders in (freeing a loaded model's copies) and hook the streamed layers."""
        for i, srcs in self._streamed.items():
            for s, p in zip(srcs, self._placeholders[i]):
                s.tensor.module._parameters[s.tensor.attr] = p
        self.residency.add(permanent_bytes)  # layer weights resident for good (GPU tier; CPU tier on a CPU)
        for i in self._streamed:
            self._hooks.append(layers[i].register_forward_pre_hook(partial(self._before, i)))
            # always_call: a forward that raises still releases its layer.
            self._hooks.append(layers[i].register_forward_hook(partial(self._after, i), always_call=True))
