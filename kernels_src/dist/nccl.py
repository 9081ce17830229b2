"""The same collectives through NCCL, the engine users trust, on the course's numba device arrays.

**Why torch.distributed.** NCCL can be reached three ways from Python here: torch.distributed (its NCCL
backend), CuPy's ``cupy.cuda.nccl`` module, or a thin binding of our own to ``libnccl``. The course takes
torch.distributed because it is what a reader's training code already calls (the data-parallel capstone and
every framework built on PyTorch use it), so the numbers measured here are the numbers their programs get; it
brings its own NCCL build in the torch wheel (2.28 on the two-H200 machine), its rendezvous (``MASTER_ADDR`` /
``MASTER_PORT`` from :func:`kernels_src.dist.env.rank_env`), and CUDA-graph capture of NCCL calls, which the
sweep uses to keep launch cost out of the small-message times. CuPy's module exposes the raw communicator
(we would hand-roll the unique-id exchange and get a second NCCL build beside torch's); a binding of our own
would be more code to keep correct than the course's topic needs.

**Zero copy.** A numba device array exposes ``__cuda_array_interface__``; ``torch.as_tensor(a, device="cuda")``
wraps the same memory as a tensor (no copy): what NCCL reduces is the numba array. Both libraries use the
device's primary context, so the pointer is valid in both.

**Stream ordering, made explicit.** A numba kernel that wrote the array was queued on a numba stream (the
default: the legacy stream 0). torch.distributed runs NCCL on its own internal stream, which first waits for
torch's *current* stream. So :func:`all_reduce` makes the numba stream torch's current stream for the call
(``torch.cuda.ExternalStream`` on its handle): NCCL then starts after the kernel that wrote the data, and,
because the call is synchronous in the stream sense (``async_op=False``: the current stream waits for NCCL's),
the next numba kernel on that stream sees the reduced data. No host synchronisation is needed, and none is done.
"""
from __future__ import annotations

import numpy as np

OPS = ("sum", "max", "min", "avg")


def _torch():
    import torch
    import torch.distributed as dist

    return torch, dist


def init(rank: int | None = None, nranks: int | None = None, device: int | None = None):
    """Join the NCCL process group (the environment from ``rank_env`` gives rank, size and the rendezvous); pin
    this process to GPU ``device`` (default: its rank)."""
    import os

    torch, dist = _torch()
    rank = int(os.environ["RANK"]) if rank is None else rank
    nranks = int(os.environ["WORLD_SIZE"]) if nranks is None else nranks
    dev = rank % max(1, torch.cuda.device_count()) if device is None else device
    torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group("nccl", rank=rank, world_size=nranks, device_id=torch.device("cuda", dev))
    return dist.get_rank(), dist.get_world_size()


def close():
    _, dist = _torch()
    if dist.is_initialized():
        dist.destroy_process_group()


def version() -> str:
    torch, _ = _torch()
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def as_tensor(dev_array):
    """The numba device array as a torch tensor on the same memory (no copy)."""
    torch, _ = _torch()
    return torch.as_tensor(dev_array, device="cuda")


def _stream_ctx(stream):
    """torch's current stream set to numba's ``stream`` (None or 0: the legacy default stream, which torch's
    default stream also is)."""
    torch, _ = _torch()
    if stream is None or isinstance(stream, int):
        handle = int(stream or 0)
    elif hasattr(stream.handle, "value"):  # a ctypes pointer
        handle = int(stream.handle.value or 0)
    else:  # a cuda-bindings CUstream
        handle = int(stream.handle)
    if handle == 0:
        return torch.cuda.stream(torch.cuda.default_stream())
    return torch.cuda.stream(torch.cuda.ExternalStream(handle))


def _op(op):
    _, dist = _torch()
    table = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "avg": dist.ReduceOp.AVG}
    if op not in table:
        raise ValueError(f"unknown reduction {op!r}; one of {', '.join(OPS)}")
    return table[op]


def all_reduce(dev_array, op: str = "sum", stream=None):
    """In place on a numba device array (every rank the same length and dtype); returns the array."""
    _, dist = _torch()
    t = as_tensor(dev_array)
    with _stream_ctx(stream):
        dist.all_reduce(t, op=_op(op))
    return dev_array


def reduce_scatter(dev_array, op: str = "sum", stream=None):
    """The reduced chunk ``chunk_bounds(L, n, rank)`` of ``dev_array`` (length L), as a new numba array. NCCL's
    reduce-scatter takes equal chunks: each of the course's chunks is copied into a slot of ``ceil(L / n)``
    elements (zero padding after it), NCCL reduce-scatters the slots, and the rank cuts its chunk out of its slot."""
    torch, dist = _torch()
    from ..compiler import cuda
    from .schedule import chunk_bounds

    n, r = dist.get_world_size(), dist.get_rank()
    t = as_tensor(dev_array)
    L = t.numel()
    m = max(1, -(-L // n))
    with _stream_ctx(stream):
        padded = torch.zeros(n * m, dtype=t.dtype, device=t.device)
        for p in range(n):
            lo, hi = chunk_bounds(L, n, p)
            padded[p * m: p * m + hi - lo] = t[lo:hi]
        slot = torch.empty(m, dtype=t.dtype, device=t.device)
        dist.reduce_scatter_tensor(slot, padded, op=_op(op))
        lo, hi = chunk_bounds(L, n, r)
        out = slot[: hi - lo].contiguous()
    return cuda.as_cuda_array(out)


def all_gather(chunk, length: int, stream=None):
    """Every rank's chunk (``chunk_bounds(length, n, rank)``) gathered into a new numba array of ``length``."""
    torch, dist = _torch()
    from ..compiler import cuda
    from .schedule import chunk_bounds

    n = dist.get_world_size()
    c = as_tensor(chunk)
    m = -(-length // n)
    with _stream_ctx(stream):
        padded = torch.zeros(m, dtype=c.dtype, device=c.device)
        padded[: c.numel()] = c
        gathered = torch.empty(n * m, dtype=c.dtype, device=c.device)
        dist.all_gather_into_tensor(gathered, padded)
        parts = [gathered[p * m: p * m + (chunk_bounds(length, n, p)[1] - chunk_bounds(length, n, p)[0])]
                 for p in range(n)]
        out = torch.cat(parts)
    return cuda.as_cuda_array(out)


def broadcast(dev_array, root: int = 0, stream=None):
    """In place: every rank's array becomes root's."""
    _, dist = _torch()
    t = as_tensor(dev_array)
    with _stream_ctx(stream):
        dist.broadcast(t, src=root)
    return dev_array


def barrier_on_device(stream=None):
    """A tiny all-reduce queued on the stream: every rank's later work starts after every rank got there
    (within the link's latency), without a host round trip."""
    torch, dist = _torch()
    t = torch.zeros(1, device="cuda")
    with _stream_ctx(stream):
        dist.all_reduce(t)


def dtype_ok(dtype) -> bool:
    return np.dtype(dtype) in (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16))
