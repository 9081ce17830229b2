"""Convolution: conv1d, conv2d and conv2d's backward (chapter 17). Pooling is in ``pool.py``.

Convention: torch's, a cross-correlation (the filter is NOT flipped), batch-first, channels-first (NCHW).

conv2d  x (N,C,H,W), w (K,C,R,S), stride, pad -> y (N,K,P,Q)
        P = (H + 2 pad - R) // stride + 1,  Q = (W + 2 pad - S) // stride + 1
        y[n,k,p,q] = sum_{c,r,s} x[n, c, p*stride - pad + r, q*stride - pad + s] * w[k,c,r,s]
        (x is zero outside 0 <= h < H, 0 <= w < W: that is what padding means)
conv1d  x (N,C,L), w (K,C,R), stride, pad -> y (N,K,P), the same with one spatial axis
dx      dy (N,K,P,Q), w (K,C,R,S) -> dx (N,C,H,W): the transposed convolution, each x element
        collects dy[n,k,p,q] * w[k,c,r,s] from every output whose window covered it
dw      x (N,C,H,W), dy (N,K,P,Q) -> dw (K,C,R,S): a correlation of x with dy over n, p, q

Cost (conv2d): 2 N K P Q C R S FLOPs, i.e. a GEMM with M = K, N = N P Q and a depth of C R S. At least
        x, w and y move once: (NCHW + KCRS + NKPQ) * 4 bytes. Chapter 17's shape (N 32, C = K = 64, 56 x 56,
        3 x 3, stride 1, pad 1): 7.4 GFLOP on 51 MB, about 144 FLOP per byte: compute-bound, like a GEMM.
        im2col makes that GEMM explicit by copying every window into a (CRS, NPQ) matrix: R S = 9 copies of
        x, 231 MB written and read again for a 26 MB input. Implicit GEMM runs the same tiles but computes
        each (c, r, s) -> x index while loading, so the matrix never exists.

Ladder (conv2d; conv1d has the direct and tiled rungs; dx and dw have their own short ladders)
  cpu/numpy         baseline  im2col with sliding_window_view, then one numpy.matmul (what a student writes)
  cpu/torch         baseline  torch.nn.functional.conv2d on the CPU (oneDNN)
  cpu/direct        rung 1    seven loops in the formula's order, @njit
  cpu/direct_par    rung 2    the same loops, (n, k) pairs spread over cores with prange
  cpu/im2col_gemm   rung 3    per image: im2col (prange) into a (CRS, PQ) matrix, then the course's packed
                              CPU GEMM (chapter 5, rung 8) writes y[n] as a (K, PQ) matrix in place
  cpu/im2row_gemm   rung 4    x to zero-padded NHWC, each output pixel's window as a row (R runs of S C
                              contiguous floats), ONE gemm_cpu_best call with the N P Q pixels as rows, a
                              transpose to NCHW (conv1d's rung 2 the same, its im2row matrix a strided view;
                              dx's gemm_row2im and dw's im2col_gemm are the backward's GEMM rungs)
  gpu/cudnn         baseline  torch's conv2d (cuDNN), TF32 off
  gpu/direct        rung 1    one thread per output, C R S loads of x and of w each
  gpu/tiled         rung 2    a block owns a tile of outputs for KB channels: the input tile plus its halo
                              and the KB filters are staged in shared memory once per input channel
  gpu/im2col_gemm   rung 3    im2col kernel, the course's warp-tiled GEMM (chapter 5, rung 11), a permute
  gpu/implicit_gemm rung 4    GEMM tiles (64 channels x 128 pixels x 8 of CRS) whose B loads gather x through
                              a (c, r, s) -> offset table: the im2col matrix is never written
"""
from __future__ import annotations

import numpy as np

from ..compiler import cuda, float32, int64 as cuda_int64, load4, njit, prange
from .. import device
from ..device import ceil_div
from ..registry import define_op, exercise_op, register
from . import gemm
from .gemm import gemm_cpu_best  # the course's fastest CPU GEMM (chapter 5), by its stable name
from .cpu_baselines import torch_cpu, tviews

EPS32 = float(np.finfo(np.float32).eps)


# ====================================================================================== references
def out_len(n, r, stride, pad):
    """Output length along one axis: windows of r taps, stride apart, over n + 2 pad positions."""
    return (n + 2 * pad - r) // stride + 1


def _windows(x, r, s, stride, pad, p, q, fill=0.0):
    """The (r, s)-th tap of every window: x_pad[:, :, r + stride*i, s + stride*j] -> (N, C, P, Q), float64."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=fill)
    return xp[:, :, r:r + stride * (p - 1) + 1:stride, s:s + stride * (q - 1) + 1:stride]


def reference(x, w, stride, pad):
    """float64 oracle of conv2d: for each filter tap (r, s), add the shifted, strided input times w[:, :, r, s]."""
    N, C, H, W = x.shape
    K, _, R, S = w.shape
    P, Q = out_len(H, R, stride, pad), out_len(W, S, stride, pad)
    y = np.zeros((N, K, P, Q))
    for r in range(R):
        for s in range(S):
            y += np.einsum("ncpq,kc->nkpq", _windows(x, r, s, stride, pad, P, Q), w[:, :, r, s].astype(np.float64))
    return y


def reference_1d(x, w, stride, pad):
    """conv1d as conv2d with H = R = 1 and no padding along H."""
    N, C, L = x.shape
    K, _, R = w.shape
    P = out_len(L, R, stride, pad)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad)))
    y = np.zeros((N, K, P))
    for r in range(R):
        y += np.einsum("ncp,kc->nkp", xp[:, :, r:r + stride * (P - 1) + 1:stride], w[:, :, r].astype(np.float64))
    return y


def reference_dx(dy, w, H, W, stride, pad):
    """dx = the adjoint of conv2d in x: every tap scatters dy * w back onto the padded input, then the pad is cut."""
    N, K, P, Q = dy.shape
    _, C, R, S = w.shape
    dxp = np.zeros((N, C, H + 2 * pad + stride, W + 2 * pad + stride))
    for r in range(R):
        for s in range(S):
            dxp[:, :, r:r + stride * (P - 1) + 1:stride, s:s + stride * (Q - 1) + 1:stride] += np.einsum(
                "nkpq,kc->ncpq", dy.astype(np.float64), w[:, :, r, s].astype(np.float64))
    return dxp[:, :, pad:pad + H, pad:pad + W]


def reference_dw(x, dy, R, S, stride, pad):
    """dw[k, c, r, s] = sum over n, p, q of dy[n, k, p, q] times the (r, s)-th tap of x's windows."""
    N, C, H, W = x.shape
    K, P, Q = dy.shape[1:]
    dw = np.zeros((K, C, R, S))
    for r in range(R):
        for s in range(S):
            dw[:, :, r, s] = np.einsum("ncpq,nkpq->kc", _windows(x, r, s, stride, pad, P, Q), dy.astype(np.float64))
    return dw


# ========================================================================================== inputs
# size = (N, C, H, W, K, R, S, stride, pad)
SIZE_NAMES = ("N", "C", "H", "W", "K", "R", "S", "stride", "pad")


def make_inputs(size, dtype, rng):
    N, C, H, W, K, R, S, stride, pad = size
    x = rng.standard_normal((N, C, H, W)).astype(dtype)
    w = rng.standard_normal((K, C, R, S)).astype(dtype)
    return x, w, int(stride), int(pad)


def make_edge_inputs(size, dtype, rng):
    """Zeros, signed zeros, tiny magnitudes, a NaN and an inf in x: a NaN (and inf times w's mixed signs) must
    reach every output whose window holds it and no other, as in the reference. (No huge finite values: a
    1e30 and a -1e30 in one window cancel differently in every summation order.)"""
    x, w, stride, pad = make_inputs(size, dtype, rng)
    if x.size:
        from ..registry import sprinkle

        x = sprinkle(x, rng, [0.0, -0.0, 1e-38, -1e-45, np.nan, np.inf])
    return x, w, stride, pad


def make_inputs_1d(size, dtype, rng):
    N, C, L, K, R, stride, pad = size
    x = rng.standard_normal((N, C, L)).astype(dtype)
    w = rng.standard_normal((K, C, R)).astype(dtype)
    return x, w, int(stride), int(pad)


def make_inputs_dx(size, dtype, rng):
    N, C, H, W, K, R, S, stride, pad = size
    P, Q = out_len(H, R, stride, pad), out_len(W, S, stride, pad)
    dy = rng.standard_normal((N, K, P, Q)).astype(dtype)
    w = rng.standard_normal((K, C, R, S)).astype(dtype)
    return dy, w, int(H), int(W), int(stride), int(pad)


def make_inputs_dw(size, dtype, rng):
    N, C, H, W, K, R, S, stride, pad = size
    P, Q = out_len(H, R, stride, pad), out_len(W, S, stride, pad)
    x = rng.standard_normal((N, C, H, W)).astype(dtype)
    dy = rng.standard_normal((N, K, P, Q)).astype(dtype)
    return x, dy, int(R), int(S), int(stride), int(pad)


def sum_tol(terms):
    """Tolerance for outputs that are sums of ``terms`` products of standard normals (chapter 5's GEMM model):
    the value is ~sqrt(terms), the float32 rounding a random walk of ~sqrt(terms) steps of eps * sqrt(terms),
    allowed 8x (a reordered sum such as cuDNN's Winograd transform is in that budget); a dropped tap is off by
    ~1, hundreds of times more."""
    def tol(size, dtype):
        t = max(1, terms(size))
        if np.dtype(dtype) == np.float64:
            return 1e-10, 1e-12 * t
        return 1e-5, 8.0 * t * EPS32 + 1e-6
    return tol


def conv_flops(s):
    N, C, H, W, K, R, S, stride, pad = s
    return 2 * N * K * out_len(H, R, stride, pad) * out_len(W, S, stride, pad) * C * R * S


def conv_bytes(s, b):
    N, C, H, W, K, R, S, stride, pad = s
    return (N * C * H * W + K * C * R * S + N * K * out_len(H, R, stride, pad) * out_len(W, S, stride, pad)) * b


def im2col_extra_bytes(s, b=4):
    """Bytes the im2col rung moves beyond conv_bytes: the (CRS, NPQ) matrix written and read once, and (GPU)
    the (K, NPQ) product written and read once more by the permute to NCHW."""
    N, C, H, W, K, R, S, stride, pad = s
    npq = N * out_len(H, R, stride, pad) * out_len(W, S, stride, pad)
    return (2 * C * R * S * npq + 2 * K * npq) * b


BENCH2D = (32, 64, 56, 56, 64, 3, 3, 1, 1)  # the shape: ResNet's 3x3 layer at 56 x 56
SIZES2D = {
    # 1, primes, odd sizes, stride 2, padding, one channel, filters larger than the GPU tile (the simulator's
    # tile is 4 x 4 outputs: R = 5 > 4) and wider than the input with padding, batch 1
    "check": [(1, 1, 1, 1, 1, 1, 1, 1, 0), (1, 1, 7, 5, 1, 3, 3, 1, 1), (2, 3, 9, 11, 5, 3, 3, 2, 1),
              (1, 5, 13, 7, 3, 5, 5, 1, 2), (3, 2, 8, 8, 4, 1, 1, 2, 0), (1, 1, 3, 3, 2, 5, 5, 1, 2),
              (2, 7, 17, 19, 9, 3, 5, 2, 2), (1, 16, 20, 20, 70, 3, 3, 1, 1), (2, 13, 31, 29, 67, 7, 7, 2, 3)],
    "check_sim": [(1, 1, 1, 1, 1, 1, 1, 1, 0), (1, 1, 7, 5, 1, 3, 3, 1, 1), (2, 3, 9, 7, 5, 3, 3, 2, 1),
                  (1, 2, 6, 5, 3, 5, 5, 1, 2)],
    "bench": [(4, 32, 28, 28, 32, 3, 3, 1, 1), (8, 64, 28, 28, 64, 3, 3, 1, 1)],
    "bench_gpu": [BENCH2D, (32, 128, 28, 28, 128, 3, 3, 1, 1), (32, 64, 56, 56, 64, 3, 3, 2, 1)],
    "bench_sim": [(1, 2, 6, 5, 3, 3, 3, 1, 1)],
}

define_op("conv2d", reference=reference, make_inputs=make_inputs, chapter=17, title="2D convolution (NCHW)",
          size_names=SIZE_NAMES, kind="compute", output_names=("y",), edge_inputs=make_edge_inputs,
          tol=sum_tol(lambda s: s[1] * s[5] * s[6]), flops=conv_flops, bytes=conv_bytes, sizes=SIZES2D)

define_op("conv1d", reference=reference_1d, make_inputs=make_inputs_1d, chapter=17, title="1D convolution (NCL)",
          size_names=("N", "C", "L", "K", "R", "stride", "pad"), kind="compute", output_names=("y",),
          tol=sum_tol(lambda s: s[1] * s[4]),
          flops=lambda s: 2 * s[0] * s[3] * out_len(s[2], s[4], s[5], s[6]) * s[1] * s[4],
          bytes=lambda s, b: (s[0] * s[1] * s[2] + s[3] * s[1] * s[4] + s[0] * s[3] * out_len(s[2], s[4], s[5], s[6])) * b,
          sizes={"check": [(1, 1, 1, 1, 1, 1, 0), (1, 1, 37, 1, 5, 1, 2), (2, 3, 100, 4, 7, 2, 3),
                           (1, 2, 5, 3, 9, 1, 4), (3, 5, 257, 6, 3, 1, 1), (2, 4, 1000, 8, 31, 3, 15)],
                 "check_sim": [(1, 1, 1, 1, 1, 1, 0), (1, 1, 37, 1, 5, 1, 2), (2, 3, 41, 2, 7, 2, 3),
                               (1, 2, 5, 3, 9, 1, 4)],
                 "bench": [(16, 64, 4096, 64, 5, 1, 2)], "bench_gpu": [(16, 256, 4096, 256, 5, 1, 2)],
                 "bench_sim": [(1, 2, 41, 2, 5, 1, 2)]})

define_op("conv2d_bwd_dx", reference=reference_dx, make_inputs=make_inputs_dx, chapter=17,
          title="conv2d backward to the input (a transposed convolution)", size_names=SIZE_NAMES, kind="compute",
          output_names=("dx",), tol=sum_tol(lambda s: s[4] * s[5] * s[6]), flops=conv_flops, bytes=conv_bytes,
          sizes=SIZES2D)

define_op("conv2d_bwd_dw", reference=reference_dw, make_inputs=make_inputs_dw, chapter=17,
          title="conv2d backward to the weights (a correlation)", size_names=SIZE_NAMES, kind="compute",
          output_names=("dw",), flops=conv_flops, bytes=conv_bytes,
          tol=sum_tol(lambda s: s[0] * out_len(s[2], s[5], s[7], s[8]) * out_len(s[3], s[6], s[7], s[8])),
          sizes=dict(SIZES2D, bench_gpu=[BENCH2D]))


def check_args(x, w, stride, pad):
    if stride < 1 or pad < 0:
        raise ValueError(f"conv: stride must be >= 1 and pad >= 0, got stride={stride}, pad={pad}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"conv: x has {x.shape[1]} channels, w expects {w.shape[1]}")
    for n, r in zip(x.shape[2:], w.shape[2:]):
        if out_len(n, r, stride, pad) < 1:
            raise ValueError(f"conv: a {r}-tap filter does not fit {n} + 2*{pad} positions")


# ============================================================================================= CPU
def im2col_numpy(x, R, S, stride, pad):
    """(C R S, N P Q) matrix of every window, built with sliding_window_view (a copy at the reshape)."""
    N, C, H, W = x.shape
    P, Q = out_len(H, R, stride, pad), out_len(W, S, stride, pad)
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (R, S), axis=(2, 3))[:, :, ::stride, ::stride][:, :, :P, :Q]
    return win.transpose(1, 4, 5, 0, 2, 3).reshape(C * R * S, N * P * Q)  # (C,R,S,N,P,Q)


@register("conv2d", "cpu", "numpy", baseline=True)
def conv2d_numpy(y, x, w, stride, pad):
    """im2col with sliding_window_view, then one numpy.matmul (BLAS) and a transpose into NCHW."""
    check_args(x, w, stride, pad)
    K, C, R, S = w.shape
    N, _, P, Q = y.shape
    col = im2col_numpy(x, R, S, stride, pad)
    y[...] = (w.reshape(K, C * R * S) @ col).reshape(K, N, P, Q).transpose(1, 0, 2, 3)


@register("conv2d", "cpu", "torch", baseline=True, requires=torch_cpu)
def conv2d_torch_cpu(y, x, w, stride, pad):
    """torch.nn.functional.conv2d on the CPU (oneDNN), same thread count, copied into y."""
    import torch

    ty, tx, tw = tviews(y, x, w)
    ty.copy_(torch.nn.functional.conv2d(tx, tw, stride=stride, padding=pad))


@njit(fastmath=True, cache=True)
def conv_point(x, w, n, k, p, q, stride, pad):
    """y[n, k, p, q]: the C R S products of one window, skipping taps that fall in the padding."""
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    R, S = w.shape[2], w.shape[3]
    acc = np.float32(0.0)
    for c in range(C):
        for r in range(R):
            h = p * stride - pad + r
            if 0 <= h < H:
                for s in range(S):
                    ww = q * stride - pad + s
                    if 0 <= ww < W:
                        acc += x[n, c, h, ww] * w[k, c, r, s]
    return acc


@njit(fastmath=True, cache=True)
def conv2d_direct(y, x, w, stride, pad):
    N, K, P, Q = y.shape
    for n in range(N):
        for k in range(K):
            for p in range(P):
                for q in range(Q):
                    y[n, k, p, q] = conv_point(x, w, n, k, p, q, stride, pad)


@register("conv2d", "cpu", "direct", rung=1)
def conv2d_direct_cpu(y, x, w, stride, pad):
    """The formula as loops: for every output, C R S multiply-adds with a bounds test per tap.
    The innermost loop runs over S = 3 taps, too short to vectorize, and each w load is a scalar: predict
    ~1-2 GFLOP/s on one core, 50-100x below BLAS."""
    check_args(x, w, stride, pad)
    conv2d_direct(y, x, w, stride, pad)


@njit(fastmath=True, parallel=True, cache=True)
def conv2d_direct_par(y, x, w, stride, pad):
    N, K, P, Q = y.shape
    for nk in prange(N * K):
        n, k = nk // K, nk % K
        for p in range(P):
            for q in range(Q):
                y[n, k, p, q] = conv_point(x, w, n, k, p, q, stride, pad)


@register("conv2d", "cpu", "direct_par", rung=2)
def conv2d_direct_par_cpu(y, x, w, stride, pad):
    """Rung 1 with the N K output planes spread over the cores (prange): each plane is independent, so
    predict P x rung 1 on P cores and still far below BLAS (the inner loops did not change)."""
    check_args(x, w, stride, pad)
    conv2d_direct_par(y, x, w, stride, pad)


@njit(cache=True)
def im2col_image(col, x, n, R, S, stride, pad):
    """col (C R S, P Q) <- the windows of image n: col[(c, r, s), (p, q)] = x[n, c, p stride - pad + r, ...]."""
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    PQ = col.shape[1]
    Q = (W + 2 * pad - S) // stride + 1
    for row in range(C * R * S):
        c = row // (R * S)
        r = (row // S) % R
        s = row % S
        for pq in range(PQ):
            h = (pq // Q) * stride - pad + r
            ww = (pq % Q) * stride - pad + s
            col[row, pq] = x[n, c, h, ww] if (0 <= h < H and 0 <= ww < W) else np.float32(0.0)


@njit(fastmath=True, parallel=True, cache=True)
def im2col_gemm_images(y, x, w2, cols, packs, R, S, stride, pad):
    """Images spread over T tasks (cols, packs: one im2col matrix and one packed copy of it per task); each
    image is im2col, then chapter 5's single-core packed GEMM (rung 7) into y[n] viewed as (K, P Q)."""
    N, K, P, Q = y.shape
    T = cols.shape[0]
    for t in prange(T):
        for n in range(t, N, T):
            im2col_image(cols[t], x, n, R, S, stride, pad)
            gemm._pack_b(packs[t], cols[t])
            gemm._gemm_packed(y[n].reshape(K, P * Q), w2, packs[t])


@register("conv2d", "cpu", "im2col_gemm", rung=3,
          bytes=lambda s, b: conv_bytes(s, b) + 2 * s[1] * s[5] * s[6] * out_len(s[2], s[5], s[7], s[8])
          * out_len(s[3], s[6], s[7], s[8]) * b)
def conv2d_im2col_cpu(y, x, w, stride, pad):
    """Per image: im2col into a (C R S, P Q) matrix, then the course's packed CPU GEMM (chapter 5, rung 7)
    computes y[n] = W (K, C R S) @ col as a (K, P Q) matrix, written straight into y (NCHW is that layout).
    The images, not the GEMM's rows, go to the cores: with K = 64 filters the GEMM has a single 64-row block,
    which rung 8's prange could give to one core only. All the FLOPs now run in the GEMM's 4x6 micro-kernel:
    predict ~50-70 % of the GEMM's own speed (the im2col copy is memory traffic on R S copies of x; one
    image's matrix stays in L2/L3)."""
    check_args(x, w, stride, pad)
    from ..compiler import get_num_threads

    N, C, H, W = x.shape
    K, _, R, S = w.shape
    P, Q = y.shape[2], y.shape[3]
    T = max(1, min(get_num_threads(), N))
    cols = np.empty((T, C * R * S, P * Q), np.float32)
    packs = np.empty((T,) + gemm._packed_buffers(cols[0], cols[0]).shape, np.float32)
    w2 = np.ascontiguousarray(w.reshape(K, C * R * S))
    im2col_gemm_images(y, x, w2, cols, packs, R, S, stride, pad)


# conv1d on the CPU
@register("conv1d", "cpu", "numpy", baseline=True)
def conv1d_numpy(y, x, w, stride, pad):
    """im2col along L with sliding_window_view, then numpy.matmul."""
    N, C, L = x.shape
    K, _, R = w.shape
    P = y.shape[2]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, R, axis=2)[:, :, ::stride][:, :, :P]  # (N, C, P, R)
    col = win.transpose(1, 3, 0, 2).reshape(C * R, N * P)
    y[...] = (w.reshape(K, C * R) @ col).reshape(K, N, P).transpose(1, 0, 2)


@njit(fastmath=True, parallel=True, cache=True)
def conv1d_direct_par(y, x, w, stride, pad):
    N, K, P = y.shape
    C, L = x.shape[1], x.shape[2]
    R = w.shape[2]
    for nk in prange(N * K):
        n, k = nk // K, nk % K
        for p in range(P):
            acc = np.float32(0.0)
            for c in range(C):
                for r in range(R):
                    i = p * stride - pad + r
                    if 0 <= i < L:
                        acc += x[n, c, i] * w[k, c, r]
            y[n, k, p] = acc


@register("conv1d", "cpu", "direct_par", rung=1)
def conv1d_direct_par_cpu(y, x, w, stride, pad):
    """The formula as loops, the N K output rows spread over cores with prange."""
    conv1d_direct_par(y, x, w, stride, pad)


# ------------------------------------------------- CPU: im2row, the course's GEMM, and NHWC (issue 36)
# The NumPy baselines are im2col + one BLAS call; to be as fast the course's rungs must do the same work with the
# course's own GEMM (gemm.gemm_cpu_best, chapter 5). Two layout choices decide the speed:
#  * the GEMM's rows are the N P Q output pixels, not the K = 64 filters: it spreads 64-row blocks of C over the
#    cores, and K = 64 would be a single block (one core);
#  * each pixel's window is copied as a row, (r, s, c) along it, from a zero-padded NHWC copy of x: the S C values
#    of one filter row are contiguous there, so im2row is R memcpys of S C floats per pixel (vector loads and
#    stores), where NCHW im2col copies runs of Q = 28 floats or single floats with bounds tests.
# The copies and row2im's adds need no fastmath (nothing is reassociated), so NaN and inf pass through as IEEE says.
@njit(parallel=True, cache=True)
def nhwc_pad(xp, x, pad):
    """xp (N, H + 2 pad, (W + 2 pad) C) <- x (N, C, H, W) as NHWC with a zero border; prange over padded rows."""
    N, C, H, W = x.shape
    Hp = xp.shape[1]
    for t in prange(N * Hp):
        n = t // Hp
        hp = t - n * Hp
        row = xp[n, hp]
        h = hp - pad
        if 0 <= h < H:
            row[:pad * C] = 0.0
            row[(W + pad) * C:] = 0.0
            for c in range(C):  # read x's rows contiguously; the scattered writes stay in this row (L1)
                src = x[n, c, h]
                for ww in range(W):
                    row[(ww + pad) * C + c] = src[ww]
        else:
            row[:] = 0.0


@njit(parallel=True, cache=True)
def im2row(colT, xp, C, R, S, stride, P, Q):
    """colT (N P Q, R S C) <- each output pixel's window from the padded NHWC xp: R copies of S C floats."""
    N = xp.shape[0]
    SC = S * C
    for t in prange(N * P):
        n = t // P
        p = t - n * P
        for q in range(Q):
            dst = colT[t * Q + q]
            o = q * stride * C
            for r in range(R):
                src = xp[n, p * stride + r, o:o + SC]
                d = dst[r * SC:(r + 1) * SC]
                for i in range(SC):
                    d[i] = src[i]


@njit(parallel=True, cache=True)
def nkp_from_npk(y, yt):
    """y (N, K, PQ) <- yt (N PQ, K): the GEMM's pixel-major rows back to channels-first, in tiles of 16 pixels
    (16 rows of yt in L1, 16 contiguous floats written per channel); prange over (n, tile)."""
    N, K, PQ = y.shape
    nb = (PQ + 15) // 16
    for t in prange(N * nb):
        n = t // nb
        i0 = (t - n * nb) * 16
        i1 = min(i0 + 16, PQ)
        for k in range(K):
            dst = y[n, k]
            for i in range(i0, i1):
                dst[i] = yt[n * PQ + i, k]


@njit(parallel=True, cache=True)
def npk_from_nkp(yt, y):
    """yt (N PQ, K) <- y (N, K, PQ), the inverse of nkp_from_npk; prange over pixel rows."""
    N, K, PQ = y.shape
    for t in prange(N * PQ):
        n = t // PQ
        i = t - n * PQ
        dst = yt[t]
        for k in range(K):
            dst[k] = y[n, k, i]


def filters_rsc(w):
    """w (K, C, R, S) -> (R S C, K): the filters as the GEMM's B, rows in im2row's (r, s, c) order."""
    K = w.shape[0]
    return np.ascontiguousarray(w.transpose(2, 3, 1, 0).reshape(-1, K))


@register("conv2d", "cpu", "im2row_gemm", rung=4,
          bytes=lambda s, b: conv_bytes(s, b) + 2 * s[1] * s[5] * s[6] * out_len(s[2], s[5], s[7], s[8])
          * out_len(s[3], s[6], s[7], s[8]) * b)
def conv2d_im2row_cpu(y, x, w, stride, pad):
    """Rung 3 reorganised around the GEMM: Y^T (N P Q, K) = im2row (N P Q, R S C) @ W^T (R S C, K).

    x is copied once to zero-padded NHWC (no bounds tests after that), every pixel's window becomes a row of R
    contiguous S C runs (vectorised copies, prange over rows of pixels), then ONE call of chapter 5's GEMM with
    N P Q = 6272 rows (98 blocks of 64 for the cores, where rung 3 gave each core whole images and a 64-row
    GEMM), and a parallel transpose back to NCHW. Predicted (2-core Xeon): the GEMM at gemm_cpu_best's 1024^3
    rate (~200 GFLOP/s for packed_par: 0.46 GFLOP in ~2.3 ms) plus the 14 MB im2row matrix written and read
    and the two 1.6 MB transposes (~0.7 ms at the copy's 49.5 GB/s): ~3 ms, about NumPy's im2col + BLAS.
    kernels asm: the copies have no scalar FP (vector moves), all FMAs are in the GEMM's micro-kernel."""
    check_args(x, w, stride, pad)
    N, C, H, W = x.shape
    K, _, R, S = w.shape
    P, Q = y.shape[2], y.shape[3]
    xp = np.empty((N, H + 2 * pad, (W + 2 * pad) * C), np.float32)
    nhwc_pad(xp, x, pad)
    colT = np.empty((N * P * Q, R * S * C), np.float32)
    im2row(colT, xp, C, R, S, stride, P, Q)
    yt = np.empty((N * P * Q, K), np.float32)
    gemm_cpu_best(yt, colT, filters_rsc(w))
    nkp_from_npk(y.reshape(N, K, P * Q), yt)


@njit(parallel=True, cache=True)
def im2col_rows(col, x, R, S, stride, pad, P, Q):
    """col (C R S, N P Q) <- NCHW im2col, rows in w's (c, r, s) order: for each (row, image) task the P runs of
    Q columns are copies of a strided run of one row of x, zeros where the tap falls in the padding."""
    N, C, H, W = x.shape
    RS = R * S
    for t in prange(C * RS * N):
        row = t // N
        n = t - row * N
        c = row // RS
        r = (row // S) % R
        s = row % S
        q0 = 0  # first q whose tap column is inside x, q1 one past the last
        while q0 < Q and q0 * stride - pad + s < 0:
            q0 += 1
        q1 = Q
        while q1 > q0 and (q1 - 1) * stride - pad + s >= W:
            q1 -= 1
        for p in range(P):
            dst = col[row, (n * P + p) * Q:(n * P + p + 1) * Q]
            h = p * stride - pad + r
            if 0 <= h < H:
                src = x[n, c, h]
                dst[:q0] = 0.0
                if stride == 1:  # a contiguous run: a vector copy
                    dst[q0:q1] = src[q0 - pad + s:q1 - pad + s]
                else:
                    for q in range(q0, q1):
                        dst[q] = src[q * stride - pad + s]
                dst[q1:] = 0.0
            else:
                dst[:] = 0.0


@register("conv2d_bwd_dw", "cpu", "im2col_gemm", rung=2)
def dw_im2col_cpu(dw, x, dy, R, S, stride, pad):
    """dW as one GEMM: dW^T (C R S, K) = im2col (C R S, N P Q) @ dY^T (N P Q, K).

    The GEMM's rows are the C R S = 576 weights and its depth the 6272 pixels. The im2col matrix is built in
    its natural (C R S, N P Q) layout, rows contiguous, because the GEMM packs A row by row: fed the forward's
    im2row matrix transposed (a strided view) the same GEMM ran ~1.7x slower in an A/B on one thread, its
    packing gathering one float per cache line. dY goes to pixel-major rows by a parallel transpose (1.6 MB).
    Predicted: 0.46 GFLOP at gemm_cpu_best's ~200 GFLOP/s (~2.3 ms) plus the 14 MB matrix written and read
    (~0.6 ms): ~3 ms, NumPy's im2col + BLAS; ~15x rung 1, whose sums walk dy and x with bounds tests."""
    N, C, H, W = x.shape
    K, P, Q = dy.shape[1], dy.shape[2], dy.shape[3]
    col = np.empty((C * R * S, N * P * Q), np.float32)
    im2col_rows(col, x, R, S, stride, pad, P, Q)
    dyt = np.empty((N * P * Q, K), np.float32)
    npk_from_nkp(dyt, dy.reshape(N, K, P * Q))
    dwt = np.empty((C * R * S, K), np.float32)
    gemm_cpu_best(dwt, col, dyt)
    dw[...] = dwt.T.reshape(K, C, R, S)


@njit(parallel=True, cache=True)
def row2im(dxp, dcolT, C, R, S, stride, P, Q):
    """dxp (N, Hp, Wp C) <- the sum of every pixel's R S C gradient row at its window (col2im, NHWC).
    Race-free without atomics: a task owns one padded input row (n, hp) and gathers the (p, r) pairs with
    p stride + r = hp; the S C runs it adds are contiguous (vectorised adds)."""
    N, Hp = dxp.shape[0], dxp.shape[1]
    SC = S * C
    for t in prange(N * Hp):
        n = t // Hp
        hp = t - n * Hp
        row = dxp[n, hp]
        row[:] = 0.0
        for r in range(R):
            if hp - r >= 0 and (hp - r) % stride == 0:
                p = (hp - r) // stride
                if p < P:
                    for q in range(Q):
                        src = dcolT[(n * P + p) * Q + q, r * SC:(r + 1) * SC]
                        d = row[q * stride * C:q * stride * C + SC]
                        for i in range(SC):
                            d[i] += src[i]


@njit(parallel=True, cache=True)
def nchw_from_nhwc_pad(dx, dxp, pad):
    """dx (N, C, H, W) <- the interior of the padded NHWC dxp; prange over (n, c) planes."""
    N, C, H, W = dx.shape
    for t in prange(N * C):
        n = t // C
        c = t - n * C
        for h in range(H):
            src = dxp[n, h + pad]
            dst = dx[n, c, h]
            for ww in range(W):
                dst[ww] = src[(ww + pad) * C + c]


@register("conv2d_bwd_dx", "cpu", "gemm_row2im", rung=2)
def dx_gemm_cpu(dx, dy, w, H, W, stride, pad):
    """dx as a GEMM and a scatter: dcol^T (N P Q, R S C) = dY^T (N P Q, K) @ W (K, R S C), then row2im adds each
    pixel's row back onto the padded NHWC input (each task owns input rows: no races), and a transpose to NCHW.

    The GEMM has 6272 rows (98 blocks for the cores) and the conv's 0.46 GFLOP; row2im reads the 14 MB dcol^T
    once and adds runs of S C = 192 contiguous floats. Predicted: ~2.3 ms of GEMM plus ~1 ms of copies, about
    NumPy's GEMM + col2im, 10x rung 1 (whose gather tests every (k, r, s) for a matching output)."""
    N, K, P, Q = dy.shape
    _, C, R, S = w.shape
    dyt = np.empty((N * P * Q, K), np.float32)
    npk_from_nkp(dyt, dy.reshape(N, K, P * Q))
    w2 = np.ascontiguousarray(w.transpose(0, 2, 3, 1).reshape(K, R * S * C))
    dcolT = np.empty((N * P * Q, R * S * C), np.float32)
    gemm_cpu_best(dcolT, dyt, w2)
    dxp = np.empty((N, H + 2 * pad + stride, (W + 2 * pad + stride) * C), np.float32)
    row2im(dxp, dcolT, C, R, S, stride, P, Q)
    nchw_from_nhwc_pad(dx, dxp, pad)


@njit(parallel=True, cache=True)
def nlc_pad(xp, x, pad):
    """xp (N, (L + 2 pad) C) <- x (N, C, L) as NLC with zeros at both ends; prange over (n, position)."""
    N, C, L = x.shape
    Lp = xp.shape[1] // C
    for t in prange(N * Lp):
        n = t // Lp
        i = t - n * Lp
        dst = xp[n, i * C:(i + 1) * C]
        if pad <= i < L + pad:
            for c in range(C):
                dst[c] = x[n, c, i - pad]
        else:
            dst[:] = 0.0


@register("conv1d", "cpu", "im2row_gemm", rung=2)
def conv1d_im2row_cpu(y, x, w, stride, pad):
    """conv1d as GEMMs with NO im2col copy: in padded NLC order, output p's window is the R C floats starting at
    p stride C, so the im2row matrix (P, R C) of image n is a strided VIEW of x (rows overlap); the course's GEMM
    packs it as it packs any A. Per image: Y_n^T (P, K) = view (P, R C) @ W^T (R C, K), then a transpose to NCL.

    Predicted: 1.34 GFLOP at the GEMM's ~200 GFLOP/s, ~7 ms, plus x and y moved twice (~17 MB each way, under
    1 ms): ~8 ms, against rung 1's per-output dot products (~580 ms)."""
    N, C, L = x.shape
    K, _, R = w.shape
    P = y.shape[2]
    xp = np.empty((N, (L + 2 * pad) * C), np.float32)
    nlc_pad(xp, x, pad)
    wt = np.ascontiguousarray(w.transpose(2, 1, 0).reshape(R * C, K))
    yt = np.empty((N * P, K), np.float32)
    it = xp.itemsize
    for n in range(N):
        a = np.lib.stride_tricks.as_strided(xp[n], shape=(P, R * C), strides=(stride * C * it, it))
        gemm_cpu_best(yt[n * P:(n + 1) * P], a, wt)
    nkp_from_npk(y, yt)


# ============================================================================================= GPU
SIG4 = "float32[:, :, :, ::1]"
SIG3 = "float32[:, :, ::1]"


def _torch_gpu():
    from .reductions import torch_gpu

    return torch_gpu()


@register("conv2d", "gpu", "cudnn", baseline=True, requires=_torch_gpu)
def conv2d_cudnn(y, x, w, stride, pad):
    """torch.nn.functional.conv2d (cuDNN picks the algorithm; benchmark mode on), TF32 off, copied into y
    (the copy moves 2 N K P Q * 4 bytes, ~5 % of the time at the bench shape)."""
    import torch

    from .reductions import torch_view

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    torch_view(y).copy_(torch.nn.functional.conv2d(torch_view(x), torch_view(w), stride=stride, padding=pad))


# ------------------------------------------------------------------------- rung 1: one thread per output
@cuda.jit(fastmath=True)
def conv2d_direct_kernel(y, x, w, stride, pad):
    # y (N,K,P,Q) <- x (N,C,H,W), w (K,C,R,S): thread i owns y.flat[i]; q is fastest, so a warp reads
    # neighbouring x elements (stride 1) and the same w element (a broadcast)
    i = cuda.grid(1)
    N, K, P, Q = y.shape
    if i >= N * K * P * Q:
        return
    q = i % Q
    p = (i // Q) % P
    k = (i // (P * Q)) % K
    n = i // (K * P * Q)
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    R, S = w.shape[2], w.shape[3]
    acc = float32(0.0)
    for c in range(C):
        for r in range(R):
            h = p * stride - pad + r
            if 0 <= h < H:
                for s in range(S):
                    ww = q * stride - pad + s
                    if 0 <= ww < W:
                        acc += x[n, c, h, ww] * w[k, c, r, s]
    y[n, k, p, q] = acc


SIG_CONV2D = f"void({SIG4}, {SIG4}, {SIG4}, int64, int64)"


@register("conv2d", "gpu", "direct", rung=1, ptx=[(conv2d_direct_kernel, SIG_CONV2D)])
def conv2d_direct_gpu(y, x, w, stride, pad):
    """One thread per output, C R S loads of x and of w each, all through L1/L2: every x element is read
    by the R S outputs whose windows hold it and by all K channels. Predict a few TFLOP/s: the loads, not
    the FMAs, set the pace (two loads per FMA)."""
    check_args(x, w, stride, pad)
    n = y.size
    if n:
        conv2d_direct_kernel[ceil_div(n, 256), 256](y, x, w, stride, pad)


# --------------------------------------------------------------- rung 2: shared-memory tiles with halos
TILE_GPU, KB_GPU = 16, 8  # a 16 x 16 tile of outputs, 8 output channels per block
TILE_SIM, KB_SIM = 4, 2  # the simulator: 16 threads per block (R = 5 filters are larger than the tile)


def make_tiled2d(R, S, stride, TILE, KB):
    """A kernel for one filter shape: the tile, its halo and the filter taps are compile-time constants,
    so the shared arrays have static shapes and the R x S x KB loop unrolls."""
    IH = (TILE - 1) * stride + R  # input rows a TILE x TILE output tile reads: the tile plus its halo
    IW = (TILE - 1) * stride + S
    NT = TILE * TILE
    RS = R * S

    @cuda.jit(fastmath=True)
    def conv2d_tiled_kernel(y, x, w, pad):
        # block (tile, kgroup, n): outputs [p0, p0 + TILE) x [q0, q0 + TILE), channels [k0, k0 + KB), image n
        N, K, P, Q = y.shape
        C, H, W = x.shape[1], x.shape[2], x.shape[3]
        tiles_q = (Q + TILE - 1) // TILE
        p0 = (cuda.blockIdx.x // tiles_q) * TILE
        q0 = (cuda.blockIdx.x % tiles_q) * TILE
        k0 = cuda.blockIdx.y * KB
        n = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        ty = tid // TILE
        tx = tid % TILE
        xs = cuda.shared.array((IH, IW), float32)
        ws = cuda.shared.array((KB, RS), float32)
        acc = cuda.local.array(KB, float32)
        for kk in range(KB):
            acc[kk] = float32(0.0)
        h0 = p0 * stride - pad  # the tile's first input row (negative inside the padding)
        w0 = q0 * stride - pad
        for c in range(C):
            for e in range(tid, IH * IW, NT):  # the input tile and its halo, zeros in the padding
                ih = e // IW
                iw = e % IW
                h = h0 + ih
                ww = w0 + iw
                xs[ih, iw] = x[n, c, h, ww] if (0 <= h < H and 0 <= ww < W) else float32(0.0)
            for e in range(tid, KB * RS, NT):  # KB filters' R x S taps for channel c
                kk = e // RS
                rs = e % RS
                ws[kk, rs] = w[k0 + kk, c, rs // S, rs % S] if k0 + kk < K else float32(0.0)
            cuda.syncthreads()
            for r in range(R):
                for s in range(S):
                    v = xs[ty * stride + r, tx * stride + s]  # one shared load serves KB FMAs
                    for kk in range(KB):
                        acc[kk] += v * ws[kk, r * S + s]
            cuda.syncthreads()  # nobody overwrites xs while a neighbour still reads it
        p = p0 + ty
        q = q0 + tx
        if p < P and q < Q:
            for kk in range(KB):
                if k0 + kk < K:
                    y[n, k0 + kk, p, q] = acc[kk]

    conv2d_tiled_kernel.geometry = (TILE, KB, NT)
    return conv2d_tiled_kernel


_tiled: dict = {}


def tiled_kernel(R, S, stride, gpu=None):
    sim = device.SIMULATED if gpu is None else not gpu
    TILE, KB = (TILE_SIM, KB_SIM) if sim else (TILE_GPU, KB_GPU)
    key = (R, S, stride, TILE, KB)
    if key not in _tiled:
        _tiled[key] = make_tiled2d(R, S, stride, TILE, KB)
    return _tiled[key]


@register("conv2d", "gpu", "tiled", rung=2,
          ptx=[(tiled_kernel(3, 3, 1, gpu=True), f"void({SIG4}, {SIG4}, {SIG4}, int64)")])
def conv2d_tiled_gpu(y, x, w, stride, pad):
    """A block stages a 16 x 16 output tile's input plus its halo (18 x 18 for 3 x 3) and 8 filters' taps in
    shared memory, once per input channel; each thread then does 9 x 8 FMAs from shared memory, one shared
    load of x per 8 FMAs. x is read from global memory K/8 times instead of K R S times: predict ~2-3x
    rung 1, and still below the GEMM rungs, whose register tiles reuse each load many more times."""
    check_args(x, w, stride, pad)
    N, K, P, Q = y.shape
    if y.size == 0:
        return
    R, S = w.shape[2], w.shape[3]
    kern = tiled_kernel(R, S, stride)
    TILE, KB, NT = kern.geometry
    kern[(ceil_div(P, TILE) * ceil_div(Q, TILE), ceil_div(K, KB), N), NT](y, x, w, pad)


# ------------------------------------------------------------------------- rung 3: im2col + the GEMM
@cuda.jit(device=True, inline=True)
def im2col_value(x, crs, j, R, S, stride, pad, P, Q):
    """Entry (crs, j) of the im2col matrix: tap (c, r, s) of output pixel j = (n, p, q); 0 in the padding."""
    H, W = x.shape[2], x.shape[3]
    c = crs // (R * S)
    r = (crs // S) % R
    s = crs % S
    n = j // (P * Q)
    pq = j % (P * Q)
    h = (pq // Q) * stride - pad + r
    ww = (pq % Q) * stride - pad + s
    return x[n, c, h, ww] if (0 <= h < H and 0 <= ww < W) else float32(0.0)


@cuda.jit
def im2col_kernel(col, x, R, S, stride, pad, P, Q):
    # col (C R S, N P Q) <- x (N,C,H,W): thread (j, row) copies one tap of one window; j is fastest so a
    # warp writes 32 consecutive floats of a row
    j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    row = cuda.blockIdx.y
    if j >= col.shape[1]:
        return
    col[row, j] = im2col_value(x, row, j, R, S, stride, pad, P, Q)


@cuda.jit
def nkpq_from_knpq_kernel(y, y2):
    # y (N,K,P,Q) <- y2 (K, N P Q): the GEMM's rows are channels, NCHW wants images first
    i = cuda.grid(1)
    N, K, P, Q = y.shape
    PQ = P * Q
    if i < y.size:
        pq = i % PQ
        k = (i // PQ) % K
        n = i // (K * PQ)
        y[n, k, pq // Q, pq % Q] = y2[k, n * PQ + pq]


_scratch: dict = {}


def scratch(name, shape):
    """A device buffer reused between calls of the same shape (the bench calls a launcher many times)."""
    key = (name, shape)
    buf = _scratch.get(key)
    if buf is None:
        if len(_scratch) > 16:
            _scratch.clear()
        buf = _scratch[key] = cuda.device_array(shape, np.float32)
    return buf


def im2col_gpu(x, R, S, stride, pad, P, Q):
    N, C = x.shape[0], x.shape[1]
    col = scratch("col", (C * R * S, N * P * Q))
    im2col_kernel[(ceil_div(N * P * Q, 128), C * R * S), 128](col, x, R, S, stride, pad, P, Q)
    return col


@register("conv2d", "gpu", "im2col_gemm", rung=3,
          bytes=lambda s, b: conv_bytes(s, b) + im2col_extra_bytes(s, b),
          ptx=[(im2col_kernel, f"void(float32[:, ::1], {SIG4}, int64, int64, int64, int64, int64, int64)"),
               (nkpq_from_knpq_kernel, f"void({SIG4}, float32[:, ::1])")])
def conv2d_im2col_gpu(y, x, w, stride, pad):
    """im2col writes every window as a column of a (C R S, N P Q) matrix; the course's warp-tiled GEMM
    (chapter 5, rung 11) computes W (K, C R S) @ col; a permute puts the (K, N P Q) result into NCHW.
    At the bench shape the matrix is 231 MB for a 26 MB input, written and read once (~0.15 ms of copy-speed
    traffic), and the GEMM runs at its own speed on M = 64 rows (half a 128-row tile: half its FMAs are
    wasted): predict ~40 % of the GEMM's 4096^3 rate, plus the copies."""
    check_args(x, w, stride, pad)
    N, K, P, Q = y.shape
    if y.size == 0:
        return
    _, C, R, S = w.shape
    col = im2col_gpu(x, R, S, stride, pad, P, Q)
    y2 = scratch("y2", (K, N * P * Q))
    gemm.gemm_warptile(y2, w.reshape(K, C * R * S), col)
    nkpq_from_knpq_kernel[ceil_div(y.size, 256), 256](y, y2)


# ------------------------------------------------------------------------------- rung 4: implicit GEMM
def make_implicit(BM=64, BN=128, BK=8, TM=8, TN=8):
    """GEMM tiles over M = K (output channels), N = N P Q (pixels) and a depth of C R S, as in chapter 5's
    register-tiled kernels (rungs 5-8: A stored transposed in shared memory, a TM x TN register tile per
    thread, the next tile's loads issued before this tile's FMAs into a second shared buffer).

    The B tile is never read from a matrix. Each thread owns one pixel column (NT is a multiple of BN) and
    gathers its BK/(NT/BN) taps from x: row crs of the virtual im2col matrix is the (c, r, s) in the table
    ``tab`` (offset c H W + r W + s, and r and s for the bounds test), so the load is
    ``x[base + tab[0, crs]]`` with base = n C H W + h0 W + w0 fixed per thread: no division in the loop.
    A thread's outputs are spaced a thread grid apart (rows ty + i TR, pixels tx + j TC) so a warp's shared
    loads and global stores hit consecutive addresses."""
    NT = (BM // TM) * (BN // TN)
    TR, TC = BM // TM, BN // TN
    LA = BM * BK // NT
    LB = BK * BN // NT
    RB = NT // BN  # B-tile rows loaded per step
    assert NT % BN == 0 and BM * BK % NT == 0 and NT & (NT - 1) == 0

    @cuda.jit(fastmath=True)
    def conv2d_implicit_kernel(y, x, w2, tab, H, W, P, Q, stride, pad):
        # y (N K P Q,) <- x (N C H W,) flat, w2 (K, CRS), tab (3, CRS) int32
        K, CRS = w2.shape
        PQ = P * Q
        NPQ = y.size // K
        tid = cuda.threadIdx.x & (NT - 1)  # proves tid >= 0 (chapter 5, rung 6)
        ty = tid // TC
        tx = tid % TC
        row0 = cuda.blockIdx.y * BM
        col0 = cuda.blockIdx.x * BN
        As = cuda.shared.array((2, BK, BM), float32)  # As[buf, k, m] = w2[m, k]
        Bs = cuda.shared.array((2, BK, BN), float32)
        acc = cuda.local.array((TM, TN), float32)
        rm = cuda.local.array(TM, float32)
        rn = cuda.local.array(TN, float32)
        ra = cuda.local.array(LA, float32)
        rb = cuda.local.array(LB, float32)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = float32(0.0)
        # this thread's pixel for the B loads: fixed for the whole kernel
        bc = tid % BN
        br = tid // BN
        pix = col0 + bc
        valid = pix < NPQ
        n = pix // PQ
        pq = pix % PQ
        h0 = (pq // Q) * stride - pad
        w0 = (pq % Q) * stride - pad
        CHW = x.size // (NPQ // PQ)  # C H W: x holds N = NPQ / PQ images
        base = n * CHW + h0 * W + w0
        ntiles = (CRS + BK - 1) // BK
        for t in range(ntiles + 1):
            if t < ntiles:  # tile t: registers first, shared memory after this tile's FMAs
                k0 = t * BK
                for s in range(LA):
                    e = tid + s * NT
                    m = e // BK
                    kk = e % BK
                    ra[s] = w2[row0 + m, k0 + kk] if (row0 + m < K and k0 + kk < CRS) else float32(0.0)
                for s in range(LB):
                    crs = k0 + br + s * RB
                    v = float32(0.0)
                    if valid and crs < CRS:
                        h = h0 + tab[1, crs]
                        ww = w0 + tab[2, crs]
                        if 0 <= h < H and 0 <= ww < W:
                            v = x[base + tab[0, crs]]
                    rb[s] = v
            if t >= 1:
                b = (t - 1) & 1
                for kk in range(BK):
                    for i in range(TM):
                        rm[i] = As[b, kk, ty + i * TR]
                    for j in range(TN):
                        rn[j] = Bs[b, kk, tx + j * TC]
                    for i in range(TM):  # TM TN FMAs for TM + TN shared loads
                        for j in range(TN):
                            acc[i, j] += rm[i] * rn[j]
            if t < ntiles:
                b = t & 1
                for s in range(LA):
                    e = tid + s * NT
                    As[b, e % BK, e // BK] = ra[s]
                for s in range(LB):
                    Bs[b, br + s * RB, bc] = rb[s]
            cuda.syncthreads()
        for j in range(TN):
            c = col0 + tx + j * TC
            if c < NPQ:
                nn = c // PQ
                pp = c % PQ
                for i in range(TM):
                    m = row0 + ty + i * TR
                    if m < K:
                        y[(nn * K + m) * PQ + pp] = acc[i, j]

    def launch(y, x, w, stride, pad):
        N, K, P, Q = y.shape
        _, C, H, W = x.shape
        R, S = w.shape[2], w.shape[3]
        if y.size == 0:
            return
        tab = offset_table(C, R, S, H, W)
        conv2d_implicit_kernel[(ceil_div(N * P * Q, BN), ceil_div(K, BM)), NT](
            y.reshape(y.size), x.reshape(x.size), w.reshape(K, C * R * S), tab, H, W, P, Q, stride, pad)

    launch.kernel = conv2d_implicit_kernel
    launch.config = dict(BM=BM, BN=BN, BK=BK, TM=TM, TN=TN, threads=NT)
    return launch


def offset_table_host(C, R, S, H, W):
    """tab (3, C R S) int32: for row crs = (c R + r) S + s of the virtual im2col matrix, the offset
    c H W + r W + s of its tap from the window's corner, and r and s (for the padding test)."""
    crs = np.arange(C * R * S)
    c, r, s = crs // (R * S), (crs // S) % R, crs % S
    return np.stack([c * H * W + r * W + s, r, s]).astype(np.int32)


_tabs: dict = {}


def offset_table(C, R, S, H, W):
    key = (C, R, S, H, W)
    if key not in _tabs:
        _tabs[key] = cuda.to_device(offset_table_host(C, R, S, H, W))
    return _tabs[key]


IMPLICIT_GPU = dict(BM=64, BN=128, BK=8, TM=8, TN=8)  # 128 threads, 64 outputs each
IMPLICIT_SIM = dict(BM=16, BN=32, BK=4, TM=4, TN=4)  # 32 threads
_implicit_gpu = make_implicit(**IMPLICIT_GPU)
_implicit = make_implicit(**IMPLICIT_SIM) if device.SIMULATED else _implicit_gpu
SIG_IMPLICIT = ("void(float32[::1], float32[::1], float32[:, ::1], int32[:, ::1], int64, int64, int64, int64, "
                "int64, int64)")


@register("conv2d", "gpu", "implicit_gemm", rung=4, ptx=[(_implicit_gpu.kernel, SIG_IMPLICIT)],
          bytes=lambda s, b: conv_bytes(s, b) + 2 * s[1] * s[5] * s[6] * 4 * s[4] // 64)
def conv2d_implicit_gpu(y, x, w, stride, pad):
    """Implicit GEMM: 64 x 128 x 8 GEMM tiles (channels x pixels x taps), 8 x 8 outputs per thread, whose
    B-tile loads gather x through a (c, r, s) -> offset table instead of reading an im2col matrix; the
    result is stored straight into NCHW. No 231 MB matrix and no permute: only x (from L2, R S times),
    w and y. Predict the speed of chapter 5's register-tiled rungs 5-8 (~20 TFLOP/s), >= 0.5x cuDNN."""
    check_args(x, w, stride, pad)
    _implicit(y, x, w, stride, pad)


# ------------------------------------------------------------- rung 5: implicit GEMM, 16-byte shared loads
def make_implicit_vec(BM=64, BN=128, BK=8, TM=8, TN=8, LR=4, LC=8, pad=4, unroll=1, minblocks=None):
    """Rung 4 with chapter 5's shared-memory lessons (rungs 6-7): each thread's TM x TN outputs are
    (TM/4) x (TN/4) pieces of 4 x 4, spaced a thread grid apart, and its lanes form an LR x LC grid inside a
    warp. A thread then reads its 4 rows of A and 4 pixels of B per piece with one 16-byte ``load4`` each
    from 16-byte aligned shared arrays (A padded by ``pad`` columns against bank conflicts on its transposed
    stores), instead of 4 scalar loads. The B gather through the offset table is rung 4's; a thread gathers
    for one pixel column (NT >= BN) or for BN / NT of them (NT < BN). ``unroll`` k steps of the inner loop
    are written out (a constant trip count the compiler unrolls), ``minblocks`` sets launch bounds."""
    NT = (BM // TM) * (BN // TN)
    TR, TC = BM // TM, BN // TN
    QM, QN = TM // 4, TN // 4
    WPR = TC // LC
    MSTEP4, NSTEP4 = TR, TC  # a piece's stride (4 TR rows, 4 TC pixels) in 16-byte groups
    BMP = BM + pad
    BMP4, BN4 = BMP // 4, BN // 4
    LA = BM * BK // NT
    CPT = max(1, BN // NT)  # pixel columns each thread gathers for
    RB = max(1, NT // BN)  # rows between a thread's gathers in one column
    LB = BK * BN // NT
    SROWS = 2 * BK  # two buffers of BK rows
    UNROLL = unroll
    align = gemm.SMEM_ALIGN
    assert (NT % BN == 0 or BN % NT == 0) and BM * BK % NT == 0 and NT & (NT - 1) == 0 and LR * LC == 32
    assert TR % LR == 0 and TC % LC == 0 and TM % 4 == 0 and TN % 4 == 0 and BMP % 4 == 0 and BK % unroll == 0
    assert LB == CPT * (BK // RB)
    opts = dict(fastmath=True)
    if minblocks:
        opts["launch_bounds"] = (NT, minblocks)

    @gemm._jit(**opts)
    def conv2d_implicit_vec_kernel(y, x, w2, tab, H, W, P, Q, stride, pad):
        # y (N K P Q,) <- x (N C H W,) flat, w2 (K, CRS), tab (3, CRS) int32
        K, CRS = w2.shape
        PQ = P * Q
        NPQ = y.size // K
        CHW = x.size // (NPQ // PQ)
        tid = cuda.threadIdx.x & (NT - 1)
        warp = tid // 32
        lane = tid % 32
        mb = ((warp // WPR) * LR + lane // LC) * 4  # first row of this thread's first 4 x 4 piece
        nb = ((warp % WPR) * LC + lane % LC) * 4  # first pixel of it
        row0 = cuda.blockIdx.y * BM
        col0 = cuda.blockIdx.x * BN
        As = cuda.shared.array((SROWS, BMP), float32, alignment=align)  # As[buf*BK + k, m] = w2[m, k]
        Bs = cuda.shared.array((SROWS, BN), float32, alignment=align)
        acc = cuda.local.array((TM, TN), float32)
        rm = cuda.local.array(TM, float32)
        rn = cuda.local.array(TN, float32)
        ra = cuda.local.array(LA, float32)
        rb = cuda.local.array(LB, float32)
        gbase = cuda.local.array(CPT, cuda_int64)  # per gathered column: n C H W + h0 W + w0
        gh0 = cuda.local.array(CPT, cuda_int64)
        gw0 = cuda.local.array(CPT, cuda_int64)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = float32(0.0)
        br = tid // BN if NT >= BN else 0
        for u in range(CPT):
            pix = col0 + (tid % BN if NT >= BN else tid + u * NT)
            n = pix // PQ
            pq = pix % PQ
            h0 = (pq // Q) * stride - pad
            w0 = (pq % Q) * stride - pad
            if pix >= NPQ:
                h0 = -(1 << 30)  # an invalid pixel: every tap fails the bounds test
            gh0[u] = h0
            gw0[u] = w0
            gbase[u] = n * CHW + h0 * W + w0
        ntiles = (CRS + BK - 1) // BK
        for t in range(ntiles + 1):
            if t < ntiles:
                k0 = t * BK
                for s in range(LA):
                    e = tid + s * NT
                    m = e // BK
                    kk = e % BK
                    ra[s] = w2[row0 + m, k0 + kk] if (row0 + m < K and k0 + kk < CRS) else float32(0.0)
                for u in range(CPT):
                    for s in range(BK // RB):
                        crs = k0 + br + s * RB
                        v = float32(0.0)
                        if crs < CRS:
                            h = gh0[u] + tab[1, crs]
                            ww = gw0[u] + tab[2, crs]
                            if 0 <= h < H and 0 <= ww < W:
                                v = x[gbase[u] + tab[0, crs]]
                        rb[u * (BK // RB) + s] = v
            if t >= 1:
                kb = ((t - 1) & 1) * BK
                for k1 in range(0, BK, UNROLL):
                    for uu in range(UNROLL):  # a constant trip count: unrolled
                        kk = kb + k1 + uu
                        for p in range(QM):
                            a0, a1, a2, a3 = load4(As, kk * BMP4 + mb // 4 + p * MSTEP4)
                            rm[4 * p] = a0
                            rm[4 * p + 1] = a1
                            rm[4 * p + 2] = a2
                            rm[4 * p + 3] = a3
                        for p in range(QN):
                            b0, b1, b2, b3 = load4(Bs, kk * BN4 + nb // 4 + p * NSTEP4)
                            rn[4 * p] = b0
                            rn[4 * p + 1] = b1
                            rn[4 * p + 2] = b2
                            rn[4 * p + 3] = b3
                        for i in range(TM):
                            for j in range(TN):
                                acc[i, j] += rm[i] * rn[j]
            if t < ntiles:
                sb = (t & 1) * BK
                for s in range(LA):
                    e = tid + s * NT
                    As[sb + e % BK, e // BK] = ra[s]
                for u in range(CPT):
                    for s in range(BK // RB):
                        Bs[sb + br + s * RB, (tid % BN if NT >= BN else tid + u * NT)] = rb[u * (BK // RB) + s]
            cuda.syncthreads()
        for pn in range(QN):
            for qn in range(4):
                c = col0 + nb + pn * 4 * TC + qn
                if c < NPQ:
                    nn = c // PQ
                    pp = c % PQ
                    for p in range(QM):
                        for q in range(4):
                            m = row0 + mb + p * 4 * TR + q
                            if m < K:
                                y[(nn * K + m) * PQ + pp] = acc[4 * p + q, 4 * pn + qn]

    def launch(y, x, w, stride, pad):
        N, K, P, Q = y.shape
        _, C, H, W = x.shape
        R, S = w.shape[2], w.shape[3]
        if y.size == 0:
            return
        tab = offset_table(C, R, S, H, W)
        conv2d_implicit_vec_kernel[(ceil_div(N * P * Q, BN), ceil_div(K, BM)), NT](
            y.reshape(y.size), x.reshape(x.size), w.reshape(K, C * R * S), tab, H, W, P, Q, stride, pad)

    launch.kernel = conv2d_implicit_vec_kernel
    launch.config = dict(BM=BM, BN=BN, BK=BK, TM=TM, TN=TN, LR=LR, LC=LC, pad=pad, threads=NT, unroll=unroll,
                         minblocks=minblocks)
    return launch


# 64 filters x 128 pixels, 8 x 8 outputs (2 x 2 pieces) per thread, the k loop unrolled by 2. (cuDNN's own FP32
# kernel at the bench shape has 256 x 64 tiles, 128 outputs per thread: a 128-float accumulator, which Numba's
# compiler puts in local memory; see book/data/bench/h100/conv2d_cudnn.json)
IMPLICIT_VEC_GPU = dict(BM=64, BN=128, BK=8, TM=8, TN=8, LR=4, LC=8, unroll=2)
IMPLICIT_VEC_SIM = dict(BM=16, BN=32, BK=4, TM=4, TN=4, LR=4, LC=8)  # 32 threads, one 4 x 4 piece each
_implicit_vec_gpu = make_implicit_vec(**IMPLICIT_VEC_GPU)
_implicit_vec = make_implicit_vec(**IMPLICIT_VEC_SIM) if device.SIMULATED else _implicit_vec_gpu


@register("conv2d", "gpu", "implicit_vec", rung=5, ptx=[(_implicit_vec_gpu.kernel, SIG_IMPLICIT)],
          bytes=lambda s, b: conv_bytes(s, b) + 2 * s[1] * s[5] * s[6] * 4 * s[4] // 64)
def conv2d_implicit_vec_gpu(y, x, w, stride, pad):
    """Rung 4 with 16-byte shared-memory loads: each thread's 8 x 8 outputs are 2 x 2 pieces of 4 x 4, so its 8
    values of A and 8 of B per k come in 4 ``ld.shared.v4`` instead of 16 scalar loads, from aligned, padded
    shared arrays with a warp-aware lane layout, and the k loop is unrolled by 2 (chapter 5's rungs 6-7, which
    took the GEMM from 7 to 27 TFLOP/s). Rung 4's profile had the FMA pipe busy 29 % of the time against
    cuDNN's 64 %, issuing twice cuDNN's instructions for the same FMAs: predict ~1.5x rung 4, >= 0.5x cuDNN."""
    check_args(x, w, stride, pad)
    _implicit_vec(y, x, w, stride, pad)


# --------------------------------------------------------------------------------------- conv1d GPU
@cuda.jit(fastmath=True)
def conv1d_direct_kernel(y, x, w, stride, pad):
    # y (N,K,P) <- x (N,C,L), w (K,C,R): one thread per output
    i = cuda.grid(1)
    N, K, P = y.shape
    if i >= y.size:
        return
    p = i % P
    k = (i // P) % K
    n = i // (K * P)
    C, L = x.shape[1], x.shape[2]
    R = w.shape[2]
    acc = float32(0.0)
    for c in range(C):
        for r in range(R):
            j = p * stride - pad + r
            if 0 <= j < L:
                acc += x[n, c, j] * w[k, c, r]
    y[n, k, p] = acc


SIG_CONV1D = f"void({SIG3}, {SIG3}, {SIG3}, int64, int64)"


@register("conv1d", "gpu", "direct", rung=1, ptx=[(conv1d_direct_kernel, SIG_CONV1D)])
def conv1d_direct_gpu(y, x, w, stride, pad):
    """One thread per output, C R loads of x (through the caches) and of w."""
    if y.size:
        conv1d_direct_kernel[ceil_div(y.size, 256), 256](y, x, w, stride, pad)


HALO_MAX = 64  # the shared tile holds TILE1D * stride + HALO_MAX inputs; longer filters go in HALO_MAX steps
TILE1D_GPU, TILE1D_SIM = 256, 16
KB1D_GPU, KB1D_SIM = 8, 2  # output channels per block: one staged input span serves KB filters


def make_tiled1d(TILE, STRIDE, KB):
    SH = (TILE - 1) * STRIDE + HALO_MAX  # inputs one chunk of taps needs: the tile's plus a halo

    @cuda.jit(fastmath=True)
    def conv1d_tiled_kernel(y, x, w, pad):
        # block (tile, kgroup, n): outputs [p0, p0 + TILE) of channels [k0, k0 + KB) of image n. The input span
        # and its halo of up to HALO_MAX - 1 taps, and the KB filters' taps, sit in shared memory; a filter
        # longer than that is done HALO_MAX taps at a time
        N, K, P = y.shape
        C, L = x.shape[1], x.shape[2]
        R = w.shape[2]
        p0 = cuda.blockIdx.x * TILE
        k0 = cuda.blockIdx.y * KB
        n = cuda.blockIdx.z
        t = cuda.threadIdx.x
        xs = cuda.shared.array(SH, float32)
        ws = cuda.shared.array((KB, HALO_MAX), float32)
        acc = cuda.local.array(KB, float32)
        for kk in range(KB):
            acc[kk] = float32(0.0)
        for c in range(C):
            for r0 in range(0, R, HALO_MAX):
                nr = min(HALO_MAX, R - r0)
                i0 = p0 * STRIDE - pad + r0  # the first input this chunk of taps reads
                span = (TILE - 1) * STRIDE + nr
                for e in range(t, span, TILE):
                    i = i0 + e
                    xs[e] = x[n, c, i] if 0 <= i < L else float32(0.0)
                for e in range(t, KB * nr, TILE):
                    kk = e // nr
                    ws[kk, e % nr] = w[k0 + kk, c, r0 + e % nr] if k0 + kk < K else float32(0.0)
                cuda.syncthreads()
                for r in range(nr):
                    v = xs[t * STRIDE + r]  # one shared load of x serves KB FMAs
                    for kk in range(KB):
                        acc[kk] += v * ws[kk, r]
                cuda.syncthreads()
        if p0 + t < P:
            for kk in range(KB):
                if k0 + kk < K:
                    y[n, k0 + kk, p0 + t] = acc[kk]

    conv1d_tiled_kernel.geometry = (TILE, KB)
    return conv1d_tiled_kernel


_tiled1d: dict = {}


def tiled1d_kernel(stride, gpu=None):
    sim = device.SIMULATED if gpu is None else not gpu
    key = (TILE1D_SIM, stride, KB1D_SIM) if sim else (TILE1D_GPU, stride, KB1D_GPU)
    if key not in _tiled1d:
        _tiled1d[key] = make_tiled1d(*key)
    return _tiled1d[key]


@register("conv1d", "gpu", "tiled", rung=2, ptx=[(tiled1d_kernel(1, gpu=True), f"void({SIG3}, {SIG3}, {SIG3}, int64)")])
def conv1d_tiled_gpu(y, x, w, stride, pad):
    """A block of TILE threads stages its TILE outputs' input span plus the (R - 1)-element halo, and 8
    filters' taps, in shared memory once per channel: each input is read from global memory about once per
    block instead of R times, and each shared load of x serves 8 FMAs. Filters longer than the halo buffer
    (64 taps) are done 64 taps at a time. Predict several times rung 1 when C and K are large (the 8 filters
    share every load); it is still no GEMM (8 FMAs per load, where the GEMM rungs do 16 or more)."""
    N, K, P = y.shape
    if y.size == 0:
        return
    kern = tiled1d_kernel(stride)
    T, KB = kern.geometry
    kern[(ceil_div(P, T), ceil_div(K, KB), N), T](y, x, w, pad)


@register("conv1d", "gpu", "cudnn", baseline=True, requires=_torch_gpu)
def conv1d_cudnn(y, x, w, stride, pad):
    """torch.nn.functional.conv1d (cuDNN), TF32 off, copied into y."""
    import torch

    from .reductions import torch_view

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    torch_view(y).copy_(torch.nn.functional.conv1d(torch_view(x), torch_view(w), stride=stride, padding=pad))


# ======================================================================================== backward
@register("conv2d_bwd_dx", "cpu", "numpy", baseline=True)
def dx_numpy(dx, dy, w, H, W, stride, pad):
    """col2im: the (C R S, N P Q) matrix W^T @ dY, each column's taps added back onto the padded input."""
    N, K, P, Q = dy.shape
    _, C, R, S = w.shape
    cols = (w.reshape(K, C * R * S).T @ dy.transpose(1, 0, 2, 3).reshape(K, N * P * Q)).reshape(C, R, S, N, P, Q)
    dxp = np.zeros((N, C, H + 2 * pad + stride, W + 2 * pad + stride), np.float32)
    for r in range(R):
        for s in range(S):
            dxp[:, :, r:r + stride * (P - 1) + 1:stride, s:s + stride * (Q - 1) + 1:stride] += cols[:, r, s].transpose(1, 0, 2, 3)
    dx[...] = dxp[:, :, pad:pad + H, pad:pad + W]


@njit(fastmath=True, cache=True)
def dx_point(dy, w, n, c, h, ww, stride, pad):
    """dx[n, c, h, ww]: the outputs whose windows covered (h, ww): p = (h + pad - r) / stride when that divides."""
    K, P, Q = dy.shape[1], dy.shape[2], dy.shape[3]
    R, S = w.shape[2], w.shape[3]
    acc = np.float32(0.0)
    for r in range(R):
        hp = h + pad - r
        if hp >= 0 and hp % stride == 0 and hp // stride < P:
            p = hp // stride
            for s in range(S):
                wq = ww + pad - s
                if wq >= 0 and wq % stride == 0 and wq // stride < Q:
                    q = wq // stride
                    for k in range(K):
                        acc += dy[n, k, p, q] * w[k, c, r, s]
    return acc


@njit(fastmath=True, parallel=True, cache=True)
def dx_gather(dx, dy, w, stride, pad):
    N, C, H, W = dx.shape
    for nc in prange(N * C):
        n, c = nc // C, nc % C
        for h in range(H):
            for ww in range(W):
                dx[n, c, h, ww] = dx_point(dy, w, n, c, h, ww, stride, pad)


@register("conv2d_bwd_dx", "cpu", "gather_par", rung=1)
def dx_gather_cpu(dx, dy, w, H, W, stride, pad):
    """The transposed convolution as a gather: each dx element sums dy * w over the (p, q, r, s) with
    p stride - pad + r = h (a tap lands on h only when h + pad - r divides by the stride). Each output is
    written by one thread: no atomics, no races; prange over the N C planes."""
    dx_gather(dx, dy, w, stride, pad)


@cuda.jit(fastmath=True)
def dx_gather_kernel(dx, dy, w, stride, pad):
    # dx (N,C,H,W) <- dy (N,K,P,Q), w (K,C,R,S): one thread per dx element, a gather over the windows covering it
    i = cuda.grid(1)
    N, C, H, W = dx.shape
    if i >= dx.size:
        return
    ww = i % W
    h = (i // W) % H
    c = (i // (H * W)) % C
    n = i // (C * H * W)
    K, P, Q = dy.shape[1], dy.shape[2], dy.shape[3]
    R, S = w.shape[2], w.shape[3]
    acc = float32(0.0)
    for r in range(R):
        hp = h + pad - r
        if hp >= 0 and hp % stride == 0 and hp // stride < P:
            p = hp // stride
            for s in range(S):
                wq = ww + pad - s
                if wq >= 0 and wq % stride == 0 and wq // stride < Q:
                    q = wq // stride
                    for k in range(K):
                        acc += dy[n, k, p, q] * w[k, c, r, s]
    dx[n, c, h, ww] = acc


@register("conv2d_bwd_dx", "gpu", "gather", rung=1, ptx=[(dx_gather_kernel, SIG_CONV2D)])
def dx_gather_gpu(dx, dy, w, H, W, stride, pad):
    """One thread per dx element gathering from the dy windows that covered it (no atomics); with stride 1
    every element reads K R S values of dy and of w: the direct forward rung's cost, run backwards."""
    if dx.size:
        dx_gather_kernel[ceil_div(dx.size, 256), 256](dx, dy, w, stride, pad)


def output_padding(dy, w, H, W, stride, pad):
    """conv_transpose2d's output_padding: the rows and columns of x that no window reached (stride > 1)."""
    P, Q = dy.shape[2], dy.shape[3]
    R, S = w.shape[2], w.shape[3]
    return H - ((P - 1) * stride - 2 * pad + R), W - ((Q - 1) * stride - 2 * pad + S)


@cuda.jit
def flip_swap_kernel(wt, w):
    # wt (C,K,R,S) <- w (K,C,R,S) flipped in space: wt[c, k, R-1-r, S-1-s] = w[k, c, r, s]
    i = cuda.grid(1)
    K, C, R, S = w.shape
    if i < w.size:
        s = i % S
        r = (i // S) % R
        c = (i // (R * S)) % C
        k = i // (C * R * S)
        wt[c, k, R - 1 - r, S - 1 - s] = w[k, c, r, s]


@register("conv2d_bwd_dx", "gpu", "as_conv", rung=2, ptx=[(flip_swap_kernel, f"void({SIG4}, {SIG4})")])
def dx_as_conv_gpu(dx, dy, w, H, W, stride, pad):
    """For stride 1, dx IS a forward convolution: of dy, padded by R - 1 - pad, with the filters flipped in
    space and their K and C axes swapped (one tiny kernel builds them). So the forward pass's best rung
    (implicit GEMM, rung 5) computes it, at the forward's speed. Stride > 1 (zeros between dy's elements)
    and pad > R - 1 fall back to rung 1's gather."""
    K, C, R, S = w.shape
    if stride != 1 or pad > R - 1 or pad > S - 1 or R != S:
        dx_gather_gpu(dx, dy, w, H, W, stride, pad)
        return
    if dx.size == 0:
        return
    wt = scratch("wt", (C, K, R, S))
    flip_swap_kernel[ceil_div(w.size, 256), 256](wt, w)
    _implicit_vec(dx, dy, wt, 1, R - 1 - pad)


@register("conv2d_bwd_dx", "gpu", "cudnn", baseline=True, requires=_torch_gpu)
def dx_cudnn(dx, dy, w, H, W, stride, pad):
    """torch's conv_transpose2d (cuDNN's backward-data algorithms), TF32 off, copied into dx."""
    import torch

    from .reductions import torch_view

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    torch_view(dx).copy_(torch.nn.functional.conv_transpose2d(
        torch_view(dy), torch_view(w), stride=stride, padding=pad, output_padding=output_padding(dy, w, H, W, stride, pad)))


@register("conv2d_bwd_dw", "cpu", "numpy", baseline=True)
def dw_numpy(dw, x, dy, R, S, stride, pad):
    """dW = dY (K, N P Q) @ col^T (N P Q, C R S): the same im2col matrix as the forward, transposed."""
    K = dy.shape[1]
    C = x.shape[1]
    col = im2col_numpy(x, R, S, stride, pad)
    dw[...] = (dy.transpose(1, 0, 2, 3).reshape(K, -1) @ col.T).reshape(K, C, R, S)


@njit(fastmath=True, parallel=True, cache=True)
def dw_corr(dw, x, dy, stride, pad):
    K, C, R, S = dw.shape
    N, H, W = x.shape[0], x.shape[2], x.shape[3]
    P, Q = dy.shape[2], dy.shape[3]
    for kc in prange(K * C):
        k, c = kc // C, kc % C
        for r in range(R):
            for s in range(S):
                acc = np.float32(0.0)
                for n in range(N):
                    for p in range(P):
                        h = p * stride - pad + r
                        if 0 <= h < H:
                            for q in range(Q):
                                ww = q * stride - pad + s
                                if 0 <= ww < W:
                                    acc += dy[n, k, p, q] * x[n, c, h, ww]
                dw[k, c, r, s] = acc


@register("conv2d_bwd_dw", "cpu", "corr_par", rung=1)
def dw_corr_cpu(dw, x, dy, R, S, stride, pad):
    """The correlation as loops: each dw[k, c, r, s] is a sum over N P Q products, prange over (k, c)."""
    dw_corr(dw, x, dy, stride, pad)


DW_THREADS_GPU, DW_THREADS_SIM = 256, 32


def make_dw_kernel(T):
    from .reductions import block_sum_smem

    @cuda.jit(fastmath=True)
    def dw_reduce_kernel(dw, x, dy, stride, pad):
        # block b owns dw.flat[b] = (k, c, r, s); its T threads stride over the N P Q products and add them
        # with chapter 7's shared-memory tree
        buf = cuda.shared.array(T, float32)
        K, C, R, S = dw.shape
        b = cuda.blockIdx.x
        s = b % S
        r = (b // S) % R
        c = (b // (R * S)) % C
        k = b // (C * R * S)
        N, H, W = x.shape[0], x.shape[2], x.shape[3]
        P, Q = dy.shape[2], dy.shape[3]
        acc = float32(0.0)
        for j in range(cuda.threadIdx.x, N * P * Q, T):
            q = j % Q
            p = (j // Q) % P
            n = j // (P * Q)
            h = p * stride - pad + r
            ww = q * stride - pad + s
            if 0 <= h < H and 0 <= ww < W:
                acc += dy[n, k, p, q] * x[n, c, h, ww]
        tot = block_sum_smem(acc, buf)
        if cuda.threadIdx.x == 0:
            dw[k, c, r, s] = tot

    return dw_reduce_kernel


_dw_gpu = make_dw_kernel(DW_THREADS_GPU)
_dw = make_dw_kernel(DW_THREADS_SIM) if device.SIMULATED else _dw_gpu


@register("conv2d_bwd_dw", "gpu", "reduce", rung=1, ptx=[(_dw_gpu, SIG_CONV2D)])
def dw_reduce_gpu(dw, x, dy, R, S, stride, pad):
    """A block per weight: a sum of N P Q products, reduced with chapter 7's shared-memory tree. Each block
    reads a dy plane and an x plane (from L2 after the first of the K C R S blocks): a reduction's pattern on a
    GEMM's arithmetic, so expect it well below the GEMM rate; it is the correctness rung."""
    if dw.size:
        _dw[dw.size, DW_THREADS_SIM if device.SIMULATED else DW_THREADS_GPU](dw, x, dy, stride, pad)


@cuda.jit
def im2col_t_kernel(colt, x, R, S, stride, pad, P, Q):
    # colt (N P Q, C R S) <- x (N,C,H,W): the im2col matrix transposed, row = pixel, column = (c, r, s);
    # thread (row j, column crs) with crs fastest, so a warp writes 32 consecutive floats of a row
    crs = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    j = cuda.blockIdx.x  # grid x: N P Q can pass the 65 535 blocks grid y allows
    if crs >= colt.shape[1]:
        return
    colt[j, crs] = im2col_value(x, crs, j, R, S, stride, pad, P, Q)


@cuda.jit
def knpq_from_nkpq_kernel(y2, y):
    # y2 (K, N P Q) <- y (N,K,P,Q): dy with its channels first, the GEMM's A operand
    i = cuda.grid(1)
    N, K, P, Q = y.shape
    PQ = P * Q
    if i < y.size:
        pq = i % PQ
        k = (i // PQ) % K
        n = i // (K * PQ)
        y2[k, n * PQ + pq] = y[n, k, pq // Q, pq % Q]


@register("conv2d_bwd_dw", "gpu", "im2col_splitk", rung=2,
          ptx=[(im2col_t_kernel, f"void(float32[:, ::1], {SIG4}, int64, int64, int64, int64, int64, int64)"),
               (knpq_from_nkpq_kernel, f"void(float32[:, ::1], {SIG4})")],
          bytes=lambda s, b: conv_bytes(s, b) + im2col_extra_bytes(s, b))
def dw_im2col_splitk_gpu(dw, x, dy, R, S, stride, pad):
    """dW (K, C R S) = dY (K, N P Q) @ X_col^T (N P Q, C R S): the forward's im2col matrix, transposed, and
    dy permuted channels-first, multiplied by chapter 5's split-K GEMM (rung 12: a depth of N P Q = 100 352
    and a 64 x 576 output, the shape split-K is for; chapter 14 dispatches dW products to it). The matrix costs
    the same 0.46 GB of traffic as the forward's im2col rung: predict ~0.5 ms, ~60x rung 1."""
    N, K, P, Q = dy.shape
    C = x.shape[1]
    if dw.size == 0:
        return
    colt = scratch("colt", (N * P * Q, C * R * S))
    im2col_t_kernel[(N * P * Q, ceil_div(C * R * S, 128)), 128](colt, x, R, S, stride, pad, P, Q)
    dy2 = scratch("dy2", (K, N * P * Q))
    knpq_from_nkpq_kernel[ceil_div(dy.size, 256), 256](dy2, dy)
    gemm.gemm_splitk_launch(dw.reshape(K, C * R * S), dy2, colt)


@register("conv2d_bwd_dw", "gpu", "cudnn", baseline=True, requires=_torch_gpu)
def dw_cudnn(dw, x, dy, R, S, stride, pad):
    """torch.nn.grad.conv2d_weight (cuDNN's backward-filter algorithms), TF32 off, copied into dw."""
    import torch

    from .reductions import torch_view

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    torch_view(dw).copy_(torch.nn.grad.conv2d_weight(torch_view(x), tuple(dw.shape), torch_view(dy),
                                                      stride=stride, padding=pad))


# ======================================================================================= exercises
def reference_halo(x, w, pad):
    """One signal, one filter: y[p] = sum_r x[p - pad + r] w[r], x zero outside [0, L)."""
    return reference_1d(x[None, None], w[None, None], 1, pad)[0, 0]


def make_inputs_halo(size, dtype, rng):
    L, R, pad = size
    return rng.standard_normal(L).astype(dtype), rng.standard_normal(R).astype(dtype), int(pad)


exercise_op("conv1d_halo", reference=reference_halo, make_inputs=make_inputs_halo, chapter=17,
            title="one-channel 1D convolution, tiled with a halo", size_names=("L", "R", "pad"), kind="compute",
            output_names=("y",), tol=sum_tol(lambda s: s[1]), flops=lambda s: 2 * s[0] * s[1],
            bytes=lambda s, b: 2 * s[0] * b,
            sizes={"check": [(1, 1, 0), (37, 5, 2), (64, 3, 1)], "check_sim": [(1, 1, 0), (37, 5, 2), (64, 3, 1)],
                   "bench": [(64, 3, 1)]})


def reference_im2col(x, R, S, stride, pad):
    """col (C R S, P Q) of one image x (C, H, W): row (c, r, s), column (p, q) holds x_pad[c, p stride + r, q stride + s]."""
    return im2col_numpy(x[None].astype(np.float64), R, S, stride, pad)


def make_inputs_im2col(size, dtype, rng):
    C, H, W, R, S, stride, pad = size
    return rng.standard_normal((C, H, W)).astype(dtype), int(R), int(S), int(stride), int(pad)


exercise_op("im2col", reference=reference_im2col, make_inputs=make_inputs_im2col, chapter=17,
            title="the im2col index map of one image", size_names=("C", "H", "W", "R", "S", "stride", "pad"),
            kind="memory", output_names=("col",), tol=(0.0, 0.0), flops=lambda s: 0, bytes=lambda s, b: 0,
            sizes={"check": [(1, 1, 1, 1, 1, 1, 0), (2, 5, 7, 3, 3, 1, 1), (3, 9, 8, 3, 2, 2, 1)],
                   "check_sim": [(1, 1, 1, 1, 1, 1, 0), (2, 5, 7, 3, 3, 1, 1)], "bench": [(2, 5, 7, 3, 3, 1, 1)]})
