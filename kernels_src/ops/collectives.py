"""Collectives over n ranks, with the ranks stacked in one array (chapter 21).

Shapes: x (n, L): row r is rank r's vector.
  allreduce_sum   out (n, L): every row = sum over ranks,  out[r, i] = sum_k x[k, i]
  allreduce_max   out (n, L): every row = max over ranks (NaN anywhere -> NaN)
  reduce_scatter  out (L,):   the sum, each rank r writing its chunk chunk_bounds(L, n, r)
  all_gather      out (n, L): every row = the vector whose chunk r comes from rank r (x[r, chunk r]; the rest of
                  row r is not rank r's to give, and make_inputs fills it with NaN to prove nobody reads it)
  broadcast       out (n, L): every row = x[0] (the root is rank 0; the other rows of x are NaN)
Size:   (n, L): ranks and elements per rank. Chunks follow kernels_src.dist.schedule.chunk_bounds: the first
        L % n chunks have one element more, and chunks are empty when L < n.
Cost:   the data that must move at least once: all-reduce reads n L and writes n L elements; reduce-scatter
        reads n L and writes L; all-gather and broadcast read L and write n L.

Why "virtual ranks": the algorithms of chapter 21 are schedules of who sends which chunk to whom. Run with all n
ranks in one process or on one GPU, a "send" from rank r - 1 to rank r is rank r reading row r - 1, and a step
of the schedule is one kernel over every rank's (send, receive) chunk pair. That checks the schedule itself
against the reference, in the simulator and on one H100, before any of it crosses a link
(``kernels_src.dist.comm`` runs the same schedule with real processes, ``kernels_src.dist.gpu`` on real GPUs).

Tolerance: a sum of n values computed in another order (the ring adds chunk c starting at rank c + 1, the
one-shot kernel in rank order) is within ``(n - 1) eps sum_k |x[k, i]|`` of another correct one
(:func:`kernels_src.dist.schedule.sum_tolerance`, the one place that says so). make_inputs draws x from
[-1, 1), so ``sum_k |x[k, i]| <= n`` and the absolute tolerance is ``(n - 1) eps n``. Max, all-gather and
broadcast only move or compare values: exact.

Ladder (each of the five ops)
  cpu/numpy    baseline  NumPy over the stacked array (x.sum(0), x.max(0), slicing and copies)
  cpu/oneshot  rung 1    one pass, each output element reads all n ranks' values (Numba)
  cpu/ring     rung 2    the ring schedule of dist.schedule.ring_steps, one Numba chunk kernel per step over all
                         ranks' (send, receive) pairs: 2(n-1) steps for an all-reduce
  gpu/oneshot  rung 1    one kernel, one thread per output element reading all n ranks (numba.cuda)
  gpu/ring     rung 2    one kernel launch per ring step over every rank's chunk pair, reading from the sending
                         rank's row (numba.cuda)
  gpu/torch    baseline  torch on the same device (x.sum(0), x.amax(0), copies), all-reduce ops only
"""
from __future__ import annotations

import numpy as np

from .. import device
from ..compiler import cuda, int32, njit
from ..device import ceil_div
from ..dist.schedule import chunk_bounds, ring_steps, sum_tolerance
from ..registry import define_op, register

OPS = ("allreduce_sum", "allreduce_max", "reduce_scatter", "all_gather", "broadcast")
DTYPES_CPU = ("float32", "float64")
DTYPES_GPU = ("float32",)
ROOT = 0
COPY, SUM, MAX = 0, 1, 2  # what a receive does with the incoming chunk


# --------------------------------------------------------------------------------------- reference
def _check(x):
    if x.ndim != 2:
        raise ValueError(f"collectives take x of shape (n, L), got {x.shape}")
    if x.shape[0] < 1:
        raise ValueError("collectives need at least one rank")


def owners(L, n):
    """owner[i] = the rank whose chunk holds element i (chunk_bounds' split)."""
    own = np.empty(L, np.int64)
    for r in range(n):
        lo, hi = chunk_bounds(L, n, r)
        own[lo:hi] = r
    return own


def reference_allreduce_sum(x):
    _check(x)
    s = x.astype(np.float64).sum(0)
    return np.broadcast_to(s, x.shape).copy()


def reference_allreduce_max(x):
    _check(x)
    m = x.astype(np.float64).max(0)  # NaN-propagating, like every variant
    return np.broadcast_to(m, x.shape).copy()


def reference_reduce_scatter(x):
    _check(x)
    return x.astype(np.float64).sum(0)


def reference_all_gather(x):
    _check(x)
    n, L = x.shape
    full = x.astype(np.float64)[owners(L, n), np.arange(L)]
    return np.broadcast_to(full, x.shape).copy()


def reference_broadcast(x):
    _check(x)
    return np.broadcast_to(x[ROOT].astype(np.float64), x.shape).copy()


def make_inputs(size, dtype, rng):
    """Uniform in [-1, 1): both signs, so a dropped or doubled contribution changes a sum by O(1)."""
    n, L = size
    return (rng.uniform(-1.0, 1.0, (n, L)).astype(dtype),)


def _not_yours(op, x):
    """NaN where a rank's row holds nothing it may send: every chunk but its own (all_gather), every row but
    the root's (broadcast). A rung that reads there returns NaN and fails."""
    n, L = x.shape
    if op == "all_gather":
        x[owners(L, n)[None, :] != np.arange(n)[:, None]] = np.nan
    elif op == "broadcast":
        x[np.arange(n) != ROOT] = np.nan
    return x


def _make(op):
    def make(size, dtype, rng):
        (x,) = make_inputs(size, dtype, rng)
        return (_not_yours(op, x),)
    make.__doc__ = make_inputs.__doc__
    return make


def _make_edge(op):
    def make_edge(size, dtype, rng):
        """NaN, +inf, -inf, -0.0 and a tiny value in random places of the meaningful entries: a NaN on one
        rank makes that element NaN everywhere (sum and max), +inf and -inf on two ranks make NaN, -0.0 + -0.0
        stays -0.0 (an exact zero is no excuse to drop a sign)."""
        n, L = size
        (x,) = make_inputs(size, dtype, rng)
        specials = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-30], dtype=dtype)
        pick = rng.random((n, L)) < 0.25
        x = np.where(pick, specials[rng.integers(0, specials.size, (n, L))], x).astype(dtype)
        return (_not_yours(op, x),)
    return make_edge


def sum_tol(size, dtype):
    """(rtol, atol) for a sum over n ranks of inputs in [-1, 1): schedule.sum_tolerance with sum|x| <= n."""
    n, _ = size
    rtol, atol_factor = sum_tolerance(n, dtype)
    return rtol, atol_factor * n


def _bytes(op):
    def nbytes(size, b):
        n, L = size
        if op in ("allreduce_sum", "allreduce_max"):
            return 2 * n * L * b
        if op == "reduce_scatter":
            return (n + 1) * L * b
        return (n + 1) * L * b  # all_gather, broadcast: read one copy, write n
    return nbytes


SIZES = {"check": [(1, 1), (1, 7), (2, 1), (2, 13), (3, 2), (3, 101), (5, 3), (5, 1009), (8, 7), (8, 4099),
                   (3, 65537)],
         # L < n (empty chunks) and L not a multiple of n, at sizes the simulator does in a second
         "check_sim": [(1, 1), (2, 3), (3, 7), (5, 13), (8, 5)],
         "bench": [(2, 1 << 22), (8, 1 << 22)],
         "bench_gpu": [(2, 1 << 26), (8, 1 << 24)],
         "bench_sim": [(3, 101)]}

_REFS = {"allreduce_sum": reference_allreduce_sum, "allreduce_max": reference_allreduce_max,
         "reduce_scatter": reference_reduce_scatter, "all_gather": reference_all_gather,
         "broadcast": reference_broadcast}
_TITLES = {"allreduce_sum": "all-reduce (sum) over n virtual ranks",
           "allreduce_max": "all-reduce (max) over n virtual ranks",
           "reduce_scatter": "reduce-scatter (sum) over n virtual ranks",
           "all_gather": "all-gather over n virtual ranks",
           "broadcast": "broadcast from rank 0 over n virtual ranks"}

for _op in OPS:
    define_op(_op, reference=_REFS[_op], make_inputs=_make(_op), chapter=21, title=_TITLES[_op],
              size_names=("n", "L"), kind="memory",
              tol=sum_tol if _op in ("allreduce_sum", "reduce_scatter") else (0.0, 0.0),
              output_names=("out",), sizes=SIZES, edge_inputs=_make_edge(_op),
              flops=(lambda s: max(s[0] - 1, 0) * s[1]) if _op.startswith(("allreduce", "reduce")) else
              (lambda s: 0), bytes=_bytes(_op))


# --------------------------------------------------------------------------------------- the schedules
def step_tables(n, op):
    """The op's ring schedule as (modes, recv): recv[s, r] is the chunk rank r receives from rank r - 1 at step
    s (-1: none), modes[s] what it does with it (COPY, SUM or MAX).

    allreduce: ring_steps(n) as it is. reduce_scatter: its reduce-scatter phase with every chunk relabelled
    c -> c - 1, so that rank r ends holding the complete chunk r. all_gather: its all-gather phase relabelled
    the same way (rank r starts with chunk r). broadcast: a pipelined chain from the root, the rank at distance
    d receiving chunk c at step c + d - 1 (2n - 2 steps: n chunks through n - 1 hops)."""
    reduce_mode = MAX if op == "allreduce_max" else SUM
    steps = ring_steps(n)
    if op == "broadcast":
        recv = np.full((max(2 * n - 2, 0), n), -1, np.int32)
        for s in range(2 * n - 2):
            for r in range(n):
                d = (r - ROOT) % n
                c = s - d + 1
                if d and 0 <= c < n:
                    recv[s, r] = c
        return np.full(len(recv), COPY, np.int32), recv
    phases = {"allreduce_sum": ("reduce_scatter", "all_gather"), "allreduce_max": ("reduce_scatter", "all_gather"),
              "reduce_scatter": ("reduce_scatter",), "all_gather": ("all_gather",)}[op]
    shift = 0 if op.startswith("allreduce") else -1
    modes, recv = [], []
    for phase in phases:
        for s in range(n - 1):
            row = np.full(n, -1, np.int32)
            for (ph, st, r, _send, rc) in steps:
                if ph == phase and st == s:
                    row[r] = (rc + shift) % n
            recv.append(row)
            modes.append(reduce_mode if phase == "reduce_scatter" else COPY)
    return np.array(modes, np.int32).reshape(-1), np.array(recv, np.int32).reshape(-1, n)


_tables: dict = {}


def tables(n, op, on_device=False):
    key = (n, op, on_device)
    if key not in _tables:
        modes, recv = step_tables(n, op)
        _tables[key] = (modes, cuda.to_device(recv) if on_device and recv.size else recv)
    return _tables[key]


# --------------------------------------------------------------------------------------- CPU
@njit(cache=True)
def _combine(a, b, mode):
    if mode == 1:
        return a + b
    if mode == 2:
        return b if (b > a or b != b) else a  # NaN on either side wins (a NaN a stays: b > a is false)
    return b


@njit(cache=True)
def ring_step_cpu(buf, recv, mode):
    """One ring step for every virtual rank: rank r combines chunk recv[r] of row r - 1 into row r.
    No two ranks of one step touch the same (row, chunk): rank r writes chunk c of row r, which only rank
    r + 1 reads, at the next step."""
    n, L = buf.shape
    q, extra = L // n, L % n
    for r in range(n):
        c = recv[r]
        if c < 0:
            continue
        lo = c * q + min(c, extra)
        hi = lo + q + (1 if c < extra else 0)
        left = (r - 1) % n
        for i in range(lo, hi):
            buf[r, i] = _combine(buf[r, i], buf[left, i], mode)


@njit(cache=True)
def oneshot_cpu(out, x, mode):
    """out[r, i] = x[0, i] (+ or max) x[1, i] ... x[n-1, i] for every row r of out: each rank reads all n."""
    n, L = x.shape
    for r in range(out.shape[0]):
        for i in range(L):  # rank order 0, 1, ..., n-1 for every element; row by row, so the loops stream
            out[r, i] = x[0, i]
        for k in range(1, n):
            for i in range(L):
                out[r, i] = _combine(out[r, i], x[k, i], mode)


def _ring_cpu(buf, op):
    modes, recv = tables(buf.shape[0], op)
    for s in range(len(modes)):
        ring_step_cpu(buf, recv[s], modes[s])


def _reg_cpu(op):
    mode = MAX if op == "allreduce_max" else SUM

    @register(op, "cpu", "numpy", baseline=True, dtypes=DTYPES_CPU)
    def numpy_baseline(out, x):
        """NumPy on the stacked ranks: x.sum(0) / x.max(0) / a gather by owner / a row copy."""
        _check(x)
        n, L = x.shape
        if op == "allreduce_sum":
            out[:] = x.sum(0)
        elif op == "allreduce_max":
            out[:] = x.max(0)
        elif op == "reduce_scatter":
            out[:] = x.sum(0)
        elif op == "all_gather":
            out[:] = x[owners(L, n), np.arange(L)]
        else:
            out[:] = x[ROOT]

    @register(op, "cpu", "oneshot", rung=1, dtypes=DTYPES_CPU)
    def cpu_oneshot(out, x):
        """One pass: each output element reads its column of all n ranks (the one-shot algorithm: every rank
        reads every peer's whole buffer). n L reads per rank: fine for small messages, n times the ring's
        traffic for large ones."""
        _check(x)
        n, L = x.shape
        if op in ("allreduce_sum", "allreduce_max"):
            oneshot_cpu(out, x, mode)
        elif op == "reduce_scatter":
            full = np.empty((1, L), x.dtype)
            oneshot_cpu(full, x, SUM)
            out[:] = full[0]
        elif op == "all_gather":
            out[:] = x[owners(L, n), np.arange(L)]
        else:
            out[:] = x[ROOT]

    @register(op, "cpu", "ring", rung=2, dtypes=DTYPES_CPU)
    def cpu_ring(out, x):
        """The ring schedule (dist.schedule.ring_steps), one Numba chunk kernel per step over all ranks'
        (send, receive) pairs; each step moves L/n elements per rank, 2(n-1) steps for an all-reduce, so
        each rank reads 2(n-1)/n of the vector from its neighbour whatever n is."""
        _check(x)
        n, L = x.shape
        if op == "reduce_scatter":
            buf = x.copy()
            _ring_cpu(buf, op)
            out[:] = buf[owners(L, n), np.arange(L)]  # rank r holds the complete chunk r
        else:
            out[:] = x
            _ring_cpu(out, op)


for _op in OPS:
    _reg_cpu(_op)


# --------------------------------------------------------------------------------------------- GPU
THREADS_GPU, THREADS_SIM = 256, 32


def _threads():
    return THREADS_SIM if device.SIMULATED else THREADS_GPU


@cuda.jit(device=True, inline="always")
def combine_gpu(a, b, mode):
    if mode == 1:
        return a + b
    if mode == 2:
        return b if (b > a or b != b) else a
    return b


@cuda.jit
def ring_step_kernel(buf, recv, s, mode):
    # buf (n, L), recv (steps, n): one thread per (rank r, element j of the chunk r receives at step s)
    n, L = buf.shape
    q = L // n
    extra = L - q * n
    per = q + (1 if extra else 0)  # the longest chunk
    t = cuda.grid(1)
    if t >= n * per:
        return
    r = t // per
    j = t - r * per
    c = recv[s, r]
    if c < 0:
        return
    lo = c * q + min(c, extra)
    hi = lo + q + (1 if c < extra else 0)
    i = lo + j
    if i < hi:
        left = r - 1 if r > 0 else n - 1
        buf[r, i] = combine_gpu(buf[r, i], buf[left, i], mode)


@cuda.jit
def copy2d_kernel(dst, src):
    n, L = src.shape
    t = cuda.grid(1)
    if t < n * L:
        r = t // L
        i = t - r * L
        dst[r, i] = src[r, i]


@cuda.jit
def gather_owned_kernel(out, buf):
    # out (L,) = buf[owner(i), i]: each element from the rank whose chunk holds it
    n, L = buf.shape
    i = cuda.grid(1)
    if i < L:
        q = L // n
        extra = L - q * n
        edge = extra * (q + 1)
        r = i // (q + 1) if i < edge else extra + (i - edge) // q
        out[i] = buf[r, i]


@cuda.jit
def oneshot_kernel(out, x, mode):
    # out (m, L), x (n, L): out[r, i] = x[0, i] (op) ... (op) x[n-1, i]; each thread reads all n ranks
    m, L = out.shape
    n = x.shape[0]
    t = cuda.grid(1)
    if t < m * L:
        r = t // L
        i = t - r * L
        acc = x[0, i]
        for k in range(1, n):
            acc = combine_gpu(acc, x[k, i], mode)
        out[r, i] = acc


@cuda.jit
def oneshot_gather_kernel(out, x, root):
    # all_gather (root < 0): out[r, i] = x[owner(i), i];  broadcast: out[r, i] = x[root, i]
    n, L = x.shape
    t = cuda.grid(1)
    if t < n * L:
        r = t // L
        i = t - r * L
        k = root
        if root < 0:
            q = L // n
            extra = L - q * n
            edge = extra * (q + 1)
            k = i // (q + 1) if i < edge else extra + (i - edge) // q
        out[r, i] = x[k, i]


_scratch: dict = {}


def _work(shape, dtype):
    key = (shape, np.dtype(dtype).name)
    if key not in _scratch:
        _scratch[key] = cuda.device_array(shape, dtype)
    return _scratch[key]


def _ring_gpu(buf, op):
    n, L = buf.shape
    modes, recv = tables(n, op, on_device=True)
    per = -(-L // n)
    T = _threads()
    grid = ceil_div(n * per, T)
    for s in range(len(modes)):
        ring_step_kernel[grid, T](buf, recv, int32(s), int32(modes[s]))


def _reg_gpu(op):
    mode = MAX if op == "allreduce_max" else SUM

    @register(op, "gpu", "oneshot", rung=1, dtypes=DTYPES_GPU,
              ptx=[(oneshot_kernel, "void(float32[:, ::1], float32[:, ::1], int32)"),
                   (oneshot_gather_kernel, "void(float32[:, ::1], float32[:, ::1], int32)")])
    def gpu_oneshot(out, x):
        """One kernel, one thread per output element, reading the element's column of all n ranks (the one-shot
        algorithm: each rank reads every peer). One launch whatever n: the small-message algorithm; for large
        messages each rank reads n L elements, n/(2(n-1)/n) times the ring's traffic. With all n virtual ranks
        on one GPU that is n * n * L reads in all: predict n/2 times torch's time (torch sums once and copies).
        Measured on an H200 (book/data/bench/h200x2/allreduce_sum_gpu.json): 0.80 ms against torch's 0.66 ms at
        n = 2, L = 2**26; 1.83 ms against 0.53 ms at n = 8, L = 2**24, where the 4.3 GB it reads run at ~2.6 TB/s."""
        n, L = x.shape
        if n * L == 0:
            return
        T = _threads()
        if op in ("allreduce_sum", "allreduce_max"):
            oneshot_kernel[ceil_div(n * L, T), T](out, x, int32(mode))
        elif op == "reduce_scatter":
            oneshot_kernel[ceil_div(L, T), T](out.reshape(1, L), x, int32(SUM))
        else:
            oneshot_gather_kernel[ceil_div(n * L, T), T](out, x, int32(-1 if op == "all_gather" else ROOT))

    @register(op, "gpu", "ring", rung=2, dtypes=DTYPES_GPU,
              ptx=[(ring_step_kernel, "void(float32[:, ::1], int32[:, ::1], int32, int32)"),
                   (copy2d_kernel, "void(float32[:, ::1], float32[:, ::1])"),
                   (gather_owned_kernel, "void(float32[::1], float32[:, ::1])")])
    def gpu_ring(out, x):
        """The ring schedule, one kernel launch per step over every rank's (send, receive) chunk pair, each
        thread reading the sending rank's row: 2(n-1) launches of L/n elements per rank for an all-reduce.
        On one GPU the "link" is HBM and each step is a few microseconds of launch: this rung checks the
        schedule, it is not meant to beat the one-shot kernel here. Each step reads two chunks and writes one
        per rank, 3 L elements in all, after a copy of x (2 n L): predict (2n + 6(n-1)) L elements of traffic.
        Measured on an H200: 1.5 ms at n = 2, L = 2**26 (2.7 GB, ~1.8 TB/s) and 2.26 ms at n = 8, L = 2**24."""
        n, L = x.shape
        if n * L == 0:
            return
        T = _threads()
        if op == "reduce_scatter":
            buf = _work((n, L), x.dtype)
            copy2d_kernel[ceil_div(n * L, T), T](buf, x)
            _ring_gpu(buf, op)
            gather_owned_kernel[ceil_div(L, T), T](out, buf)
        else:
            copy2d_kernel[ceil_div(n * L, T), T](out, x)
            _ring_gpu(out, op)


for _op in OPS:
    _reg_gpu(_op)


# ------------------------------------------------------------------------------------ GPU baseline
def _torch_gpu():
    from .reductions import torch_gpu

    return torch_gpu()


def _reg_torch(op):
    @register(op, "gpu", "torch", baseline=True, requires=_torch_gpu, dtypes=DTYPES_GPU)
    def torch_baseline(out, x):
        """torch on the same device: x.sum(0) / x.amax(0) broadcast into every row (what a user writes to
        reduce stacked per-rank buffers on one GPU)."""
        import torch

        from .reductions import torch_view

        to, tx = torch_view(out), torch_view(x)
        if op == "allreduce_sum":
            to.copy_(torch.sum(tx, 0).expand_as(to))
        elif op == "allreduce_max":
            to.copy_(torch.amax(tx, 0).expand_as(to))  # amax propagates NaN
        else:
            torch.sum(tx, 0, out=to)


for _op in ("allreduce_sum", "allreduce_max", "reduce_scatter"):
    _reg_torch(_op)
