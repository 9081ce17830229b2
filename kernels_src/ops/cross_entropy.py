"""Fused softmax cross-entropy over a vocabulary, forward and backward (chapter 13).

Shapes: logits (M,V) one row of V vocabulary scores per token, targets (M,) int32 the next token
        (a negative target marks a row to ignore: loss 0, gradient 0)
  cross_entropy      logits, targets -> loss (M,), lse (M,)
                     lse_i = log sum_j exp(logits_ij);  loss_i = lse_i - logits_i,t(i)
  cross_entropy_bwd  logits, targets, lse, dloss (M,) -> dlogits (M,V)
                     dlogits_ij = dloss_i * (exp(logits_ij - lse_i) - [j == t(i)])
The softmax is never written: the forward keeps only lse (one float per row) for the backward, which
recomputes each probability from it. Chapter 8 stopped at softmax over a row; a language model's rows
are vocabulary-long and the only thing the loss needs from them is lse and one logit.
Cost: forward ~4 FLOPs per element and M*V elements read once (the online rungs); backward reads
logits and writes dlogits: 2*M*V elements. Memory-bound.

Unfused, the same loss would write the (M,V) probabilities, read them back for the log and again in
the backward: 3 extra passes over the largest activation of a small model.

Ladder (forward)
  cpu/loop          rung 1  three passes per row: max, sum of exp(x - max), then the loss
  cpu/online_prange rung 2  one online pass (running max and rescaled sum, chapter 8) with rows over cores
  cpu/simd_prange   rung 3  two walks in SIMD: chapter 8's integer-key max, then the exps (chapter 8's
                            exp_nonpos on cpumath's arithmetic, no libm call) summed in vector lanes
  cpu/simd_exp2     rung 4  rung 3 with cpumath's cheaper 2^w (exp2_nonpos_f32) for the exps
  cpu/numpy         baseline the NumPy formula: max, log(sum(exp(x - max))), a gather of the target logits
  cpu/torch         baseline F.cross_entropy(reduction="none") for the loss and torch.logsumexp for lse
  gpu/row           rung 1  one block per row: each thread an online (max, sum) over its strided columns,
                            one shared-memory merge (chapter 8's block_online_smem), thread 0 writes
Backward
  cpu/prange        rung 1  rows over cores, one pass per row, the probability recomputed from lse
  cpu/simd_prange   rung 2  rung 1 with the vectorizable exp: the row loop in SIMD
  cpu/numpy         baseline the NumPy formula (exp(x - lse) - onehot) * dloss
  cpu/torch         baseline the same formula in torch eager ops (exp with out=)
  gpu/row           rung 1  one block per row, threads stride over the columns: coalesced, no reduction
Rows whose logits are all -inf have lse = -inf; the reference then defines loss = inf when the row is
not ignored (the target's probability is 0) and a zero gradient.
"""
import math

import numpy as np
from ..compiler import cuda, float32, njit, prange

from ..registry import define_op, register, sprinkle
from .reductions import FAST_MATH, NEG_INF, ONE, ZERO
from .cpu_baselines import torch_cpu, tviews
from .softmax import CPU_FAST, block_online_smem, exp_nonpos, row_max_simd
from .cpumath import LOG2E, exp2_nonpos_f32


# --------------------------------------------------------------------------------------- reference
def _lse(x):
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return (m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True)))[:, 0]


def reference(logits, targets):
    """float64 oracle: (loss, lse) per row; ignored rows (target < 0) get loss 0."""
    x = np.asarray(logits, np.float64)
    lse = _lse(x)
    t = np.asarray(targets)
    xt = x[np.arange(x.shape[0]), np.maximum(t, 0)]
    with np.errstate(invalid="ignore"):
        loss = np.where(t >= 0, lse - xt, 0.0)
    loss = np.where((t >= 0) & np.isneginf(lse), np.inf, loss)
    return loss, lse


def reference_bwd(logits, targets, lse, dloss):
    """float64 oracle: dlogits = dloss * (softmax - onehot), with the softmax exp(x - lse) computed in
    float64 from the lse the forward saved (as the kernels do: a float32 lse of 1e4 is off by up to half
    an ulp, 5e-4, and every probability of the row shares that relative shift)."""
    x = np.asarray(logits, np.float64)
    l64 = np.asarray(lse, np.float64)
    t = np.asarray(targets)
    fin = np.isfinite(l64)[:, None]
    with np.errstate(invalid="ignore"):
        p = np.where(fin, np.exp(x - np.where(fin, l64[:, None], 0.0)), 0.0)
    onehot = np.zeros_like(p)
    rows = np.arange(x.shape[0])
    onehot[rows, np.maximum(t, 0)] = 1.0
    g = (p - onehot) * np.asarray(dloss, np.float64)[:, None]
    return np.where((t >= 0)[:, None] & fin, g, 0.0)


def make_inputs(size, dtype, rng):
    """Logits 3*N(0,1) (a trained model's spread), uniform targets, every 5th row ignored (-1)."""
    M, V = size
    x = (3.0 * rng.standard_normal((M, V))).astype(dtype)
    t = rng.integers(0, V, M).astype(np.int32)
    t[3::5] = -1
    return x, t


def make_inputs_bwd(size, dtype, rng):
    x, t = make_inputs(size, dtype, rng)
    _, lse = reference(x, t)
    dloss = rng.uniform(0.5, 1.5, size[0]).astype(dtype)
    return x, t, lse.astype(dtype), dloss


def _edge_logits(size, dtype, rng):
    M, V = size
    x = 3.0 * rng.standard_normal((M, V))
    for i in range(M):
        k = i % 4
        if k == 0:  # +-1e4: exp overflows unless the max is subtracted
            x[i] = 1e4 * np.sign(rng.standard_normal(V) + 0.01)
        elif k == 1:  # a large common offset: lse - x_t must not lose the small difference
            x[i] = 1e3 + rng.standard_normal(V)
        elif k == 2:  # masked vocabulary entries (-inf), never the target
            x[i] = rng.standard_normal(V)
    return x


def make_edge_inputs(size, dtype, rng):
    """Logits of +-1e4, rows offset by 1e3, -inf entries and exact zeros; targets on finite logits."""
    M, V = size
    x = _edge_logits(size, dtype, rng)
    t = rng.integers(0, V, M).astype(np.int32)
    for i in range(2, M, 4):
        if V > 1:
            mask = rng.random(V) < 0.5
            mask[t[i]] = False
            x[i, mask] = -np.inf
    for i in range(3, M, 4):
        sprinkle(x[i], rng, [0.0, -0.0])
    t[5::7] = -1
    return x.astype(dtype), t


def make_edge_inputs_bwd(size, dtype, rng):
    x, t = make_edge_inputs(size, dtype, rng)
    _, lse = reference(x, t)
    dloss = rng.uniform(0.5, 1.5, size[0]).astype(dtype)
    return x, t, lse.astype(dtype), dloss


def _flops(s):
    return 4.0 * s[0] * s[1]


# float32: lse is a sum of V terms (relative error ~ eps*sqrt(V)) plus a log; the loss is a difference of
# two O(log V)..O(|x|) numbers, so atol scales with the logits' size. The edge rows of 1e3 keep atol at
# ~1e3 * eps = 1.2e-4 for lse; their loss (a difference) is exact to the same absolute error.
TOL = {"float32": (3e-5, 2e-4), "float64": (1e-12, 1e-10)}
TOL_BWD = {"float32": (3e-5, 3e-6), "float64": (1e-12, 1e-12)}
SIZES = {"check": [(1, 1), (3, 7), (5, 33), (13, 97), (64, 257), (7, 1000), (3, 4099)],
         "check_sim": [(1, 1), (3, 7), (4, 33), (2, 70)],
         "bench": [(1024, 4096), (4096, 32768)],
         "bench_gpu": [(4096, 32768), (8192, 50304)],
         "bench_sim": [(4, 33)]}

define_op("cross_entropy", reference=reference, make_inputs=make_inputs, chapter=13,
          title="fused softmax cross-entropy (loss, lse)", size_names=("M", "V"), kind="memory", tol=TOL,
          output_names=("loss", "lse"), sizes=SIZES, flops=_flops,
          bytes=lambda s, b: (s[0] * s[1] + 3 * s[0]) * b, edge_inputs=make_edge_inputs)
define_op("cross_entropy_bwd", reference=reference_bwd, make_inputs=make_inputs_bwd, chapter=13,
          title="fused softmax cross-entropy backward", size_names=("M", "V"), kind="memory", tol=TOL_BWD,
          output_names=("dlogits",), sizes=SIZES, flops=lambda s: 4.0 * s[0] * s[1],
          bytes=lambda s, b: (2 * s[0] * s[1] + 3 * s[0]) * b, edge_inputs=make_edge_inputs_bwd)


# ------------------------------------------------------------------------------------------- CPU
@njit(cache=True, error_model="numpy")
def _loss_row_3pass(loss, lse, x, t, i):
    V = x.shape[1]
    m = -np.inf
    for j in range(V):
        if x[i, j] > m:
            m = x[i, j]
    ms = m if m > -np.inf else 0.0
    s = 0.0  # float64 accumulator: V terms
    for j in range(V):
        s += math.exp(x[i, j] - ms)
    ls = ms + math.log(s) if s > 0.0 else -np.inf
    lse[i] = ls
    if t[i] < 0:
        loss[i] = 0.0
    elif ls == -np.inf:
        loss[i] = np.inf
    else:
        loss[i] = ls - x[i, t[i]]


@njit(cache=True, error_model="numpy")
def _ce_loop(loss, lse, x, t):
    for i in range(x.shape[0]):
        _loss_row_3pass(loss, lse, x, t, i)


@register("cross_entropy", "cpu", "loop", rung=1)
def cross_entropy_loop(loss, lse, logits, targets):
    """Three passes per row: max, sum of exp(x - max) in float64, then loss = lse - x[t].

    Reads each row twice (the max pass and the exp pass): 2*M*V*4 bytes. Predict ~ a softmax's speed."""
    _ce_loop(loss, lse, logits, targets)


@njit(cache=True, error_model="numpy", parallel=True)
def _ce_online_prange(loss, lse, x, t):
    M, V = x.shape
    for i in prange(M):
        m = -np.inf
        s = 0.0
        for j in range(V):
            v = x[i, j]
            if v > m:
                s = s * math.exp(m - v) + 1.0 if m > -np.inf else 1.0
                m = v
            elif v > -np.inf:
                s += math.exp(v - m)
        ls = m + math.log(s) if s > 0.0 else -np.inf
        lse[i] = ls
        if t[i] < 0:
            loss[i] = 0.0
        elif ls == -np.inf:
            loss[i] = np.inf
        else:
            loss[i] = ls - x[i, t[i]]


@register("cross_entropy", "cpu", "online_prange", rung=2)
def cross_entropy_online_prange(loss, lse, logits, targets):
    """One online pass per row (running max, rescaled sum: chapter 8) and rows over the cores.

    Each row is read once: half rung 1's traffic, and cores x more bandwidth. Predict ~2 x cores x rung 1
    while rows fit in cache."""
    _ce_online_prange(loss, lse, logits, targets)


@njit(cache=True, error_model="numpy", parallel=True, fastmath=CPU_FAST)
def _ce_simd_prange(loss, lse, x, t):
    M, V = x.shape
    for i in prange(M):
        xr = x[i]
        m = row_max_simd(xr)  # walk 1, from DRAM: vpmaxsd on the float bits (chapter 8, rung 5)
        s = np.float32(0.0)
        if m > -np.inf:
            for j in range(V):  # walk 2, from L2 (a row of 32768 logits is 128 KiB): 8 exps per instruction
                s += exp_nonpos(xr[j] - m)
        # once per row, in float64: lse of logits ~1e4 rounded to float32 is off by up to 5e-4, and the loss
        # lse - x[t] (a few units) would inherit all of it
        ls = np.float64(m) + math.log(np.float64(s)) if s > 0.0 else -np.inf
        lse[i] = ls
        if t[i] < 0:
            loss[i] = 0.0
        elif ls == -np.inf:
            loss[i] = np.inf
        else:
            loss[i] = ls - np.float64(xr[t[i]])


@register("cross_entropy", "cpu", "simd_prange", rung=3)
def cross_entropy_simd_prange(loss, lse, logits, targets):
    """Rung 2 in SIMD, and two walks per row instead of one online walk: the row's max as an integer max of the
    float bits (vectorized), then the sum of exp(x - max) with chapter 8's SIMD exp, reassociated into vector
    lanes. The online walk's rescaling is a branch per element, which keeps a loop scalar; the second walk
    costs no DRAM traffic, because a row (128 KiB at V = 32768) is still in L2. float32 partial sums (V/8
    terms per lane; relative error ~1e-5 on lse at V = 32768, inside the tolerance). Rung 2 is bound by one
    libm exp per logit; predicted: ~8x rung 2, still bound by the exp arithmetic (~0.3 ns per logit on 2
    cores), not by DRAM: ~30 % of copy bandwidth at 4096 x 32768, several times torch (whose
    F.cross_entropy writes a full log_softmax)."""
    _ce_simd_prange(loss, lse, logits, targets)


@njit(cache=True, error_model="numpy", parallel=True, fastmath=CPU_FAST)
def _ce_simd_exp2(loss, lse, x, t):
    M, V = x.shape
    for i in prange(M):
        xr = x[i]
        m = row_max_simd(xr)
        s = np.float32(0.0)
        if m > -np.inf:
            for j in range(V):  # e^(x - m) = 2^((x - m) log2 e): a subtraction, a multiply and cpumath's 2^w
                s += exp2_nonpos_f32((xr[j] - m) * LOG2E)
        ls = np.float64(m) + math.log(np.float64(s)) if s > 0.0 else -np.inf
        lse[i] = ls
        if t[i] < 0:
            loss[i] = 0.0
        elif ls == -np.inf:
            loss[i] = np.inf
        else:
            loss[i] = ls - np.float64(xr[t[i]])


@register("cross_entropy", "cpu", "simd_exp2", rung=4)
def cross_entropy_simd_exp2(loss, lse, logits, targets):
    """Rung 3 with cpumath's exp2_nonpos_f32 for the exps (issue 36): (x - m) log2 e, then rint, one
    subtraction and a degree-5 minimax 2^f, where exp_nonpos has floor(x + 1/2), a two-FMA Cody-Waite step, a
    degree-7 polynomial and a NaN select. Relative error of each exp <= cpumath.EXP2_MAX_REL_ERR + |x - m| 1.2e-7
    (the rounding of the product), so ~2e-6 at x - m = -16 and a smaller share of lse: inside the tolerance.
    Rung 3 is bound by the exp arithmetic of its second walk (from L2); predict ~1.25x rung 3."""
    _ce_simd_exp2(loss, lse, logits, targets)


@register("cross_entropy", "cpu", "numpy", baseline=True)
def cross_entropy_numpy(loss, lse, logits, targets):
    """The NumPy formula in float32: lse = max + log(sum(exp(x - max))), loss = lse - x[t], 0 where t < 0
    (the last two per row in float64, as every rung does). Temporaries: x - max and its exp, M x V floats."""
    m = logits.max(axis=1, keepdims=True)
    s = np.exp(logits - m).sum(axis=1)
    ls = m[:, 0].astype(np.float64) + np.log(s.astype(np.float64))  # per row in float64: see rung 3
    lse[:] = ls
    xt = logits[np.arange(logits.shape[0]), np.maximum(targets, 0)]
    np.copyto(loss, np.where(targets >= 0, ls - xt, 0.0))


@register("cross_entropy", "cpu", "torch", baseline=True, requires=torch_cpu)
def cross_entropy_torch_cpu(loss, lse, logits, targets):
    """torch as a user computes this op's two outputs: F.cross_entropy(reduction="none") for the loss (torch
    needs int64 targets, and ignores rows by one ignore_index: our negative targets are mapped to -100),
    copied into loss (no out= overload); torch.logsumexp(out=lse) for lse, a second pass over the logits
    (F.cross_entropy does not return it)."""
    import torch
    import torch.nn.functional as F

    tl, tx, tt = tviews(loss, logits, lse)
    tg = torch.from_numpy(targets).long()
    tg[tg < 0] = -100
    tl.copy_(F.cross_entropy(tx, tg, reduction="none"))
    torch.logsumexp(tx, 1, out=tt)


@njit(cache=True, error_model="numpy", parallel=True)
def _ce_bwd_prange(dx, x, t, lse, dloss):
    M, V = x.shape
    for i in prange(M):
        ls = lse[i]
        if t[i] < 0 or ls == -np.inf:
            for j in range(V):
                dx[i, j] = 0.0
            continue
        d = dloss[i]
        for j in range(V):
            dx[i, j] = d * math.exp(x[i, j] - ls)
        dx[i, t[i]] -= d


@register("cross_entropy_bwd", "cpu", "prange", rung=1)
def cross_entropy_bwd_prange(dlogits, logits, targets, lse, dloss):
    """Rows over cores; each probability recomputed as exp(x - lse) and written straight into dlogits,
    then the target's entry lowered by dloss. Reads and writes M*V once: predict ~copy speed."""
    _ce_bwd_prange(dlogits, logits, targets, lse, dloss)


@njit(cache=True, error_model="numpy", parallel=True, fastmath=CPU_FAST)
def _ce_bwd_simd_prange(dx, x, t, lse, dloss):
    M, V = x.shape
    for i in prange(M):
        ls = lse[i]
        if t[i] < 0 or ls == -np.inf:
            for j in range(V):
                dx[i, j] = 0.0
            continue
        d = dloss[i]
        for j in range(V):  # x - lse <= 0: the subnormal-free exp of chapter 8's rung 5
            dx[i, j] = d * exp_nonpos(x[i, j] - ls)
        dx[i, t[i]] -= d


@register("cross_entropy_bwd", "cpu", "simd_prange", rung=2)
def cross_entropy_bwd_simd_prange(dlogits, logits, targets, lse, dloss):
    """Rung 1 with the vectorizable exp (chapter 8's exp_nonpos on cpumath's arithmetic, inlined): the row loop
    runs 8 elements per instruction instead of one expf call each. Predicted: ~5x rung 1, bound by the exp
    arithmetic on 2 cores rather than by DRAM (~40 % of copy bandwidth at 4096 x 32768)."""
    _ce_bwd_simd_prange(dlogits, logits, targets, lse, dloss)


@njit(cache=True, error_model="numpy", parallel=True, fastmath=CPU_FAST)
def _ce_bwd_exp2(dx, x, t, lse, dloss):
    M, V = x.shape
    for i in prange(M):
        ls = lse[i]
        xr = x[i]
        dr = dx[i]
        if t[i] < 0 or ls == -np.inf:
            for j in range(V):
                dr[j] = 0.0
            continue
        d = dloss[i]
        for j in range(V):  # e^(x - lse) = 2^((x - lse) log2 e), the argument <= 0
            dr[j] = d * exp2_nonpos_f32((xr[j] - ls) * LOG2E)
        dr[t[i]] -= d


@register("cross_entropy_bwd", "cpu", "simd_exp2", rung=3)
def cross_entropy_bwd_simd_exp2(dlogits, logits, targets, lse, dloss):
    """Rung 2 with the forward's rung-4 exp (issue 36): e^(x - lse) as cpumath.exp2_nonpos_f32 of (x - lse) log2 e
    (rint, a degree-5 minimax 2^f, no Cody-Waite reduction; relative error <= cpumath.EXP2_MAX_REL_ERR plus the
    rounding of the product, ~2e-6 at x - lse = -16, inside TOL_BWD), and the row as a contiguous 1-D view.
    Rung 2 measured 56 % of copy at 4096 x 32768: the exp arithmetic, not DRAM, is its bound on 2 cores, so
    predicted ~1.2x rung 2 (fewer instructions per 16 logits). Measured (indicative, alternating in one process):
    16 x 8192 one core in cache 1.44x rung 2; 64 x 32768 on 2 threads (from L3) 0.94-1.07x, and at 4096 x 32768
    equal on the loaded machine: with both cores the stream, not the exp, is the bound there. kernels asm: packed
    zmm (16 -> 14), no libm call."""
    _ce_bwd_exp2(dlogits, logits, targets, lse, dloss)


@register("cross_entropy_bwd", "cpu", "numpy", baseline=True)
def cross_entropy_bwd_numpy(dlogits, logits, targets, lse, dloss):
    """The NumPy formula in float32: (exp(x - lse) - onehot) * dloss, zero rows where t < 0."""
    M = logits.shape[0]
    p = np.exp(logits - lse[:, None])
    keep = targets >= 0
    rows = np.arange(M)[keep]
    p[rows, targets[keep]] -= 1.0
    p *= np.where(keep, dloss, np.float32(0.0))[:, None]
    np.copyto(dlogits, p)


@register("cross_entropy_bwd", "cpu", "torch", baseline=True, requires=torch_cpu)
def cross_entropy_bwd_torch_cpu(dlogits, logits, targets, lse, dloss):
    """The formula in torch eager ops on the CPU, as a user with the saved lse writes it (autograd's own
    backward of F.cross_entropy needs the full log_softmax, which this op never stores):
    torch.sub(x, lse) then exp into dlogits (out=, no copy), the target entries lowered by 1, the rows scaled
    by dloss (zero where the target is negative). One temporary of M x V floats (x - lse)."""
    import torch

    dl, x, ls, dlo = tviews(dlogits, logits, lse, dloss)
    tg = torch.from_numpy(targets).long()
    keep = tg >= 0
    torch.exp(torch.sub(x, ls[:, None]), out=dl)
    rows = torch.nonzero(keep)[:, 0]
    dl[rows, tg[rows]] -= 1.0
    dl.mul_(torch.where(keep, dlo, 0.0)[:, None])


# ------------------------------------------------------------------------------------------- GPU
THREADS = 128


@cuda.jit(fastmath=FAST_MATH)
def ce_fwd_row_kernel(loss, lse, x, t):
    bm = cuda.shared.array(THREADS, float32)
    bs = cuda.shared.array(THREADS, float32)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    V = x.shape[1]
    m = NEG_INF
    s = ZERO
    for c in range(tid, V, THREADS):  # one pass: running (max, sum) per thread
        v = x[row, c]
        if v > m:
            s = s * math.exp(m - v) + ONE if m > NEG_INF else ONE
            m = v
        elif v > NEG_INF:
            s += math.exp(v - m)
    mx, total = block_online_smem(m, s, bm, bs)
    if tid == 0:
        ls = mx + math.log(total) if total > ZERO else NEG_INF
        lse[row] = ls
        tg = t[row]
        if tg < 0:
            loss[row] = ZERO
        elif ls == NEG_INF:
            loss[row] = -NEG_INF
        else:
            loss[row] = ls - x[row, tg]


@cuda.jit(fastmath=FAST_MATH)
def ce_bwd_row_kernel(dx, x, t, lse, dloss):
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    V = x.shape[1]
    tg = t[row]
    ls = lse[row]
    dead = tg < 0 or ls == NEG_INF
    d = dloss[row]
    for c in range(tid, V, THREADS):
        if dead:
            dx[row, c] = ZERO
        else:
            p = math.exp(x[row, c] - ls)
            dx[row, c] = d * (p - ONE) if c == tg else d * p


_F2 = "float32[:, ::1]"
_F1 = "float32[::1]"
_I1 = "int32[::1]"


@register("cross_entropy", "gpu", "row", rung=1,
          ptx=[(ce_fwd_row_kernel, f"void({_F1}, {_F1}, {_F2}, {_I1})")])
def cross_entropy_row_gpu(loss, lse, logits, targets):
    """One block of 128 threads per row: each thread an online (max, sum) over columns tid, tid+128, ...
    (coalesced), one shared-memory tree of (max, sum) pairs, thread 0 writes lse and loss.

    The row is read once (plus one logit): M*V*4 bytes. With M >= 4 x the SM count blocks, predict near
    chapter 8's online softmax rung, i.e. a large fraction of copy bandwidth, for V in the thousands."""
    ce_fwd_row_kernel[logits.shape[0], THREADS](loss, lse, logits, targets)


@register("cross_entropy_bwd", "gpu", "row", rung=1,
          ptx=[(ce_bwd_row_kernel, f"void({_F2}, {_F2}, {_I1}, {_F1}, {_F1})")])
def cross_entropy_bwd_row_gpu(dlogits, logits, targets, lse, dloss):
    """One block per row, threads stride over the columns: dlogits = dloss * (exp(x - lse) - onehot).

    No reduction (lse came from the forward), one read and one write per element: predict close to
    copy bandwidth once V is a few thousand columns."""
    cross_entropy_bwd_launch(dlogits, logits, targets, lse, dloss)


def cross_entropy_bwd_launch(dlogits, logits, targets, lse, dloss):
    ce_bwd_row_kernel[logits.shape[0], THREADS](dlogits, logits, targets, lse, dloss)
