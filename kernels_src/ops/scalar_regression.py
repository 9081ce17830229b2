"""regression_grad: the loss of y_hat = w*x + b and its two gradients, over a batch (chapter 2).

Shapes: w, b scalars; x (n,), y (n,) -> loss (1,), dw (1,), db (1,)

    r_i  = w*x_i + b - y_i                 the forward pass and the error, one per sample
    loss = (1/n) * sum_i r_i^2             mean squared error
    dw   = (2/n) * sum_i r_i * x_i         dL/dw
    db   = (2/n) * sum_i r_i               dL/db

Cost:   about 8n FLOPs (3 for r, 2 for r^2 and its sum, 2 for r*x and its sum, 1 for the sum of r);
        8n bytes must move (read x and y once, float32), the three outputs are nothing. One FLOP per
        byte: memory-bound everywhere. The interesting part is the *reduction*: n numbers become 3.

Ladder
  cpu/numpy            baseline: vectorised NumPy; builds r, r*r and r*x as temporaries (5 passes)
  cpu/loop      rung 1 one @njit loop, float64 accumulators: one pass over x and y, no temporaries
  cpu/prange    rung 2 the same loop with prange: numba splits the sums over cores and adds the parts
  cpu/chunks    rung 3 fixed chunks of 16K samples over the cores, each summed in SIMD lanes (float64
                       lanes, reassociation allowed in the sums only), the chunk sums added in chunk order
  gpu/atomic    rung 1 the first @cuda.jit kernel: one thread per sample; every thread atomically
                       adds its three terms to the same three addresses in global memory (float64 sums,
                       rounded to float32 once: a float32 running sum of n terms drifts by percents)
  gpu/twopass   rung 2 each block sums its samples in shared memory (a tree); a second, one-block
                       kernel adds the per-block partial sums. Deterministic, needs a scratch buffer
  gpu/blockatomic rung 3 the same per-block tree, then one atomic per block (not per sample) finishes
                       the sum in a single launch. The order of the final additions varies run to run
"""
import math

import numpy as np
from ..compiler import cuda, njit, prange

from ..device import ceil_div
from ..registry import exercise_op
from ..registry import sprinkle as _sprinkle
from ..registry import define_op, register


def reference(w, b, x, y):
    """float64 oracle: the formulas above, written the obvious way."""
    n = x.shape[0]
    r = w * x + b - y
    return (np.array([np.sum(r * r) / n]), np.array([2.0 * np.sum(r * x) / n]),
            np.array([2.0 * np.sum(r) / n]))


def make_data(n, rng, w_true=1.5, b_true=-0.5, noise=0.3, dtype=np.float32):
    """The chapter's data set: x uniform on [-2, 2], y = 1.5 x - 0.5 plus Gaussian noise."""
    x = rng.uniform(-2.0, 2.0, n)
    y = w_true * x + b_true + noise * rng.standard_normal(n)
    return x.astype(dtype), y.astype(dtype)


def make_inputs(size, dtype, rng):
    """A batch and a model that is far from the fit (w <= 0.5, b >= 0.5), so that neither gradient
    is close to zero: a relative tolerance then means something, with no cancellation to hide behind."""
    (n,) = size
    x, y = make_data(n, rng, dtype=dtype)
    w = dtype.type(rng.uniform(-1.0, 0.5))
    b = dtype.type(rng.uniform(0.5, 1.5))
    return w, b, x, y


def make_edge_inputs(size, dtype, rng):
    """Awkward but finite values (for the graders' edge=True): exact and signed zeros, a subnormal, and
    one sample far out (x = 3e4), whose terms dominate all three sums. (One, not two: two large terms
    of opposite sign could cancel and leave a result far smaller than the float32 rounding of the
    terms.) Nothing overflows float32."""
    w, b, x, y = make_inputs(size, dtype, rng)
    _sprinkle(x, rng, [0.0, -0.0, 1e-40, 3e4])
    _sprinkle(y, rng, [0.0, -0.0])
    return w, b, x, y


EPS32 = float(np.finfo(np.float32).eps)


def tolerance(size, dtype):
    """float32 sums of n terms. The error of a float32 sum is at most about eps x (the longest chain of
    additions any partial sum goes through) relative to sum |terms|. In the tree kernels that chain is
    the grid-stride loop (ceil(n / 262144) samples per thread), 8 tree levels, at most 4 partials per
    thread and 8 levels in the second pass: ceil(n / 262144) + 28. For these inputs sum |terms| is at
    most a few times |sum|, so we allow 4 eps x chain (1.5e-5 at n = 1e6) and never less than 1e-5.
    The CPU variants accumulate in float64 and NumPy's sum is pairwise: both are far inside this.
    (Emulating the tree order in NumPy, the error stays near 1 eps up to n = 2^22.)"""
    if np.dtype(dtype) != np.float32:
        return None
    (n,) = size
    chain = math.ceil(n / (MAX_BLOCKS * THREADS)) + 28
    rtol = max(1e-5, 4 * EPS32 * chain)
    return (rtol, 1e-6)


def atomic_error_bound(n: int) -> float:
    """The per-sample atomic kernel's error, relative to sum |terms| (loss: to the loss itself). Each r_i is
    computed in float32 like every rung (at most 3 roundings, relative to |w x_i| + |b| + |y_i|); r_i^2 and
    r_i x_i are exact in float64 (24-bit times 24-bit significands fit in 53 bits); the n atomic adds are a
    float64 running sum in any order, error at most (n - 1) * 2^-53 of sum |terms|; one division by n and
    one rounding to float32 end it. So: 3 float32 ulps per term, half an ulp at the end, and a float64 chain
    that stays below 2^-29 (4 float32 eps) up to n = 2^24. A float32 running sum instead has the chain
    (n - 1) * 2^-24: useless once n nears 2^24 (measured on the H100 before the fix: 3 % at n = 2^24)."""
    return 3.5 * EPS32 + (n - 1) * 2.0 ** -53


define_op(
    "regression_grad", reference=reference, make_inputs=make_inputs, chapter=2,
    title="y = w*x + b: MSE loss and its gradients dw, db", size_names=("n",), kind="memory",
    output_names=("loss", "dw", "db"), tol=tolerance,
    flops=lambda s: 8 * s[0], bytes=lambda s, b: 2 * s[0] * b,
    sizes={"check": [(1,), (2,), (7,), (255,), (256,), (257,), (1000,), (4099,), (65537,), (1_000_003,)],
           "check_sim": [(1,), (7,), (257,), (600,)],
           "bench": [(1 << 10,), (1 << 14,), (1 << 18,), (1 << 22,)],
           "bench_gpu": [(1 << 10,), (1 << 14,), (1 << 18,), (1 << 22,), (1 << 24,), (1 << 26,)],
           "bench_sim": [(300,)]},
)


def reference_db(w, b, x, y):
    """float64 oracle of the exercise op regression_db: dL/db alone."""
    return np.array([2.0 * np.sum(w * x + b - y) / x.shape[0]])


# An exercise-only op (chapter 2's GPU exercise): db as one reduction, no ladder of course variants.
exercise_op("regression_db", reference=reference_db, make_inputs=make_inputs, chapter=2,
            title="dL/db = (2/n) sum(w*x + b - y)", size_names=("n",), kind="memory", output_names=("db",),
            tol=tolerance, flops=lambda s: 4 * s[0], bytes=lambda s, b: 2 * s[0] * b,
            sizes={"check": [(1,), (7,), (129,), (300,), (4099,)], "check_sim": [(1,), (7,), (129,), (300,)],
                   "bench": [(1 << 20,)]})


# ------------------------------------------------------------------------------------------ CPU
@register("regression_grad", "cpu", "numpy", baseline=True, bytes=lambda s, b: 15 * s[0] * b)
def regression_grad_numpy(loss, dw, db, w, b, x, y):
    """NumPy: each operator is its own pass over memory with a full-length temporary (w*x, then +b,
    then -y, r*r, r*x) and each sum another pass: about 15n elements move instead of 2n."""
    n = x.shape[0]
    r = w * x + b - y
    loss[0] = np.sum(r * r) / n
    dw[0] = 2 * np.sum(r * x) / n
    db[0] = 2 * np.sum(r) / n


@njit(cache=True)
def _regression_loop(loss, dw, db, w, b, x, y):
    n = x.shape[0]
    s_rr = 0.0  # a Python float: numba makes these float64 accumulators
    s_rx = 0.0
    s_r = 0.0
    for i in range(n):
        r = w * x[i] + b - y[i]
        s_rr += r * r
        s_rx += r * x[i]
        s_r += r
    loss[0] = s_rr / n
    dw[0] = 2.0 * s_rx / n
    db[0] = 2.0 * s_r / n


@register("regression_grad", "cpu", "loop", rung=1)
def regression_grad_loop(loss, dw, db, w, b, x, y):
    """One compiled loop that computes r and adds it into three float64 accumulators: a single pass,
    2n elements read, no temporaries. Predicted: ~5x fewer bytes than NumPy, so up to ~5x faster on
    arrays larger than the caches (less where NumPy's SIMD sums win on small ones)."""
    _regression_loop(loss, dw, db, w, b, x, y)


@njit(parallel=True, cache=True)
def _regression_prange(loss, dw, db, w, b, x, y):
    n = x.shape[0]
    s_rr = 0.0
    s_rx = 0.0
    s_r = 0.0
    for i in prange(n):  # numba sees the += on scalars and makes each one a parallel reduction
        r = w * x[i] + b - y[i]
        s_rr += r * r
        s_rx += r * x[i]
        s_r += r
    loss[0] = s_rr / n
    dw[0] = 2.0 * s_rx / n
    db[0] = 2.0 * s_r / n


@register("regression_grad", "cpu", "prange", rung=2)
def regression_grad_prange(loss, dw, db, w, b, x, y):
    """prange: each core sums a chunk into private accumulators, then the parts are added. Predicted:
    up to cores x the loop on large n; slower than the loop on small n, where starting the threads
    (microseconds) costs more than the work."""
    _regression_prange(loss, dw, db, w, b, x, y)


REG_CHUNK = 1 << 14  # samples per chunk: the chunks, not the threads, fix the order of the additions


@njit(cache=True)
def _residual(w, xi, b, yi):
    return w * xi + b - yi  # float32, in this order: no fast-math here, so r rounds as in rungs 1 and 2


@njit(cache=True, fastmath={"reassoc"})
def _regression_chunk_sums(parts, c, w, b, x, y):
    # x, y (chunk,) -> parts[c] = (sum r*r, sum r*x, sum r) in float64. "reassoc" lets the compiler keep
    # the three sums in SIMD lanes (8 float64 per zmm, several registers each) instead of one chain each.
    s_rr = 0.0
    s_rx = 0.0
    s_r = 0.0
    for i in range(x.shape[0]):
        r = _residual(w, x[i], b, y[i])
        s_rr += r * r
        s_rx += r * x[i]
        s_r += r
    parts[c, 0] = s_rr
    parts[c, 1] = s_rx
    parts[c, 2] = s_r


@njit(parallel=True, cache=True)
def _regression_chunks(loss, dw, db, w, b, x, y, parts):
    # parts (C, 3) float64: one row of sums per chunk of REG_CHUNK samples
    n = x.shape[0]
    for c in prange(parts.shape[0]):
        lo = c * REG_CHUNK
        hi = min(n, lo + REG_CHUNK)
        _regression_chunk_sums(parts, c, w, b, x[lo:hi], y[lo:hi])
    s_rr = 0.0
    s_rx = 0.0
    s_r = 0.0
    for c in range(parts.shape[0]):  # chunk order: the same sums whatever the number of threads
        s_rr += parts[c, 0]
        s_rx += parts[c, 1]
        s_r += parts[c, 2]
    loss[0] = s_rr / n
    dw[0] = 2.0 * s_rx / n
    db[0] = 2.0 * s_r / n


@register("regression_grad", "cpu", "chunks", rung=3)
def regression_grad_chunks(loss, dw, db, w, b, x, y):
    """Rung 2 is not memory-bound: each of its three float64 sums is one chain of dependent adds, one
    sample per add latency (~4 cycles) per core, ~1.5 G samples/s on 2 cores = 12 GB/s, a quarter of
    copy. Here fixed chunks of 16K samples go to the cores and each chunk's sums are kept in SIMD lanes
    (reassociation allowed in the sums, not in r): many samples per cycle, so the 8 bytes per sample
    are the limit. Predict ~70-80 % of copy at 2^22 (a read-only stream; the copy also writes), and
    the same result whatever the number of threads: the chunk sums are added in chunk order."""
    parts = np.empty((max(1, -(-x.shape[0] // REG_CHUNK)), 3))
    _regression_chunks(loss, dw, db, w, b, x, y, parts)


# ------------------------------------------------------------------------------------------ GPU
THREADS = 256  # threads per block; a power of two, which the shared-memory tree needs
MAX_BLOCKS = 1024  # the grid-stride kernels never launch more blocks than this
OUT_SIG = "float32[::1], float32[::1], float32[::1]"
IN_SIG = "float32, float32, float32[::1], float32[::1]"


@cuda.jit
def zero3_kernel(loss, dw, db):
    """Atomics add into the outputs, so something must set them to 0 first (one thread)."""
    if cuda.grid(1) == 0:
        loss[0] = 0.0
        dw[0] = 0.0
        db[0] = 0.0


@cuda.jit
def regression_atomic_kernel(acc, w, b, x, y):
    i = cuda.grid(1)  # this thread's sample: blockIdx.x * blockDim.x + threadIdx.x
    if i < x.size:  # the bounds guard: the last block runs past the end when n % 256 != 0
        r = np.float64(w * x[i] + b - y[i])  # the error in float32, as in every rung; the sums in float64
        cuda.atomic.add(acc, 0, r * r)
        cuda.atomic.add(acc, 1, r * np.float64(x[i]))
        cuda.atomic.add(acc, 2, r)


@cuda.jit
def zero_acc_kernel(acc):
    """The float64 accumulators start at 0 (one thread)."""
    if cuda.grid(1) == 0:
        acc[0] = 0.0
        acc[1] = 0.0
        acc[2] = 0.0


@cuda.jit
def finish_acc_kernel(loss, dw, db, acc, n):
    """Scale the three float64 sums and round each to float32 once (one thread)."""
    if cuda.grid(1) == 0:
        loss[0] = np.float32(acc[0] / n)
        dw[0] = np.float32(2.0 * acc[1] / n)
        db[0] = np.float32(2.0 * acc[2] / n)


_acc: list = []


def acc_buffer():
    """The three float64 running sums of the atomic rung, on the device, allocated once and reused."""
    if not _acc:
        _acc.append(cuda.device_array(3, dtype=np.float64))
    return _acc[0]


@register("regression_grad", "gpu", "atomic", rung=1,
          ptx=[(zero_acc_kernel, "void(float64[::1])"), (regression_atomic_kernel, f"void(float64[::1], {IN_SIG})"),
               (finish_acc_kernel, f"void({OUT_SIG}, float64[::1], int64)")])
def regression_grad_atomic(loss, dw, db, w, b, x, y):
    """One thread per sample, ceil(n/256) blocks of 256; each thread does 3 atomic adds to the same 3
    addresses. The loads coalesce, but the atomics on one address are serialised in the L2 cache:
    predicted ~3n atomic operations at roughly one per clock per address, i.e. ~n ns, far below
    the memory system's rate once n is large. The three sums are float64 (atomics on float64 exist since
    sm_60): a float32 running sum of n terms rounds each small term against a large sum, and was 3 % off
    at n = 2^24 on the H100 (error bound: :func:`atomic_error_bound`). A zeroing thread before, a
    finishing thread after (scale by 1/n, round to float32 once)."""
    acc = acc_buffer()
    zero_acc_kernel[1, 1](acc)
    regression_atomic_kernel[ceil_div(x.size, THREADS), THREADS](acc, w, b, x, y)
    finish_acc_kernel[1, 1](loss, dw, db, acc, x.size)


@cuda.jit
def regression_partials_kernel(partials, w, b, x, y):
    t = cuda.threadIdx.x
    # 1. each thread sums its samples (a grid-stride loop: thread i takes i, i + gridsize, ...)
    s_rr = np.float32(0.0)
    s_rx = np.float32(0.0)
    s_r = np.float32(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        r = w * x[i] + b - y[i]
        s_rr += r * r
        s_rx += r * x[i]
        s_r += r
    # 2. the block's 256 threads add their sums in shared memory, halving the count at each step
    sh = cuda.shared.array((3, THREADS), dtype=np.float32)
    sh[0, t] = s_rr
    sh[1, t] = s_rx
    sh[2, t] = s_r
    cuda.syncthreads()
    step = THREADS // 2
    while step > 0:  # 256 -> 128 -> ... -> 1 values; half the threads idle at each level
        if t < step:
            sh[0, t] += sh[0, t + step]
            sh[1, t] += sh[1, t + step]
            sh[2, t] += sh[2, t + step]
        cuda.syncthreads()
        step //= 2
    # 3. one thread per block writes the block's three sums
    if t == 0:
        blk = cuda.blockIdx.x
        partials[0, blk] = sh[0, 0]
        partials[1, blk] = sh[1, 0]
        partials[2, blk] = sh[2, 0]


@cuda.jit
def regression_finish_kernel(loss, dw, db, partials, n):
    """The second pass: a single block adds the per-block partial sums and scales them."""
    sh = cuda.shared.array((3, THREADS), dtype=np.float32)
    t = cuda.threadIdx.x
    a0 = np.float32(0.0)
    a1 = np.float32(0.0)
    a2 = np.float32(0.0)
    for j in range(t, partials.shape[1], cuda.blockDim.x):
        a0 += partials[0, j]
        a1 += partials[1, j]
        a2 += partials[2, j]
    sh[0, t] = a0
    sh[1, t] = a1
    sh[2, t] = a2
    cuda.syncthreads()
    step = THREADS // 2
    while step > 0:
        if t < step:
            sh[0, t] += sh[0, t + step]
            sh[1, t] += sh[1, t + step]
            sh[2, t] += sh[2, t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        inv_n = np.float32(1.0) / np.float32(n)
        loss[0] = sh[0, 0] * inv_n
        dw[0] = np.float32(2.0) * sh[1, 0] * inv_n
        db[0] = np.float32(2.0) * sh[2, 0] * inv_n


_scratch: dict = {}


def partials_buffer(blocks: int):
    """The (3, blocks) scratch array of the two-pass reduction, allocated once per size and reused
    (cudaMalloc costs more than the whole kernel at small n)."""
    buf = _scratch.get(blocks)
    if buf is None:
        buf = _scratch[blocks] = cuda.device_array((3, blocks), dtype=np.float32)
    return buf


def reduction_blocks(n: int) -> int:
    return max(1, min(ceil_div(n, THREADS), MAX_BLOCKS))


@register("regression_grad", "gpu", "twopass", rung=2,
          ptx=[(regression_partials_kernel, f"void(float32[:, ::1], {IN_SIG})"),
               (regression_finish_kernel, f"void({OUT_SIG}, float32[:, ::1], int64)")])
def regression_grad_twopass(loss, dw, db, w, b, x, y):
    """Per-block shared-memory trees (pass 1), then one block adds the <= 1024 partials (pass 2).
    No atomics: 3 global writes per block instead of 3 atomics per sample. Predicted: close to copy
    bandwidth for large n (the data is read once; the tree is ~log2(256) = 8 steps in shared
    memory), and a fixed cost of two launches (~2 x a few microseconds) for small n."""
    n = x.size
    blocks = reduction_blocks(n)
    part = partials_buffer(blocks)
    regression_partials_kernel[blocks, THREADS](part, w, b, x, y)
    regression_finish_kernel[1, THREADS](loss, dw, db, part, n)


@cuda.jit
def regression_blockatomic_kernel(loss, dw, db, w, b, x, y):
    t = cuda.threadIdx.x
    # 1. each thread sums its samples (a grid-stride loop: thread i takes i, i + gridsize, ...)
    s_rr = np.float32(0.0)
    s_rx = np.float32(0.0)
    s_r = np.float32(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        r = w * x[i] + b - y[i]
        s_rr += r * r
        s_rx += r * x[i]
        s_r += r
    # 2. the block's 256 threads add their sums in shared memory, halving the count at each step
    sh = cuda.shared.array((3, THREADS), dtype=np.float32)
    sh[0, t] = s_rr
    sh[1, t] = s_rx
    sh[2, t] = s_r
    cuda.syncthreads()
    step = THREADS // 2
    while step > 0:  # 256 -> 128 -> ... -> 1 values; half the threads idle at each level
        if t < step:
            sh[0, t] += sh[0, t + step]
            sh[1, t] += sh[1, t + step]
            sh[2, t] += sh[2, t + step]
        cuda.syncthreads()
        step //= 2
    # 3. one atomic per block and output, instead of one per sample
    if t == 0:
        inv_n = np.float32(1.0) / np.float32(x.size)
        cuda.atomic.add(loss, 0, sh[0, 0] * inv_n)
        cuda.atomic.add(dw, 0, np.float32(2.0) * sh[1, 0] * inv_n)
        cuda.atomic.add(db, 0, np.float32(2.0) * sh[2, 0] * inv_n)


@register("regression_grad", "gpu", "blockatomic", rung=3,
          ptx=[(zero3_kernel, f"void({OUT_SIG})"), (regression_blockatomic_kernel, f"void({OUT_SIG}, {IN_SIG})")])
def regression_grad_blockatomic(loss, dw, db, w, b, x, y):
    """The same per-block trees as twopass, but each block's thread 0 finishes with 3 atomics: at most
    3 x 1024 atomics in all, so contention is negligible, and no scratch buffer or second reduction
    kernel is needed (only the tiny zeroing launch). Predicted: the same bandwidth as twopass at
    large n; the result's last bits may differ run to run (the blocks finish in any order)."""
    zero3_kernel[1, 1](loss, dw, db)
    regression_blockatomic_kernel[reduction_blocks(x.size), THREADS](loss, dw, db, w, b, x, y)
