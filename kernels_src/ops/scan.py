"""Prefix sums (scan): inclusive and exclusive, int32 (exact) and float32 (chapter 15).

Shapes: x (n,) -> out (n,)
        inclusive: out[i] = x[0] + ... + x[i]        exclusive: out[i] = x[0] + ... + x[i-1], out[0] = 0
Cost:   n - 1 additions; at least 8n bytes move in int32/float32 (x read once, out written once). A scan
        does no more arithmetic than a copy, so it is judged as a copy: GB/s against the copy yardstick.

Integer scans are exact: int32 additions wrap modulo 2**32 like NumPy's ``cumsum(dtype=int32)`` in any
order, so every rung must agree with the reference bit for bit (tolerance 0).

Float32 error model (stated once, here, and used as the tolerance by ``scan_tol``). Every rung computes
out[i] as a sum of x[0..i] in some tree of additions; the tree's depth d(i) is the longest chain of
additions any x[j] passes through. Each addition rounds with relative error <= eps/2 (eps = 2**-23), so
        |out[i] - exact[i]| <= d(i) * eps/2 * (|x[0]| + ... + |x[i]|)        (worst case)
and, because on random data the rounding errors are independent and of both signs, typically about
sqrt(d(i)) * eps/2 times that sum. The sequential loop has d(i) = i (the worst); a tile scan has
d <= ITEMS + 2*log2(T) + (tiles before it): every rung has d(i) <= n. The tolerance allows
sqrt(n) * eps relative to the sum of |x| (the inputs are non-negative, so that sum is |exact[i]|), plus
8 eps for the short sums where sqrt(n) is small. A dropped or doubled element (a relative error of at least
1/(i+1) at element i with inputs in [0.5, 1)) fails it for every n the checks use.

Ladder (the same for inclusive ``scan`` and exclusive ``scan_exclusive``)
  cpu/numpy        baseline  np.cumsum (one sequential loop in C)
  cpu/torch        baseline  torch.cumsum on the CPU
  cpu/seq          rung 1    one compiled loop with a running total
  cpu/two_pass     rung 2    prange: per-chunk sums, a scan of the P sums, each chunk rescanned with its offset
  cpu/blocked      rung 3    one DRAM pass: rounds of one cache-sized block per thread; a block is scanned as
                             8 sub-blocks at once (8 independent chains), its offset added next round from L2
  gpu/hillis_steele rung 1   ONE block walks the array in tiles of T; Hillis-Steele in shared memory
                             (log2 T steps, n log n additions), a carry between tiles
  gpu/blelloch     rung 2    ONE block; each thread scans ITEMS values in registers, then Blelloch's
                             work-efficient up-sweep/down-sweep over the T thread totals
  gpu/reduce_then_scan rung 3 many blocks, 3 kernels: tile sums; one block scans the sums; every tile
                             rescanned from its offset. Reads x twice: 12n bytes instead of 8n
  gpu/lookback     rung 4    single pass with decoupled look-back (Merrill & Garland 2016): each tile
                             publishes its sum, then its inclusive prefix, and a tile finds its offset by
                             looking back at its predecessors' flags. 8n bytes. Real GPU only (fences)
  gpu/decoupled    rung 5    rung 4 with ONE packed 64-bit (status, value) word per tile (no fence: a reader
                             sees both halves or neither), a warp-wide look-back (32 predecessors per step,
                             ballot + shuffle sum), 16 values per thread and 16-byte loads. 8n bytes.
                             Real GPU only (shuffles); ``segmented_scan`` reuses it with a (flag, value) operator
  gpu/torch        baseline  torch.cumsum on the GPU
  gpu/cccl         baseline  CCCL's cuda.compute scan (CUB from Python), where it is installed

The look-back's memory-ordering rules (see ``lookback_kernel``):
  1. a tile's number comes from an atomic ticket counter, not blockIdx.x: tickets are handed out in the
     order blocks START, so every tile a block waits for belongs to a block that is already running (or
     done). With blockIdx.x, block 5000 could occupy an SM and spin on tile 4999 whose block is not yet
     resident because every SM is full of spinners: a deadlock;
  2. the writer stores the value (aggregate or inclusive prefix), then ``cuda.threadfence()``, then sets
     the flag with an atomic: the fence orders the value before the flag for every observer on the device;
  3. the reader polls the flag with an atomic (which goes to L2, never a stale L1 line), then
     ``cuda.threadfence()``, then reads the value with an atomic too (a plain load could hit a line this SM
     cached earlier);
  4. the flags carry an epoch (2e for "aggregate ready", 2e + 1 for "inclusive prefix ready"; e grows by one
     each launch), so no launch has to clear them first: anything below 2e is "not yet".
The CUDA simulator has no ``cuda.threadfence`` and runs blocks one after another, so it can neither run
nor test this rung; rung 3 computes the same result in the simulator.
"""
import math

import numpy as np

from ..compiler import cuda, float32, int32, njit, prange
from .. import device
from ..device import ceil_div
from ..registry import define_op, exercise_op, register

EPS32 = float(np.finfo(np.float32).eps)
DTYPES = ("int32", "float32")


# --------------------------------------------------------------------------------------- reference
def reference(x):
    """Inclusive prefix sum. int32: exact, wrapping modulo 2**32 (NumPy's int32 cumsum); float: float64."""
    if np.issubdtype(x.dtype, np.integer):
        return np.cumsum(x, dtype=x.dtype)
    return np.cumsum(x.astype(np.float64))


def reference_exclusive(x):
    """Exclusive prefix sum: out[0] = 0, out[i] = x[0] + ... + x[i-1]."""
    inc = reference(x)
    out = np.zeros_like(inc)
    out[1:] = inc[:-1]
    return out


def make_inputs(size, dtype, rng):
    """int32: integers in [-1000, 1000] (both signs: a wrong order or a dropped element shows at once);
    float32: uniform in [0.5, 1), all positive, so |out[i]| is the sum of |x| the error model scales with,
    and a dropped element changes out[i] by at least 0.5."""
    (n,) = size
    if np.dtype(dtype).kind in "iu":
        return (rng.integers(-1000, 1001, n).astype(np.int32),)
    return ((0.5 + 0.5 * rng.random(n)).astype(np.float32),)


def make_edge_inputs(size, dtype, rng):
    """int32: values near +-2**31, so the running sum wraps (every rung must wrap as int32 does);
    float32: a +inf, a NaN and a -0.0 among ordinary values: every output after the inf is inf, after the
    NaN NaN, in whatever order the rung adds (an infinite sum has no rounding to argue about)."""
    (n,) = size
    (x,) = make_inputs(size, dtype, rng)
    if n == 0:
        return (x,)
    if x.dtype == np.int32:
        big = rng.integers(2**30, 2**31 - 1, n)
        x = np.where(rng.random(n) < 0.3, big * np.where(rng.random(n) < 0.5, -1, 1), x).astype(np.int32)
        return (x,)
    pos = rng.permutation(n)[:3]
    vals = [np.inf, np.nan, -0.0]
    order = sorted(zip(pos, vals))  # any order: reference and kernels agree on NaN and inf wherever they fall
    for p, v in order:
        x[p] = v
    return (x,)


def scan_tol(size, dtype):
    """The error model of the module docstring: exact for integers; float32 within
    (sqrt(n) + 8) * eps of |exact[i]| (inputs non-negative, so |exact[i]| is the sum of |x|)."""
    if np.dtype(dtype).kind in "iu":
        return (0.0, 0.0)
    (n,) = size
    return ((math.sqrt(max(n, 1)) + 8.0) * EPS32, 0.0)


SIZES = {"check": [(0,), (1,), (2,), (7,), (127,), (1000,), (4099,), (65537,),
                   (262147,)],  # 3 of cpu/blocked's blocks and a tail: 2 rounds on 2 threads, one block idle
         # 97 and 301 span several simulator tiles (T = 32, ITEMS = 3: 96 per tile)
         "check_sim": [(0,), (1,), (7,), (97,), (301,)],
         "bench": [(1 << 20,), (1 << 24,)],
         "bench_gpu": [(1 << 20,), (1 << 24,), (1 << 28,)],
         "bench_sim": [(301,)]}

for _name, _ref, _title in (("scan", reference, "inclusive prefix sum"),
                            ("scan_exclusive", reference_exclusive, "exclusive prefix sum")):
    define_op(_name, reference=_ref, make_inputs=make_inputs, chapter=15, title=_title, size_names=("n",),
              kind="memory", tol=scan_tol, output_names=("out",), sizes=SIZES, edge_inputs=make_edge_inputs,
              flops=lambda s: max(s[0] - 1, 0), bytes=lambda s, b: 2 * s[0] * b)


# --------------------------------------------------------------------------------------------- CPU
@njit(cache=True)
def scan_seq(out, x, exclusive):
    acc = x.dtype.type(0)
    for i in range(x.size):
        v = x[i]
        if exclusive:
            out[i] = acc
            acc = acc + v
        else:
            acc = acc + v
            out[i] = acc


@njit(parallel=True, cache=True)
def scan_two_pass(out, x, parts, exclusive):
    # x (n,) -> out (n,); parts (P,): one running total per chunk
    n = x.size
    P = parts.size
    per = (n + P - 1) // P
    for p in prange(P):  # pass 1: each core sums its chunk
        acc = x.dtype.type(0)
        for i in range(p * per, min(n, (p + 1) * per)):
            acc = acc + x[i]
        parts[p] = acc
    run = x.dtype.type(0)  # the scan of the P chunk sums: P additions, sequential
    for p in range(P):
        s = parts[p]
        parts[p] = run
        run = run + s
    for p in prange(P):  # pass 2: each core rescans its chunk from its offset
        acc = parts[p]
        for i in range(p * per, min(n, (p + 1) * per)):
            if exclusive:
                out[i] = acc
                acc = acc + x[i]
            else:
                acc = acc + x[i]
                out[i] = acc


# Rung 3's geometry: a block is 8 sub-blocks of SUB values (~64K values, 256 KiB of int32/float32 output),
# small enough that the block's output is still in the core's L2 when its offset is added one round later.
# SUB is 8192 + 16, not 8192: with sub-blocks 32 KiB apart, the 16 streams (8 loads, 8 stores) all fall in
# the same L1 set and evict each other; 64 bytes more each and they fall in 16 different sets (measured:
# several times faster on one core).
SUB = 8192 + 16
CHAINS = 8


@njit(cache=True)
def scan_chains8(out, x, s, L, tot, p, exclusive):
    # x[s : s + 8L] -> out: 8 sub-blocks of L values scanned at once, each from 0; tot[p, j]: sub-block j's sum.
    # Slices indexed from 0 let the compiler drop the negative-index checks a global index would need.
    z = x.dtype.type(0)
    a0 = z; a1 = z; a2 = z; a3 = z; a4 = z; a5 = z; a6 = z; a7 = z  # noqa: E702
    x0 = x[s:s + L]; x1 = x[s + L:s + 2 * L]; x2 = x[s + 2 * L:s + 3 * L]; x3 = x[s + 3 * L:s + 4 * L]  # noqa: E702
    x4 = x[s + 4 * L:s + 5 * L]; x5 = x[s + 5 * L:s + 6 * L]; x6 = x[s + 6 * L:s + 7 * L]  # noqa: E702
    x7 = x[s + 7 * L:s + 8 * L]
    o0 = out[s:s + L]; o1 = out[s + L:s + 2 * L]; o2 = out[s + 2 * L:s + 3 * L]  # noqa: E702
    o3 = out[s + 3 * L:s + 4 * L]; o4 = out[s + 4 * L:s + 5 * L]; o5 = out[s + 5 * L:s + 6 * L]  # noqa: E702
    o6 = out[s + 6 * L:s + 7 * L]; o7 = out[s + 7 * L:s + 8 * L]  # noqa: E702
    for k in range(L):  # 8 independent add chains: 8 values per chain latency instead of 1
        v0 = x0[k]; v1 = x1[k]; v2 = x2[k]; v3 = x3[k]; v4 = x4[k]; v5 = x5[k]; v6 = x6[k]; v7 = x7[k]  # noqa: E702
        if exclusive:
            o0[k] = a0; o1[k] = a1; o2[k] = a2; o3[k] = a3  # noqa: E702
            o4[k] = a4; o5[k] = a5; o6[k] = a6; o7[k] = a7  # noqa: E702
        a0 += v0; a1 += v1; a2 += v2; a3 += v3; a4 += v4; a5 += v5; a6 += v6; a7 += v7  # noqa: E702
        if not exclusive:
            o0[k] = a0; o1[k] = a1; o2[k] = a2; o3[k] = a3  # noqa: E702
            o4[k] = a4; o5[k] = a5; o6[k] = a6; o7[k] = a7  # noqa: E702
    tot[p, 0] = a0; tot[p, 1] = a1; tot[p, 2] = a2; tot[p, 3] = a3  # noqa: E702
    tot[p, 4] = a4; tot[p, 5] = a5; tot[p, 6] = a6; tot[p, 7] = a7  # noqa: E702


@njit(parallel=True, cache=True)
def scan_blocked(out, x, tot, off, L, exclusive):
    # x (n,) -> out (n,); tot, off (P, 8): this round's sub-block sums, last round's sub-block offsets.
    # Round r: thread p adds the offsets to block (r-1)P + p (its output still in L2), then scans block rP + p
    # from 0; between rounds, one thread turns the 8P sums into offsets in block order (deterministic: the
    # same additions whatever P is). x is read from DRAM once and out written once.
    n = x.size
    P = tot.shape[0]
    B = CHAINS * L
    nblk = n // B
    R = (nblk + P - 1) // P
    run = x.dtype.type(0)
    for r in range(R + 1):
        for p in prange(P):
            b = (r - 1) * P + p
            if r > 0 and b < nblk:
                for j in range(CHAINS):
                    c = off[p, j]
                    o = out[b * B + j * L:b * B + (j + 1) * L]
                    for i in range(L):  # contiguous: vector adds, from L2
                        o[i] += c
            b = r * P + p
            if r < R and b < nblk:
                scan_chains8(out, x, b * B, L, tot, p, exclusive)
        if r < R:
            for p in range(P):
                if r * P + p < nblk:
                    for j in range(CHAINS):
                        off[p, j] = run
                        run = run + tot[p, j]
    for i in range(nblk * B, n):  # the tail (< one block): one chain from the running total
        v = x[i]
        if exclusive:
            out[i] = run
            run = run + v
        else:
            run = run + v
            out[i] = run


def _torch_cpu():
    from .cpu_baselines import torch_cpu

    return torch_cpu()


def _torch_dtype(a):
    import torch

    return torch.int32 if a.dtype == np.int32 else torch.float32


def _register_cpu(op, exclusive):
    @register(op, "cpu", "numpy", baseline=True, dtypes=DTYPES)
    def numpy_cumsum(out, x):
        """NumPy's cumsum: one sequential loop in C, written into out."""
        if exclusive:
            if x.size:
                out[0] = 0
                np.cumsum(x[:-1], out=out[1:])
        else:
            np.cumsum(x, out=out)

    @register(op, "cpu", "torch", baseline=True, requires=_torch_cpu, dtypes=DTYPES)
    def torch_cumsum_cpu(out, x):
        """torch.cumsum on the CPU, written into out (exclusive: the cumsum of x[:-1] into out[1:])."""
        import torch

        from .cpu_baselines import tviews

        to, tx = tviews(out, x)
        if exclusive:
            if x.size:
                to[0] = 0
                torch.cumsum(tx[:-1], 0, dtype=_torch_dtype(x), out=to[1:])
        else:
            torch.cumsum(tx, 0, dtype=_torch_dtype(x), out=to)

    @register(op, "cpu", "seq", rung=1, dtypes=DTYPES)
    def seq(out, x):
        """One compiled loop with a running total: each addition waits for the previous one (a chain of n
        dependent adds, ~1 element per add latency), so predict about NumPy's speed, far below copy."""
        scan_seq(out, x, exclusive)

    @register(op, "cpu", "two_pass", rung=2, dtypes=DTYPES)
    def two_pass(out, x):
        """prange over P chunks: sum each chunk, scan the P sums, rescan each chunk from its offset. Reads x
        twice (12n bytes instead of 8n) but runs P dependency chains at once: predict up to P x rung 1 on
        data in cache, and 2/3 of the copy bandwidth once DRAM is the limit."""
        from ..compiler import get_num_threads

        parts = np.empty(max(1, min(x.size, 4 * get_num_threads())), x.dtype)
        scan_two_pass(out, x, parts, exclusive)

    @register(op, "cpu", "blocked", rung=3, dtypes=DTYPES)
    def blocked(out, x):
        """One DRAM pass. Rounds of one ~64K-value block per thread: the block is scanned as 8 sub-blocks of
        8208 at once (8 independent add chains, so the loop is bound by its one store per value, not by the
        add latency that holds rungs 1-2 to one value per ~4 cycles), and its offsets are added one round
        later while its 256 KiB of output is still in L2 (a contiguous vector add). x is read once and out
        written once, the copy's traffic. Prediction: about one value per cycle per core, 2 cores x ~2.5 GHz
        x 8 bytes = ~40 GB/s, so ~80 % of copy at 2^24 (the tail block and one barrier per round aside).
        The barrier makes it slow when other programs hold the cores: each round waits for every thread."""
        from ..compiler import get_num_threads

        P = max(1, get_num_threads())
        tot = np.empty((P, CHAINS), x.dtype)
        off = np.empty((P, CHAINS), x.dtype)
        scan_blocked(out, x, tot, off, SUB, exclusive)

    return numpy_cumsum, torch_cumsum_cpu, seq, two_pass, blocked


_register_cpu("scan", False)
_register_cpu("scan_exclusive", True)


# --------------------------------------------------------------------------------------------- GPU
# Block geometry. On the GPU a tile is T threads x ITEMS values (ITEMS odd, so that thread t reading its
# ITEMS consecutive values at t*ITEMS + k from shared memory hits 32 different banks). The simulator runs
# one Python thread per CUDA thread: 32 threads of 3 values.
HS_THREADS = 1024
T_GPU, ITEMS_GPU = 256, 15
T_SIM, ITEMS_SIM = 32, 3


def geometry():
    """(T, ITEMS) for the tile kernels here: the GPU's, or the simulator's small ones."""
    return (T_SIM, ITEMS_SIM) if device.SIMULATED else (T_GPU, ITEMS_GPU)


_TYPES = {"int32": int32, "float32": float32}


def _zero(dt):
    return np.int32(0) if dt == "int32" else np.float32(0.0)


def make_block_scans(nbt, T):
    """Shared-memory block scans over one value per thread, for T threads (T a power of two) of numba type
    ``nbt``. Both return (scan of v, block total); every thread of the block must call them."""
    ZERO = nbt(0)

    @cuda.jit(device=True, inline="always")
    def block_scan_hs(v, buf):
        """Hillis-Steele, inclusive: log2(T) steps; in step k every thread adds the value 2**k places to its
        left. T*log2(T) additions for T values: not work-efficient, but only log2(T) steps deep."""
        tid = cuda.threadIdx.x
        buf[tid] = v
        cuda.syncthreads()
        off = 1
        while off < T:
            t = buf[tid - off] if tid >= off else ZERO
            cuda.syncthreads()  # everybody has read before anybody writes
            buf[tid] += t
            cuda.syncthreads()
            off *= 2
        r = buf[tid]
        total = buf[T - 1]
        cuda.syncthreads()
        return r, total

    @cuda.jit(device=True, inline="always")
    def block_scan_blelloch(v, buf):
        """Blelloch, exclusive: an up-sweep builds a sum tree in place (T - 1 additions), the root is
        replaced by 0, and a down-sweep pushes prefixes back down (T - 1 additions, T - 1 swaps).
        2*log2(T) steps, O(T) work: work-efficient."""
        tid = cuda.threadIdx.x
        buf[tid] = v
        cuda.syncthreads()
        off = 1
        d = T // 2
        while d > 0:  # up-sweep: buf[bi] becomes the sum of its subtree
            if tid < d:
                ai = off * (2 * tid + 1) - 1
                bi = off * (2 * tid + 2) - 1
                buf[bi] += buf[ai]
            off *= 2
            cuda.syncthreads()
            d //= 2
        total = buf[T - 1]
        cuda.syncthreads()  # everybody has the total before the root is cleared
        if tid == 0:
            buf[T - 1] = ZERO
        cuda.syncthreads()
        d = 1
        while d < T:  # down-sweep: a node passes its prefix left, prefix + left sum right
            off //= 2
            if tid < d:
                ai = off * (2 * tid + 1) - 1
                bi = off * (2 * tid + 2) - 1
                t = buf[ai]
                buf[ai] = buf[bi]
                buf[bi] += t
            cuda.syncthreads()
            d *= 2
        r = buf[tid]
        cuda.syncthreads()
        return r, total

    return block_scan_hs, block_scan_blelloch


def make_tile_scan(nbt, T, ITEMS, exclusive):
    """``tile_scan(out, x, base, carry, s, buf)``: scan the tile x[base : base + T*ITEMS] (elements past
    x.size count as 0 and are not written), add ``carry`` to every output, write them, and return the
    tile's total. Loads and stores are coalesced through shared memory ``s`` (T*ITEMS values); each
    thread scans its ITEMS consecutive values sequentially; Blelloch scans the T thread totals (``buf``)."""
    ZERO = nbt(0)
    _, block_scan_blelloch = make_block_scans(nbt, T)

    @cuda.jit(device=True, inline="always")
    def tile_total(x, base, buf):
        tid = cuda.threadIdx.x
        n = x.size
        acc = ZERO
        for k in range(ITEMS):  # coalesced: consecutive threads read consecutive elements
            g = base + k * T + tid
            if g < n:
                acc += x[g]
        _, total = block_scan_blelloch(acc, buf)
        return total

    @cuda.jit(device=True, inline="always")
    def tile_scan(out, x, base, carry, s, buf):
        tid = cuda.threadIdx.x
        n = x.size
        for k in range(ITEMS):
            i = k * T + tid
            g = base + i
            s[i] = x[g] if g < n else ZERO
        cuda.syncthreads()
        acc = ZERO
        for k in range(ITEMS):  # thread tid owns s[tid*ITEMS : (tid+1)*ITEMS]
            acc += s[tid * ITEMS + k]
        excl, total = block_scan_blelloch(acc, buf)
        run = excl + carry
        for k in range(ITEMS):
            j = tid * ITEMS + k
            v = s[j]
            if exclusive:
                s[j] = run
                run += v
            else:
                run += v
                s[j] = run
        cuda.syncthreads()
        for k in range(ITEMS):
            i = k * T + tid
            g = base + i
            if g < n:
                out[g] = s[i]
        cuda.syncthreads()  # s may be refilled by the next tile
        return total

    return tile_total, tile_scan


_kcache: dict = {}


def _cached(key, build):
    if key not in _kcache:
        _kcache[key] = build()
    return _kcache[key]


def hs_kernel(dt, exclusive, T):
    def build():
        nbt = _TYPES[dt]
        ZERO = nbt(0)
        block_scan_hs, _ = make_block_scans(nbt, T)

        @cuda.jit
        def scan_hs_one_block(out, x):
            # x (n,) -> out (n,): one block of T threads walks x in tiles of T
            buf = cuda.shared.array(T, nbt)
            sh = cuda.shared.array(T, nbt)
            tid = cuda.threadIdx.x
            carry = ZERO
            for base in range(0, x.size, T):
                g = base + tid
                v = x[g] if g < x.size else ZERO
                r, total = block_scan_hs(v, buf)
                if exclusive:  # the left neighbour's inclusive value (inc - v would turn inf into NaN)
                    sh[tid] = r
                    cuda.syncthreads()
                    r = sh[tid - 1] if tid > 0 else ZERO
                    cuda.syncthreads()
                if g < x.size:
                    out[g] = carry + r
                carry += total

        return scan_hs_one_block

    return _cached(("hs", dt, exclusive, T), build)


def blelloch_kernel(dt, exclusive, T, ITEMS):
    def build():
        nbt = _TYPES[dt]
        ZERO = nbt(0)
        TILE = T * ITEMS
        _, tile_scan = make_tile_scan(nbt, T, ITEMS, exclusive)

        @cuda.jit
        def scan_blelloch_one_block(out, x):
            # x (n,) -> out (n,): one block walks x in tiles of T*ITEMS, carrying the running total
            s = cuda.shared.array(TILE, nbt)
            buf = cuda.shared.array(T, nbt)
            carry = ZERO
            for base in range(0, x.size, T * ITEMS):
                carry += tile_scan(out, x, base, carry, s, buf)

        return scan_blelloch_one_block

    return _cached(("bl", dt, exclusive, T, ITEMS), build)


def rts_kernels(dt, exclusive, T, ITEMS):
    """The three kernels of reduce-then-scan."""
    def build():
        nbt = _TYPES[dt]
        ZERO = nbt(0)
        TILE = T * ITEMS
        tile_total, tile_scan = make_tile_scan(nbt, T, ITEMS, exclusive)
        _, scan_parts_tile = make_tile_scan(nbt, T, ITEMS, True)

        @cuda.jit
        def tile_sums(part, x):
            # x (n,) -> part (tiles,): block b sums tile b
            buf = cuda.shared.array(T, nbt)
            total = tile_total(x, cuda.blockIdx.x * (T * ITEMS), buf)
            if cuda.threadIdx.x == 0:
                part[cuda.blockIdx.x] = total

        @cuda.jit
        def scan_sums(part, tmp):
            # part (tiles,) -> part: its exclusive scan, in place, by one block (tmp: a copy of part)
            s = cuda.shared.array(TILE, nbt)
            buf = cuda.shared.array(T, nbt)
            carry = ZERO
            for base in range(0, tmp.size, T * ITEMS):
                carry += scan_parts_tile(part, tmp, base, carry, s, buf)

        @cuda.jit
        def tile_scan_offset(out, x, part):
            # x (n,) -> out (n,): block b rescans tile b starting from part[b]
            s = cuda.shared.array(TILE, nbt)
            buf = cuda.shared.array(T, nbt)
            b = cuda.blockIdx.x
            tile_scan(out, x, b * (T * ITEMS), part[b], s, buf)

        return tile_sums, scan_sums, tile_scan_offset

    return _cached(("rts", dt, exclusive, T, ITEMS), build)


def lookback_kernel(dt, exclusive, T, ITEMS):
    """The single-pass scan with decoupled look-back (rules 1-4 of the module docstring)."""
    def build():
        nbt = _TYPES[dt]
        ZERO = nbt(0)
        TILE = T * ITEMS
        _, tile_scan = make_tile_scan(nbt, T, ITEMS, exclusive)
        _, block_scan_blelloch = make_block_scans(nbt, T)

        @cuda.jit
        def scan_lookback(out, x, flags, aggs, incls, ticket, epoch):
            # x (n,) -> out (n,); flags (tiles,) int32; aggs, incls (tiles,): published tile sums and
            # inclusive prefixes; ticket (1,) int32, zero between launches; epoch: this launch's number
            s = cuda.shared.array(TILE, nbt)
            buf = cuda.shared.array(T, nbt)
            sh_tile = cuda.shared.array(1, int32)
            sh_prefix = cuda.shared.array(1, nbt)
            tid = cuda.threadIdx.x
            if tid == 0:  # rule 1: the tile is the order this block started in, not blockIdx.x
                t = cuda.atomic.add(ticket, 0, 1)
                sh_tile[0] = t
                if t == cuda.gridDim.x - 1:  # the last ticket: every block has one, so reset for next launch
                    cuda.atomic.exch(ticket, 0, 0)
            cuda.syncthreads()
            b = sh_tile[0]
            base = b * (T * ITEMS)
            n = x.size
            for k in range(ITEMS):  # load and sum the tile first: its aggregate is published early
                i = k * T + tid
                g = base + i
                s[i] = x[g] if g < n else ZERO
            cuda.syncthreads()
            acc = ZERO
            for k in range(ITEMS):
                acc += s[tid * ITEMS + k]
            excl, total = block_scan_blelloch(acc, buf)
            AGG = 2 * epoch
            INC = 2 * epoch + 1
            if tid == 0:
                prefix = ZERO
                if b == 0:
                    incls[0] = total
                    cuda.threadfence()  # rule 2: the value before the flag
                    cuda.atomic.exch(flags, 0, INC)
                else:
                    aggs[b] = total
                    cuda.threadfence()
                    cuda.atomic.exch(flags, b, AGG)
                    j = b - 1
                    while True:  # rule 3: poll with an atomic, fence, read the value with an atomic
                        f = cuda.atomic.add(flags, j, 0)
                        if f == INC:
                            cuda.threadfence()
                            prefix += cuda.atomic.add(incls, j, ZERO)
                            break
                        if f == AGG:
                            cuda.threadfence()
                            prefix += cuda.atomic.add(aggs, j, ZERO)
                            j -= 1
                        # else: tile j's block has started (rule 1) but not published yet: poll again
                    incls[b] = prefix + total
                    cuda.threadfence()
                    cuda.atomic.exch(flags, b, INC)
                sh_prefix[0] = prefix
            cuda.syncthreads()
            run = excl + sh_prefix[0]
            for k in range(ITEMS):
                j2 = tid * ITEMS + k
                v = s[j2]
                if exclusive:
                    s[j2] = run
                    run += v
                else:
                    run += v
                    s[j2] = run
            cuda.syncthreads()
            for k in range(ITEMS):
                i = k * T + tid
                g = base + i
                if g < n:
                    out[g] = s[i]

        return scan_lookback

    return _cached(("lb", dt, exclusive, T, ITEMS), build)


def _dt(a) -> str:
    return "int32" if np.dtype(a.dtype) == np.int32 else "float32"


_scratch: dict = {}


def _buf(key, n, dtype, zero=False):
    """A cached device buffer of at least n elements (no allocation inside timed launches)."""
    have = _scratch.get(key)
    if have is None or have.size < n:
        arr = np.zeros(max(n, 1), dtype)
        have = _scratch[key] = cuda.to_device(arr) if zero else cuda.device_array(max(n, 1), dtype)
    return have


def scan_hs(out, x, exclusive=False):
    if x.size == 0:
        return
    T = 32 if device.SIMULATED else HS_THREADS
    hs_kernel(_dt(x), exclusive, T)[1, T](out, x)


def scan_blelloch(out, x, exclusive=False):
    if x.size == 0:
        return
    T, ITEMS = geometry()
    blelloch_kernel(_dt(x), exclusive, T, ITEMS)[1, T](out, x)


def scan_rts(out, x, exclusive=False):
    if x.size == 0:
        return
    T, ITEMS = geometry()
    dt = _dt(x)
    k_sums, k_scan, k_fix = rts_kernels(dt, exclusive, T, ITEMS)
    tiles = ceil_div(x.size, T * ITEMS)
    part = _buf(("part", dt), tiles, np.dtype(dt))[:tiles]
    tmp = _buf(("tmp", dt), tiles, np.dtype(dt))[:tiles]
    k_sums[tiles, T](tmp, x)  # kernel 1: one sum per tile (reads x)
    k_scan[1, T](part, tmp)  # kernel 2: one block scans the tile sums (exclusive)
    k_fix[tiles, T](out, x, part)  # kernel 3: each tile rescanned from its offset (reads x, writes out)


_epoch = {}


def scan_lookback(out, x, exclusive=False):
    if x.size == 0:
        return
    T, ITEMS = geometry()
    dt = _dt(x)
    tiles = ceil_div(x.size, T * ITEMS)
    key = ("lbflags",)
    e = _epoch.get(dt, 0) + 1
    if e >= (1 << 29):  # the epoch would overflow the flags: start over from cleared flags
        _scratch.pop(key, None)
        e = 1
    flags = _buf(key, tiles, np.int32, zero=True)
    if flags.size < tiles:  # pragma: no cover  (_buf grows it)
        raise RuntimeError("flag buffer too small")
    _epoch[dt] = e
    for other in _epoch:  # one flag buffer for both dtypes: they share the epoch count
        _epoch[other] = e
    aggs = _buf(("aggs", dt), tiles, np.dtype(dt))
    incls = _buf(("incls", dt), tiles, np.dtype(dt))
    ticket = _buf(("ticket",), 1, np.int32, zero=True)
    lookback_kernel(dt, exclusive, T, ITEMS)[tiles, T](out, x, flags, aggs, incls, ticket, np.int32(e))


def needs_fences():
    """``requires=`` for the look-back: a real GPU (the simulator has no cuda.threadfence, and its blocks
    run one after another, so a look-back could never be tested there)."""
    if device.MODE != "gpu":
        return False, "decoupled look-back needs a real GPU (the simulator has no cuda.threadfence)"
    return True, ""


# ------------------------------------------------------------- rung 5: single pass, warp-wide look-back
# One tile = DL_T threads x DL_ITEMS values (8 warps x 512). Each warp loads its own 512 contiguous values with
# 16-byte loads into shared memory, padded by one word per 32 so that both the loads (4 consecutive values per
# lane) and the scan (16 consecutive values per lane) hit 32 different banks.
DL_T, DL_ITEMS = 256, 16
DL_TILE = DL_T * DL_ITEMS
_U0, _U32, _LOW32 = np.uint64(0), np.uint64(32), np.uint64(0xFFFFFFFF)
FULL_MASK = 0xFFFFFFFF


def _bits_fns(dt):
    """(to_bits, from_bits): a 4-byte value <-> its bit pattern as uint32 (float32: the IEEE bits; int32:
    two's complement), so that a value can ride in the low half of a 64-bit descriptor."""
    from ..compiler import f32_as_u32, u32_as_f32, uint32

    if dt == "float32":
        return f32_as_u32, u32_as_f32

    @cuda.jit(device=True, inline=True)
    def i32_bits(v):
        return uint32(v)

    @cuda.jit(device=True, inline=True)
    def bits_i32(u):
        return int32(u)

    return i32_bits, bits_i32


def decoupled_kernel(dt, exclusive, vec, segmented=False):
    """Rung 5 of ``scan`` (and the fast rung of ``segmented_scan``): one pass, 8n bytes, a warp-wide
    look-back over packed 64-bit (status, value) descriptors. ``vec``: x and out start on 16-byte
    boundaries, so whole groups of four move as one 16-byte load/store. ``segmented``: a head-flag array
    comes with x and the scan restarts at every nonzero flag."""
    def build():
        from ..compiler import int64, load4, store4, uint32, uint64

        nbt = _TYPES[dt]
        ZERO = nbt(0)
        T, ITEMS = DL_T, DL_ITEMS
        W = T // 32
        WTILE = 32 * ITEMS  # values per warp
        TILE = T * ITEMS
        PAD = TILE + TILE // 32
        HPAD = PAD if segmented else 1
        GROUPS = WTILE // 128  # 16-byte loads per lane
        to_bits, from_bits = _bits_fns(dt)

        @cuda.jit(device=True, inline=True)
        def pack(status, v):  # one 64-bit word: the status in the high half, the value's bits in the low
            return (uint64(status) << _U32) | uint64(to_bits(v))

        @cuda.jit(device=True, inline=True)
        def warp_sum(v):
            off = 16
            while off > 0:
                v += cuda.shfl_xor_sync(FULL_MASK, v, off)
                off //= 2
            return v

        @cuda.jit(device=True, inline=True)
        def load_warp_tile(s, a, base, wbase, lane, n, zero):
            # a[base + wbase : base + wbase + 512] -> s (padded), 128 contiguous values per warp instruction
            for k in range(GROUPS):
                e = wbase + k * 128 + lane * 4
                g = base + e
                q = e + (e >> 5)
                if vec and g + 3 < n:
                    v0, v1, v2, v3 = load4(a, g // 4)
                else:
                    v0 = a[g] if g < n else zero
                    v1 = a[g + 1] if g + 1 < n else zero
                    v2 = a[g + 2] if g + 2 < n else zero
                    v3 = a[g + 3] if g + 3 < n else zero
                s[q] = v0
                s[q + 1] = v1
                s[q + 2] = v2
                s[q + 3] = v3

        @cuda.jit
        def scan_single_pass(out, x, heads, desc, ticket, epoch):
            # x (n,) -> out (n,); heads (n,) int32 head flags (segmented) or (1,) unused; desc (tiles,) uint64:
            # one packed (status, value) word per tile; ticket (1,) int32, zero between launches
            s = cuda.shared.array(PAD, nbt)
            hs = cuda.shared.array(HPAD, int32)
            wsum = cuda.shared.array(W, nbt)
            wflag = cuda.shared.array(W, int32)
            sh_tile = cuda.shared.array(1, int32)
            sh_prefix = cuda.shared.array(1, nbt)
            tid = cuda.threadIdx.x
            lane = tid & 31
            w = tid >> 5
            if tid == 0:  # the tile is the order this block started in (rule 1), not blockIdx.x
                t = cuda.atomic.add(ticket, 0, 1)
                sh_tile[0] = t
                if t == cuda.gridDim.x - 1:
                    cuda.atomic.exch(ticket, 0, 0)
            cuda.syncthreads()
            b = sh_tile[0]
            base = b * TILE
            n = x.size
            wbase = w * WTILE
            load_warp_tile(s, x, base, wbase, lane, n, ZERO)
            if segmented:
                load_warp_tile(hs, heads, base, wbase, lane, n, int32(0))
            cuda.syncwarp()
            e0 = wbase + lane * ITEMS
            q0 = e0 + (e0 >> 5)  # a lane's 16 values never straddle a padding word
            acc = ZERO  # pass 1: the lane's total (since its last head, if segmented)
            hf = int32(0)
            for i in range(ITEMS):
                v = s[q0 + i]
                if segmented and hs[q0 + i] != 0:
                    acc = v
                    hf = int32(1)
                else:
                    acc += v
            # inclusive warp scan of the lane totals: Hillis-Steele over shuffles, 5 steps, no barrier
            inc = acc
            incf = hf
            off = 1
            while off < 32:
                y = cuda.shfl_up_sync(FULL_MASK, inc, off)
                if segmented:
                    yf = cuda.shfl_up_sync(FULL_MASK, incf, off)
                    if lane >= off:
                        if incf == 0:
                            inc = y + inc
                        incf |= yf
                elif lane >= off:
                    inc = y + inc
                off *= 2
            tex = cuda.shfl_up_sync(FULL_MASK, inc, 1)  # the lane's exclusive prefix within the warp
            texf = cuda.shfl_up_sync(FULL_MASK, incf, 1) if segmented else incf
            if lane == 0:
                tex = ZERO
                texf = incf & 0
            if lane == 31:
                wsum[w] = inc
                wflag[w] = incf
            cuda.syncthreads()
            woff = ZERO  # the warps before this one, and the whole tile (each thread folds the same 8 values)
            wof = int32(0)
            total = ZERO
            tf = int32(0)
            for k in range(W):
                v = wsum[k]
                f = wflag[k]
                if k < w:
                    woff = v if f != 0 else woff + v
                    wof |= f
                total = v if f != 0 else total + v
                tf |= f
            if w == 0:  # the look-back: warp 0 only
                AGG = uint32(2 * epoch)
                INC = AGG + uint32(1)
                if lane == 0:  # publish: a tile with a head (or tile 0) already knows its inclusive prefix
                    cuda.atomic.exch(desc, b, pack(INC if (b == 0 or tf != 0) else AGG, total))
                prefix = ZERO
                if b > 0:  # (a tile with a head still needs the prefix for its values before the head)
                    j = b - 1  # lane l reads tile j - l: 32 predecessors per step
                    while True:
                        idx = j - lane
                        st = INC
                        v = ZERO
                        if idx >= 0:
                            d = cuda.atomic.add(desc, idx, _U0)  # an L2 read no cache can hold stale
                            st = uint32(d >> _U32)
                            v = from_bits(uint32(d & _LOW32))
                        if not cuda.all_sync(FULL_MASK, st == AGG or st == INC):
                            continue  # some predecessor has started (rule 1) but not published: poll again
                        m = int64(cuda.ballot_sync(FULL_MASK, st == INC))
                        if m != 0:  # the nearest inclusive tile ends the walk: add it and the aggregates after it
                            low = m & (-m)
                            prefix += warp_sum(v if (int64(1) << lane) <= low else ZERO)
                            break
                        prefix += warp_sum(v)
                        j -= 32
                    if lane == 0 and tf == 0:
                        cuda.atomic.exch(desc, b, pack(INC, prefix + total))
                if lane == 0:
                    sh_prefix[0] = prefix
            cuda.syncthreads()
            run = sh_prefix[0]  # prefix (+) warp offset (+) lane offset, each (+) restarting at a head
            run = woff if wof != 0 else run + woff
            run = tex if texf != 0 else run + tex
            for i in range(ITEMS):  # pass 2: rescan the lane's 16 values from its offset, in place
                v = s[q0 + i]
                if exclusive:
                    s[q0 + i] = run
                    run += v
                else:
                    if segmented and hs[q0 + i] != 0:
                        run = v
                    else:
                        run += v
                    s[q0 + i] = run
            cuda.syncwarp()
            for k in range(GROUPS):
                e = wbase + k * 128 + lane * 4
                g = base + e
                q = e + (e >> 5)
                if vec and g + 3 < n:
                    store4(out, g // 4, s[q], s[q + 1], s[q + 2], s[q + 3])
                else:
                    for u in range(4):
                        if g + u < n:
                            out[g + u] = s[q + u]

        return scan_single_pass

    return _cached(("dl", dt, exclusive, vec, segmented), build)


def _aligned(*arrays) -> bool:
    """Every array's data starts on a 16-byte boundary (device arrays do; a slice may not)."""
    for a in arrays:
        cai = getattr(a, "__cuda_array_interface__", None)
        ptr = cai["data"][0] if cai is not None else a.ctypes.data
        if ptr % 16:
            return False
    return True


_dl_epoch: dict = {}


def _descriptors(tiles):
    """The descriptor words and this launch's epoch. Status 2e is "aggregate ready", 2e + 1 "inclusive prefix
    ready"; anything else (a cleared word, an earlier launch's) is "not yet", so no launch clears them."""
    key = ("dldesc",)
    e = _dl_epoch.get(key, 0) + 1
    if e >= (1 << 30):
        _scratch.pop(key, None)
        e = 1
    _dl_epoch[key] = e
    return _buf(key, tiles, np.uint64, zero=True), _buf(("dlticket",), 1, np.int32, zero=True), e


def scan_decoupled(out, x, exclusive=False, heads=None):
    if x.size == 0:
        return
    tiles = ceil_div(x.size, DL_TILE)
    desc, ticket, e = _descriptors(tiles)
    seg = heads is not None
    vec = _aligned(out, x) and (not seg or _aligned(heads))
    if not seg:
        heads = _buf(("dlnoheads",), 1, np.int32, zero=True)
    decoupled_kernel(_dt(x), exclusive, vec, seg)[tiles, DL_T](out, x, heads, desc, ticket, np.int32(e))


def _torch_gpu():
    from .reductions import torch_gpu

    return torch_gpu()


def _cccl():
    ok, why = _torch_gpu()
    if not ok:
        return ok, why
    try:
        import cuda.compute as cc  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return False, f"cuda.compute (CCCL Python) is not importable: {type(e).__name__}"
    if not hasattr(cc, "inclusive_scan"):
        return False, "cuda.compute has no inclusive_scan"
    return True, ""


def _sig(dt, extra=""):
    return f"void({dt}[::1], {dt}[::1]{extra})"


def _ptx(which, dt, exclusive):
    T, ITEMS = T_GPU, ITEMS_GPU
    if which == "hs":
        return [(hs_kernel(dt, exclusive, HS_THREADS), _sig(dt))]
    if which == "bl":
        return [(blelloch_kernel(dt, exclusive, T, ITEMS), _sig(dt))]
    if which == "rts":
        a, b, c = rts_kernels(dt, exclusive, T, ITEMS)
        return [(a, _sig(dt)), (b, _sig(dt)), (c, f"void({dt}[::1], {dt}[::1], {dt}[::1])")]
    if which == "dl":
        return [(decoupled_kernel(dt, exclusive, vec), DL_SIG.format(dt=dt)) for vec in (True, False)]
    return [(lookback_kernel(dt, exclusive, T, ITEMS),
             f"void({dt}[::1], {dt}[::1], int32[::1], {dt}[::1], {dt}[::1], int32[::1], int32)")]


DL_SIG = "void({dt}[::1], {dt}[::1], int32[::1], uint64[::1], int32[::1], int32)"


def _ptx_all(which, exclusive):
    return [k for dt in DTYPES for k in _ptx(which, dt, exclusive)]


def _register_gpu(op, exclusive):
    @register(op, "gpu", "hillis_steele", rung=1, ptx=_ptx_all("hs", exclusive), dtypes=DTYPES)
    def hillis_steele(out, x):
        """ONE block of 1024 threads walks x in tiles of 1024, Hillis-Steele in shared memory (10 steps,
        20 barriers per tile), a carry between tiles. One SM of 132 works: predict ~1 % of copy."""
        scan_hs(out, x, exclusive)

    @register(op, "gpu", "blelloch", rung=2, ptx=_ptx_all("bl", exclusive), dtypes=DTYPES)
    def blelloch(out, x):
        """Still ONE block, but each of 256 threads scans 15 values in registers and Blelloch's tree scans
        only the 256 thread totals: 15x fewer barrier steps per element than rung 1. Still one SM: predict
        a few times rung 1, still ~1-3 % of copy. The block-level building block of rungs 3 and 4."""
        scan_blelloch(out, x, exclusive)

    @register(op, "gpu", "reduce_then_scan", rung=3, ptx=_ptx_all("rts", exclusive), dtypes=DTYPES)
    def reduce_then_scan(out, x):
        """Every SM works: kernel 1 sums each 3840-element tile, kernel 2 (one block) scans the tile sums,
        kernel 3 rescans each tile from its offset. x is read twice: 12n bytes for the op's 8n, so
        predict at most 2/3 of copy (~2000 GB/s) at 2^28."""
        scan_rts(out, x, exclusive)

    @register(op, "gpu", "lookback", rung=4, ptx=_ptx_all("lb", exclusive), dtypes=DTYPES,
              requires=needs_fences)
    def lookback(out, x):
        """One pass: each tile publishes its sum, looks back over its predecessors' flags for its offset,
        then publishes its inclusive prefix. x is read once: 8n bytes, so predict ~80-90 % of copy at 2^28
        if the look-back (a few L2 round trips per tile) hides behind the loads of other blocks."""
        scan_lookback(out, x, exclusive)

    @register(op, "gpu", "decoupled", rung=5, ptx=_ptx_all("dl", exclusive), dtypes=DTYPES,
              requires=device.needs_real_gpu)
    def decoupled(out, x):
        """Rung 4 with its look-back made parallel and its tile made bigger. Each of 256 threads scans 16
        values (16-byte loads, 4096 per tile: 65536 tiles at 2^28, not 69906 of 3840); a tile publishes ONE
        64-bit word (status in the high half, the value's bits in the low), so a reader can never see a flag
        without its value and no fence is needed; warp 0 reads 32 predecessors' words at once, a ballot finds
        the nearest inclusive one, a shuffle sum adds the aggregates in between. Prediction from its bytes:
        8n = 2.15 GB at 2^28, so 0.72 ms at the copy's ~3000 GB/s; the goal (80 % of copy) is 0.89 ms."""
        scan_decoupled(out, x, exclusive)

    @register(op, "gpu", "torch", baseline=True, requires=_torch_gpu, dtypes=DTYPES)
    def torch_cumsum_gpu(out, x):
        """torch.cumsum on the GPU (CUB underneath), written into out."""
        import torch

        from .reductions import torch_view

        to, tx = torch_view(out), torch_view(x)
        if exclusive:
            if x.size:
                to[0] = 0
                torch.cumsum(tx[:-1], 0, dtype=_torch_dtype(x), out=to[1:])
        else:
            torch.cumsum(tx, 0, dtype=_torch_dtype(x), out=to)

    @register(op, "gpu", "cccl", baseline=True, requires=_cccl, dtypes=DTYPES)
    def cccl_scan(out, x):
        """CCCL's cuda.compute scan (CUB's single-pass decoupled look-back, from Python)."""
        import cuda.compute as cc

        from .reductions import torch_view

        if x.size == 0:
            return
        h_init = np.zeros(1, np.dtype(_dt(x)))
        fn = cc.exclusive_scan if exclusive else cc.inclusive_scan
        fn(torch_view(x), torch_view(out), cc.OpKind.PLUS, h_init, x.size)

    return hillis_steele, blelloch, reduce_then_scan, lookback, decoupled


(scan_gpu_hillis_steele, scan_gpu_blelloch, scan_gpu_reduce_then_scan, scan_gpu_lookback,
 scan_gpu_decoupled) = _register_gpu("scan", False)
(scan_exclusive_gpu_hillis_steele, scan_exclusive_gpu_blelloch, scan_exclusive_gpu_reduce_then_scan,
 scan_exclusive_gpu_lookback, scan_exclusive_gpu_decoupled) = _register_gpu("scan_exclusive", True)


# ------------------------------------------------------------------ chapter 15's predict-then-measure exercise
def reference_scan_time(n, gbps):
    """Predicted microseconds of a scan of n float32 at a streaming bandwidth of gbps GB/s (read + write
    counted, as the copy yardstick counts them): column 0 reads x twice and writes once (12n bytes:
    the two-pass CPU rung, reduce-then-scan on the GPU), column 1 reads once and writes once (8n bytes:
    the single-pass look-back)."""
    return np.stack([12.0 * n / (gbps * 1e3), 8.0 * n / (gbps * 1e3)], axis=1)


def make_inputs_scan_time(size, dtype, rng):
    (k,) = size
    n = np.floor(2.0 ** rng.uniform(10, 30, k))
    return n, rng.uniform(5.0, 4000.0, k)


exercise_op("scan_time_prediction", reference=reference_scan_time, make_inputs=make_inputs_scan_time, chapter=15,
            title="a scan's time from its bytes and a measured bandwidth", size_names=("k",), kind="memory",
            output_names=("us",), tol=(1e-6, 0.0), flops=lambda s: 0, bytes=lambda s, b: 0,
            sizes={"check": [(1,), (5,)], "check_sim": [(1,), (5,)], "bench": [(5,)]})
