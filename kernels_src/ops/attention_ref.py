"""Scaled dot-product attention (chapter 9): the float64 oracle, the inputs, the tolerances and the ops
(attention, attention_bwd, attention_scores, attention_bwd_dv). The kernels are in attention_cpu,
attention_fwd (GPU rungs 1-5), attention_flash2 (GPU rungs 6-7), attention_bwd and attention_bwd_vec (the
GPU backward, rungs 1 and 2) and attention_torch (torch's SDPA yardsticks); attention_speedup holds the
chapter's "predict, then measure" op. kernels_src.ops.attention hands all of their names on.

Shapes (letters fixed for the whole chapter):
    Q (B,H,S,D)        queries: B sequences, H query heads, S query positions, head size D
    K, V (B,Hkv,T,D)   keys and values: Hkv key/value heads, T key positions
    kv_len (B,) int32  key-padding mask: keys j >= kv_len[b] do not exist for sequence b
    causal (int 0/1)   causal mask, aligned bottom-right: query i sees key j iff j <= i + (T - S)
                       (S = T: the usual lower triangle; S = 1: one decode step sees every key)
    -> O (B,H,S,D), L (B,H,S)

Grouped-query attention (GQA): H = g * Hkv, and query head h reads key/value head h // g. Hkv = H is
multi-head attention; Hkv = 1 is multi-query attention. GQA exists to shrink K and V (and the KV cache)
by g while keeping H query heads.

Math, per (b, h), with scale = 1/sqrt(D) and "visible(i, j)" the two masks:
    s_ij = scale * q_i . k_j            (-inf where not visible)      scores (S,T)
    L_i  = log sum_j exp(s_ij)          the per-row logsumexp          (S,)
    P_ij = exp(s_ij - L_i)              softmax of each row            (S,T)
    O_i  = sum_j P_ij v_j                                                (S,D)
A fully masked row (no visible key) has no softmax: it is DEFINED as O_i = 0 and L_i = -inf, the
convention of chapter 8's softmax, so no NaN reaches the next layer.

Cost: 4*D FLOPs per visible (i, j) pair per head (2D for q.k, 2D for P v): 4*S*T*D per head without
masks, about half that with a causal mask. Bytes that must move: Q, K, V and O once (plus L) -- the S x T
score matrix never has to. That is the whole point of the chapter: at S = T = 2048, H = 16, B = 4 the
scores are 1 GiB in float32, while Q, K, V and O together are 128 MiB.

Backward (P recomputed from the saved L, as in FlashAttention), given dO (B,H,S,D), Q, K, V, O and L:
    Dr_i  = sum_d dO_id * O_id                     (B,H,S)   one dot per row, once
    P_ij  = exp(s_ij - L_i)                        recomputed from the saved L: no S x T buffer
    dV_j  = sum_i P_ij dO_i                        summed over the g query heads of the group too
    dP_ij = dO_i . v_j
    dS_ij = P_ij (dP_ij - Dr_i)
    dQ_i  = scale * sum_j dS_ij k_j
    dK_j  = scale * sum_i dS_ij q_i                summed over the group's heads
Useful FLOPs: 8*D per visible pair per head (four matrix products); a flash backward also recomputes
a fifth, Q K^T, so it does at least 10*D = 2.5x the forward's 4*D. FlashAttention-2's backward (Dao 2023,
arXiv 2307.08691, Alg. 2) reaches that minimum with ONE kernel per key tile that builds dK and dV and
adds each tile's share of dQ into DRAM with atomic adds. Ours uses TWO kernels and no atomics: one owns a
tile of keys and loops over every query tile (and every head of its group) to build dK and dV; another
owns a tile of queries and loops over keys for dQ. Both recompute s and dP, so a pair costs 14*D (3.5x the
forward) instead of 10*D, but each output element is written by exactly one thread: the result is bitwise
reproducible.

Size tuple (what the registry, bench and tests pass around): (B, H, Hkv, S, T, D, mask) with
mask = 0 none, 1 causal, 2 key padding, 3 causal + key padding. make_inputs turns it into
(Q, K, V, kv_len, causal); with padding, kv_len is 2T/3 for even b and T for odd b.

Ladder (forward; op ``attention``)
  cpu/naive        rung 1   per (b, h) the S x T score matrix materialized, then softmax, then P V
  cpu/online       rung 2   one query row at a time, online softmax over the keys: O(D) extra memory
  cpu/prange       rung 3   rung 2 with (b, h, row block) spread over the cores
  cpu/blocked      rung 4   16 query rows x 64-key tiles: each K/V tile is reused by 16 rows from cache
  cpu/simd         rung 5   rung 4 in SIMD: score and P V tiles register-blocked 2 rows x 4 keys, the
"""
from __future__ import annotations
import math
import numpy as np

from ..registry import define_op


MASKS = {0: "none", 1: "causal", 2: "padding", 3: "causal+padding"}


# --------------------------------------------------------------------------------------- reference
def kv_lengths(B, T, mask):
    """The key-padding pattern of make_inputs: 2T/3 valid keys for even b, all T for odd b."""
    if mask & 2:
        return np.array([max(1, (2 * T) // 3) if b % 2 == 0 else T for b in range(B)], dtype=np.int32)
    return np.full(B, T, dtype=np.int32)


def visible(S, T, kv_len, causal):
    """Boolean (B,1,S,T): may query i attend to key j? Padding: j < kv_len[b]; causal: j <= i + T - S."""
    j = np.arange(T)[None, None, None, :]
    ok = j < np.asarray(kv_len).reshape(-1, 1, 1, 1)
    if causal:
        i = np.arange(S)[None, None, :, None]
        ok = ok & (j <= i + (T - S))
    return ok


def scores_reference(q, k, v, kv_len, causal):
    """float64: s = Q K^T / sqrt(D) with -inf where masked; (B,H,S,T). K, V repeated over each group."""
    B, H, S, D = q.shape
    g = H // k.shape[1]
    kk = np.repeat(k, g, axis=1)
    s = np.matmul(q, kk.transpose(0, 1, 3, 2)) / np.sqrt(D)  # batched BLAS: fast at benchmark sizes
    return np.where(visible(S, k.shape[2], kv_len, causal), s, -np.inf)


def reference(q, k, v, kv_len, causal):
    """float64 oracle: (O, L). Fully masked rows: O = 0, L = -inf."""
    g = q.shape[1] // k.shape[1]
    s = scores_reference(q, k, v, kv_len, causal)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)  # exp(-inf) = 0 on masked entries
    l = np.sum(e, axis=-1, keepdims=True)
    vv = np.repeat(v, g, axis=1)
    o = np.matmul(e, vv) / np.where(l > 0, l, 1.0)
    lse = np.where(l > 0, m + np.log(np.where(l > 0, l, 1.0)), -np.inf)[..., 0]
    return o, lse


def reference_bwd(do, q, k, v, o, lse, kv_len, causal):
    """float64 oracle: (dQ, dK, dV), recomputed from Q, K, V in float64 (the given O and L are only
    float32 roundings of the exact ones, which the kernels use)."""
    B, H, S, D = q.shape
    Hkv = k.shape[1]
    g = H // Hkv
    s = scores_reference(q, k, v, kv_len, causal)
    o64, l64 = reference(q, k, v, kv_len, causal)
    p = np.where(np.isfinite(l64)[..., None], np.exp(s - np.where(np.isfinite(l64), l64, 0.0)[..., None]), 0.0)
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    dv = np.matmul(p.transpose(0, 1, 3, 2), do)
    dp = np.matmul(do, vv.transpose(0, 1, 3, 2))
    dr = np.sum(do * o64, axis=-1, keepdims=True)
    ds = p * (dp - dr) / np.sqrt(D)
    dq = np.matmul(ds, kk)
    dk = np.matmul(ds.transpose(0, 1, 3, 2), q)
    fold = lambda x: x.reshape(B, Hkv, g, *x.shape[2:]).sum(axis=2)  # noqa: E731  sum over the group
    return dq, fold(dk), fold(dv)


def make_inputs(size, dtype, rng):
    """Q, K, V ~ N(0, 1) (scores ~ N(0, 1) after the 1/sqrt(D) scale), kv_len from the mask code."""
    B, H, Hkv, S, T, D, mask = size
    q = rng.standard_normal((B, H, S, D)).astype(dtype)
    k = rng.standard_normal((B, Hkv, T, D)).astype(dtype)
    v = rng.standard_normal((B, Hkv, T, D)).astype(dtype)
    return q, k, v, kv_lengths(B, T, mask), int(mask & 1)


def make_edge_inputs(size, dtype, rng):
    """Rows attention must survive: scaled logits near +1e4 and near -1e4 on every key (exp overflows
    or underflows to 0/0 unless the running max is subtracted), exact ties (built from +-1 patterns, so
    the float32 dot products are exact), and fully masked rows (kv_len = 0 for b = 1 mod 3).
    Q rows cycle: +c*u, -c*u, N(0,1); K rows are u with 0-2 signs flipped; c = 1e4/sqrt(D)."""
    B, H, Hkv, S, T, D, mask = size
    c = float(round(1e4 / math.sqrt(D)))
    u = np.where(rng.random(D) < 0.5, -1.0, 1.0)
    q = rng.standard_normal((B, H, S, D))
    q[:, :, 0::3] = c * u
    q[:, :, 1::3] = -c * u
    k = np.broadcast_to(u, (B, Hkv, T, D)).copy()
    for idx in np.ndindex(B, Hkv, T):
        for f in rng.choice(D, size=int(rng.integers(0, 3)), replace=False):
            k[idx + (f,)] *= -1
    v = rng.standard_normal((B, Hkv, T, D))
    kv = kv_lengths(B, T, mask)
    kv[1::3] = 0
    return q.astype(dtype), k.astype(dtype), v.astype(dtype), kv, int(mask & 1)


def make_inputs_bwd(size, dtype, rng, edge=False):
    q, k, v, kv, causal = (make_edge_inputs if edge else make_inputs)(size, dtype, rng)
    o, lse = reference(*(a.astype(np.float64) for a in (q, k, v)), kv, causal)
    do = rng.standard_normal(o.shape).astype(dtype)
    return do, q, k, v, o.astype(dtype), lse.astype(dtype), kv, causal


def make_edge_inputs_bwd(size, dtype, rng):
    return make_inputs_bwd(size, dtype, rng, edge=True)


def visible_pairs(size):
    """Number of visible (i, j) pairs of one head of each sequence, summed over b."""
    B, H, Hkv, S, T, D, mask = size
    n = 0
    for kv in kv_lengths(B, T, mask):
        if mask & 1:
            lim = np.minimum(np.arange(S) + (T - S) + 1, kv)
            n += int(np.clip(lim, 0, None).sum())
        else:
            n += S * int(kv)
    return n


def _flops(size):
    return 4 * size[5] * size[1] * visible_pairs(size)


def _bytes(size, b):
    B, H, Hkv, S, T, D, _ = size
    return (2 * B * H * S * D + 2 * B * Hkv * T * D + B * H * S) * b


def _bytes_bwd(size, b):
    B, H, Hkv, S, T, D, _ = size
    return (4 * B * H * S * D + 4 * B * Hkv * T * D + B * H * S) * b


def tol(size, dtype):
    """O is a convex combination of V rows (|O| <~ 3): errors come from the D-term dots (~sqrt(D) eps
    in the logits, so a relative error of that size in each weight) and the T-term sums; with the GPU's
    fast exp (2 ulp) we see ~1e-6. L is ~log T + max logit. Allowing 1e-4 relative + 2e-5 absolute
    leaves ~10x margin on the normal inputs and still fails a dropped key (an O(1/T) change)."""
    return (1e-4, 2e-5) if np.dtype(dtype) == np.float32 else (1e-10, 1e-12)


def tol_bwd(size, dtype):
    """dK, dV sum over S queries (and g heads): the absolute error grows like sqrt(S*g) eps times the
    terms; we see ~1e-5 on the normal inputs, so 2e-3 relative + 2e-4 absolute is a wide margin that
    still fails any missing term. (On the edge inputs, logits of ~1e4 -- and L -- are rounded to ~1e-3
    in float32, so the recomputed P has relative errors ~1e-3: tests/test_ch09_attention.py allows 5e-3.)"""
    return (2e-3, 2e-4) if np.dtype(dtype) == np.float32 else (1e-9, 1e-10)


SIZES = {
    # (B, H, Hkv, S, T, D, mask): 1s, primes, S != T both ways, GQA (g = 2, 3, 4), S = 1 decode, every
    # head size, every mask, T never a multiple of a tile. No causal row sees zero keys here (S > T
    # only without the causal mask): fully masked rows are the edge inputs' job.
    "check": [(1, 1, 1, 1, 1, 16, 0), (2, 3, 3, 37, 37, 16, 1), (1, 4, 2, 5, 41, 32, 0),
              (2, 2, 1, 67, 67, 64, 3), (1, 2, 2, 1, 130, 128, 1), (3, 2, 2, 70, 67, 64, 2),
              (1, 6, 2, 131, 257, 64, 1), (2, 4, 1, 33, 71, 128, 0)],
    "check_sim": [(1, 1, 1, 1, 1, 16, 0), (1, 2, 1, 5, 7, 16, 1), (2, 2, 2, 3, 9, 16, 2),
                  (1, 3, 3, 9, 9, 16, 3)],
    "bench": [(1, 4, 4, 256, 256, 64, 0), (1, 4, 4, 256, 256, 64, 1)],
    "bench_gpu": [(4, 16, 16, 2048, 2048, 64, 0), (4, 16, 16, 2048, 2048, 64, 1)],
    "bench_sim": [(1, 2, 1, 5, 7, 16, 1)],
}
SIZE_NAMES = ("B", "H", "Hkv", "S", "T", "D", "mask")

define_op("attention", reference=reference, make_inputs=make_inputs, chapter=9,
          title="scaled dot-product attention (O, L)", size_names=SIZE_NAMES, kind="compute", tol=tol,
          output_names=("O", "L"), sizes=SIZES, flops=_flops, bytes=_bytes)
define_op("attention_bwd", reference=reference_bwd, make_inputs=make_inputs_bwd, chapter=9,
          title="attention backward (dQ, dK, dV)", size_names=SIZE_NAMES, kind="compute", tol=tol_bwd,
          output_names=("dQ", "dK", "dV"), sizes=SIZES,
          flops=lambda s: 2 * _flops(s), bytes=_bytes_bwd)
define_op("attention_scores", reference=scores_reference, make_inputs=make_inputs, chapter=9,
          title="masked scaled scores Q K^T / sqrt(D)", size_names=SIZE_NAMES, kind="memory",
          tol=lambda s, d: (1e-5, 1e-5 * math.sqrt(s[5])) if np.dtype(d) == np.float32 else (1e-10, 1e-12),
          output_names=("scores",), sizes={k: v for k, v in SIZES.items() if k != "bench_gpu"},
          flops=lambda s: 2 * s[0] * s[1] * s[3] * s[4] * s[5],
          bytes=lambda s, b: (s[0] * s[1] * s[3] * (s[4] + s[5]) + s[0] * s[2] * s[4] * s[5]) * b)


def _reference_dv(do, q, k, v, o, lse, kv_len, causal):
    return reference_bwd(do, q, k, v, o, lse, kv_len, causal)[2]


define_op("attention_bwd_dv", reference=_reference_dv, make_inputs=make_inputs_bwd, chapter=9,
          title="attention backward, dV only", size_names=SIZE_NAMES, kind="compute", tol=tol_bwd,
          output_names=("dV",), sizes={k: v for k, v in SIZES.items() if k != "bench_gpu"},
          flops=lambda s: _flops(s), bytes=lambda s, b: _bytes_bwd(s, b) // 2)
