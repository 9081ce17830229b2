"""Token embeddings and the head-layout glue of a transformer, forward and backward (chapter 13).

The capstone GPT needs a few data-movement ops that no earlier chapter has: they do no arithmetic
worth the name, but each is a pass over an activation and each has a backward.

  embedding       ids (M,) int32, table (V,C)      -> x (M,C)         x[m] = table[ids[m]]       (a gather)
  embedding_bwd   ids (M,) int32, dx (M,C), V      -> dtable (V,C)    dtable[v] = sum_{m: ids[m]=v} dx[m]
  heads_merge     o (B,H,T,D)                      -> y (B,T,H*D)     attention output back to token rows
  heads_split     dy (B,T,H*D)                     -> do (B,H,T,D)    its backward (and the inverse permute)
  transpose       X (M,K)                          -> Y (K,M)         so every product can be chapter 5's
                  GEMM: dW = X^T G = gemm(transpose(X), G) and dX = G W^T = gemm(G, transpose(W))
  qkv_rope_bwd    dq, dk, dv (B,H,T,D), cos, sin   -> dqkv (B,T,3H,D) the backward of chapter 10's fused
                  rope_kv_write at start 0: dq and dk rotated by -theta (the transpose of a rotation), dv
                  copied, all three put back into the projection's token-major layout
Cost: one read and one write of every element (the embedding backward also reads the ids); memory-bound.

Ladder (every op)
  cpu/prange  rung 1  rows (tokens, or table columns for the scatter-add) over the cores
  gpu/thread  rung 1  one thread per output element (consecutive threads -> consecutive elements of
                      the output, so writes coalesce; the permutes' reads are strided by D)
  transpose: cpu/tiles rung 2   64x64 tiles over the cores, each read and written while it sits in L1
  transpose: cpu/regs16 rung 3  the tiles moved as 16x16 blocks transposed in registers (whole-line loads
                      and stores, shuffles between them: compiler.transpose16x16)
  transpose: cpu/stream rung 4  rung 3's blocks with Y's 16 rows written by streaming stores (vmovntps: whole
                      lines, not read first: compiler.transpose16x16_nt) where Y's lines allow it, in
                      256x256 tiles walked along X's rows
  transpose: gpu/smem rung 2  32x32 tiles through shared memory (padded to 33 columns: no bank
                      conflicts), so both the reads and the writes coalesce
The scatter-add is deterministic on both backends: a thread (or core) owns a column of the table and
walks the tokens in order, so no two writers meet and there are no atomics.
"""
import math

import numpy as np
from ..compiler import cuda, njit, prange, sfence, transpose16x16, transpose16x16_nt

from ..device import ceil_div
from ..registry import define_op, register

THREADS = 256


# --------------------------------------------------------------------------------------- references
def ref_embedding(ids, table):
    return np.asarray(table, np.float64)[np.asarray(ids)]


def ref_embedding_bwd(ids, dx, n_vocab):
    out = np.zeros((n_vocab, dx.shape[1]))
    np.add.at(out, np.asarray(ids), np.asarray(dx, np.float64))
    return out


def ref_heads_merge(o):
    B, H, T, D = o.shape
    return np.asarray(o, np.float64).transpose(0, 2, 1, 3).reshape(B, T, H * D)


def ref_heads_split(dy, n_heads):
    B, T, C = dy.shape
    return np.asarray(dy, np.float64).reshape(B, T, n_heads, C // n_heads).transpose(0, 2, 1, 3)


def ref_transpose(X):
    return np.asarray(X, np.float64).T.copy()


def in_transpose(size, dtype, rng):
    M, K = size
    return (rng.standard_normal((M, K)).astype(dtype),)


def rotate_back(x, cos, sin):
    """x (B,H,T,D) rotated by -theta(t) (half-split pairs, positions 0..T-1), in float64."""
    x = np.asarray(x, np.float64)
    T, r2 = x.shape[2], cos.shape[1]
    c = np.asarray(cos, np.float64)[:T][None, None]
    s = np.asarray(sin, np.float64)[:T][None, None]
    a, b = x[..., :r2], x[..., r2:2 * r2]
    y = x.copy()
    y[..., :r2] = a * c + b * s
    y[..., r2:2 * r2] = b * c - a * s
    return y


def ref_qkv_rope_bwd(dq, dk, dv, cos, sin):
    B, H, T, D = dq.shape
    parts = [rotate_back(dq, cos, sin), rotate_back(dk, cos, sin), np.asarray(dv, np.float64)]
    return np.concatenate([p.transpose(0, 2, 1, 3) for p in parts], axis=2)  # (B,T,3H,D)


# ------------------------------------------------------------------------------------- inputs
def in_embedding(size, dtype, rng):
    M, V, C = size
    return rng.integers(0, V, M).astype(np.int32), rng.standard_normal((V, C)).astype(dtype)


def in_embedding_bwd(size, dtype, rng):
    M, V, C = size
    ids = rng.integers(0, max(1, V // 2), M).astype(np.int32)  # repeats, and rows nobody uses (zero)
    return ids, rng.standard_normal((M, C)).astype(dtype), V


def in_heads_merge(size, dtype, rng):
    B, H, T, D = size
    return (rng.standard_normal((B, H, T, D)).astype(dtype),)


def in_heads_split(size, dtype, rng):
    B, H, T, D = size
    return rng.standard_normal((B, T, H * D)).astype(dtype), H


def in_qkv_rope_bwd(size, dtype, rng):
    from .rope import cos_sin_cache

    B, H, T, D = size
    g = [rng.standard_normal((B, H, T, D)).astype(dtype) for _ in range(3)]
    cos, sin = cos_sin_cache(T, D, dtype=dtype)
    return (*g, cos, sin)


def edge_values(make):
    """Edge inputs: the normal ones with inf, -inf, NaN-free huge (3e38) and tiny (1e-45) values
    sprinkled into the float arrays (data movement must carry every value through unchanged)."""
    from ..registry import sprinkle

    def edge(size, dtype, rng):
        args = list(make(size, dtype, rng))
        for a in args:
            if isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.ndim >= 2 and a.size > 4:
                if make is in_qkv_rope_bwd and a.ndim == 2:
                    continue  # the cos/sin tables stay exact
                sprinkle(a, rng, [3e38, -3e38, 1e-45, 0.0])
        return tuple(args)

    return edge


SZ_EMB = {"check": [(1, 1, 1), (7, 5, 3), (37, 11, 33), (130, 97, 64)], "check_sim": [(1, 1, 1), (7, 5, 3), (9, 4, 17)],
          "bench": [(8192, 256, 768)], "bench_sim": [(7, 5, 3)]}
SZ_HEADS = {"check": [(1, 1, 1, 2), (2, 3, 5, 8), (3, 2, 37, 16), (1, 4, 67, 64)],
            "check_sim": [(1, 1, 1, 2), (2, 3, 5, 8)], "bench": [(8, 12, 1024, 64)], "bench_sim": [(2, 3, 5, 8)]}
_el = lambda s: float(np.prod(s))  # noqa: E731
_common = dict(chapter=13, kind="memory", tol=(1e-6, 1e-30))  # pure data movement: exact up to float32 rounding
define_op("embedding", reference=ref_embedding, make_inputs=in_embedding, title="token embedding (gather)",
          size_names=("M", "V", "C"), output_names=("x",), sizes=SZ_EMB, flops=lambda s: 0,
          bytes=lambda s, b: 2 * s[0] * s[2] * b, edge_inputs=edge_values(in_embedding), **_common)
define_op("embedding_bwd", reference=ref_embedding_bwd, make_inputs=in_embedding_bwd,
          title="token embedding backward (scatter-add)", size_names=("M", "V", "C"), output_names=("dtable",),
          sizes=SZ_EMB, flops=lambda s: s[0] * s[2], bytes=lambda s, b: (s[0] + s[1]) * s[2] * b,
          **{**_common, "tol": (1e-5, 1e-6)})  # sums of repeated rows in float32
define_op("heads_merge", reference=ref_heads_merge, make_inputs=in_heads_merge, title="(B,H,T,D) -> (B,T,H*D)",
          size_names=("B", "H", "T", "D"), output_names=("y",), sizes=SZ_HEADS, flops=lambda s: 0,
          bytes=lambda s, b: 2 * _el(s) * b, edge_inputs=edge_values(in_heads_merge), **_common)
define_op("heads_split", reference=ref_heads_split, make_inputs=in_heads_split, title="(B,T,H*D) -> (B,H,T,D)",
          size_names=("B", "H", "T", "D"), output_names=("do",), sizes=SZ_HEADS, flops=lambda s: 0,
          bytes=lambda s, b: 2 * _el(s) * b, edge_inputs=edge_values(in_heads_split), **_common)
define_op("transpose", reference=ref_transpose, make_inputs=in_transpose, title="Y = X^T",
          size_names=("M", "K"), output_names=("Y",), flops=lambda s: 0, bytes=lambda s, b: 2 * s[0] * s[1] * b,
          sizes={"check": [(1, 1), (3, 7), (33, 65), (130, 67)], "check_sim": [(1, 1), (3, 7), (33, 40)],
                 "bench": [(4096, 4096)], "bench_sim": [(33, 40)]},
          edge_inputs=edge_values(in_transpose), **_common)
define_op("qkv_rope_bwd", reference=ref_qkv_rope_bwd, make_inputs=in_qkv_rope_bwd,
          title="backward of the fused RoPE + head split", size_names=("B", "H", "T", "D"), output_names=("dqkv",),
          sizes=SZ_HEADS, flops=lambda s: 3 * _el(s), bytes=lambda s, b: 6 * _el(s) * b,
          **{**_common, "tol": (2e-6, 1e-6)})  # two products and a sum per element


# ------------------------------------------------------------------------------------------- CPU
@njit(cache=True, parallel=True)
def _emb(x, ids, table):
    for m in prange(ids.shape[0]):
        x[m, :] = table[ids[m], :]


@njit(cache=True, parallel=True)
def _emb_bwd(dtable, ids, dx):
    V, C = dtable.shape
    for c in prange(C):  # a core owns columns: no two cores write the same element
        for v in range(V):
            dtable[v, c] = 0.0
        for m in range(ids.shape[0]):
            dtable[ids[m], c] += dx[m, c]


@njit(cache=True, parallel=True)
def _merge(y, o):
    B, H, T, D = o.shape
    for bt in prange(B * T):
        b, t = bt // T, bt % T
        for h in range(H):
            y[b, t, h * D:(h + 1) * D] = o[b, h, t, :]


@njit(cache=True, parallel=True)
def _split(do, dy):
    B, H, T, D = do.shape
    for bt in prange(B * T):
        b, t = bt // T, bt % T
        for h in range(H):
            do[b, h, t, :] = dy[b, t, h * D:(h + 1) * D]


@njit(cache=True, parallel=True)
def _qkv_bwd(dqkv, dq, dk, dv, cos, sin):
    B, H, T, D = dq.shape
    r2 = cos.shape[1]
    for bt in prange(B * T):
        b, t = bt // T, bt % T
        for h in range(H):
            for i in range(D):
                dqkv[b, t, 2 * H + h, i] = dv[b, h, t, i]
            for i in range(r2, D - r2):
                dqkv[b, t, h, i] = dq[b, h, t, i]
                dqkv[b, t, H + h, i] = dk[b, h, t, i]
            for i in range(r2):
                c, s = cos[t, i], sin[t, i]
                a, bb = dq[b, h, t, i], dq[b, h, t, i + r2]
                dqkv[b, t, h, i] = a * c + bb * s
                dqkv[b, t, h, i + r2] = bb * c - a * s
                a, bb = dk[b, h, t, i], dk[b, h, t, i + r2]
                dqkv[b, t, H + h, i] = a * c + bb * s
                dqkv[b, t, H + h, i + r2] = bb * c - a * s


@njit(cache=True, parallel=True)
def _transpose(Y, X):
    M, K = X.shape
    for kb in prange((K + 31) // 32):  # 32-column strips of X: 32 rows of Y written per strip
        for i in range(M):
            for k in range(kb * 32, min(K, kb * 32 + 32)):
                Y[k, i] = X[i, k]


@register("transpose", "cpu", "prange", rung=1)
def transpose_cpu(Y, X):
    """Strips of 32 columns of X over the cores: each strip's 32 output rows stay in cache while the
    strip is read row by row. Predict a fraction of copy speed (one side is always strided)."""
    _transpose(Y, X)


TT = 64  # transpose tile: 64 x 64 float32 = 16 KiB read + 16 KiB written, both inside a 32-48 KiB L1


@njit(cache=True, parallel=True)
def _transpose_tiles(Y, X):
    M, K = X.shape
    tm = (M + TT - 1) // TT
    tk = (K + TT - 1) // TT
    for t in prange(tm * tk):
        i0 = (t // tk) * TT
        k0 = (t % tk) * TT
        i1 = min(M, i0 + TT)
        k1 = min(K, k0 + TT)
        for k in range(k0, k1):  # Y's row k: contiguous writes; X's column k: TT lines that stay in L1
            for i in range(i0, i1):
                Y[k, i] = X[i, k]


@register("transpose", "cpu", "tiles", rung=2)
def transpose_tiles(Y, X):
    """Cache-blocked (issue 36): 64 x 64 tiles over the cores, each read and written while both halves sit in
    L1 (16 KiB each), so every cache line of X and of Y comes from DRAM once and is used whole. Rung 1's strips
    touch 32 rows of Y per row of X, 512 KiB per strip, and ran at ~9 % of copy; predict >= 70 %."""
    _transpose_tiles(Y, X)


@njit(cache=True, parallel=True)
def _transpose_regs16(Y, X, i_a, k_a):
    M, K = X.shape
    nbi = (M - i_a) // 16  # whole 16 x 16 blocks from row i_a and column k_a of X (where lines start)
    nbk = (K - k_a) // 16
    i_e = i_a + nbi * 16
    k_e = k_a + nbk * 16
    tk = (nbk + 3) // 4
    for t in prange(((nbi + 3) // 4) * tk):  # tiles of 4 x 4 blocks (64 x 64) over the cores
        bi0 = (t // tk) * 4
        bk0 = (t % tk) * 4
        for bk in range(bk0, min(nbk, bk0 + 4)):  # 16 x 16 blocks in registers: 64-byte row loads and stores
            for bi in range(bi0, min(nbi, bi0 + 4)):
                transpose16x16(Y, X, i_a + bi * 16, k_a + bk * 16)
    for k in prange(K):  # what the blocks leave (row k of Y, element by element)
        if k < k_a or k >= k_e:
            for i in range(M):
                Y[k, i] = X[i, k]
        else:
            for i in range(i_a):
                Y[k, i] = X[i, k]
            for i in range(i_e, M):
                Y[k, i] = X[i, k]


def _line_start(a, n_cols):
    """The first column at which every row of the float32 array ``a`` starts a 64-byte line (0 when its rows
    do not all share one alignment)."""
    return min(n_cols, (-(a.ctypes.data // 4)) % 16) if n_cols % 16 == 0 and a.ctypes.data % 4 == 0 else 0


@register("transpose", "cpu", "regs16", rung=3)
def transpose_regs16(Y, X):
    """Rung 2's 64 x 64 tiles, each moved as 16 x 16 blocks transposed in registers (issue 36): 16 loads of 16
    floats, 64 two-source shuffles (`kernels asm`: vpermt2ps zmm, 4 per 16 values), 16 stores of 16 floats, so
    every load and store is a whole 64-byte line where rung 2 moved one float per instruction and read X down a
    column (one 4-byte load per line touched). The blocks start where X's and Y's rows start a line (NumPy's
    large arrays begin 16 bytes into one; the columns before are done one float at a time). Measured on the
    shared 2-core machine, A/B in one process: 1.1-1.4x rung 2 at 4096^2 (2.5x on one core in L2, 512 x 512).
    Predict the 4096^2 transpose moves from rung 2's ~26 % to >= 35 % of copy."""
    _transpose_regs16(Y, X, _line_start(Y, Y.shape[1]), _line_start(X, X.shape[1]))


TB = 16  # rung 4's tile: 16 x 16 blocks of 16 x 16 (256 x 256 floats)


@njit(cache=True, parallel=True)
def _transpose_stream(Y, X, i_a, k_a, nt):
    # rung 3's blocks in 256 x 256 tiles walked along X's rows; nt: every block row &Y[k, i_a + 16 bi] starts a
    # 64-byte line, so the blocks' stores stream
    M, K = X.shape
    nbi = (M - i_a) // 16
    nbk = (K - k_a) // 16
    i_e = i_a + nbi * 16
    k_e = k_a + nbk * 16
    tk = (nbk + TB - 1) // TB
    for t in prange(((nbi + TB - 1) // TB) * tk):
        bi0 = (t // tk) * TB
        bk0 = (t % tk) * TB
        for bi in range(bi0, min(nbi, bi0 + TB)):  # 16 rows of X, read left to right: 16 sequential streams
            for bk in range(bk0, min(nbk, bk0 + TB)):
                if nt:
                    transpose16x16_nt(Y, X, i_a + bi * 16, k_a + bk * 16)
                else:
                    transpose16x16(Y, X, i_a + bi * 16, k_a + bk * 16)
        if nt:
            sfence()  # this tile's streaming stores visible before the thread moves on
    for k in prange(K):  # what the blocks leave, element by element (ordinary stores)
        if k < k_a or k >= k_e:
            for i in range(M):
                Y[k, i] = X[i, k]
        else:
            for i in range(i_a):
                Y[k, i] = X[i, k]
            for i in range(i_e, M):
                Y[k, i] = X[i, k]


@register("transpose", "cpu", "stream", rung=4)
def transpose_stream(Y, X):
    """Rung 3 with each 16 x 16 block's 16 rows of Y written by streaming stores (vmovntps: a whole 64-byte line
    written without being read first), where Y's rows are a whole number of lines (M % 16 == 0) and the blocks
    start one; elsewhere rung 3's ordinary stores. Rung 3's stores read every line of Y before writing it
    (write-allocate): 3 lines through the bus per 2 counted; streaming: 2. The blocks go in 256 x 256 tiles walked
    along X's rows (16 rows read left to right: sequential streams the prefetcher follows), where rung 3 walked
    64 x 64 tiles down X's columns. A/B in one process on a busy 2-core AVX2 EPYC (no AVX-512: each block is
    shuffled in ymm halves), 4096^2: streaming stores alone (rung 3's tiles and order) 1.2-1.3x rung 3; this rung
    1.9x rung 3 on two threads (49-50 % of that run's copy against 26-27 %) and 2.2x on one. Predict rung 3's
    ~36 % of copy -> >= 70 %."""
    i_a = _line_start(Y, Y.shape[1])
    nt = Y.shape[1] % 16 == 0 and (Y.ctypes.data + 4 * i_a) % 64 == 0
    _transpose_stream(Y, X, i_a, _line_start(X, X.shape[1]), nt)


@njit(cache=True)
def _bucket_tokens(ids, V):
    # counting sort of the token positions by id, positions in increasing order inside each id (stable)
    start = np.zeros(V + 1, np.int64)
    for m in range(ids.shape[0]):
        start[ids[m] + 1] += 1
    for v in range(V):
        start[v + 1] += start[v]
    order = np.empty(ids.shape[0], np.int64)
    fill = start[:V].copy()
    for m in range(ids.shape[0]):
        order[fill[ids[m]]] = m
        fill[ids[m]] += 1
    return start, order


@njit(cache=True, parallel=True)
def _emb_bwd_sorted(dtable, start, order, dx):
    V, C = dtable.shape
    for v in prange(V):  # a core owns whole rows of the table: no two cores write the same element
        for c in range(C):
            dtable[v, c] = 0.0
        for p in range(start[v], start[v + 1]):
            m = order[p]
            for c in range(C):  # one contiguous row of dx added to one contiguous row of dtable: SIMD
                dtable[v, c] += dx[m, c]


ROW_CHUNKS = 64  # rung 3: table rows dealt round-robin to this many chunks (chunk c owns rows c, c+64, ...)


@njit(cache=True, parallel=True)
def _emb_bwd_dealt(dtable, start, order, dx):
    V, C = dtable.shape
    for ch in prange(ROW_CHUNKS):
        for v in range(ch, V, ROW_CHUNKS):  # still one owner per row: race-free, and the same sums in the same order
            for c in range(C):
                dtable[v, c] = 0.0
            for p in range(start[v], start[v + 1]):
                m = order[p]
                for c in range(C):
                    dtable[v, c] += dx[m, c]


@register("embedding_bwd", "cpu", "sorted", rung=2)
def embedding_bwd_sorted(dtable, ids, dx, n_vocab):
    """Sort by token (issue 36): a counting sort of the M positions by id (O(M), serial, stable), then the vocab
    rows over the cores, each adding its tokens' dx rows in position order. Race-free without atomics and
    deterministic (each row sums in the same order as the serial loop); rows are read and written whole, so
    predict >= 70 % of copy where rung 1's column ownership read dx with stride C (~2 %)."""
    start, order = _bucket_tokens(ids, dtable.shape[0])
    _emb_bwd_sorted(dtable, start, order, dx)


@register("embedding_bwd", "cpu", "dealt", rung=3)
def embedding_bwd_dealt(dtable, ids, dx, n_vocab):
    """Rung 2 with the table rows dealt round-robin (issue 36): prange splits its range into one contiguous
    block per thread, and token ids are not spread evenly over the vocabulary (the bench's use half of it, a real
    text's frequent tokens cluster at low ids in a BPE vocabulary), so on 2 cores one thread had nearly all the
    rows with tokens and the other mostly zeros to write. Here chunk c of 64 owns rows c, c + 64, ...: each
    thread gets every busy region's share. Same owner per row, same order of sums: the same bits as rung 2.
    Predict ~2x rung 2 on these inputs (its 40 % of copy was one core's worth), >= 70 % of copy."""
    start, order = _bucket_tokens(ids, dtable.shape[0])
    _emb_bwd_dealt(dtable, start, order, dx)


@register("embedding", "cpu", "prange", rung=1)
def embedding_cpu(x, ids, table):
    """Token rows copied over the cores: a gather, 2*M*C elements moved. Predict ~copy speed."""
    _emb(x, ids, table)


@register("embedding_bwd", "cpu", "prange", rung=1)
def embedding_bwd_cpu(dtable, ids, dx, n_vocab):
    """Columns of the table over the cores, tokens in order: deterministic, no atomics. dx is read
    with stride C per core (column ownership), which costs cache lines; fine at C <= 1024."""
    _emb_bwd(dtable, ids, dx)


@register("heads_merge", "cpu", "prange", rung=1)
def heads_merge_cpu(y, o):
    """(b, t) rows over the cores, each gathering its H head slices of D: contiguous writes."""
    _merge(y, o)


@register("heads_split", "cpu", "prange", rung=1)
def heads_split_cpu(do, dy, n_heads):
    """The inverse permute: (b, t) rows over the cores, each scattering H slices of D."""
    _split(do, dy)


@register("qkv_rope_bwd", "cpu", "prange", rung=1)
def qkv_rope_bwd_cpu(dqkv, dq, dk, dv, cos, sin):
    """(b, t) rows over the cores: dq, dk rotated back by -theta(t), dv copied, into token-major dqkv."""
    _qkv_bwd(dqkv, dq, dk, dv, cos, sin)


# ------------------------------------------------------------------------------------------- GPU
@cuda.jit
def embedding_kernel(x, ids, table):
    i = cuda.grid(1)
    C = x.shape[1]
    if i < x.shape[0] * C:
        m = i // C
        x[m, i - m * C] = table[ids[m], i - m * C]


@cuda.jit
def embedding_bwd_kernel(dtable, ids, dx):
    i = cuda.grid(1)  # one thread per table element: walks the tokens in order (deterministic)
    V, C = dtable.shape
    if i < V * C:
        v = i // C
        c = i - v * C
        acc = np.float32(0.0)
        for m in range(ids.shape[0]):
            if ids[m] == v:
                acc += dx[m, c]
        dtable[v, c] = acc


@cuda.jit
def heads_merge_kernel(y, o):
    i = cuda.grid(1)
    B, H, T, D = o.shape
    if i < B * H * T * D:
        d = i % D
        h = (i // D) % H
        t = (i // (D * H)) % T
        b = i // (D * H * T)
        y[b, t, h * D + d] = o[b, h, t, d]


@cuda.jit
def heads_split_kernel(do, dy):
    i = cuda.grid(1)
    B, H, T, D = do.shape
    if i < B * H * T * D:
        d = i % D
        t = (i // D) % T
        h = (i // (D * T)) % H
        b = i // (D * T * H)
        do[b, h, t, d] = dy[b, t, h * D + d]


@cuda.jit
def qkv_rope_bwd_kernel(dqkv, dq, dk, dv, cos, sin):
    i = cuda.grid(1)
    B, T, H3, D = dqkv.shape
    H = H3 // 3
    r2 = cos.shape[1]
    if i < B * T * H3 * D:
        d = i % D
        j = (i // D) % H3
        t = (i // (D * H3)) % T
        b = i // (D * H3 * T)
        if j >= 2 * H:
            dqkv[b, t, j, d] = dv[b, j - 2 * H, t, d]
            return
        g = dq if j < H else dk
        h = j if j < H else j - H
        if d < r2:
            dqkv[b, t, j, d] = g[b, h, t, d] * cos[t, d] + g[b, h, t, d + r2] * sin[t, d]
        elif d < 2 * r2:
            e = d - r2
            dqkv[b, t, j, d] = g[b, h, t, d] * cos[t, e] - g[b, h, t, e] * sin[t, e]
        else:
            dqkv[b, t, j, d] = g[b, h, t, d]


@cuda.jit
def transpose_kernel(Y, X):
    j, i = cuda.grid(2)  # x -> column of X (coalesced reads), strided writes
    if i < X.shape[0] and j < X.shape[1]:
        Y[j, i] = X[i, j]


@cuda.jit
def transpose_smem_kernel(Y, X):
    tile = cuda.shared.array((32, 33), np.float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y  # 32 x 8 threads, 4 rows each
    i0, j0 = cuda.blockIdx.y * 32, cuda.blockIdx.x * 32
    for r in range(ty, 32, 8):
        if i0 + r < X.shape[0] and j0 + tx < X.shape[1]:
            tile[r, tx] = X[i0 + r, j0 + tx]
    cuda.syncthreads()
    for r in range(ty, 32, 8):
        if j0 + r < X.shape[1] and i0 + tx < X.shape[0]:
            Y[j0 + r, i0 + tx] = tile[tx, r]


def _grid(n):
    return max(1, ceil_div(n, THREADS)), THREADS


_F2, _F4, _I1 = "float32[:, ::1]", "float32[:, :, :, ::1]", "int32[::1]"
_F3 = "float32[:, :, ::1]"


@register("embedding", "gpu", "thread", rung=1, ptx=[(embedding_kernel, f"void({_F2}, {_I1}, {_F2})")])
def embedding_gpu(x, ids, table):
    """One thread per output element: a warp copies 32 consecutive floats of one token row (coalesced).
    Predict near copy bandwidth for C >= 32."""
    embedding_kernel[_grid(x.size)](x, ids, table)


@register("embedding_bwd", "gpu", "thread", rung=1, ptx=[(embedding_bwd_kernel, f"void({_F2}, {_I1}, {_F2})")])
def embedding_bwd_gpu(dtable, ids, dx, n_vocab):
    """One thread per table element scans all M ids and adds the matching rows: deterministic and
    atomic-free, but O(V*M) id reads: fine for a char-level vocabulary, wrong for 50k tokens (there,
    sort the ids or use atomics)."""
    embedding_bwd_kernel[_grid(dtable.size)](dtable, ids, dx)


@register("heads_merge", "gpu", "thread", rung=1, ptx=[(heads_merge_kernel, f"void({_F3}, {_F4})")])
def heads_merge_gpu(y, o):
    """One thread per element in input order: reads coalesce, writes are D-long runs. ~copy speed."""
    heads_merge_kernel[_grid(o.size)](y, o)


@register("heads_split", "gpu", "thread", rung=1, ptx=[(heads_split_kernel, f"void({_F4}, {_F3})")])
def heads_split_gpu(do, dy, n_heads):
    """One thread per element in output order: writes coalesce, reads are D-long runs. ~copy speed."""
    heads_split_kernel[_grid(do.size)](do, dy)


@register("qkv_rope_bwd", "gpu", "thread", rung=1,
          ptx=[(qkv_rope_bwd_kernel, f"void({_F4}, {_F4}, {_F4}, {_F4}, {_F2}, {_F2})")])
def qkv_rope_bwd_gpu(dqkv, dq, dk, dv, cos, sin):
    """One thread per element of dqkv (coalesced writes); each rotated element reads itself, its pair
    partner and (c, s). Predict ~copy speed: 6 elements moved per 3 output elements' worth of inputs."""
    qkv_rope_bwd_kernel[_grid(dqkv.size)](dqkv, dq, dk, dv, cos, sin)


@register("transpose", "gpu", "thread", rung=1, ptx=[(transpose_kernel, f"void({_F2}, {_F2})")])
def transpose_gpu(Y, X):
    """One thread per element, threadIdx.x along the rows of X: reads coalesce, writes are 4*M bytes
    apart (one sector per float). Predict ~1/8 of copy bandwidth for large M."""
    M, K = X.shape
    transpose_kernel[(ceil_div(K, 32), ceil_div(M, 8)), (32, 8)](Y, X)


@register("transpose", "gpu", "smem", rung=2, ptx=[(transpose_smem_kernel, f"void({_F2}, {_F2})")])
def transpose_smem_gpu(Y, X):
    """32x32 tiles staged in shared memory (33 columns: the column reads hit 32 different banks):
    reads and writes both coalesce. Predict close to copy bandwidth."""
    M, K = X.shape
    transpose_smem_kernel[(ceil_div(K, 32), ceil_div(M, 32)), (32, 8)](Y, X)
