"""Mixture of Experts, part 1: the router and its losses (chapter 18). The padded permutation, the gather
and the weighted combine are in moe_align.py; the expert products (the grouped GEMM) and the whole layer in
moe_gemm.py. This docstring holds the definitions the three modules share.

Letters: T tokens, d model width, E experts, k experts per token (top-k), S = T*k slots, B the row tile of
the grouped GEMM (the alignment), P = (ceil(S/B) + E) * B the rows of the padded, permuted layout (an upper
bound on the padded total that needs no host synchronisation), n the width of an expert product.

  moe_router       x (T,d) @ Wr (d,E) -> logits (T,E); softmax; top-k -> weights (T,k) float32, ids (T,k) int32
                   (renorm = 1: the k weights divided by their sum, a softmax over the chosen k)
  moe_router_bwd   dweights (T,k), logits (T,E), ids (T,k) -> dlogits (T,E)   (dx and dWr are chapter 3's products)
  moe_aux_loss     logits (T,E), ids (T,k) -> (lb, z): Switch's load-balancing loss and the router z-loss
  moe_aux_loss_bwd logits, ids -> dlb/dlogits (T,E), dz/dlogits (T,E)

Slots. Token t's j-th choice is slot s = t*k + j. The permuted layout lists, expert by expert, the slots routed
to that expert in increasing slot order (a STABLE sort of the slots by expert: token order within an expert),
each expert's run padded with the sentinel S up to a multiple of B, so that every B-row block of the grouped
GEMM belongs to one expert. This is the layout of vLLM's ``moe_align_block_size``: ``sorted_ids`` (the
slots, padded), ``block_expert`` (the expert of each row block, -1 past the padded total) and the padded
total, here ``offsets[E]`` (offsets (E+1,) are the padded starts of the experts). ``slot_row[s]`` is the row
slot s landed in (the inverse permutation), or -1 when it was dropped.

Capacity. cap = 0: dropless (every slot kept). cap > 0: each expert keeps its first cap slots in slot order
(token order: earlier tokens win) and drops the rest; a dropped slot has slot_row -1 and adds nothing to its
token's output (the residual connection around the layer carries the token on, as in Switch).

Tie rule of the router. Experts are ranked by logit, larger first; EQUAL logits in increasing expert index
(ranking the logits ranks the softmax probabilities the same way, and logits have no rounding from exp).
NaN rule: a token whose logits contain a NaN is routed to experts 0, 1, ..., k-1 with NaN weights. Its
output is then NaN (a NaN is never hidden) and no other token's output changes (rows are independent).
Infinite logits are outside the contract (softmax of +inf is NaN in any order of evaluation).

Ladders: cpu/prange rung 1 (a token per iteration), gpu/thread rung 1 (a thread per token; the losses'
column sums by one block with a fixed-order tree, so the same bits every run); the router has a cpu/numpy
baseline and gpu/gemm rung 2 (the logits by chapter 5's warptile GEMM, then a thread per token for the
softmax and top-k). The losses count tokens per expert with chapter 15's histogram.
"""
import math

import numpy as np

from ..compiler import cuda, float32, njit, prange
from .. import device
from ..device import ceil_div
from ..registry import define_op, register
from . import histogram as hist_mod

ZIPF_A = 1.1
EPS32 = float(np.finfo(np.float32).eps)
B_GPU, B_SIM = 128, 16  # the grouped GEMM's row tile: the alignment the layer uses (moe_gemm.BM)


def row_block():
    return B_SIM if device.SIMULATED else B_GPU


def padded_rows(S, E, B):
    """P: rows of the padded layout. sum_e ceil(c_e/B) <= ceil(S/B) + E blocks, whatever the counts."""
    return (ceil_div(S, B) + E) * B


# ------------------------------------------------------------------------------------------ inputs
def make_routing(T, E, k, skew, rng):
    """ids (T,k) int32, k distinct experts per token. skew 0: uniform; 1: Zipf-like (expert e drawn with
    weight (e+1)**-1.1, without replacement, by the Gumbel top-k trick), so the last experts are often
    empty; 2: every token to experts 0..k-1 (with k = 1 all tokens go to one expert; E - k experts empty)."""
    if skew == 2:
        return np.tile(np.arange(k, dtype=np.int32), (T, 1))
    score = rng.gumbel(size=(T, E))
    if skew == 1:
        score = score - ZIPF_A * np.log(np.arange(1, E + 1))
    return np.argsort(-score, axis=1, kind="stable")[:, :k].astype(np.int32)


def quantized(shape, rng, step, lim):
    """Normal values rounded to multiples of ``step`` in [-lim, lim]: float32 sums of their products are exact
    (few bits each), so the float32 kernels and the float64 reference rank the logits identically and
    equal logits are really equal: the tie rule decides them, not rounding."""
    return np.clip(np.round(rng.standard_normal(shape) / step) * step, -lim, lim).astype(np.float32)


# ------------------------------------------------------------------------------------------ router
def reference_router(x, Wr, k, renorm):
    """float64: logits, the top-k softmax weights (renormalised over k if renorm) and their experts."""
    logits = x @ Wr
    T, E = logits.shape
    bad = np.isnan(logits).any(axis=1)
    ids = np.argsort(-np.where(bad[:, None], 0.0, logits), axis=1, kind="stable")[:, :k]
    ids[bad] = np.arange(k)
    with np.errstate(invalid="ignore"):
        m = logits.max(axis=1, keepdims=True)
        p = np.exp(logits - m)
        p = p / p.sum(axis=1, keepdims=True)
        w = np.take_along_axis(p, ids, axis=1)
        if renorm:
            w = w / w.sum(axis=1, keepdims=True)
    w[bad] = np.nan
    return logits, w, ids.astype(np.int32)


def make_inputs_router(size, dtype, rng):
    """x and Wr quantized (exact float32 logits); Wr's last column repeats its first, so experts 0 and E-1
    tie on every token and the tie rule is exercised everywhere."""
    T, d, E, k, renorm = size
    x = quantized((T, d), rng, 0.25, 2.0)
    Wr = quantized((d, E), rng, 1 / 16, 1.0)
    if E > 1:
        Wr[:, E - 1] = Wr[:, 0]
    return x, Wr, int(k), int(renorm)


def make_edge_inputs_router(size, dtype, rng):
    """A NaN in a few tokens' x: those tokens' logits are NaN (the NaN rule), the others are unaffected."""
    x, Wr, k, renorm = make_inputs_router(size, dtype, rng)
    T = x.shape[0]
    for t in rng.permutation(T)[: max(1, T // 5)]:
        x[t, rng.integers(0, x.shape[1])] = np.nan
    return x, Wr, k, renorm


ROUTER_SIZES = {"check": [(1, 1, 1, 1, 0), (7, 5, 3, 3, 1), (33, 17, 7, 2, 0), (100, 64, 13, 4, 1),
                          (257, 31, 64, 8, 0), (50, 8, 8, 8, 1)],
                "check_sim": [(1, 3, 1, 1, 0), (5, 4, 3, 3, 1), (13, 5, 7, 2, 0)],
                "bench": [(4096, 1024, 8, 2, 1), (4096, 1024, 64, 8, 1)],
                "bench_sim": [(13, 5, 7, 2, 0)]}

# The logits are exact (quantized inputs); the weights are float32 softmax values over E terms: a few eps
# of relative error. A wrong expert id is off by >= 1, far outside atol.
define_op("moe_router", reference=reference_router, make_inputs=make_inputs_router, chapter=18,
          title="MoE router: logits, softmax, top-k with a tie rule", size_names=("T", "d", "E", "k", "renorm"),
          kind="memory", tol=(1e-5, 1e-6), output_names=("logits", "weights", "ids"), sizes=ROUTER_SIZES,
          edge_inputs=make_edge_inputs_router,
          flops=lambda s: 2 * s[0] * s[1] * s[2] + 4 * s[0] * s[2] * s[3],
          bytes=lambda s, b: (s[0] * s[1] + s[1] * s[2] + s[0] * s[2]) * b + 8 * s[0] * s[3])


def _route_row(lg, w, ids, k, renorm):
    # lg (E,) one token's logits -> w (k,), ids (k,): softmax, then the k largest by the tie rule
    E = lg.shape[0]
    m = lg[0]
    bad = False
    for e in range(E):
        v = lg[e]
        if v != v:
            bad = True
        elif v > m:
            m = v
    if bad:  # the NaN rule: experts 0..k-1, NaN weights
        for j in range(k):
            ids[j] = j
            w[j] = math.nan
        return
    s = lg[0] - lg[0]  # a zero of the logits' type
    for e in range(E):
        s += math.exp(lg[e] - m)
    pv = math.inf  # the previous pick (value, index): the next pick comes after it in the order
    pi = -1
    tot = s - s
    for j in range(k):
        best = -1
        bv = -math.inf
        for e in range(E):
            v = lg[e]
            if v < pv or (v == pv and e > pi):  # not yet picked
                if best < 0 or v > bv:  # strictly larger: on a tie the lower index stays
                    best = e
                    bv = v
        ids[j] = best
        p = math.exp(bv - m) / s
        w[j] = p
        tot += p
        pv = bv
        pi = best
    if renorm:
        for j in range(k):
            w[j] = w[j] / tot


route_row_cpu = njit(inline="always")(_route_row)
route_row_gpu = cuda.jit(device=True, inline="always")(_route_row)


@njit(parallel=True, cache=True)
def router_prange(logits, w, ids, x, Wr, k, renorm):
    T, d = x.shape
    E = Wr.shape[1]
    for t in prange(T):
        for e in range(E):
            logits[t, e] = 0.0
        for i in range(d):  # x[t, i] times row i of Wr: the inner loop runs along Wr's rows (stride 1)
            xi = x[t, i]
            for e in range(E):
                logits[t, e] += xi * Wr[i, e]
        route_row_cpu(logits[t], w[t], ids[t], k, renorm)


@register("moe_router", "cpu", "numpy", baseline=True)
def router_numpy(logits, w, ids, x, Wr, k, renorm):
    """NumPy: x @ Wr, softmax, a stable argsort of -logits (the tie rule), the first k."""
    lg, ww, ii = reference_router(x, Wr, k, renorm)
    logits[:] = lg
    w[:] = ww
    ids[:] = ii


@register("moe_router", "cpu", "prange", rung=1)
def router_cpu(logits, w, ids, x, Wr, k, renorm):
    """prange over tokens: E dot products of length d, a softmax and k selection passes over E. The
    products dominate (2dE FLOPs a token); predict a few GFLOP/s per core, like chapter 4's GEMV."""
    router_prange(logits, w, ids, x, Wr, k, renorm)


@cuda.jit
def router_thread_kernel(logits, w, ids, x, Wr, k, renorm):
    # one thread per token: x (T,d), Wr (d,E) -> logits (T,E); weights, ids (T,k)
    t = cuda.grid(1)
    if t < x.shape[0]:
        d = x.shape[1]
        E = Wr.shape[1]
        for e in range(E):
            acc = float32(0.0)
            for i in range(d):
                acc += x[t, i] * Wr[i, e]
            logits[t, e] = acc
        route_row_gpu(logits[t], w[t], ids[t], k, renorm)


def _threads():
    return 32 if device.SIMULATED else 128


def router_gpu(logits, w, ids, x, Wr, k, renorm):
    T = x.shape[0]
    if T:
        router_thread_kernel[ceil_div(T, _threads()), _threads()](logits, w, ids, x, Wr, k, renorm)


F2 = "float32[:, ::1]"
I2 = "int32[:, ::1]"
I1 = "int32[::1]"
F1 = "float32[::1]"


@register("moe_router", "gpu", "thread", rung=1,
          ptx=[(router_thread_kernel, f"void({F2}, {F2}, {I2}, {F2}, {F2}, int64, int64)")])
def router_gpu_thread(logits, w, ids, x, Wr, k, renorm):
    """One thread per token: E dot products of length d (Wr read by every thread: it sits in L1/L2), the
    softmax, k selection passes. A router is ~2dE/(2d*ff*k*3) of the layer's FLOPs (0.1 % at d 1024, E 8);
    predict it far from any roofline (one thread walks a row of x, uncoalesced) and still small next to
    the expert products."""
    router_gpu(logits, w, ids, x, Wr, k, renorm)


@cuda.jit
def route_kernel(w, ids, logits, k, renorm):
    # one thread per token: the softmax and top-k of a row of logits already computed
    t = cuda.grid(1)
    if t < logits.shape[0]:
        route_row_gpu(logits[t], w[t], ids[t], k, renorm)


def logits_gemm(logits, x, Wr):
    """logits (T,E) = x (T,d) @ Wr (d,E) with chapter 5's GEMM: rung 11 (warptile) on a GPU, rung 2 in the
    simulator (a 256-thread warptile block is slow there; the result is the same)."""
    from . import gemm

    if device.SIMULATED:
        gemm.gemm_coalesced(logits, x, Wr)
    else:
        gemm._warptile(logits, x, Wr)


def router_gemm_gpu(logits, w, ids, x, Wr, k, renorm):
    T = x.shape[0]
    if T:
        logits_gemm(logits, x, Wr)
        route_kernel[ceil_div(T, _threads()), _threads()](w, ids, logits, k, renorm)


def _router_gemm_ptx():
    from . import gemm

    return [(gemm._warptile.kernel, gemm.SIG_VEC), (route_kernel, f"void({F2}, {I2}, {F2}, int64, int64)")]


@register("moe_router", "gpu", "gemm", rung=2, ptx=_router_gemm_ptx())
def router_gpu_gemm(logits, w, ids, x, Wr, k, renorm):
    """The logits by chapter 5's warptile GEMM (T x E x d: a 128-row tile per block, all of the E columns in
    one 128-wide tile), then a thread per token for the softmax and top-k reading its row. Rung 1 walks a row
    of x per thread (uncoalesced) and does 2dE dependent FMAs in one thread: at T 4096, d 1024, E 64 that is
    131k FMAs in a row per thread. Predict the GEMM at a few tens of microseconds (it wastes 128/E of its
    columns) and the whole router 10-50x faster than rung 1."""
    router_gemm_gpu(logits, w, ids, x, Wr, k, renorm)


# ------------------------------------------------------------------------------------ router backward
def reference_router_bwd(dw, logits, ids, renorm):
    """dlogits (T,E) of sum(dw * weights). No renorm: w_j = p[ids_j], dlogits_i = p_i (g_i - sum_j dw_j w_j)
    with g_i = dw_j where i = ids_j (0 elsewhere). renorm: w is a softmax over the chosen logits only, so
    dlogits is w_j (dw_j - sum_m dw_m w_m) at the chosen experts and 0 elsewhere."""
    T, E = logits.shape
    with np.errstate(invalid="ignore"):
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p = p / p.sum(axis=1, keepdims=True)
        w = np.take_along_axis(p, ids.astype(np.int64), axis=1)
        g = np.zeros((T, E))
        if renorm:
            w = w / w.sum(axis=1, keepdims=True)
            np.put_along_axis(g, ids.astype(np.int64), w * (dw - (dw * w).sum(axis=1, keepdims=True)), axis=1)
            return g
        np.put_along_axis(g, ids.astype(np.int64), dw, axis=1)
        return p * (g - (dw * w).sum(axis=1, keepdims=True))


def make_inputs_router_bwd(size, dtype, rng):
    T, E, k, renorm = size
    logits = rng.standard_normal((T, E)).astype(np.float32)
    _, _, ids = reference_router(logits.astype(np.float64), np.eye(E), k, renorm)
    return rng.standard_normal((T, k)).astype(np.float32), logits, ids, int(renorm)


def make_edge_inputs_router_bwd(size, dtype, rng):
    """NaN in some tokens' logits (routed to 0..k-1 by the NaN rule): their gradient rows are NaN (without
    renorm every entry; with renorm the chosen ones, the others stay 0); other rows are unaffected."""
    dw, logits, ids, renorm = make_inputs_router_bwd(size, dtype, rng)
    T, E = logits.shape
    k = ids.shape[1]
    for t in rng.permutation(T)[: max(1, T // 5)]:
        logits[t, rng.integers(0, E)] = np.nan
        ids[t] = np.arange(k)
    return dw, logits, ids, renorm


ROUTER_BWD_SIZES = {"check": [(1, 1, 1, 0), (7, 3, 3, 1), (33, 7, 2, 0), (100, 13, 4, 1), (257, 64, 8, 0)],
                    "check_sim": [(1, 1, 1, 0), (5, 3, 3, 1), (13, 7, 2, 0)],
                    "bench": [(4096, 64, 8, 1)], "bench_sim": [(13, 7, 2, 0)]}

define_op("moe_router_bwd", reference=reference_router_bwd, make_inputs=make_inputs_router_bwd, chapter=18,
          title="MoE router backward: through top-k and the softmax", size_names=("T", "E", "k", "renorm"),
          kind="memory", tol=(1e-5, 1e-6), output_names=("dlogits",), sizes=ROUTER_BWD_SIZES,
          edge_inputs=make_edge_inputs_router_bwd,
          flops=lambda s: 6 * s[0] * s[1], bytes=lambda s, b: 2 * s[0] * s[1] * b + 8 * s[0] * s[2])


def _router_bwd_row(dl, dw, lg, ids, renorm):
    # one token: dl (E,) <- dw (k,), lg (E,), ids (k,)
    E = lg.shape[0]
    k = ids.shape[0]
    m = lg[0]
    for e in range(E):
        v = lg[e]
        if v != v or v > m:
            m = v
    s = lg[0] - lg[0]
    for e in range(E):
        s += math.exp(lg[e] - m)
    if renorm:
        tot = s - s
        for j in range(k):
            tot += math.exp(lg[ids[j]] - m)
        c = s - s
        for j in range(k):
            c += dw[j] * (math.exp(lg[ids[j]] - m) / tot)
        for e in range(E):
            dl[e] = 0.0
        for j in range(k):
            wj = math.exp(lg[ids[j]] - m) / tot
            dl[ids[j]] = wj * (dw[j] - c)
    else:
        c = s - s
        for j in range(k):
            c += dw[j] * (math.exp(lg[ids[j]] - m) / s)
        for e in range(E):
            dl[e] = -(math.exp(lg[e] - m) / s) * c
        for j in range(k):
            dl[ids[j]] += (math.exp(lg[ids[j]] - m) / s) * dw[j]


router_bwd_row_cpu = njit(inline="always")(_router_bwd_row)
router_bwd_row_gpu = cuda.jit(device=True, inline="always")(_router_bwd_row)


@njit(parallel=True, cache=True)
def router_bwd_prange(dl, dw, lg, ids, renorm):
    for t in prange(lg.shape[0]):
        router_bwd_row_cpu(dl[t], dw[t], lg[t], ids[t], renorm)


@register("moe_router_bwd", "cpu", "prange", rung=1)
def router_bwd_cpu(dlogits, dw, logits, ids, renorm):
    """prange over tokens: a softmax of E logits and k scatters per token. O(T*E) work on O(T*E) bytes:
    memory-bound; predict near a CPU copy of the (T,E) arrays."""
    router_bwd_prange(dlogits, dw, logits, ids, renorm)


@cuda.jit
def router_bwd_kernel(dl, dw, lg, ids, renorm):
    t = cuda.grid(1)
    if t < lg.shape[0]:
        router_bwd_row_gpu(dl[t], dw[t], lg[t], ids[t], renorm)


@register("moe_router_bwd", "gpu", "thread", rung=1,
          ptx=[(router_bwd_kernel, f"void({F2}, {F2}, {F2}, {I2}, int64)")])
def router_bwd_gpu(dlogits, dw, logits, ids, renorm):
    """One thread per token. Each thread walks its own row (stride E between threads: uncoalesced for
    E >= 8); predict well below copy speed, a small cost beside the expert products."""
    T = logits.shape[0]
    if T:
        router_bwd_kernel[ceil_div(T, _threads()), _threads()](dlogits, dw, logits, ids, renorm)


_scratch: dict = {}


def _buf(key, n, dtype):
    have = _scratch.get(key)
    if have is None or have.size < n:
        have = _scratch[key] = cuda.device_array(max(n, 1), dtype)
    return have[:n]


# ------------------------------------------------------------------------------------------ aux losses
def reference_aux(logits, ids):
    """(lb, z). lb = E * sum_e f_e P_e (Switch Transformer), f_e = the fraction of the S = T*k slots routed to
    e, P_e = the mean over tokens of softmax(logits)[t, e]; it is 1 when both are uniform. z = mean over
    tokens of logsumexp(logits[t])**2 (the router z-loss of ST-MoE), which keeps the logits small."""
    T, E = logits.shape
    k = ids.shape[1]
    f = np.bincount(ids.reshape(-1).astype(np.int64), minlength=E) / (T * k)
    m = logits.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
    p = np.exp(logits - lse[:, None])
    return np.array([E * float(f @ p.mean(axis=0)), float((lse ** 2).mean())])


def reference_aux_bwd(logits, ids):
    """d lb/d logits[t,i] = (E/T) p_ti (f_i - sum_e f_e p_te) (f is a count: no gradient);
    d z/d logits[t,i] = (2/T) lse_t p_ti."""
    T, E = logits.shape
    k = ids.shape[1]
    f = np.bincount(ids.reshape(-1).astype(np.int64), minlength=E) / (T * k)
    m = logits.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
    p = np.exp(logits - lse[:, None])
    return (E / T) * p * (f[None, :] - (p @ f)[:, None]), (2.0 / T) * lse[:, None] * p


def make_inputs_aux(size, dtype, rng):
    T, E, k = size
    logits = (2 * rng.standard_normal((T, E))).astype(np.float32)
    _, _, ids = reference_router(logits.astype(np.float64), np.eye(E), k, 0)
    return logits, ids


AUX_SIZES = {"check": [(1, 1, 1), (7, 3, 3), (33, 7, 2), (1000, 13, 4), (257, 64, 8)],
             "check_sim": [(1, 1, 1), (7, 3, 3), (33, 7, 2)],
             "bench": [(4096, 64, 8)], "bench_sim": [(33, 7, 2)]}


def aux_tol(size, dtype):
    """Sums over T tokens of float32 softmax values: ~sqrt(T) eps relative, plus the exp's few ulps."""
    T = size[0]
    return (8 * (math.sqrt(T) + 8) * EPS32, 1e-7)


define_op("moe_aux_loss", reference=reference_aux, make_inputs=make_inputs_aux, chapter=18,
          title="MoE load-balancing loss and router z-loss", size_names=("T", "E", "k"), kind="memory",
          tol=aux_tol, output_names=("losses",), sizes=AUX_SIZES,
          flops=lambda s: 5 * s[0] * s[1], bytes=lambda s, b: s[0] * s[1] * b + 4 * s[0] * s[2])
# dlb is (E/T) p (f_i - sum_e f_e p_e): a difference of O(1/E) terms, so its error is a few eps of E/T in
# absolute terms, not relative to the (possibly tiny) difference.
define_op("moe_aux_loss_bwd", reference=reference_aux_bwd, make_inputs=make_inputs_aux, chapter=18,
          title="MoE load-balancing and z-loss gradients", size_names=("T", "E", "k"), kind="memory",
          tol=lambda s, dt: (1e-5, 8 * EPS32 * s[1] / s[0]), output_names=("dlb", "dz"), sizes=AUX_SIZES,
          flops=lambda s: 8 * s[0] * s[1], bytes=lambda s, b: 3 * s[0] * s[1] * b + 4 * s[0] * s[2])


def _lse_row(lg):
    E = lg.shape[0]
    m = lg[0]
    for e in range(E):
        v = lg[e]
        if v != v or v > m:
            m = v
    s = lg[0] - lg[0]
    for e in range(E):
        s += math.exp(lg[e] - m)
    return m + math.log(s)


lse_row_cpu = njit(inline="always")(_lse_row)
lse_row_gpu = cuda.jit(device=True, inline="always")(_lse_row)


@njit(cache=True)
def aux_seq(losses, logits, ids, counts):
    T, E = logits.shape
    S = ids.size
    hist_mod.hist_seq(counts, ids.reshape(-1), E)
    Pe = np.zeros(E)  # float64 accumulators: T terms each
    z = 0.0
    for t in range(T):
        lse = lse_row_cpu(logits[t])
        z += lse * lse
        for e in range(E):
            Pe[e] += math.exp(logits[t, e] - lse)
    lb = 0.0
    for e in range(E):
        lb += (counts[e] / S) * (Pe[e] / T)
    losses[0] = E * lb
    losses[1] = z / T


@register("moe_aux_loss", "cpu", "seq", rung=1)
def aux_cpu(losses, logits, ids):
    """One loop over tokens with float64 accumulators (the counts from chapter 15's histogram). Two scalars
    from T*E values: predict memory-bound, a few GB/s on one core (an exp per element)."""
    aux_seq(losses, logits, ids, np.empty(logits.shape[1], np.int32))


@njit(parallel=True, cache=True)
def aux_bwd_prange(dlb, dz, logits, ids, counts):
    T, E = logits.shape
    S = ids.size
    for t in prange(T):
        lse = lse_row_cpu(logits[t])
        pf = 0.0
        for e in range(E):
            pf += math.exp(logits[t, e] - lse) * (counts[e] / S)
        for e in range(E):
            p = math.exp(logits[t, e] - lse)
            dlb[t, e] = (E / T) * p * (counts[e] / S - pf)
            dz[t, e] = (2.0 / T) * lse * p


@register("moe_aux_loss_bwd", "cpu", "prange", rung=1)
def aux_bwd_cpu(dlb, dz, logits, ids):
    """The counts (chapter 15's histogram), then prange over tokens: one softmax and two gradient rows each.
    Predict near CPU copy speed of the three (T,E) arrays."""
    counts = np.empty(logits.shape[1], np.int32)
    hist_mod.hist_seq(counts, np.ascontiguousarray(ids).reshape(-1), logits.shape[1])
    aux_bwd_prange(dlb, dz, logits, ids, counts)


@cuda.jit
def aux_rows_kernel(p, lse, logits):
    # one thread per token: p (T,E) softmax rows, lse (T,)
    t = cuda.grid(1)
    if t < logits.shape[0]:
        v = lse_row_gpu(logits[t])
        lse[t] = v
        for e in range(logits.shape[1]):
            p[t, e] = math.exp(logits[t, e] - v)


@cuda.jit
def aux_reduce_kernel(losses, p, lse, counts, S):
    # one block of NT threads: column sums of p and the sum of lse**2, each a fixed-order tree (deterministic)
    NT = 32
    buf = cuda.shared.array(NT, float32)
    tid = cuda.threadIdx.x
    T, E = p.shape
    lb = float32(0.0)
    for e in range(E):
        acc = float32(0.0)
        for t in range(tid, T, NT):
            acc += p[t, e]
        buf[tid] = acc
        cuda.syncthreads()
        h = NT // 2
        while h > 0:
            if tid < h:
                buf[tid] += buf[tid + h]
            cuda.syncthreads()
            h //= 2
        lb += (counts[e] / float32(S)) * (buf[0] / float32(T))
        cuda.syncthreads()
    acc = float32(0.0)
    for t in range(tid, T, NT):
        acc += lse[t] * lse[t]
    buf[tid] = acc
    cuda.syncthreads()
    h = NT // 2
    while h > 0:
        if tid < h:
            buf[tid] += buf[tid + h]
        cuda.syncthreads()
        h //= 2
    if tid == 0:
        losses[0] = E * lb
        losses[1] = buf[0] / float32(T)


@register("moe_aux_loss", "gpu", "thread", rung=1,
          ptx=[(aux_rows_kernel, f"void({F2}, {F1}, {F2})"),
               (aux_reduce_kernel, f"void({F1}, {F2}, {F1}, {I1}, int64)")] )
def aux_gpu(losses, logits, ids):
    """Counts from chapter 15's histogram; a thread per token for the softmax rows and logsumexp; one block
    reduces the columns with a fixed-order tree (the same result every run, unlike atomics). One block for
    the reduction: predict launch- and latency-bound, tens of microseconds, negligible in a step."""
    T, E = logits.shape
    counts = _buf("aux_counts", E, np.int32)
    hist_mod.hist_privatized(counts, ids.reshape(ids.size), E)
    p = _buf("aux_p", T * E, np.float32).reshape(T, E)
    lse = _buf("aux_lse", T, np.float32)
    aux_rows_kernel[ceil_div(T, _threads()), _threads()](p, lse, logits)
    aux_reduce_kernel[1, 32](losses, p, lse, counts, ids.size)


@cuda.jit
def aux_bwd_kernel(dlb, dz, logits, counts, S):
    t = cuda.grid(1)
    T, E = logits.shape
    if t < T:
        v = lse_row_gpu(logits[t])
        pf = float32(0.0)
        for e in range(E):
            pf += math.exp(logits[t, e] - v) * (counts[e] / float32(S))
        for e in range(E):
            p = math.exp(logits[t, e] - v)
            dlb[t, e] = (float32(E) / float32(T)) * p * (counts[e] / float32(S) - pf)
            dz[t, e] = (float32(2.0) / float32(T)) * v * p


@register("moe_aux_loss_bwd", "gpu", "thread", rung=1,
          ptx=[(aux_bwd_kernel, f"void({F2}, {F2}, {F2}, {I1}, int64)")])
def aux_bwd_gpu(dlb, dz, logits, ids):
    """Counts from chapter 15's histogram, then a thread per token. Predict memory-bound, well below copy
    (rows of E floats per thread are uncoalesced), negligible in a step."""
    T, E = logits.shape
    counts = _buf("aux_counts", E, np.int32)
    hist_mod.hist_privatized(counts, ids.reshape(ids.size), E)
    if T:
        aux_bwd_kernel[ceil_div(T, _threads()), _threads()](dlb, dz, logits, counts, ids.size)
