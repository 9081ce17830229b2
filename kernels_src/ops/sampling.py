"""Sampling the next token for decode: temperature, top-k and top-p (nucleus), reproducible from a seed (chapter 16).

  sample    logits (B,V) f32, temperature, top_k, top_p, seed, step  ->  ids (B,) int32

Rules (the reference, every rung and the tests follow them exactly):
  order     tokens are ranked by logit, largest first; equal logits by index, smallest first
            (-0.0 and +0.0 are equal). Every cut below is a prefix of this order.
  weights   w_i = exp((l_i - max_j l_j) / temperature) in float64 (the softmax numerators).
  greedy    temperature = 0: the first token of the order (argmax, smallest index among ties); no draw.
  top-k     top_k = k > 0 keeps the first k tokens of the order (k = 0, or k >= V: all of them).
  top-p     top_p = p < 1 keeps, of those, the shortest prefix of the order whose weight is >= p times the
            weight of all top-k tokens (p = 1: no cut). The most likely token is always kept.
  draw      u = uniform of the Philox stream (seed, offset = step), element b for row b (chapter 16's stream:
            (bits >> 8) 2^-24 in [0, 1)). Walking the kept tokens in INDEX order, the chosen one is the first
            whose running weight exceeds u times the kept weight (the last kept token if rounding leaves none).
  errors    temperature < 0 or NaN, top_k < 0, top_p outside (0, 1], NaN logits: ValueError. A row needs at least
            one finite logit.
  parity    integer-exact against the reference, except where u times the kept weight, or a top-p target, lies
            within a float64 rounding error (~1e-16 relative) of a running sum: sums taken in another order can then
            round to the other side. No check size comes near that; ties with weights exactly representable (equal
            logits: weight 1) are exact in any order, which is what the tie tests use.

Cost: the logits are read a few dozen times (each bisection step is one pass), but one row is 200 kB at V = 50304
and stays in L2: the GPU version is bound by its block-wide reductions (latency), not by DRAM.

Ladder
  cpu/sort    rung 1  per row: a stable sort of the order (O(V log V)), cumulative sums, as the reference does
  cpu/select  rung 2  no sort: the k-th key and the top-p cut found by bisection over the 32-bit order key
                      (32 passes of counts / sums), rows over the cores with prange
  gpu/block   rung 1  one block per row: the same bisection, each pass a block-wide reduction in shared memory
                      (no warp shuffles, so it runs in the simulator), then a block prefix sum of per-thread chunk
                      weights to find the drawn token
"""
import math

import numpy as np

from .. import device
from ..compiler import cuda, float64, njit, prange
from ..registry import define_op, exercise_op, register
from .philox import philox10_cpu, philox10_dev, split64, uniforms

SIGN = np.uint32(0x80000000)
ALL = np.uint32(0xFFFFFFFF)
SH8 = np.uint32(8)
U24 = 2.0 ** -24


# ------------------------------------------------------------------------------------------ parameters
def check_params(temperature, top_k, top_p):
    """(temperature, top_k, top_p) as floats/ints, or ValueError saying which one is wrong."""
    t, p = float(temperature), float(top_p)
    if not t >= 0.0:  # NaN fails too
        raise ValueError(f"temperature must be >= 0 (0 = greedy), not {temperature}")
    if int(top_k) != top_k or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 = no top-k cut), not {top_k}")
    if not 0.0 < p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (1 = no top-p cut), not {top_p}")
    return t, int(top_k), p


def kernel_params(temperature, top_k, top_p, V):
    """What the kernels take: 1/temperature (0 for greedy), k (0 = off), p; greedy becomes k = 1, p = 1."""
    t, k, p = check_params(temperature, top_k, top_p)
    if t == 0.0:
        return 0.0, 1, 1.0
    if k >= V:
        k = 0
    return 1.0 / t, k, p


# -------------------------------------------------------------------------------------------- reference
def sample_ref(logits, temperature, top_k, top_p, seed, step):
    """The rules of the module docstring, with a sort: float64 NumPy, one row at a time."""
    t, k, p = check_params(temperature, top_k, top_p)
    logits = np.asarray(logits, dtype=np.float64)
    if np.isnan(logits).any():
        raise ValueError("NaN in the logits")
    B, V = logits.shape
    u = uniforms(seed, step, B)
    ids = np.empty(B, dtype=np.int32)
    for b in range(B):
        l = logits[b] + 0.0  # -0.0 -> +0.0
        order = np.lexsort((np.arange(V), -l))  # largest logit first, then smallest index
        if t == 0.0:
            ids[b] = order[0]
            continue
        w = np.exp((l - l.max()) / t)
        keep = order[:k] if 0 < k < V else order
        if p < 1.0:
            cw = np.cumsum(w[keep])
            keep = keep[: int(np.searchsorted(cw, p * cw[-1], side="left")) + 1]
        kept = np.sort(keep)  # the draw walks the kept tokens in index order
        c = np.cumsum(w[kept])
        j = int(np.searchsorted(c, u[b] * c[-1], side="right"))
        ids[b] = kept[min(j, kept.size - 1)]
    return ids


# ----------------------------------------------------------------------------------------- registration
def sample_inputs(size, dtype, rng):
    """Logits on a grid of 0.25 (many exact ties), a few -inf (masked tokens), and one setting of the knobs."""
    B, V = size
    logits = (np.round(3.0 * rng.standard_normal((B, V)) * 4.0) / 4.0).astype(dtype)
    if V > 4:
        logits[:, rng.integers(0, V, size=max(1, V // 20))] = -np.inf
        logits[:, 0] = np.maximum(logits[:, 0], 0.0)  # at least one finite logit per row
    temperature = float(rng.choice([0.0, 0.7, 1.0, 1.6]))
    top_k = int(rng.choice([0, 1, 3, 20]))
    top_p = float(rng.choice([1.0, 0.9, 0.5]))
    return logits, temperature, top_k, top_p, int(rng.integers(0, 1 << 62)), int(rng.integers(0, 1 << 20))


define_op("sample", reference=sample_ref, make_inputs=sample_inputs, chapter=16,
          title="temperature / top-k / top-p sampling", size_names=("B", "V"), kind="memory", tol=(0.0, 0.0),
          output_names=("ids",),
          sizes={"check": [(1, 1), (1, 7), (3, 37), (4, 1000), (2, 50304)],
                 "check_sim": [(1, 1), (2, 7), (3, 37)],
                 "bench": [(1, 50304), (16, 50304)],
                 "bench_gpu": [(1, 50304), (8, 50304), (64, 50304)],
                 "bench_sim": [(2, 37)]},
          flops=lambda s: 4 * s[0] * s[1], bytes=lambda s, b: s[0] * s[1] * b)  # the logits, read once at best


# ------------------------------------------------------------------------------------- the order key
def order_key(bits):
    """A float32's bits -> a uint32 that orders like the float (larger float, larger key); -0.0 is mapped to
    +0.0's key so that the two tie, as they do as numbers. Works on NumPy arrays and in kernels."""
    if bits == SIGN:  # -0.0
        bits = np.uint32(0)
    return np.uint32(bits ^ ALL) if bits & SIGN else np.uint32(bits | SIGN)


key_cpu = njit(inline="always")(order_key)
key_dev = cuda.jit(device=True, inline="always")(order_key)


def order_keys_np(logits):
    b = np.ascontiguousarray(logits, dtype=np.float32).view(np.uint32).copy()
    b[b == SIGN] = 0
    return np.where(b & SIGN, b ^ ALL, b | SIGN).astype(np.uint32)


# --------------------------------------------------------------------------------- CPU rung 1: sort
@njit
def _sample_row_sort(l, keys, inv_t, k, p, u):
    V = l.size
    order = np.argsort(-keys.astype(np.int64), kind="mergesort")  # stable: ties stay in index order
    if inv_t == 0.0:
        return order[0]
    lmax = l[order[0]]
    n = k if 0 < k < V else V
    w = np.empty(n)
    for j in range(n):
        w[j] = math.exp((np.float64(l[order[j]]) - lmax) * inv_t)
    if p < 1.0:
        total = 0.0
        for j in range(n):
            total += w[j]
        target = p * total
        acc = 0.0
        m = n
        for j in range(n):
            acc += w[j]
            if acc >= target:
                m = j + 1
                break
        n = m
    kept = np.sort(order[:n])
    z = 0.0
    for j in range(n):
        z += math.exp((np.float64(l[kept[j]]) - lmax) * inv_t)
    target = u * z
    acc = 0.0
    for j in range(n):
        acc += math.exp((np.float64(l[kept[j]]) - lmax) * inv_t)
        if acc > target:
            return kept[j]
    return kept[n - 1]


@njit
def sample_sort_rows(ids, logits, keys, inv_t, k, p, k0, k1, o0, o1):
    for b in range(logits.shape[0]):
        r = philox10_cpu(np.uint32(b // 4), np.uint32(0), o0, o1, k0, k1)
        u = np.float64(r[b % 4] >> SH8) * U24
        ids[b] = _sample_row_sort(logits[b], keys[b], inv_t, k, p, u)


def _stream(seed, step):
    k0, k1 = split64(seed)
    o0, o1 = split64(step)
    return k0, k1, o0, o1


@register("sample", "cpu", "sort", rung=1)
def sample_cpu_sort(ids, logits, temperature, top_k, top_p, seed, step):
    """Per row: a stable sort of the order (np.argsort, mergesort), then the cuts and the draw as running sums.
    O(V log V) per row: about 16 passes' worth of work at V = 50304."""
    inv_t, k, p = kernel_params(temperature, top_k, top_p, logits.shape[1])
    sample_sort_rows(ids, logits, order_keys_np(logits), inv_t, k, p, *_stream(seed, step))


# ---------------------------------------------------------------------------- CPU rung 2: selection
@njit
def _count_ge(bits, t):
    c = 0
    for i in range(bits.size):
        if key_cpu(bits[i]) >= t:
            c += 1
    return c


@njit
def _sample_row_select(l, bits, inv_t, k, p, u):
    V = l.size
    kmin, kmax, lmax, imax = np.int64(0xFFFFFFFF), np.int64(0), -np.inf, 0
    for i in range(V):
        key = np.int64(key_cpu(bits[i]))
        kmin = min(kmin, key)
        if key > kmax or i == 0:
            kmax, lmax, imax = key, np.float64(l[i]), i
    if inv_t == 0.0:
        return imax
    # top-k: the k-th largest key tk, by bisection over [kmin, kmax]: largest t with count(key >= t) >= k
    tk, cut_k = np.int64(-1), np.int64(-1)
    if k > 0:
        lo, hi = kmin, kmax
        while lo < hi:
            mid = lo + (hi - lo + 1) // 2
            if _count_ge(bits, mid) >= k:
                lo = mid
            else:
                hi = mid - 1
        tk = lo
        need = k - _count_ge(bits, tk + 1)  # ties at tk to keep, lowest indices first
        for i in range(V):
            if key_cpu(bits[i]) == tk:
                need -= 1
                if need == 0:
                    cut_k = i
                    break
    # top-p: largest t with weight(kept_k and key >= t) >= p * weight(kept_k)
    tp, cut_p = np.int64(-1), np.int64(-1)
    if p < 1.0:
        zk = 0.0
        for i in range(V):
            key = np.int64(key_cpu(bits[i]))
            if key > tk or (key == tk and i <= cut_k):
                zk += math.exp((np.float64(l[i]) - lmax) * inv_t)
        target = p * zk
        lo, hi = kmin, kmax
        while lo < hi:
            mid = lo + (hi - lo + 1) // 2
            m = 0.0
            for i in range(V):
                key = np.int64(key_cpu(bits[i]))
                if key >= mid and (key > tk or (key == tk and i <= cut_k)):
                    m += math.exp((np.float64(l[i]) - lmax) * inv_t)
            if m >= target:
                lo = mid
            else:
                hi = mid - 1
        tp = lo
        m_gt, q, nties = 0.0, 0.0, 0
        for i in range(V):
            key = np.int64(key_cpu(bits[i]))
            if key > tk or (key == tk and i <= cut_k):
                wi = math.exp((np.float64(l[i]) - lmax) * inv_t)
                if key > tp:
                    m_gt += wi
                elif key == tp:
                    q = wi
                    nties += 1
        c = nties
        if q > 0.0:
            c = min(nties, max(1, int(math.ceil((target - m_gt) / q))))
        for i in range(V):
            key = np.int64(key_cpu(bits[i]))
            if key == tp and (key > tk or (key == tk and i <= cut_k)):
                c -= 1
                if c <= 0:
                    cut_p = i
                    break
    # the draw, in index order over the kept tokens
    z = 0.0
    last = 0
    for i in range(V):
        key = np.int64(key_cpu(bits[i]))
        if (key > tk or (key == tk and i <= cut_k)) and (key > tp or (key == tp and i <= cut_p)):
            z += math.exp((np.float64(l[i]) - lmax) * inv_t)
            last = i
    target = u * z
    acc = 0.0
    for i in range(V):
        key = np.int64(key_cpu(bits[i]))
        if (key > tk or (key == tk and i <= cut_k)) and (key > tp or (key == tp and i <= cut_p)):
            acc += math.exp((np.float64(l[i]) - lmax) * inv_t)
            if acc > target:
                return i
    return last


@njit(parallel=True)
def sample_select_rows(ids, logits, bits, inv_t, k, p, k0, k1, o0, o1):
    for b in prange(logits.shape[0]):
        r = philox10_cpu(np.uint32(b // 4), np.uint32(0), o0, o1, k0, k1)
        u = np.float64(r[b % 4] >> SH8) * U24
        ids[b] = _sample_row_select(logits[b], bits[b], inv_t, k, p, u)


@register("sample", "cpu", "select", rung=2)
def sample_cpu_select(ids, logits, temperature, top_k, top_p, seed, step):
    """No sort: the k-th largest key and the top-p cut by bisection over the 32-bit order key (each step one
    pass of counts or sums over the row), rows over the cores. ~70 passes of V against the sort's V log2 V
    (16 V at V = 50304): predict about the sort's time on one row, and the cores' speed-up on B >= 2 rows."""
    inv_t, k, p = kernel_params(temperature, top_k, top_p, logits.shape[1])
    sample_select_rows(ids, logits, logits.view(np.uint32), inv_t, k, p, *_stream(seed, step))


# ------------------------------------------------------------------------------------- GPU: block per row
THREADS = 256  # a power of two (the tree reductions halve it)


@cuda.jit(device=True, inline="always")
def _bsum(sh, v):
    """Sum of v over the block (float64 tree in shared memory). Every thread gets it; all must call."""
    tid = cuda.threadIdx.x
    cuda.syncthreads()  # the previous reduction's readers are done with sh
    sh[tid] = v
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            sh[tid] += sh[tid + s]
        cuda.syncthreads()
        s //= 2
    return sh[0]


@cuda.jit(device=True, inline="always")
def _bmax(sh, v):
    tid = cuda.threadIdx.x
    cuda.syncthreads()
    sh[tid] = v
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s and sh[tid + s] > sh[tid]:
            sh[tid] = sh[tid + s]
        cuda.syncthreads()
        s //= 2
    return sh[0]


@cuda.jit(device=True, inline="always")
def _bprefix(sh, v):
    """(exclusive prefix of v over threads 0..tid-1, total): sequential sums over shared memory, so thread t+1's
    prefix is exactly thread t's prefix + v_t, rounded the same way."""
    tid = cuda.threadIdx.x
    cuda.syncthreads()
    sh[tid] = v
    cuda.syncthreads()
    acc = 0.0
    excl = 0.0
    for j in range(cuda.blockDim.x):
        if j == tid:
            excl = acc
        acc += sh[j]
    return excl, acc


@cuda.jit(device=True, inline="always")
def _kept(key, i, tk, cut_k, tp, cut_p):
    return (key > tk or (key == tk and i <= cut_k)) and (key > tp or (key == tp and i <= cut_p))


@cuda.jit
def sample_block_kernel(ids, logits, bits, inv_t, k, p, k0, k1, o0, o1):
    # logits (B,V) f32 and the same memory as bits (B,V) u32 -> ids (B,); one block per row b.
    # Passes that only count or sum read strided (i = tid, tid + T, ...: coalesced); the two that need index
    # order (the k-th tie, the draw) give each thread one contiguous chunk.
    sh = cuda.shared.array(THREADS, float64)
    b = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    T = cuda.blockDim.x
    V = logits.shape[1]
    chunk = (V + T - 1) // T
    c0 = tid * chunk
    c1 = min(V, c0 + chunk)
    # pass 1: the largest and smallest key and the largest logit
    kmx, kmn, lmx = -1.0, 4294967296.0, -math.inf
    for i in range(tid, V, T):
        key = float64(key_dev(bits[b, i]))
        kmx = max(kmx, key)
        kmn = min(kmn, key)
        lmx = max(lmx, float64(logits[b, i]))
    kmax = np.int64(_bmax(sh, kmx))
    kmin = np.int64(-_bmax(sh, -kmn))
    lmax = _bmax(sh, lmx)
    tk, cut_k, tp, cut_p = np.int64(-1), np.int64(-1), np.int64(-1), np.int64(-1)
    if inv_t == 0.0:  # greedy: the smallest index holding the largest key (a max over -index)
        first = -1e18
        for i in range(tid, V, T):
            if np.int64(key_dev(bits[b, i])) == kmax:
                first = -float64(i)
                break
        best = _bmax(sh, first)
        if tid == 0:
            ids[b] = np.int32(-best)
        return
    if k > 0:  # top-k: bisection for the k-th largest key
        lo, hi = kmin, kmax
        while lo < hi:
            mid = lo + (hi - lo + 1) // 2
            cnt = 0.0
            for i in range(tid, V, T):
                if np.int64(key_dev(bits[b, i])) >= mid:
                    cnt += 1.0
            if _bsum(sh, cnt) >= k:
                lo = mid
            else:
                hi = mid - 1
        tk = lo
        cnt = 0.0
        for i in range(tid, V, T):
            if np.int64(key_dev(bits[b, i])) > tk:
                cnt += 1.0
        need = float64(k) - _bsum(sh, cnt)  # ties at tk to keep, lowest indices first
        cnt = 0.0
        for i in range(c0, c1):
            if np.int64(key_dev(bits[b, i])) == tk:
                cnt += 1.0
        excl, _ = _bprefix(sh, cnt)
        found = -1.0
        if excl < need <= excl + cnt:
            r = need - excl
            for i in range(c0, c1):
                if np.int64(key_dev(bits[b, i])) == tk:
                    r -= 1.0
                    if r == 0.0:
                        found = float64(i)
                        break
        cut_k = np.int64(_bmax(sh, found))
    if p < 1.0:  # top-p: bisection for the largest key whose prefix weight reaches p * (top-k weight)
        zk = 0.0
        for i in range(tid, V, T):
            key = np.int64(key_dev(bits[b, i]))
            if key > tk or (key == tk and i <= cut_k):
                zk += math.exp((float64(logits[b, i]) - lmax) * inv_t)
        target = p * _bsum(sh, zk)
        lo, hi = kmin, kmax
        while lo < hi:
            mid = lo + (hi - lo + 1) // 2
            m = 0.0
            for i in range(tid, V, T):
                key = np.int64(key_dev(bits[b, i]))
                if key >= mid and (key > tk or (key == tk and i <= cut_k)):
                    m += math.exp((float64(logits[b, i]) - lmax) * inv_t)
            if _bsum(sh, m) >= target:
                lo = mid
            else:
                hi = mid - 1
        tp = lo
        m_gt, q = 0.0, 0.0
        for i in range(tid, V, T):
            key = np.int64(key_dev(bits[b, i]))
            if key > tk or (key == tk and i <= cut_k):
                wi = math.exp((float64(logits[b, i]) - lmax) * inv_t)
                if key > tp:
                    m_gt += wi
                elif key == tp:
                    q = wi
        m_gt = _bsum(sh, m_gt)
        q = _bmax(sh, q)  # every tie at tp has the same logit, so the same weight
        cnt = 0.0
        for i in range(c0, c1):
            key = np.int64(key_dev(bits[b, i]))
            if key == tp and (key > tk or (key == tk and i <= cut_k)):
                cnt += 1.0
        excl, nties = _bprefix(sh, cnt)
        c = nties
        if q > 0.0:
            c = min(nties, max(1.0, math.ceil((target - m_gt) / q)))
        found = -1.0
        if excl < c <= excl + cnt:
            r = c - excl
            for i in range(c0, c1):
                key = np.int64(key_dev(bits[b, i]))
                if key == tp and (key > tk or (key == tk and i <= cut_k)):
                    r -= 1.0
                    if r == 0.0:
                        found = float64(i)
                        break
        cut_p = np.int64(_bmax(sh, found))
    # the draw: kept weight per contiguous chunk, a block prefix sum, and the thread whose chunk holds u * Z walks it
    zc = 0.0
    last = -1.0
    for i in range(c0, c1):
        key = np.int64(key_dev(bits[b, i]))
        if _kept(key, i, tk, cut_k, tp, cut_p):
            zc += math.exp((float64(logits[b, i]) - lmax) * inv_t)
            last = float64(i)
    excl, z = _bprefix(sh, zc)
    r0, r1, r2, r3 = philox10_dev(np.uint32(b // 4), np.uint32(0), o0, o1, k0, k1)
    w4 = b % 4
    rb = r0 if w4 == 0 else (r1 if w4 == 1 else (r2 if w4 == 2 else r3))
    target = float64(rb >> SH8) * U24 * z
    pick = -1.0
    if last >= 0.0 and excl <= target < excl + zc:
        acc = excl
        pick = last  # rounding left the running sum short of the target: the chunk's last kept token
        for i in range(c0, c1):
            key = np.int64(key_dev(bits[b, i]))
            if _kept(key, i, tk, cut_k, tp, cut_p):
                acc += math.exp((float64(logits[b, i]) - lmax) * inv_t)
                if acc > target:
                    pick = float64(i)
                    break
    pick = _bmax(sh, pick)
    final_last = _bmax(sh, last)
    if tid == 0:
        ids[b] = np.int32(pick if pick >= 0.0 else final_last)


SAMPLE_SIG = "void(int32[::1], float32[:, ::1], uint32[:, ::1], float64, int64, float64, uint32, uint32, uint32, uint32)"


@register("sample", "gpu", "block", rung=1, ptx=[(sample_block_kernel, SAMPLE_SIG)])
def sample_gpu_block(ids, logits, temperature, top_k, top_p, seed, step):
    """One block of 256 threads per row: max, then the top-k and top-p cuts by bisection over the 32-bit order
    key (each step one pass over the row and one block-wide tree reduction in shared memory), then the draw
    from a block prefix sum of per-thread chunk weights. A row (200 kB at V = 50304) stays in L2, so each pass
    is ~50 loads per thread plus ~10 barriers: predict ~1-3 us per pass, 50-150 us per call with both cuts,
    nearly flat in B up to the number of SMs (132)."""
    B, V = logits.shape
    inv_t, k, p = kernel_params(temperature, top_k, top_p, V)
    t = 32 if device.SIMULATED else THREADS
    sample_block_kernel[B, t](ids, logits, logits.view(np.uint32), inv_t, k, p, *_stream(seed, step))


def sample(logits, temperature=1.0, top_k=0, top_p=1.0, seed=0, step=0, out=None):
    """Next-token ids (B,) int32 from logits (B,V) float32 by the rules above: the GPU block kernel for a device
    array, the CPU selection rung for a NumPy array. For decode, pass the step number as ``step``: every call
    draws fresh uniforms, and the same (seed, step) gives the same tokens on every backend."""
    check_params(temperature, top_k, top_p)
    if hasattr(logits, "__cuda_array_interface__") and not isinstance(logits, np.ndarray):
        ids = out if out is not None else cuda.device_array(logits.shape[0], dtype=np.int32)
        sample_gpu_block(ids, logits, temperature, top_k, top_p, seed, step)
        return ids
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    if np.isnan(logits).any():
        raise ValueError("NaN in the logits")
    ids = out if out is not None else np.empty(logits.shape[0], dtype=np.int32)
    sample_cpu_select(ids, logits, temperature, top_k, top_p, seed, step)
    return ids


# --------------------------------------------------------------------------- exercise: top-p's cutoff
def top_p_count_ref(w, p):
    """For each row of weights w (B,V) >= 0: the length of the shortest prefix of the descending order whose sum
    is >= p times the row's sum (the number of tokens top-p keeps)."""
    n = np.empty(w.shape[0], dtype=np.int32)
    for b in range(w.shape[0]):
        cw = np.cumsum(np.sort(w[b])[::-1])
        n[b] = int(np.searchsorted(cw, p * cw[-1], side="left")) + 1
    return n


def top_p_count_inputs(size, dtype, rng):
    """Weights on a grid of 1/8 (ties; every sum exact in float32 and float64, so the ">=" boundary is met
    exactly as often as it happens), a positive largest weight, and p on a grid of 1/8. Row 0 (V >= 5) holds
    4, 2, 1, 1/2, 1/2 at random places and zeros elsewhere: its prefix sums 4, 6, 7, 7.5, 8 hit p * 8 exactly
    for p = 1/2, 7/8 and 1, where an answer that wants "> p" instead of ">= p" keeps one token too many."""
    B, V = size
    w = (rng.integers(0, 9, size=(B, V)) / 8.0).astype(dtype)
    w[:, 0] = np.maximum(w[:, 0], 1.0)
    if V >= 5:
        w[0] = 0.0
        w[0, rng.permutation(V)[:5]] = [4.0, 2.0, 1.0, 0.5, 0.5]
    return w, float(rng.choice([0.25, 0.5, 0.625, 0.875, 1.0]))


exercise_op("top_p_count", reference=top_p_count_ref, make_inputs=top_p_count_inputs, chapter=16,
            title="top-p: how many tokens the nucleus keeps", size_names=("B", "V"), kind="memory",
            output_names=("n",), tol=(0.0, 0.0), flops=lambda s: s[0] * s[1], bytes=lambda s, b: s[0] * s[1] * b,
            sizes={"check": [(1, 1), (3, 7), (4, 37), (2, 300)], "check_sim": [(1, 1), (3, 7)], "bench": [(8, 50304)]})
