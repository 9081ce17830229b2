"""Softmax over the last axis, forward and backward (chapter 8).

Shapes: x (M,N) logits -> y (M,N), y[i, j] = exp(x[i, j] - m_i) / sum_k exp(x[i, k] - m_i), m_i = max_k x[i, k]
        backward: dy (M,N), y (M,N) -> dx (M,N) = y * (dy - sum_k dy[:, k] * y[:, k])
Cost:   forward ~5 FLOPs per element (max, subtract, exp, add, scale); at least 2MN elements move (read
        x once, write y once). Backward: 4 FLOPs, 3MN elements. Both are memory-bound.

Fully masked rows. A row whose logits are all -inf (every position masked out) has no finite maximum and
a zero denominator: the formula gives 0/0. The reference DEFINES its softmax as all zeros (no probability
mass anywhere), which is what attention kernels write for such rows, and which keeps a NaN from
spreading into the next matrix product. The safe and online rungs follow it; the naive rung does not
(it returns NaN there, on purpose: chapter 8's stability demo).

Ladder (forward)
  cpu/naive        rung 1   exp(x) / sum(exp(x)): two passes; overflows to inf/inf = NaN for x > 88
  cpu/safe         rung 2   subtract the row max first: three passes (max, sum, write), never overflows
  cpu/online       rung 3   one pass keeps a running max and a rescaled running sum, one pass writes
  cpu/online_prange rung 4  rung 3 with rows split over cores
  cpu/simd_prange  rung 5   rung 4 in SIMD: exp from kernels_src/ops/cpumath.py (no libm call), the max as an
                            integer max of the float bits, the sum reassociated into vector lanes
  cpu/numpy        baseline the NumPy formula (max, exp, sum, divide), float32
  cpu/torch        baseline torch's CPU softmax (aten._softmax with out=), torch's thread count = Numba's
  gpu/naive        rung 1   one block per row, shared-memory tree reductions; reads the row twice
  gpu/safe         rung 2   max, sum, write: reads the row three times (stable, slower)
  gpu/online       rung 3   (max, sum) in one pass and one combined reduction: reads the row twice
  gpu/regs         rung 4   each thread keeps its slice of the row in registers: the row is read ONCE
  gpu/regs_shfl    rung 5   rung 4 with warp-shuffle reductions (real GPU only)
  gpu/vec4         rung 6   rung 5 with 16-byte loads and stores (kernels_src/vec.py): a quarter of the
                            memory instructions for the same bytes (rows whose length is a multiple of 4)
  gpu/torch        baseline torch's softmax kernel, writing into our output buffer
Ladder (backward)
  cpu/loop         rung 1   the dot <dy, y>, then the write
  cpu/simd_prange  rung 2   rows over cores, the dot reassociated into SIMD lanes
  cpu/numpy        baseline y * (dy - sum(dy * y)), float32
  cpu/torch        baseline aten._softmax_backward_data with out=
  gpu/row          rung 1   one block per row, two walks over dy and y, a shared-memory tree
  gpu/regs         rung 2   dy and y held in registers: one read of each, one write
  gpu/vec4         rung 3   rung 2 with 16-byte loads/stores and a warp-shuffle sum
Every GPU kernel is compiled with fastmath (fast exp, approximate division) minus the no-inf/no-NaN
assumptions, so -inf logits keep their meaning.

The normal inputs (make_inputs) are logits of scale 2 with some entries masked to -inf: every rung,
naive included, is correct on them. Large logits and fully masked rows are exercised by the demo in
chapter 8 and by tests/test_ch08_softmax.py.
"""
import math

import numpy as np
from ..compiler import cuda, float32, float32_from_bits, load4, njit, prange, store4

from ..device import needs_real_gpu
from ..registry import EDGE_INPUTS
from ..registry import define_op, register
from .reductions import (FAST_MATH, row_jit, NEG_INF, ONE, ZERO, torch_view, block_max_smem, block_sum_smem, row_config,
                         row_threads_streaming, torch_gpu, block_sum_shfl, next_pow2, ROW_MAX_ITEMS)
from ..device import ceil_div
from .. import device
from .cpu_baselines import aten_out, torch_cpu, tviews
from .cpumath import C2, C3, C4, C5, C6, C7, F1, HALF, LN2_HI, LN2_LO, LOG2E, exp2_nonpos_f32, pow2f

THREADS = None  # block size of the register rungs (None: from the row length and PER_THREAD)
PER_THREAD = 16  # target values per thread in the register rungs (N = 4096 -> 256 threads of 16)
VEC_PER_THREAD = 4  # target float4 groups per thread in the vec4 rungs (N = 4096 -> 256 threads of 4 x 4)
BWD_PER_THREAD = 16  # values of dy (and of y) per thread in the backward register rungs


# --------------------------------------------------------------------------------------- reference
def reference(x):
    """float64 oracle. Rows with no finite logit (fully masked) are defined as all zeros."""
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)  # m = -inf only when the whole row is -inf
    e = np.exp(x - m)
    s = np.sum(e, axis=-1, keepdims=True)
    return np.where(s > 0, e / np.where(s > 0, s, 1.0), 0.0)


def make_inputs(size, dtype, rng):
    """Logits 2*N(0,1), with x[1::4, 1::3] masked to -inf (column 0 never is, so no row is fully masked)."""
    m, n = size
    x = (2.0 * rng.standard_normal((m, n))).astype(dtype)
    x[1::4, 1::3] = -np.inf
    return (x,)


def make_edge_inputs(size, dtype, rng):
    """The rows a softmax must survive, cycling: logits of +-1e4 (exp overflows unless the max is
    subtracted), a fully masked row (all -inf: the reference's zeros), a row mixing -inf with logits of
    1e4, and an ordinary row. The naive rung fails these by design; every other rung must pass."""
    m, n = size
    x = 2.0 * rng.standard_normal((m, n))
    for i in range(m):
        k = i % 4
        if k == 0:
            x[i] = 1e4 * np.sign(rng.standard_normal(n))
        elif k == 1:
            x[i] = -np.inf
        elif k == 2:
            x[i] = 1e4 + rng.standard_normal(n)
            x[i, rng.random(n) < 0.5] = -np.inf
    return (x.astype(dtype),)


EDGE_INPUTS["softmax"] = make_edge_inputs


def reference_bwd(dy, y):
    """float64 oracle: dx = y * (dy - <dy, y>) row by row (the Jacobian diag(y) - y y^T, applied)."""
    return y * (dy - np.sum(dy * y, axis=-1, keepdims=True))


def make_inputs_bwd(size, dtype, rng):
    m, n = size
    y = reference(2.0 * rng.standard_normal((m, n))).astype(dtype)
    dy = rng.standard_normal((m, n)).astype(dtype)
    return dy, y


# Each output is one exp times one reciprocal of a sum of N positive terms: relative error of a few
# eps from the fast exp (ex2.approx) and the sum; tiny probabilities may flush to zero (atol).
TOL = (2e-5, 1e-7)
SIZES = {"check": [(1, 1), (3, 7), (5, 33), (2, 257), (64, 1000), (17, 4099), (3, 12289), (5, 4100)],
         # (3, 36): rows a multiple of 4 long, so the simulator runs the 16-byte-load path of the vec4 rungs
         "check_sim": [(1, 1), (3, 7), (5, 33), (2, 257), (3, 36)],
         "bench": [(1024, 1024), (4096, 4096)],
         "bench_gpu": [(16384, 1024), (16384, 4096)],
         "bench_sim": [(5, 33)]}

define_op("softmax", reference=reference, make_inputs=make_inputs, chapter=8, title="softmax over rows",
          size_names=("M", "N"), kind="memory", tol=TOL, output_names=("y",), sizes=SIZES,
          flops=lambda s: 5 * s[0] * s[1], bytes=lambda s, b: 2 * s[0] * s[1] * b)
define_op("softmax_bwd", reference=reference_bwd, make_inputs=make_inputs_bwd, chapter=8,
          title="softmax backward", size_names=("M", "N"), kind="memory",
          tol=(1e-5, 1e-6),  # a dot product of N terms per row; values O(1)
          output_names=("dx",), sizes=SIZES,
          flops=lambda s: 4 * s[0] * s[1], bytes=lambda s, b: 3 * s[0] * s[1] * b)


# --------------------------------------------------------------------------------------------- CPU
@njit(cache=True, error_model="numpy")
def softmax_naive_rows(y, x):
    m, n = x.shape
    for i in range(m):
        s = np.float32(0.0)
        for j in range(n):
            s += np.exp(x[i, j])  # exp(89) = inf in float32: one large logit ruins the row
        for j in range(n):
            y[i, j] = np.exp(x[i, j]) / s


@register("softmax", "cpu", "naive", rung=1, edge_exempt="the textbook formula: it overflows on large logits, which is the point of this rung")
def softmax_naive(y, x):
    """Straight from the formula: sum exp(x), then divide. Two passes over x, two exps per element.
    Overflows (inf/inf = NaN) as soon as a logit passes ~88, and gives 0/0 = NaN on a fully masked row."""
    softmax_naive_rows(y, x)


@njit(cache=True, error_model="numpy")
def softmax_safe_rows(y, x):
    m, n = x.shape
    for i in range(m):
        mx = np.float32(-np.inf)
        for j in range(n):
            mx = max(mx, x[i, j])
        if mx == -np.inf:  # fully masked row: the reference's zeros
            y[i, :] = 0.0
            continue
        s = np.float32(0.0)
        for j in range(n):
            s += np.exp(x[i, j] - mx)  # every term in (0, 1]: no overflow, and s >= 1
        inv = np.float32(1.0) / s
        for j in range(n):
            y[i, j] = np.exp(x[i, j] - mx) * inv


@register("softmax", "cpu", "safe", rung=2)
def softmax_safe(y, x):
    """Subtract the row max before exp: softmax(x) = softmax(x - c) for any c, and with c = max every
    exp is <= 1, so nothing overflows. The price: a third pass over x (max, sum, write)."""
    softmax_safe_rows(y, x)


@njit(cache=True, error_model="numpy")
def _online_row(y, x, i):
    n = x.shape[1]
    mx = np.float32(-np.inf)
    s = np.float32(0.0)
    for j in range(n):  # one pass: keep sum exp(x - mx) valid for the max seen SO FAR
        v = x[i, j]
        if v > mx:
            s = s * np.exp(mx - v) + np.float32(1.0)  # a new max: rescale the old sum to it
            mx = v
        elif v > -np.inf:
            s += np.exp(v - mx)
    if mx == -np.inf:
        y[i, :] = 0.0
        return
    inv = np.float32(1.0) / s
    for j in range(n):
        y[i, j] = np.exp(x[i, j] - mx) * inv


@njit(cache=True, error_model="numpy")
def softmax_online_rows(y, x):
    for i in range(x.shape[0]):
        _online_row(y, x, i)


@register("softmax", "cpu", "online", rung=3)
def softmax_online(y, x):
    """Online softmax: one pass tracks the running max m and the sum s of exp(x - m); when a larger
    value arrives, s is rescaled by exp(m_old - m_new). Two passes over x instead of three: predict
    ~1.5x less memory traffic than the safe rung (more exps, but exps are cheap next to DRAM)."""
    softmax_online_rows(y, x)


@njit(parallel=True, cache=True, error_model="numpy")
def softmax_online_prange_rows(y, x):
    for i in prange(x.shape[0]):
        _online_row(y, x, i)


@register("softmax", "cpu", "online_prange", rung=4)
def softmax_online_prange(y, x):
    """Rung 3 with rows spread over the cores (rows are independent). Predict up to cores x on rows
    that fit in cache, less once DRAM bandwidth is shared."""
    softmax_online_prange_rows(y, x)


# CPU SIMD rung. LLVM turns a loop into SIMD code only when (1) nothing in it is a call it cannot see through
# (libm's expf is one: exp_f32 is inlined arithmetic instead), and (2) reordering its reduction is allowed:
# a float sum split over 8 lanes adds in another order, so it needs "reassoc". The flags below allow that and
# nothing about NaN or inf ("nnan"/"ninf" would let LLVM assume -inf never occurs, and masked logits are -inf).
CPU_FAST = {"reassoc", "nsz", "contract", "arcp"}
# float_key / row_max_simd (an integer max over the float bits, which LLVM vectorizes with no flag) live in
# reductions.py beside the other reductions; chapter 8's rung 5 and chapter 7's max rung share them.
from .reductions import float_key, row_max_simd  # noqa: E402,F401


EXP_FLOOR = np.float32(-80.0)  # e^-80 = 1.8e-35: far below any tolerance, far above the subnormals (< 1.2e-38)


@njit(inline="always", error_model="numpy")
def exp_nonpos(d):
    """exp(d) for d = x - max <= 0 (or NaN), from cpumath's pieces (its constants, polynomial and pow2f),
    specialised to what a softmax needs. Two changes from exp_f32:

    - d < -80 gives 0 (-inf included) and is never computed: e^-104, which exp_f32 builds for -inf, goes
      through a multiply whose result is a subnormal float, and an Intel core finishes such a multiply in a
      microcode assist of ~100 cycles, for the whole vector. One masked logit in 8 made rung 5 3x slower.
    - with d in [-80, 0], the exponent n is in [-115, 0], so 2^n is one normal float: no overflow clamp and
      no split of 2^n into two factors (whose 64-bit integer arithmetic, from Numba's int64 promotion,
      compiled to 512-bit instructions). Same polynomial, so the same results, bit for bit, with 1.65x
      fewer cycles per exp measured on 1024 x 1024 in-cache values (this machine, 2 cores).

    A NaN d passes the clamp unchanged and the last select returns it."""
    dc = EXP_FLOOR if d < EXP_FLOOR else d
    nf = np.floor(dc * LOG2E + HALF)
    r = (dc - nf * LN2_HI) - nf * LN2_LO
    p = F1 + r * (F1 + r * (C2 + r * (C3 + r * (C4 + r * (C5 + r * (C6 + r * C7))))))
    y = p * pow2f(nf)  # 2^n from float arithmetic and one conversion (issue 36: no int64-promoted steps)
    return np.float32(0.0) if d < EXP_FLOOR else (y if d == d else d)


@njit(inline="always", error_model="numpy", fastmath=CPU_FAST)
def softmax_row_simd(yr, xr):
    """y = softmax(x) for one contiguous row: max, then e = exp(x - max) written to y while summed, then
    y *= 1/sum. Three walks over the row, all in L1/L2 (a row of 4096 is 16 KiB): x is read from DRAM once,
    y written once, and exp is computed once per element."""
    n = xr.size
    mx = row_max_simd(xr)
    if mx == -np.inf:  # fully masked row: the reference's zeros
        for j in range(n):
            yr[j] = 0.0
        return
    s = np.float32(0.0)
    for j in range(n):
        e = exp_nonpos(xr[j] - mx)
        yr[j] = e
        s += e
    inv = np.float32(1.0) / s
    for j in range(n):
        yr[j] *= inv


@njit(parallel=True, cache=True, error_model="numpy", fastmath=CPU_FAST)
def softmax_simd_prange_rows(y, x):
    for i in prange(x.shape[0]):
        softmax_row_simd(y[i], x[i])


@register("softmax", "cpu", "simd_prange", rung=5)
def softmax_simd_prange(y, x):
    """Rung 4 in SIMD: the exp is cpumath's (kernels_src/ops/cpumath.py) arithmetic, inlined into the loop
    (exp_nonpos above), so the loop is vectorized 8 floats per instruction (AVX2) instead of one libm call per
    element; the max is an integer max of the float bits (vectorizes without assuming "no NaN"), the sum
    reassociated into vector lanes. Rung 4 spends ~10 ns per element in expf per core; predicted: the
    arithmetic drops ~8x, so the row loop nears memory speed: >= 70 % of copy bandwidth at 4096 x 4096, at
    least torch's CPU softmax (~1.1x)."""
    softmax_simd_prange_rows(y, x)


@njit(inline="always", error_model="numpy", fastmath=CPU_FAST)
def softmax_row_exp2(yr, xr):
    """softmax_row_simd with e^(x - max) as 2^((x - max) log2 e) from cpumath.exp2_nonpos_f32."""
    n = xr.size
    mx = row_max_simd(xr)
    if mx == -np.inf:
        for j in range(n):
            yr[j] = 0.0
        return
    s = np.float32(0.0)
    for j in range(n):
        e = exp2_nonpos_f32((xr[j] - mx) * LOG2E)
        yr[j] = e
        s += e
    inv = np.float32(1.0) / s
    for j in range(n):
        yr[j] *= inv


@njit(parallel=True, cache=True, error_model="numpy", fastmath=CPU_FAST)
def softmax_exp2_rows(y, x):
    for i in prange(x.shape[0]):
        softmax_row_exp2(y[i], x[i])


@register("softmax", "cpu", "simd_exp2", rung=6)
def softmax_simd_exp2(y, x):
    """Rung 5 with cpumath's exp2_nonpos_f32 (issue 36): (x - max) log2 e, rint, one subtraction, a degree-5
    minimax 2^f (relative error <= cpumath.EXP2_MAX_REL_ERR plus |x - max| 1.2e-7 from the product's rounding),
    in place of exp_nonpos's floor(x + 1/2), two-FMA Cody-Waite step, degree-7 polynomial and NaN select.
    kernels asm counts the packed instructions of both. Predict ~1.2x rung 5 in cache on one core (the exp
    walk is most of the row's arithmetic), and closer to the copy bandwidth at 4096 x 4096."""
    softmax_exp2_rows(y, x)


@register("softmax", "cpu", "numpy", baseline=True,
          edge_exempt="the formula a student writes gives 0/0 = NaN on a fully masked row")
def softmax_numpy(y, x):
    """The NumPy formula in float32: e = exp(x - max), y = e / sum(e). Four temporaries of M x N floats."""
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.divide(e, e.sum(axis=1, keepdims=True), out=y)


@register("softmax", "cpu", "torch", baseline=True, requires=torch_cpu,
          edge_exempt="torch's softmax gives NaN on a fully masked row (the reference defines zeros)")
def softmax_torch_cpu(y, x):
    """torch's CPU softmax kernel (aten._softmax.out), writing straight into y: no copy."""
    t = tviews(y, x)
    aten_out("_softmax", t[1], 1, False, out=t[0])


@njit(cache=True, error_model="numpy")
def softmax_bwd_rows(dx, dy, y):
    m, n = y.shape
    for i in range(m):
        dot = np.float32(0.0)
        for j in range(n):
            dot += dy[i, j] * y[i, j]
        for j in range(n):
            dx[i, j] = y[i, j] * (dy[i, j] - dot)


@register("softmax_bwd", "cpu", "loop", rung=1)
def softmax_bwd_cpu(dx, dy, y):
    """Two passes per row: the dot <dy, y>, then dx = y * (dy - dot). The M x N x N Jacobian is never
    formed: its product with dy collapses to one dot product per row."""
    softmax_bwd_rows(dx, dy, y)


@njit(parallel=True, cache=True, error_model="numpy", fastmath=CPU_FAST)
def softmax_bwd_simd_rows(dx, dy, y):
    m, n = y.shape
    for i in prange(m):
        dot = np.float32(0.0)
        for j in range(n):  # reassociated: 8 partial dots in one vector register, summed at the end
            dot += dy[i, j] * y[i, j]
        for j in range(n):
            dx[i, j] = y[i, j] * (dy[i, j] - dot)


@register("softmax_bwd", "cpu", "simd_prange", rung=2)
def softmax_bwd_simd_prange(dx, dy, y):
    """Rung 1 with rows over the cores and the dot reassociated ("reassoc"), so that both loops run 8 floats
    per instruction (rung 1's dot is a chain of dependent scalar adds: 4 cycles each). The second walk of a
    row (16 KiB for dy and y at N = 4096) hits L1/L2. Predicted: memory-bound, >= 70 % of copy bandwidth,
    ~2x rung 1 on 2 cores."""
    softmax_bwd_simd_rows(dx, dy, y)


@njit(inline="always", fastmath=CPU_FAST)
def _dot_f32(a, b):
    s = np.float32(0.0)
    for j in range(a.size):
        s += a[j] * b[j]
    return s


@njit(parallel=True, cache=True, error_model="numpy", fastmath=CPU_FAST)
def softmax_bwd_pipe_rows(dx, dy, y, chunks):
    m, n = y.shape
    per = (m + chunks - 1) // chunks
    for p in prange(chunks):
        lo = p * per
        hi = min(m, (p + 1) * per)
        if lo >= hi:
            continue
        dot = _dot_f32(dy[lo], y[lo])
        for i in range(lo, hi):
            k = i + 1 if i + 1 < hi else i  # the last row of a chunk sums itself once more
            yr, dyr, dxr, yn, dyn = y[i], dy[i], dx[i], y[k], dy[k]
            nd = np.float32(0.0)
            for j in range(n):
                dxr[j] = yr[j] * (dyr[j] - dot)
                nd += dyn[j] * yn[j]  # the next row's dot, read from memory while this row is written
            dot = nd


@register("softmax_bwd", "cpu", "pipe", rung=3)
def softmax_bwd_pipe(dx, dy, y):
    """Rung 2 with one walk per row instead of two (issue 36): the next row's dot <dy, y> is summed in this row's
    dx walk, so each walk streams the next row's dy and y in from memory while it re-reads this row's from L1/L2
    and writes dx: the loads and the stores of one loop are in flight together, where rung 2 alternates a
    load-only walk and a walk that mostly stores. Rows are split into one contiguous chunk per thread (the chunk's
    last row sums its own dot once more). Predicted: memory-bound, nearer copy bandwidth than rung 2's 51 %.
    Measured (indicative, 4096 x 4096, 2 threads, alternating in one process on the shared machine, min of 12,
    two runs): 7.5-7.7 ms -> 6.2-6.5 ms (1.2x rung 2; torch 7.6-7.9 ms); in cache (32 x 4096, one core) 0.9x
    rung 2, the cost of the second stream in one loop. kernels asm: packed zmm."""
    from ..compiler import get_num_threads

    softmax_bwd_pipe_rows(dx, dy, y, max(1, min(y.shape[0], get_num_threads())))


@register("softmax_bwd", "cpu", "numpy", baseline=True)
def softmax_bwd_numpy(dx, dy, y):
    """The NumPy formula in float32: dx = y * (dy - sum(dy * y)). Two temporaries of M x N floats."""
    np.multiply(y, dy - (dy * y).sum(axis=1, keepdims=True), out=dx)


@register("softmax_bwd", "cpu", "torch", baseline=True, requires=torch_cpu)
def softmax_bwd_torch_cpu(dx, dy, y):
    """torch's CPU softmax backward (aten._softmax_backward_data.out, what autograd calls), into dx: no copy."""
    import torch

    t = tviews(dx, dy, y)  # its out overload names the output grad_input, not out
    torch.ops.aten._softmax_backward_data.out(t[1], t[2], 1, torch.float32, grad_input=t[0])


# ---------------------------------------------------------------- GPU: block-level online combination
@cuda.jit(device=True, inline="always")
def online_combine(m1, s1, m2, s2):
    """Merge two partial softmax states (max m, sum s of exp(x - m)) into one, for the larger max."""
    m = m1 if m1 >= m2 else m2
    if m == NEG_INF:  # both parts empty (fully masked): exp(-inf - -inf) would be NaN
        return m, ZERO
    return m, s1 * math.exp(m1 - m) + s2 * math.exp(m2 - m)


@cuda.jit(device=True, inline="always")
def block_online_smem(m, s, bm, bs):
    """Shared-memory tree over (m, s) pairs; bm, bs: shared float32[blockDim.x] (a power of two)."""
    tid = cuda.threadIdx.x
    bm[tid] = m
    bs[tid] = s
    cuda.syncthreads()
    st = cuda.blockDim.x // 2
    while st > 0:
        if tid < st:
            mm, ss = online_combine(bm[tid], bs[tid], bm[tid + st], bs[tid + st])
            bm[tid] = mm
            bs[tid] = ss
        cuda.syncthreads()
        st //= 2
    m = bm[0]
    s = bs[0]
    cuda.syncthreads()
    return m, s


@cuda.jit(device=True, inline="always")
def warp_online(m, s):
    off = 16
    while off > 0:
        m2 = cuda.shfl_xor_sync(0xFFFFFFFF, m, off)
        s2 = cuda.shfl_xor_sync(0xFFFFFFFF, s, off)
        m, s = online_combine(m, s, m2, s2)
        off //= 2
    return m, s


@cuda.jit(device=True, inline="always")
def block_online_shfl(m, s, wm, ws):
    """Warp shuffles, one (m, s) per warp through shared float32[32] buffers, shuffles again."""
    tid = cuda.threadIdx.x
    lane = tid % 32
    m, s = warp_online(m, s)
    if lane == 0:
        wm[tid // 32] = m
        ws[tid // 32] = s
    cuda.syncthreads()
    if lane < (cuda.blockDim.x + 31) // 32:
        m = wm[lane]
        s = ws[lane]
    else:
        m = NEG_INF
        s = ZERO
    return warp_online(m, s)


# ------------------------------------------------------------------------- GPU: streaming rungs 1-3
def make_naive_kernel(threads):
    @row_jit(threads)
    def softmax_naive_kernel(y, x):
        # x (M,N) -> y (M,N): block = row, threads stride over its columns
        buf = cuda.shared.array(threads, float32)
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        n = x.shape[1]
        s = ZERO
        for c in range(tid, n, threads):
            s += math.exp(x[row, c])
        total = block_sum_smem(s, buf)
        for c in range(tid, n, threads):
            y[row, c] = math.exp(x[row, c]) / total

    return softmax_naive_kernel


def make_safe_kernel(threads):
    @row_jit(threads)
    def softmax_safe_kernel(y, x):
        buf = cuda.shared.array(threads, float32)
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        n = x.shape[1]
        m = NEG_INF
        for c in range(tid, n, threads):  # pass 1: max
            m = max(m, x[row, c])
        mx = block_max_smem(m, buf)
        mx_safe = mx if mx != NEG_INF else ZERO
        s = ZERO
        for c in range(tid, n, threads):  # pass 2: sum of exp(x - max), each term <= 1
            s += math.exp(x[row, c] - mx_safe)
        total = block_sum_smem(s, buf)
        inv = ONE / total if total > ZERO else ZERO
        for c in range(tid, n, threads):  # pass 3: write
            y[row, c] = math.exp(x[row, c] - mx_safe) * inv

    return softmax_safe_kernel


def make_online_kernel(threads):
    @row_jit(threads)
    def softmax_online_kernel(y, x):
        bm = cuda.shared.array(threads, float32)
        bs = cuda.shared.array(threads, float32)
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        n = x.shape[1]
        m = NEG_INF
        s = ZERO
        for c in range(tid, n, threads):  # pass 1: running (max, sum) per thread
            v = x[row, c]
            if v > m:
                s = s * math.exp(m - v) + ONE
                m = v
            elif v > NEG_INF:
                s += math.exp(v - m)
        mx, total = block_online_smem(m, s, bm, bs)  # one reduction of (max, sum) pairs
        mx_safe = mx if mx != NEG_INF else ZERO
        inv = ONE / total if total > ZERO else ZERO
        for c in range(tid, n, threads):  # pass 2: write
            y[row, c] = math.exp(x[row, c] - mx_safe) * inv

    return softmax_online_kernel


# ----------------------------------------------------------------------- GPU: register rungs 4 and 5
def make_regs_kernel(threads, items, shuffle):
    """Kernel for rows of at most threads*items elements, thread t holding columns t, t+T, t+2T, ...
    ``items`` and ``threads`` are compile-time constants, so the loops unroll and ``v`` lives in registers."""
    nbuf = 32 if shuffle else threads

    @row_jit(threads)
    def softmax_regs_kernel(y, x):
        bm = cuda.shared.array(nbuf, float32)
        bs = cuda.shared.array(nbuf, float32)
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        n = x.shape[1]
        v = cuda.local.array(items, float32)
        m = NEG_INF
        if n == threads * items:  # a full row (the common case): no bounds tests between the loads
            for k in range(items):  # the ONLY read of x: `items` independent loads in flight per thread
                v[k] = x[row, tid + k * threads]
        else:
            for k in range(items):
                c = tid + k * threads
                v[k] = x[row, c] if c < n else NEG_INF  # padding: exp(-inf) = 0 adds nothing
        for k in range(items):
            m = max(m, v[k])
        m_safe = m if m != NEG_INF else ZERO
        s = ZERO
        for k in range(items):  # exp once per element, kept for the write
            e = math.exp(v[k] - m_safe)
            v[k] = e
            s += e
        if shuffle:
            mx, total = block_online_shfl(m, s, bm, bs)
        else:
            mx, total = block_online_smem(m, s, bm, bs)
        # this thread's exps are relative to its own max m <= mx: one rescale factor for all of them
        scale = math.exp(m - mx) / total if (total > ZERO and m != NEG_INF) else ZERO
        for k in range(items):
            c = tid + k * threads
            if c < n:
                y[row, c] = v[k] * scale

    return softmax_regs_kernel


_kernels: dict = {}


def kernel(kind, *cfg):
    key = (kind, *cfg)
    if key not in _kernels:
        make = globals()[f"make_{kind}_kernel"]  # naive, safe, online, regs, vec4 (defined further down)
        _kernels[key] = make(*cfg)
    return _kernels[key]


SIG = "void(float32[:, ::1], float32[:, ::1])"
PTX_STREAM = 256  # the configuration compiled by `kernels ptx` (the one used at large N)


def _launch_streaming(kind, y, x):
    t = row_threads_streaming(x.shape[1])
    kernel(kind, t)[x.shape[0], t](y, x)


@register("softmax", "gpu", "naive", rung=1, ptx=[(kernel("naive", PTX_STREAM), SIG)],
          edge_exempt="the textbook formula: it overflows on large logits, which is the point of this rung")
def softmax_naive_gpu(y, x):
    """One block per row; threads stride over the columns, a shared-memory tree sums exp(x). The row is
    read twice (sum, then write): 3 DRAM passes instead of 2 if L2 cannot hold it between the two, so
    predict well below copy bandwidth; and it overflows like the CPU naive rung."""
    _launch_streaming("naive", y, x)


@register("softmax", "gpu", "safe", rung=2, ptx=[(kernel("safe", PTX_STREAM), SIG)])
def softmax_safe_gpu(y, x):
    """Max, then sum of exp(x - max), then write: three reads of the row and two block reductions.
    Stable, and slower than rung 1 (predict ~3/4 of its speed if every read went to DRAM)."""
    _launch_streaming("safe", y, x)


@register("softmax", "gpu", "online", rung=3, ptx=[(kernel("online", PTX_STREAM), SIG)])
def softmax_online_gpu(y, x):
    """Online: each thread keeps a running (max, sum), and ONE block reduction merges the (max, sum)
    pairs. Back to two reads of the row, as stable as rung 2: predict rung 1's speed."""
    _launch_streaming("online", y, x)


def _launch_regs(shuffle, y, x):
    cfg = row_config(x.shape[1], THREADS, PER_THREAD)
    if cfg is None:  # a row too long for registers: stream it instead
        return _launch_streaming("online", y, x)
    t, e = cfg
    kernel("regs", t, e, shuffle)[x.shape[0], t](y, x)


@register("softmax", "gpu", "regs", rung=4, ptx=[(kernel("regs", 256, 16, False), SIG)])
def softmax_regs(y, x):
    """The row goes from DRAM to registers once (each of T threads holds N/T values: 256 threads x 16
    at N = 4096, so 16 loads are in flight per thread), the exps are computed once and kept, and y is
    written from registers: exactly 2MN*4 bytes move. Predict close to copy bandwidth, limited by the
    shared-memory tree's 8 barriers. This is also the simulator's version of rung 5. Rows longer than
    1024*32 fall back to rung 3."""
    _launch_regs(False, y, x)


@register("softmax", "gpu", "regs_shfl", rung=5, ptx=[(kernel("regs", 256, 16, True), SIG)],
          requires=needs_real_gpu)
def softmax_regs_shfl(y, x):
    """Rung 4 with the (max, sum) reduction done by warp shuffles: two barriers per row instead of
    ~10. Predict >= 85 % of copy bandwidth at 16384 x 4096."""
    _launch_regs(True, y, x)


# ------------------------------------------------------------------------------- GPU: rung 6, vec4
def _aligned16(*arrays) -> bool:
    """Every array's data starts on a 16-byte boundary (always true for whole device arrays)."""
    for a in arrays:
        cai = getattr(a, "__cuda_array_interface__", None)
        if cai is not None and cai["data"][0] % 16:
            return False
    return True


def vec4_config(n: int, vecs: int | None = None):
    """(T, V) for rows of n elements (n a multiple of 4) held as V float4 groups per thread by T threads,
    or None when the row is too long for registers. GPU: V = VEC_PER_THREAD (unless given), T = the
    power of two in [32, 1024] that covers n/4 groups, V shrunk to fit; simulator: T <= 32, V exact."""
    n4 = n // 4
    if device.SIMULATED:
        t = min(32, next_pow2(max(n4, 1)))
        return t, ceil_div(n4, t)
    v = vecs or VEC_PER_THREAD
    t = min(1024, max(32, next_pow2(ceil_div(n4, v))))
    v = next_pow2(ceil_div(n4, t))
    return (t, v) if 4 * v <= ROW_MAX_ITEMS else None


def make_vec4_kernel(threads, vecs, shuffle):
    """Rows of n = 4 * n4 elements, n4 <= threads * vecs. Thread t holds the float4 groups t, t + T, ...
    of its row (a warp's load instruction covers 512 contiguous bytes), loaded with ONE 16-byte load each."""
    nbuf = 32 if shuffle else threads
    nv = 4 * vecs  # values per thread (a compile-time constant, so v stays in registers)

    @row_jit(threads)
    def softmax_vec4_kernel(y, x):
        bm = cuda.shared.array(nbuf, float32)
        bs = cuda.shared.array(nbuf, float32)
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        n4 = x.shape[1] // 4
        base = row * n4  # this row's first float4 group in the flat buffer
        v = cuda.local.array(nv, float32)
        for k in range(vecs):  # the only read of x: `vecs` 16-byte loads in flight per thread
            g = tid + k * threads
            if g < n4:
                a, b, c, d = load4(x, base + g)
            else:
                a = b = c = d = NEG_INF  # padding: exp(-inf) = 0 adds nothing
            v[4 * k] = a
            v[4 * k + 1] = b
            v[4 * k + 2] = c
            v[4 * k + 3] = d
        m = NEG_INF
        for k in range(nv):
            m = max(m, v[k])
        m_safe = m if m != NEG_INF else ZERO
        s = ZERO
        for k in range(nv):
            e = math.exp(v[k] - m_safe)
            v[k] = e
            s += e
        if shuffle:
            mx, total = block_online_shfl(m, s, bm, bs)
        else:
            mx, total = block_online_smem(m, s, bm, bs)
        scale = math.exp(m - mx) / total if (total > ZERO and m != NEG_INF) else ZERO
        for k in range(vecs):
            g = tid + k * threads
            if g < n4:
                store4(y, base + g, v[4 * k] * scale, v[4 * k + 1] * scale, v[4 * k + 2] * scale,
                       v[4 * k + 3] * scale)

    return softmax_vec4_kernel


def _launch_vec4(y, x):
    n = x.shape[1]
    cfg = vec4_config(n) if (n % 4 == 0 and _aligned16(x, y)) else None
    if cfg is None:  # odd row lengths and overlong rows take the scalar rungs
        return _launch_regs(not device.SIMULATED, y, x)
    t, v = cfg
    kernel("vec4", t, v, not device.SIMULATED)[x.shape[0], t](y, x)


@register("softmax", "gpu", "vec4", rung=6, ptx=[(kernel("vec4", 256, 4, True), SIG)])
def softmax_vec4(y, x):
    """Rung 5 with 16-byte loads and stores: each thread holds 4 float4 groups at N = 4096, so a warp's
    load instruction fetches 512 contiguous bytes and the kernel issues a quarter of rung 5's memory
    instructions for the same bytes. Predict a few percent over rung 5, at or above torch.compile (>= 95 %
    of copy): the DRAM bytes are already minimal, so only the instruction overhead can shrink. Rows whose
    length is not a multiple of 4 take rung 5 (rung 4 in the simulator, which has no shuffles and runs
    the shared-memory merge here)."""
    _launch_vec4(y, x)


@register("softmax", "gpu", "torch", baseline=True, requires=torch_gpu)
def softmax_torch(y, x):
    """torch's CUDA softmax (aten._softmax with out=), writing directly into y."""
    import torch

    torch.ops.aten._softmax.out(torch_view(x), -1, False, out=torch_view(y))


def eager_torch(x):
    """torch eager as a user calls it (allocates its output): for the same-run comparison in chapter 8."""
    import torch

    return torch.softmax(x, dim=-1)


# ---------------------------------------------------------------------------------- GPU: backward
def make_bwd_kernel(threads):
    @row_jit(threads)
    def softmax_bwd_kernel(dx, dy, y):
        # dy, y (M,N) -> dx (M,N): block = row; pass 1 the dot <dy, y>, pass 2 the write
        buf = cuda.shared.array(threads, float32)
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        n = y.shape[1]
        d = ZERO
        for c in range(tid, n, threads):
            d += dy[row, c] * y[row, c]
        dot = block_sum_smem(d, buf)
        for c in range(tid, n, threads):
            dx[row, c] = y[row, c] * (dy[row, c] - dot)

    return softmax_bwd_kernel


SIG_BWD = "void(float32[:, ::1], float32[:, ::1], float32[:, ::1])"
_bwd_kernels: dict = {}


def _bwd(t):
    if t not in _bwd_kernels:
        _bwd_kernels[t] = make_bwd_kernel(t)
    return _bwd_kernels[t]


@register("softmax_bwd", "gpu", "row", rung=1, ptx=[(_bwd(PTX_STREAM), SIG_BWD)])
def softmax_bwd_gpu(dx, dy, y):
    """One block per row: a shared-memory tree for the dot, then dx = y * (dy - dot). Reads dy and y
    twice (the second time mostly from L2), writes dx once: predict 60-80 % of copy bandwidth."""
    t = row_threads_streaming(y.shape[1])
    _bwd(t)[y.shape[0], t](dx, dy, y)


def make_bwd_regs_kernel(threads, items, shuffle):
    """dy and y of a row of at most threads*items elements held in registers, thread t holding columns
    t, t + T, ...: one read of each, one block sum, one write."""
    nbuf = 32 if shuffle else threads

    @row_jit(threads)
    def softmax_bwd_regs_kernel(dx, dy, y):
        buf = cuda.shared.array(nbuf, float32)
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        n = y.shape[1]
        vd = cuda.local.array(items, float32)
        vy = cuda.local.array(items, float32)
        d = ZERO
        for k in range(items):  # 2*items independent loads in flight per thread
            c = tid + k * threads
            if c < n:
                vd[k] = dy[row, c]
                vy[k] = y[row, c]
            else:
                vd[k] = ZERO
                vy[k] = ZERO
        for k in range(items):
            d += vd[k] * vy[k]
        dot = block_sum_shfl(d, buf) if shuffle else block_sum_smem(d, buf)
        for k in range(items):
            c = tid + k * threads
            if c < n:
                dx[row, c] = vy[k] * (vd[k] - dot)

    return softmax_bwd_regs_kernel


def make_bwd_vec4_kernel(threads, vecs, shuffle):
    """As make_bwd_regs_kernel, with dy and y read (and dx written) as float4 groups: rows of n = 4*n4."""
    nbuf = 32 if shuffle else threads
    nv = 4 * vecs

    @row_jit(threads)
    def softmax_bwd_vec4_kernel(dx, dy, y):
        buf = cuda.shared.array(nbuf, float32)
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        n4 = y.shape[1] // 4
        base = row * n4
        vd = cuda.local.array(nv, float32)
        vy = cuda.local.array(nv, float32)
        for k in range(vecs):
            g = tid + k * threads
            if g < n4:
                a, b, c, e = load4(dy, base + g)
                p, q, r, s = load4(y, base + g)
            else:
                a = b = c = e = p = q = r = s = ZERO
            vd[4 * k] = a
            vd[4 * k + 1] = b
            vd[4 * k + 2] = c
            vd[4 * k + 3] = e
            vy[4 * k] = p
            vy[4 * k + 1] = q
            vy[4 * k + 2] = r
            vy[4 * k + 3] = s
        d = ZERO
        for k in range(nv):
            d += vd[k] * vy[k]
        dot = block_sum_shfl(d, buf) if shuffle else block_sum_smem(d, buf)
        for k in range(vecs):
            g = tid + k * threads
            if g < n4:
                store4(dx, base + g, vy[4 * k] * (vd[4 * k] - dot), vy[4 * k + 1] * (vd[4 * k + 1] - dot),
                       vy[4 * k + 2] * (vd[4 * k + 2] - dot), vy[4 * k + 3] * (vd[4 * k + 3] - dot))

    return softmax_bwd_vec4_kernel


def bwd_kernel(kind, *cfg):
    key = ("bwd_" + kind, *cfg)
    if key not in _kernels:
        _kernels[key] = {"regs": make_bwd_regs_kernel, "vec4": make_bwd_vec4_kernel}[kind](*cfg)
    return _kernels[key]


def _launch_bwd_regs(shuffle, dx, dy, y):
    cfg = row_config(y.shape[1], None, BWD_PER_THREAD)
    if cfg is None:  # a row too long for registers: the streaming rung 1
        return softmax_bwd_gpu(dx, dy, y)
    t, e = cfg
    bwd_kernel("regs", t, e, shuffle)[y.shape[0], t](dx, dy, y)


@register("softmax_bwd", "gpu", "regs", rung=2, ptx=[(bwd_kernel("regs", 256, 16, False), SIG_BWD)])
def softmax_bwd_regs(dx, dy, y):
    """dy and y go from DRAM into registers once (16 of each per thread at N = 4096, so 32 loads in
    flight), a shared-memory tree sums the dot, and dx is written from registers. Rung 1 walks dy and y
    twice, but its second walk mostly hits L2; what it lacks is loads in flight and it pays a second set of
    address arithmetic. Predict ~80 % of copy bandwidth. Rows longer than 1024*32 take rung 1."""
    _launch_bwd_regs(False, dx, dy, y)


@register("softmax_bwd", "gpu", "vec4", rung=3, ptx=[(bwd_kernel("vec4", 256, 4, True), SIG_BWD)])
def softmax_bwd_vec4(dx, dy, y):
    """Rung 2 with 16-byte loads and stores (a quarter of the memory instructions) and a warp-shuffle sum
    (one barrier instead of eight). Predict >= 85 % of copy bandwidth, like the forward's vec4 rung. Rows
    whose length is not a multiple of 4 take rung 2; the simulator (no shuffles) uses the shared tree."""
    n = y.shape[1]
    cfg = vec4_config(n) if (n % 4 == 0 and _aligned16(dx, dy, y)) else None
    if cfg is None:
        return _launch_bwd_regs(not device.SIMULATED, dx, dy, y)
    t, v = cfg
    bwd_kernel("vec4", t, v, not device.SIMULATED)[y.shape[0], t](dx, dy, y)


def eager_torch_bwd(dy, y):
    """torch's softmax backward kernel as autograd calls it (aten._softmax_backward_data, allocating)."""
    import torch

    return torch.ops.aten._softmax_backward_data(dy, y, -1, torch.float32)
