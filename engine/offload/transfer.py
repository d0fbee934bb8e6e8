"""Fetching one layer's streamed weights to the compute device, and loading resident ones.

Streamed weights come from host memory (CPU tier, when computing on a GPU)
or from the checkpoint file (disk tier). On a GPU every host-to-device copy
is issued on a side stream and an event marks when the layer is complete;
the decode stream waits on that event, so layer i's kernels and layer i+1's
copies overlap. Disk-tier bytes are read into page-locked staging memory
first, which is what lets those copies run asynchronously. On the CPU a
disk-tier tensor is read straight into a reused buffer (`BufferPool`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.offload.buffers import BufferPool
from engine.offload.checkpoint import Checkpoint
from engine.offload.layout import LayerTensor


@dataclass(frozen=True)
class Source:
    """Where one streamed tensor comes from: `host` if it has a host copy, else checkpoint key `key`."""

    tensor: LayerTensor
    key: str
    host: torch.Tensor | None  # same shape and dtype as the compute tensor; pinned when useful


@dataclass(frozen=True)
class Fetched:
    tensors: tuple[torch.Tensor, ...]  # on the compute device, one per Source, same order
    pooled: tuple[torch.Tensor, ...]  # CPU buffers to give back to the pool on release
    ready: torch.cuda.Event | None  # recorded on the side stream after the last copy (GPU only)
    nbytes: int


def load_tensor(
    checkpoint: Checkpoint, key: str, device: torch.device, dtype: torch.dtype, pin: bool = False
) -> torch.Tensor:
    """An owned copy of checkpoint tensor `key` on `device` in `dtype` (page-locked on the CPU if `pin`)."""
    stored = checkpoint.entries[key].dtype
    if device.type == "cpu" and stored == dtype:
        return checkpoint.read(key, pin=pin)  # read straight into the final tensor: one copy
    host = checkpoint.read(key)
    if device.type == "cpu":
        out = torch.empty(host.shape, dtype=dtype, pin_memory=pin)
        return out.copy_(host)
    return host.to(device=device, dtype=dtype)


def _disk_to_cpu(checkpoint: Checkpoint, key: str, dtype: torch.dtype, pool: BufferPool) -> torch.Tensor:
    e = checkpoint.entries[key]
    if e.dtype == dtype:
        buf = pool.take(e.shape, dtype)
        checkpoint.read_into(key, buf)
        return buf
    raw = pool.take(e.shape, e.dtype)  # as stored, then converted (the pool then also keeps raw buffers)
    checkpoint.read_into(key, raw)
    buf = pool.take(e.shape, dtype).copy_(raw)
    pool.give(raw)
    return buf


def fetch_to_cpu(sources: Sequence[Source], checkpoint: Checkpoint, pool: BufferPool) -> Fetched:
    tensors, nbytes = [], 0
    for s in sources:
        nbytes += s.tensor.nbytes
        assert s.host is None, "CPU-tier weights are resident when computing on the CPU"
        tensors.append(_disk_to_cpu(checkpoint, s.key, s.tensor.dtype, pool))
    return Fetched(tuple(tensors), tuple(tensors), None, nbytes)


def _staged(checkpoint: Checkpoint, key: str, dtype: torch.dtype) -> torch.Tensor:
    """A page-locked host copy of a disk-tier tensor in the compute dtype, ready for an async copy.

    Converted on the CPU rather than the GPU, so the link carries the compute
    dtype (half the bytes of a float32 checkpoint computed in bfloat16). The
    caller just drops it after queueing the copy: torch's caching host
    allocator holds a freed pinned block back until the copies reading it
    have finished.
    """
    e = checkpoint.entries[key]
    if e.dtype == dtype:
        return checkpoint.read(key, pin=True)
    return torch.empty(e.shape, dtype=dtype, pin_memory=True).copy_(checkpoint.read(key))


def fetch_to_cuda(
    sources: Sequence[Source],
    checkpoint: Checkpoint,
    device: torch.device,
    stream: torch.cuda.Stream,
    after: torch.cuda.Event | None,
) -> Fetched:
    # The host thread runs ahead of the GPU: without this wait it could queue copies for every layer
    # of a token, each into fresh device memory (freed blocks are not reused until the decode stream
    # has passed them). Waiting for the layer released before the one now computing keeps two
    # layers' copies on the device, while the link still never idles: this copy is queued as soon
    # as that layer is done, long before the copy ahead of it in the queue finishes.
    if after is not None:
        after.synchronize()
    tensors, nbytes = [], 0
    with torch.cuda.stream(stream):
        for s in sources:
            nbytes += s.tensor.nbytes
            host = s.host if s.host is not None else _staged(checkpoint, s.key, s.tensor.dtype)
            # Allocated while the side stream is current, so the caching allocator ties the block to it;
            # the decode stream's use is recorded in `bind` before it is freed.
            out = torch.empty(host.shape, dtype=s.tensor.dtype, device=device)
            out.copy_(host, non_blocking=True)
            tensors.append(out)
        ready = torch.cuda.Event()
        ready.record(stream)
    return Fetched(tuple(tensors), (), ready, nbytes)


def fetch(
    sources: Sequence[Source],
    checkpoint: Checkpoint,
    device: torch.device,
    stream: torch.cuda.Stream | None,
    pool: BufferPool,
    after: torch.cuda.Event | None = None,
) -> Fetched:
    """Layer weights on the compute device. `after`: on a GPU, first wait for that point of the decode stream."""
    if device.type == "cuda":
        assert stream is not None
        return fetch_to_cuda(sources, checkpoint, device, stream, after)
    return fetch_to_cpu(sources, checkpoint, pool)


def bind(sources: Sequence[Source], fetched: Fetched) -> None:
    """Put fetched tensors into their modules; on a GPU make the decode stream wait for the copies."""
    if fetched.ready is not None:
        current = torch.cuda.current_stream(fetched.tensors[0].device)
        current.wait_event(fetched.ready)
        for t in fetched.tensors:
            t.record_stream(current)  # the block is not reused until the decode stream is past its last use
    for s, t in zip(sources, fetched.tensors):
        s.tensor.module._parameters[s.tensor.attr] = torch.nn.Parameter(t, requires_grad=False)


def unbind(sources: Sequence[Source], placeholders: Sequence[torch.nn.Parameter]) -> None:
    """Put the shape-only placeholders back; the fetched tensors are the caller's to release."""
    for s, p in zip(sources, placeholders):
        s.tensor.module._parameters[s.tensor.attr] = p


def release(fetched: Fetched, pool: BufferPool) -> None:
    """Recycle CPU buffers (the layer's compute is done: CPU ops are synchronous); device copies just go."""
    for t in fetched.pooled:
        pool.give(t)
