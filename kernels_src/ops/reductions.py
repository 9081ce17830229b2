"""Reductions: the sum and the maximum of a vector (chapter 7), and the block-level building blocks
that LayerNorm, RMSNorm and softmax reuse.

Shapes: x (n,) -> out (1,)
Cost:   n - 1 FLOPs; n elements read once, one written: 4n bytes in float32, 1/4 FLOP per byte.
        A reduction is as memory-bound as a kernel can be: the whole job is reading x once.

Ladder (sum; max has the same GPU rungs and a NumPy baseline plus one CPU loop)
  cpu/numpy          baseline  NumPy's sum (float32, pairwise internally)
  cpu/naive          rung 1    one float32 accumulator, left to right
  cpu/pairwise       rung 2    naive sums of 128-element blocks, then a pairwise tree of the block sums
  cpu/kahan          rung 3    compensated (Kahan) summation: carries the rounding error of every add
  cpu/f64acc         rung 4    the easy fix: a float64 accumulator
  gpu/smem_tree      rung 1    ONE block: each thread sums a strided slice, then a shared-memory tree
  gpu/shfl           rung 2    the same single block, reducing inside each warp with shuffles (real GPU only)
  gpu/two_pass       rung 3    grid level: many blocks write partial results, a second launch reduces them
  gpu/two_pass_shfl  rung 4    the two-pass reduction with warp shuffles (real GPU only)

The simulator has no warp shuffles (``cuda.shfl_*_sync``), so the shuffle rungs register with
``requires=needs_real_gpu`` and the shared-memory rungs are what the simulator (and the exercises) run.

Block-level helpers exported for other families: ``block_sum_smem``, ``block_max_smem`` (shared-memory
tree; blockDim.x a power of two), ``warp_sum``, ``warp_max``, ``block_sum_shfl``, ``block_max_shfl``
(warp shuffles; blockDim.x a multiple of 32, at most 1024).
"""
import math

import numpy as np
from ..compiler import cuda, fastmath, float32, float32_from_bits, njit, prange

from .. import device
from ..device import ceil_div, needs_real_gpu
from ..registry import define_op, register, sprinkle

NEG_INF = np.float32(-np.inf)
ZERO = np.float32(0.0)
ONE = np.float32(1.0)
FULL_MASK = 0xFFFFFFFF
EPS32 = float(np.finfo(np.float32).eps)
FAST_MATH = fastmath({"contract", "afn", "arcp", "nsz", "reassoc"})  # fastmath without "ninf"/"nnan": -inf must survive


def row_jit(threads: int, fast: bool = True):
    """``cuda.jit`` for a kernel always launched with ``threads`` threads per block: fastmath (without
    the no-inf/no-NaN assumptions) and, on a real GPU, launch bounds, so the compiler never uses more
    registers per thread than ``threads`` threads can launch with (it spills instead of failing)."""
    kw = {"fastmath": FAST_MATH} if fast else {}
    if not device.SIMULATED:  # the simulator's jit has no launch_bounds
        kw["launch_bounds"] = threads
    return cuda.jit(**kw)


# --------------------------------------------------------------------------------------- reference
def reference_sum(x):
    """float64 oracle: math.fsum is correctly rounded, so the oracle itself has no accumulation error.
    With an infinity or NaN in x the sum is that (inf + -inf = NaN), as IEEE addition gives in any order."""
    if not np.all(np.isfinite(x)):
        return np.array([np.sum(x)])
    return np.array([math.fsum(x)])


def reference_max(x):
    return np.array([np.max(x)])  # NaN if any element is NaN (the course's rule, NumPy's and torch's)


def make_inputs(size, dtype, rng):
    """Uniform in [0, 1): all positive, so the sum grows like n/2 and rounding errors accumulate the way
    they do in real workloads (a sum of squares, a softmax denominator)."""
    (n,) = size
    return (rng.random(n).astype(dtype),)


def make_inputs_max(size, dtype, rng):
    (n,) = size
    return (rng.standard_normal(n).astype(dtype),)


def make_edge_inputs_sum(size, dtype, rng):
    """+inf among ordinary values, signed zeros and a denormal: the sum is +inf for every rung (a Kahan
    compensation that computes inf - inf would turn it into NaN)."""
    (x,) = make_inputs(size, dtype, rng)
    return (sprinkle(x, rng, [np.inf, 0.0, -0.0, 1e-40]),)


def make_edge_inputs_max(size, dtype, rng):
    """A NaN, infinities and signed zeros: the max is NaN (NaN propagates, as in NumPy and torch), also for
    the one-element vector [NaN]."""
    (x,) = make_inputs_max(size, dtype, rng)
    return (sprinkle(x, rng, [np.nan, -np.inf, np.inf, -0.0]),)


def sum_tol(size, dtype):
    """A sum of n terms of the same sign: each add rounds with relative error <= eps/2, and on random
    data the errors add up like a random walk. The naive loop's relative error grows like sqrt(n)*eps
    (we measure about 0.1*sqrt(n)*eps; the worst case is n*eps); tree-shaped sums (pairwise, every GPU
    rung) stay near log2(n)*eps. We allow sqrt(n)*eps relative: the naive loop passes with a margin of
    about 7x, and a dropped or doubled element (about 1/n relative) still fails for n up to ~2e4."""
    (n,) = size
    return (math.sqrt(max(n, 1)) * EPS32, 1e-6)


_sizes = {"check": [(1,), (2,), (7,), (127,), (1000,), (4099,), (65537,)],
          "check_sim": [(1,), (7,), (257,), (1000,)],
          "bench": [(1 << 16,), (1 << 20,), (1 << 24,)],
          "bench_gpu": [(1 << 16,), (1 << 20,), (1 << 24,), (1 << 26,)],
          "bench_sim": [(1000,)]}

define_op("reduce_sum", reference=reference_sum, make_inputs=make_inputs, chapter=7,
          title="sum of a vector", size_names=("n",), kind="memory", tol=sum_tol,
          flops=lambda s: max(s[0] - 1, 0), bytes=lambda s, b: (s[0] + 1) * b, sizes=_sizes,
          output_names=("total",), edge_inputs=make_edge_inputs_sum)
define_op("reduce_max", reference=reference_max, make_inputs=make_inputs_max, chapter=7,
          title="maximum of a vector", size_names=("n",), kind="memory",
          tol=(0.0, 0.0),  # max only compares and copies: the result must be exact
          flops=lambda s: max(s[0] - 1, 0), bytes=lambda s, b: (s[0] + 1) * b, sizes=_sizes,
          output_names=("maximum",), edge_inputs=make_edge_inputs_max)


# --------------------------------------------------------------------------------------------- CPU
@register("reduce_sum", "cpu", "numpy", baseline=True)
def sum_numpy(out, x):
    """NumPy's float32 sum: pairwise internally, vectorised."""
    out[0] = np.sum(x)


def _torch_cpu():
    from .cpu_baselines import torch_cpu

    return torch_cpu()


@register("reduce_sum", "cpu", "torch", baseline=True, requires=_torch_cpu)
def sum_torch_cpu(out, x):
    """torch on the CPU: ``torch.sum`` (vectorised, multi-threaded), written into out."""
    import torch

    from .cpu_baselines import tviews

    to, tx = tviews(out, x)
    torch.sum(tx, dim=0, keepdim=True, out=to)


@njit(cache=True)
def sum_naive(x):
    acc = np.float32(0.0)  # the accumulator is float32, like the data
    for i in range(x.size):
        acc += x[i]
    return acc


@register("reduce_sum", "cpu", "naive", rung=1)
def sum_naive_cpu(out, x):
    """One float32 accumulator, left to right. Once the running sum is large, each small x[i] loses its
    low bits when it is added: the relative error grows like sqrt(n)*eps on random data (n*eps worst)."""
    out[0] = sum_naive(x)


PAIRWISE_BLOCK = 128


@njit(cache=True)
def sum_pairwise(x):
    n = x.size
    nb = (n + PAIRWISE_BLOCK - 1) // PAIRWISE_BLOCK
    if nb == 0:
        return np.float32(0.0)
    part = np.empty(nb, np.float32)
    for b in range(nb):  # naive sums of short blocks: error ~ 128 * eps at most
        acc = np.float32(0.0)
        for i in range(b * PAIRWISE_BLOCK, min(n, (b + 1) * PAIRWISE_BLOCK)):
            acc += x[i]
        part[b] = acc
    m = nb
    while m > 1:  # then a balanced tree over the block sums: log2(nb) levels
        h = m // 2
        for i in range(h):
            part[i] = part[2 * i] + part[2 * i + 1]
        if m % 2 == 1:
            part[h] = part[m - 1]
            m = h + 1
        else:
            m = h
    return part[0]


@register("reduce_sum", "cpu", "pairwise", rung=2)
def sum_pairwise_cpu(out, x):
    """Pairwise: sum 128-element blocks, then add the block sums in a balanced tree. Every element passes
    through about 128 + log2(n/128) additions instead of up to n, so the error bound drops from n*eps
    to (128 + log2 n)*eps. Same bytes, same speed."""
    out[0] = sum_pairwise(x)


@njit(cache=True)  # no fastmath here: reassociation would let the compiler delete the compensation
def sum_kahan(x):
    s = np.float32(0.0)
    c = np.float32(0.0)  # the low-order bits lost so far
    for i in range(x.size):
        y = x[i] - c
        t = s + y
        if math.isinf(t):  # inf - inf would make the compensation NaN: an infinite sum has nothing to carry
            c = np.float32(0.0)
        else:
            c = (t - s) - y  # what the add just rounded away (algebraically zero)
        s = t
    return s


@register("reduce_sum", "cpu", "kahan", rung=3)
def sum_kahan_cpu(out, x):
    """Kahan: a second float32 carries the rounding error of each add into the next. The error bound
    becomes 2*eps, independent of n, for 4 FLOPs per element instead of 1 (still memory-bound)."""
    out[0] = sum_kahan(x)


@njit(cache=True)
def sum_f64acc(x):
    acc = 0.0  # float64
    for i in range(x.size):
        acc += x[i]
    return acc


@register("reduce_sum", "cpu", "f64acc", rung=4)
def sum_f64acc_cpu(out, x):
    """Accumulate in float64 and round once at the end: 29 extra mantissa bits absorb the error of any
    realistic n. This is what GPU kernels usually cannot afford (FP64 is slow on most GPUs), which is why
    they rely on tree order instead."""
    out[0] = sum_f64acc(x)


# ------------------------------------------------------------------------------------ CPU SIMD reductions
# A float max does not vectorize: maxss with a NaN operand returns the second operand, so a reordered max could
# lose a NaN, and LLVM will not reorder it unless told NaN cannot occur. An integer max has no such problem
# (vpmaxsd, 8 or 16 lanes, no flag needed), and the bits of a float32 can be mapped to an int32 that orders
# like the float: that is float_key.
_LOW31 = np.int32(0x7FFFFFFF)
_KEY_MIN = np.int32(-2147483648)


@njit(inline="always", error_model="numpy")
def float_key(b):
    """The int32 bits b of a float32 mapped to an int32 that orders like the floats: non-negative floats keep
    their bits, negative ones (sign bit set) get their 31 magnitude bits flipped. -inf maps below every
    number, NaN (positive) above +inf. The map is its own inverse."""
    return np.int32(b ^ ((b >> np.int32(31)) & _LOW31))


@njit(inline="always", error_model="numpy")
def row_max_simd(r):
    """max of a contiguous float32 vector, as an integer max of float_key over its bits. LLVM vectorizes an
    integer max reduction with no flag at all (vpmaxsd, 8 lanes); a float max (maxss) it will not vectorize
    unless told NaN cannot occur. A NaN in r (key above +inf) makes the result NaN, like np.max."""
    ri = r.view(np.int32)
    mk = _KEY_MIN
    for j in range(ri.size):
        mk = max(mk, float_key(ri[j]))
    return float32_from_bits(float_key(mk))



@njit(inline="always", error_model="numpy")
def _key_max(xi):
    mk = _KEY_MIN
    for j in range(xi.size):
        mk = max(mk, float_key(xi[j]))
    return mk


@njit(parallel=True, cache=True, error_model="numpy")
def max_simd_prange(xi, parts):
    # xi: the float32 vector's bits as int32, viewed by the caller. (A .view inside Numba types the result as
    # an array of unknown layout, and LLVM then reads it with gathers: vpgatherqd in `kernels asm`.)
    n = xi.size
    P = parts.size
    per = (n + P - 1) // P
    for p in prange(P):  # one contiguous chunk per core, each an integer max (SIMD)
        parts[p] = _key_max(xi[p * per:min(n, (p + 1) * per)])
    m = _KEY_MIN
    for p in range(P):
        m = max(m, parts[p])
    return float32_from_bits(float_key(m))


@register("reduce_max", "cpu", "simd_prange", rung=2)
def max_simd_prange_cpu(out, x):
    """The max as an integer max over the floats' bits (float_key: vpmaxsd, every lane at once, with NaN
    ordered above +inf so it still wins), one contiguous chunk per core. Rung 1's maxss is a chain of dependent
    compares, one element per step. Predicted: memory-bound, >= 70 % of the copy bandwidth."""
    from ..compiler import get_num_threads

    out[0] = max_simd_prange(np.ascontiguousarray(x).view(np.int32),
                             np.empty(max(1, min(x.size, get_num_threads())), np.int32))


SUM_FAST = {"reassoc", "contract"}  # reorder the sum (SIMD lanes, threads); never nnan/ninf


@njit(parallel=True, cache=True, fastmath=SUM_FAST)
def sum_simd_prange(x):
    acc = 0.0
    for i in prange(x.size):
        acc += np.float64(x[i])
    return np.float32(acc)


@register("reduce_sum", "cpu", "simd_prange", rung=5)
def sum_simd_prange_cpu(out, x):
    """Rung 4's float64 accumulation (exact enough for any realistic n), with the additions allowed to be
    reordered (fastmath "reassoc"): each core sums its share in several float64 SIMD lanes, and the partial
    sums are added at the end. Accuracy stays rung 4's (29 spare bits absorb the new order); rungs 1-4 are one
    dependent chain of adds, ~1 element per add latency. Predicted: memory-bound, >= 70 % of the copy bandwidth."""
    out[0] = sum_simd_prange(x)


@register("reduce_max", "cpu", "numpy", baseline=True)
def max_numpy(out, x):
    """NumPy's max, vectorised."""
    out[0] = np.max(x)


@register("reduce_max", "cpu", "torch", baseline=True, requires=_torch_cpu)
def max_torch_cpu(out, x):
    """torch on the CPU: ``torch.amax``, written into out."""
    import torch

    from .cpu_baselines import tviews

    to, tx = tviews(out, x)
    torch.amax(tx, dim=0, keepdim=True, out=to)


@njit(cache=True)
def max_loop(x):
    m = np.float32(-np.inf)
    for i in range(x.size):
        if x[i] > m or x[i] != x[i]:  # a NaN sticks: nothing compares greater than NaN afterwards
            m = x[i]
    return m


@register("reduce_max", "cpu", "loop", rung=1)
def max_loop_cpu(out, x):
    """One compiled loop. max is exact in any order, so precision is not a question here."""
    out[0] = max_loop(x)


# -------------------------------------------------------------------- GPU: block-level building blocks
@cuda.jit(device=True, inline="always")
def _add(a, b):
    return a + b


@cuda.jit(device=True, inline="always")
def _max(a, b):
    # NaN wins, from either side (a != a only for NaN), as in np.max: a NaN anywhere makes the max NaN
    return a if (a >= b or a != a) else b


def _make_smem_reduce(combine):
    @cuda.jit(device=True, inline="always")
    def block_reduce_smem(v, buf):
        """Every thread passes its value ``v``; every thread gets the block's result back.
        ``buf``: shared float32[blockDim.x]; blockDim.x must be a power of two."""
        tid = cuda.threadIdx.x
        buf[tid] = v
        cuda.syncthreads()
        s = cuda.blockDim.x // 2
        while s > 0:  # log2(blockDim.x) halving steps; half the active threads retire each step
            if tid < s:
                buf[tid] = combine(buf[tid], buf[tid + s])
            cuda.syncthreads()
            s //= 2
        r = buf[0]
        cuda.syncthreads()  # nobody may overwrite buf[0] until everyone has read it
        return r

    return block_reduce_smem


def _make_warp_reduce(combine):
    @cuda.jit(device=True, inline="always")
    def warp_reduce(v):
        """Butterfly over the 32 lanes of a warp: after 5 exchanges every lane holds the result.
        No shared memory and no barrier: the lanes of a warp swap registers directly."""
        off = 16
        while off > 0:
            v = combine(v, cuda.shfl_xor_sync(FULL_MASK, v, off))
            off //= 2
        return v

    return warp_reduce


def _make_shfl_reduce(warp_reduce, identity):
    @cuda.jit(device=True, inline="always")
    def block_reduce_shfl(v, wbuf):
        """Reduce inside each warp with shuffles, park one value per warp in ``wbuf`` (shared
        float32[32]), then every warp reduces those <= 32 values again. One barrier instead of log2(T).
        Do not reuse ``wbuf`` before the next barrier: use one buffer per reduction."""
        tid = cuda.threadIdx.x
        lane = tid % 32
        nwarps = (cuda.blockDim.x + 31) // 32
        v = warp_reduce(v)
        if lane == 0:
            wbuf[tid // 32] = v
        cuda.syncthreads()
        v = wbuf[lane] if lane < nwarps else identity
        return warp_reduce(v)

    return block_reduce_shfl


block_sum_smem = _make_smem_reduce(_add)
block_max_smem = _make_smem_reduce(_max)
warp_sum = _make_warp_reduce(_add)
warp_max = _make_warp_reduce(_max)
block_sum_shfl = _make_shfl_reduce(warp_sum, ZERO)
block_max_shfl = _make_shfl_reduce(warp_max, NEG_INF)

# ---------------------------------------------- GPU: reductions of pairs and of (count, mean, M2) triples
@cuda.jit(device=True, inline="always")
def block_sum2_smem(a, b, ba, bb):
    """Two block sums in one shared-memory tree (buffers float32[blockDim.x] each)."""
    tid = cuda.threadIdx.x
    ba[tid] = a
    bb[tid] = b
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            ba[tid] += ba[tid + s]
            bb[tid] += bb[tid + s]
        cuda.syncthreads()
        s //= 2
    a = ba[0]
    b = bb[0]
    cuda.syncthreads()
    return a, b


@cuda.jit(device=True, inline="always")
def block_sum2_shfl(a, b, wa, wb):
    """Two block sums with warp shuffles and ONE barrier (buffers float32[32] each)."""
    a = warp_sum(a)
    b = warp_sum(b)
    tid = cuda.threadIdx.x
    lane = tid % 32
    if lane == 0:
        wa[tid // 32] = a
        wb[tid // 32] = b
    cuda.syncthreads()
    nw = (cuda.blockDim.x + 31) // 32
    a = wa[lane] if lane < nw else ZERO
    b = wb[lane] if lane < nw else ZERO
    return warp_sum(a), warp_sum(b)


@cuda.jit(device=True, inline="always")
def welford_combine(na, ma, qa, nb, mb, qb):
    """Merge two (count, mean, sum of squared deviations from the mean) summaries of disjoint sets into
    the summary of their union (Chan, Golub and LeVeque's pairwise update). No E[x^2] - E[x]^2 anywhere,
    so nothing cancels when |mean| >> std."""
    n = na + nb
    if n == ZERO:
        return ZERO, ZERO, ZERO
    d = mb - ma
    f = nb / n
    return n, ma + d * f, qa + qb + d * d * na * f


@cuda.jit(device=True, inline="always")
def block_welford_smem(n, m, q, bn, bm, bq):
    """Block-wide merge of per-thread (count, mean, M2) with a shared-memory tree (3 float32[T] buffers)."""
    tid = cuda.threadIdx.x
    bn[tid] = n
    bm[tid] = m
    bq[tid] = q
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            n2, m2, q2 = welford_combine(bn[tid], bm[tid], bq[tid], bn[tid + s], bm[tid + s], bq[tid + s])
            bn[tid] = n2
            bm[tid] = m2
            bq[tid] = q2
        cuda.syncthreads()
        s //= 2
    n = bn[0]
    m = bm[0]
    q = bq[0]
    cuda.syncthreads()
    return n, m, q


@cuda.jit(device=True, inline="always")
def warp_welford(n, m, q):
    off = 16
    while off > 0:
        n2 = cuda.shfl_xor_sync(FULL_MASK, n, off)
        m2 = cuda.shfl_xor_sync(FULL_MASK, m, off)
        q2 = cuda.shfl_xor_sync(FULL_MASK, q, off)
        n, m, q = welford_combine(n, m, q, n2, m2, q2)
        off //= 2
    return n, m, q


@cuda.jit(device=True, inline="always")
def block_welford_shfl(n, m, q, wn, wm, wq):
    """Block-wide merge with warp shuffles and one barrier (3 float32[32] buffers)."""
    tid = cuda.threadIdx.x
    lane = tid % 32
    n, m, q = warp_welford(n, m, q)
    if lane == 0:
        wn[tid // 32] = n
        wm[tid // 32] = m
        wq[tid // 32] = q
    cuda.syncthreads()
    if lane < (cuda.blockDim.x + 31) // 32:
        n = wn[lane]
        m = wm[lane]
        q = wq[lane]
    else:
        n = ZERO
        m = ZERO
        q = ZERO
    return warp_welford(n, m, q)


_COMBINE = {"sum": (_add, ZERO, block_sum_smem, block_sum_shfl),
            "max": (_max, NEG_INF, block_max_smem, block_max_shfl)}


# ------------------------------------------------------------------------------ GPU: reduce kernels
def make_reduce_kernel(kind: str, threads: int, shuffle: bool):
    """A kernel in which every block reduces a grid-strided slice of x to one value, out[blockIdx.x].
    Launched with one block it reduces the whole vector; with many blocks it is pass 1 of two."""
    combine, identity, smem_reduce, shfl_reduce = _COMBINE[kind]

    @row_jit(threads, fast=False)
    def reduce_kernel(out, x):
        # x (n,) -> out (gridDim.x,): one partial result per block
        buf = cuda.shared.array(threads, float32)
        acc = identity
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < x.size:  # each thread folds its strided slice: coalesced, n / (threads*blocks) loads each
            acc = combine(acc, x[i])
            i += stride
        if shuffle:  # a compile-time constant: the other branch is not even compiled
            r = shfl_reduce(acc, buf)
        else:
            r = smem_reduce(acc, buf)
        if cuda.threadIdx.x == 0:
            out[cuda.blockIdx.x] = r

    return reduce_kernel


def _threads(big: int) -> int:
    """Block size: the simulator runs one Python thread per CUDA thread, so it gets 32."""
    return 32 if device.SIMULATED else big


_kernels: dict = {}


def reduce_kernel(kind, threads, shuffle):
    key = (kind, threads, shuffle)
    if key not in _kernels:
        _kernels[key] = make_reduce_kernel(kind, threads, shuffle)
    return _kernels[key]


_scratch: dict = {}


def scratch(n: int):
    """A cached float32 device buffer of n elements (no allocation inside timed launches)."""
    if n not in _scratch:
        _scratch[n] = cuda.device_array(n, dtype=np.float32)
    return _scratch[n]


ONE_BLOCK = 1024
PASS1_THREADS, PASS1_ITEMS, PASS1_MAX_BLOCKS = 256, 16, 2048
SIG = "void(float32[::1], float32[::1])"


def _one_block(kind, shuffle, out, x):
    reduce_kernel(kind, _threads(ONE_BLOCK), shuffle)[1, _threads(ONE_BLOCK)](out, x)


def _two_pass(kind, shuffle, out, x):
    t1 = _threads(PASS1_THREADS)
    blocks = max(1, min(ceil_div(x.size, t1 * PASS1_ITEMS), 8 if device.SIMULATED else PASS1_MAX_BLOCKS))
    part = scratch(blocks)
    reduce_kernel(kind, t1, shuffle)[blocks, t1](part, x)  # pass 1: one partial per block
    t2 = _threads(ONE_BLOCK)
    reduce_kernel(kind, t2, shuffle)[1, t2](out, part[:blocks])  # pass 2: one block folds the partials


def _ptx(kind, shuffle, two_pass):
    ks = [(reduce_kernel(kind, ONE_BLOCK, shuffle), SIG)]
    if two_pass:
        ks.append((reduce_kernel(kind, PASS1_THREADS, shuffle), SIG))
    return ks


def _register_gpu(kind):
    op = "reduce_" + kind

    @register(op, "gpu", "smem_tree", rung=1, ptx=_ptx(kind, False, False))
    def one_block_smem(out, x):
        """One block of 1024 threads: each thread folds a strided slice, then a shared-memory tree
        halves the 1024 values in 10 steps with a barrier after each. Only one of the 132 SMs works, so
        predict ~1/100 of the copy bandwidth: this rung is about correctness, not speed."""
        _one_block(kind, False, out, x)

    @register(op, "gpu", "shfl", rung=2, ptx=_ptx(kind, True, False), requires=needs_real_gpu)
    def one_block_shfl(out, x):
        """Same single block; warps reduce with register shuffles and only one barrier is left. The tree
        was never the bottleneck (the strided loads on one SM are), so predict the same speed as rung 1."""
        _one_block(kind, True, out, x)

    @register(op, "gpu", "two_pass", rung=3, ptx=_ptx(kind, False, True))
    def two_pass_smem(out, x):
        """Grid level: up to 2048 blocks of 256 threads each write one partial (pass 1), then one block
        reduces the partials (pass 2). Every SM now reads: predict ~85-90 % of copy bandwidth at large n,
        where pass 2 (2048 values) costs a few microseconds."""
        _two_pass(kind, False, out, x)

    @register(op, "gpu", "two_pass_shfl", rung=4, ptx=_ptx(kind, True, True), requires=needs_real_gpu)
    def two_pass_shfl(out, x):
        """Two passes with warp-shuffle reductions: fewer barriers inside each block. Memory-bound, so
        predict rung 3's speed within a few per cent; the shuffles matter more when a block's reduction
        sits inside a bigger kernel (LayerNorm, softmax)."""
        _two_pass(kind, True, out, x)

    return one_block_smem, one_block_shfl, two_pass_smem, two_pass_shfl


(sum_smem_tree, sum_shfl, sum_two_pass, sum_two_pass_shfl) = _register_gpu("sum")
(max_smem_tree, max_shfl, max_two_pass, max_two_pass_shfl) = _register_gpu("max")


# --------------------------------------------------------------------- accumulation-precision study
def summation_errors(ns, rng=None, trials: int = 3) -> dict:
    """Relative error against math.fsum of each CPU summation order, for uniform [0, 1) float32 data.
    Returns {"n": [...], "naive": [...], "pairwise": [...], "kahan": [...], "numpy": [...], "f64acc": [...]}
    (median over ``trials`` random vectors). Used by chapter 7's precision plot."""
    rng = rng or np.random.default_rng(0)
    fns = {"naive": sum_naive, "pairwise": sum_pairwise, "kahan": sum_kahan, "numpy": np.sum,
           "f64acc": lambda x: np.float32(sum_f64acc(x))}
    res = {k: [] for k in fns}
    res["n"] = list(ns)
    for n in ns:
        errs = {k: [] for k in fns}
        for _ in range(trials):
            x = rng.random(n, dtype=np.float32)
            exact = math.fsum(x.astype(np.float64))
            for k, f in fns.items():
                errs[k].append(abs(float(f(x)) - exact) / exact)
        for k in fns:
            res[k].append(float(np.median(errs[k])))
    return res


# ------------------------------------------------- row-wise helpers shared with norms.py and softmax.py
# A row of N floats, one block per row. The fast kernels keep the row in registers: each of T threads
# holds E = ceil(N / T) elements in a cuda.local.array whose size is a compile-time constant (so the
# compiler can unroll every loop over it and keep it in registers instead of local memory).
ROW_MAX_ITEMS = 32  # more than 32 floats per thread starts to cost occupancy; longer rows stream instead


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


def row_threads_streaming(n: int, big: int = 256) -> int:
    """Block size for kernels that stream over a row: ``big`` on a GPU; in the simulator (one Python
    thread per CUDA thread) at most 32, and no more than the row needs (a power of two for the tree)."""
    if device.SIMULATED:
        return min(32, next_pow2(n))
    return big


def row_config(n: int, threads: int | None = None, per_thread: int = 8):
    """(T, E) for a register-resident row of n elements, or None when the row is too long.
    GPU: T = n/per_thread rounded up to a power of two within [32, 1024] (n = 4096, per_thread = 16 ->
    256 threads of 16 values), unless ``threads`` is given; E = ceil(n/T) rounded up to a power of two
    so that few distinct kernels get compiled. Simulator: T <= 32 and E exact."""
    if device.SIMULATED:
        t = min(32, next_pow2(n))
        return t, ceil_div(n, t)
    t = threads or min(1024, max(32, next_pow2(ceil_div(n, per_thread))))
    e = next_pow2(ceil_div(n, t))
    return (t, e) if e <= ROW_MAX_ITEMS else None


def torch_gpu():
    """``requires=`` for torch baselines: a real GPU and an importable torch with CUDA."""
    if device.MODE != "gpu":
        return False, "torch baselines need a real GPU"
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "torch cannot see the GPU"
    return True, ""


def as_torch(a):
    """A zero-copy torch view of a numba device array (through __cuda_array_interface__)."""
    import torch

    return torch.as_tensor(a, device="cuda")


_views: dict = {}


def torch_view(a):
    """:func:`as_torch`, cached per array, so a timed baseline call does not pay to build its views."""
    hit = _views.get(id(a))
    if hit is None or hit[0] is not a:
        hit = _views[id(a)] = (a, as_torch(a))
    return hit[1]
