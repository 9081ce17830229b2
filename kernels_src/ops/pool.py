"""Pooling: max and average over sliding windows (chapter 17), a reduction per output.

Shapes: x (N,C,H,W), window R x S, stride, pad -> y (N,C,P,Q),  P = (H + 2 pad - R) // stride + 1 (as conv2d)
        maxpool2d: y[n,c,p,q] = max over the window of x; the padding is -inf (it never wins), and a NaN in
                   the window makes the output NaN (torch's rule, and np.maximum's)
        avgpool2d: y[n,c,p,q] = (sum over the window of x) / (R S); the padding counts as zeros in the
                   divisor (torch's default, count_include_pad=True)
        torch requires pad <= R / 2 and S / 2; the sizes below keep to that, the kernels do not need it.
Cost:   N C P Q R S comparisons or additions on N C H W + N C P Q floats: memory-bound (a 3 x 3 stride-2 pool
        reads each input about 2.25 times from L1/L2 and once from DRAM).

Ladder (both ops)
  cpu/numpy   baseline  sliding_window_view, then .max / .mean over the window axes
  cpu/torch   baseline  torch.nn.functional.max_pool2d / avg_pool2d on the CPU
  cpu/par     rung 1    loops over each window, planes spread over cores with prange
  gpu/direct  rung 1    one thread per output, its window read through L1 (q fastest: coalesced)
  gpu/torch   baseline  torch's max_pool2d / avg_pool2d
"""
import numpy as np

from ..compiler import cuda, float32, njit, prange
from ..device import ceil_div
from ..registry import define_op, register, sprinkle
from .conv import out_len
from .cpu_baselines import torch_cpu, tviews


def _padded_windows(x, R, S, stride, pad, fill):
    N, C, H, W = x.shape
    P, Q = out_len(H, R, stride, pad), out_len(W, S, stride, pad)
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=fill)
    return np.lib.stride_tricks.sliding_window_view(xp, (R, S), axis=(2, 3))[:, :, ::stride, ::stride][:, :, :P, :Q]


def reference_max(x, R, S, stride, pad):
    """float64 oracle: the maximum over each window of x padded with -inf (a NaN in a window wins)."""
    return np.max(_padded_windows(x.astype(np.float64), R, S, stride, pad, -np.inf), axis=(4, 5))


def reference_avg(x, R, S, stride, pad):
    """float64 oracle: the mean over each R x S window of x padded with zeros (the zeros count)."""
    return np.sum(_padded_windows(x.astype(np.float64), R, S, stride, pad, 0.0), axis=(4, 5)) / (R * S)


def make_inputs(size, dtype, rng):
    N, C, H, W, R, S, stride, pad = size
    return rng.standard_normal((N, C, H, W)).astype(dtype), int(R), int(S), int(stride), int(pad)


def make_edge_inputs(size, dtype, rng):
    """NaN, +-inf, signed zeros and extreme magnitudes: a NaN must win its windows and only those."""
    x, R, S, stride, pad = make_inputs(size, dtype, rng)
    if x.size:
        x = sprinkle(x, rng, [np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38, -3e38, 1e-45])
    return x, R, S, stride, pad


SIZES = {"check": [(1, 1, 1, 1, 1, 1, 1, 0), (1, 1, 7, 5, 3, 3, 2, 1), (2, 3, 9, 11, 2, 2, 2, 0),
                   (1, 5, 13, 7, 5, 5, 1, 2), (3, 2, 8, 8, 3, 2, 1, 1), (2, 7, 17, 19, 3, 3, 3, 1)],
         "check_sim": [(1, 1, 1, 1, 1, 1, 1, 0), (1, 1, 7, 5, 3, 3, 2, 1), (2, 3, 9, 11, 2, 2, 2, 0),
                       (1, 2, 6, 5, 5, 5, 1, 2)],
         "bench": [(8, 64, 112, 112, 3, 3, 2, 1)], "bench_gpu": [(32, 64, 112, 112, 3, 3, 2, 1)],
         "bench_sim": [(1, 2, 9, 9, 3, 3, 2, 1)]}


def _bytes(s, b):
    N, C, H, W, R, S, stride, pad = s
    return (N * C * H * W + N * C * out_len(H, R, stride, pad) * out_len(W, S, stride, pad)) * b


def _flops(s):
    N, C, H, W, R, S, stride, pad = s
    return N * C * out_len(H, R, stride, pad) * out_len(W, S, stride, pad) * R * S


NAMES = ("N", "C", "H", "W", "R", "S", "stride", "pad")
define_op("maxpool2d", reference=reference_max, make_inputs=make_inputs, chapter=17, title="max pooling (NCHW)",
          size_names=NAMES, kind="memory", output_names=("y",), tol=(0.0, 0.0), edge_inputs=make_edge_inputs,
          flops=_flops, bytes=_bytes, sizes=SIZES)
# a sum of R S values divided by R S: a few float32 roundings of values ~1 (|x| ~ 1, sum ~ sqrt(RS))
define_op("avgpool2d", reference=reference_avg, make_inputs=make_inputs, chapter=17, title="average pooling (NCHW)",
          size_names=NAMES, kind="memory", output_names=("y",), tol=(1e-5, 1e-6), flops=_flops, bytes=_bytes,
          sizes=SIZES)


# --------------------------------------------------------------------------------------------- CPU
@register("maxpool2d", "cpu", "numpy", baseline=True)
def maxpool_numpy(y, x, R, S, stride, pad):
    """sliding_window_view over x padded with -inf, then .max over the two window axes."""
    y[...] = _padded_windows(x, R, S, stride, pad, -np.inf).max(axis=(4, 5))


@register("avgpool2d", "cpu", "numpy", baseline=True)
def avgpool_numpy(y, x, R, S, stride, pad):
    """sliding_window_view over x padded with zeros, then .sum over the window axes / (R S)."""
    y[...] = _padded_windows(x, R, S, stride, pad, 0.0).sum(axis=(4, 5)) / np.float32(R * S)


@register("maxpool2d", "cpu", "torch", baseline=True, requires=torch_cpu)
def maxpool_torch_cpu(y, x, R, S, stride, pad):
    """torch.nn.functional.max_pool2d on the CPU, copied into y."""
    import torch

    ty, tx = tviews(y, x)
    ty.copy_(torch.nn.functional.max_pool2d(tx, (R, S), stride=stride, padding=pad))


@register("avgpool2d", "cpu", "torch", baseline=True, requires=torch_cpu)
def avgpool_torch_cpu(y, x, R, S, stride, pad):
    """torch.nn.functional.avg_pool2d on the CPU (count_include_pad=True), copied into y."""
    import torch

    ty, tx = tviews(y, x)
    ty.copy_(torch.nn.functional.avg_pool2d(tx, (R, S), stride=stride, padding=pad))


@njit(inline="always")
def nan_max(a, b):
    """max with NaN winning from either side (a != a only for NaN), as np.maximum."""
    return a if (a >= b or a != a) else b


@njit(parallel=True, cache=True)
def pool_par(y, x, R, S, stride, pad, is_max):
    N, C, P, Q = y.shape
    H, W = x.shape[2], x.shape[3]
    for nc in prange(N * C):
        n, c = nc // C, nc % C
        for p in range(P):
            for q in range(Q):
                acc = -np.inf if is_max else 0.0
                acc = np.float32(acc)
                for r in range(R):
                    h = p * stride - pad + r
                    if 0 <= h < H:
                        for s in range(S):
                            ww = q * stride - pad + s
                            if 0 <= ww < W:
                                acc = nan_max(acc, x[n, c, h, ww]) if is_max else acc + x[n, c, h, ww]
                y[n, c, p, q] = acc if is_max else acc / np.float32(R * S)


@register("maxpool2d", "cpu", "par", rung=1)
def maxpool_par(y, x, R, S, stride, pad):
    """Each window's maximum by loops (the padding skipped: -inf never wins), prange over the N C planes."""
    pool_par(y, x, R, S, stride, pad, True)


@register("avgpool2d", "cpu", "par", rung=1)
def avgpool_par(y, x, R, S, stride, pad):
    """Each window's sum by loops (padding adds nothing), divided by R S; prange over the N C planes."""
    pool_par(y, x, R, S, stride, pad, False)


# --------------------------------------------------------------------------------------------- GPU
def make_pool_kernel(is_max):
    @cuda.jit
    def pool_kernel(y, x, R, S, stride, pad):
        # y (N,C,P,Q) <- x (N,C,H,W): thread i owns y.flat[i] and reduces its R x S window
        i = cuda.grid(1)
        N, C, P, Q = y.shape
        if i >= y.size:
            return
        q = i % Q
        p = (i // Q) % P
        c = (i // (P * Q)) % C
        n = i // (C * P * Q)
        H, W = x.shape[2], x.shape[3]
        acc = float32(-np.inf) if is_max else float32(0.0)
        for r in range(R):
            h = p * stride - pad + r
            if 0 <= h < H:
                for s in range(S):
                    ww = q * stride - pad + s
                    if 0 <= ww < W:
                        v = x[n, c, h, ww]
                        if is_max:
                            acc = acc if (acc >= v or acc != acc) else v  # NaN wins from either side
                        else:
                            acc += v
        y[n, c, p, q] = acc if is_max else acc / float32(R * S)

    return pool_kernel


maxpool_kernel = make_pool_kernel(True)
avgpool_kernel = make_pool_kernel(False)
SIG = "void(float32[:, :, :, ::1], float32[:, :, :, ::1], int64, int64, int64, int64)"


@register("maxpool2d", "gpu", "direct", rung=1, ptx=[(maxpool_kernel, SIG)])
def maxpool_gpu(y, x, R, S, stride, pad):
    """One thread per output reducing its window; neighbouring threads read neighbouring (or, with stride 2,
    every other) x elements, and overlapping windows re-read x from L1. Predict near copy speed on the
    N C H W + N C P Q bytes."""
    if y.size:
        maxpool_kernel[ceil_div(y.size, 256), 256](y, x, R, S, stride, pad)


@register("avgpool2d", "gpu", "direct", rung=1, ptx=[(avgpool_kernel, SIG)])
def avgpool_gpu(y, x, R, S, stride, pad):
    """As max pooling, with a sum and one division per output."""
    if y.size:
        avgpool_kernel[ceil_div(y.size, 256), 256](y, x, R, S, stride, pad)


def _torch_gpu():
    from .reductions import torch_gpu

    return torch_gpu()


@register("maxpool2d", "gpu", "torch", baseline=True, requires=_torch_gpu)
def maxpool_torch_gpu(y, x, R, S, stride, pad):
    """torch's max_pool2d (cuDNN or ATen's kernel), copied into y."""
    import torch

    from .reductions import torch_view

    torch_view(y).copy_(torch.nn.functional.max_pool2d(torch_view(x), (R, S), stride=stride, padding=pad))


@register("avgpool2d", "gpu", "torch", baseline=True, requires=_torch_gpu)
def avgpool_torch_gpu(y, x, R, S, stride, pad):
    """torch's avg_pool2d, copied into y."""
    import torch

    from .reductions import torch_view

    torch_view(y).copy_(torch.nn.functional.avg_pool2d(torch_view(x), (R, S), stride=stride, padding=pad))
