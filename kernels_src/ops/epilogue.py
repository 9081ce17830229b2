"""gemm_bias_gelu: C = gelu(A @ B + bias), a GEMM with its epilogue fused (chapter 5, section "GEMM epilogue").

Shapes: A (M,K) @ B (K,N) + bias (N,) -> C (M,N), float32, row-major. Sizes are written (M, N, K).
GELU:   the tanh approximation, gelu(x) = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), GPT-2's and
        torch's ``gelu(approximate="tanh")`` (chapter 6 derives it; the exact erf form costs more per
        element and gains nothing here). Evaluated as x * sigmoid(2u) = x / (1 + exp(-2u)), the same function
        without the cancellation of 1 + tanh(u) near -1.
Cost:   2MNK + ~10MN FLOPs. The unfused pair moves 2MN more floats than the fused kernel: the GEMM writes
        C, and a second kernel reads it back and writes it again. At 4096^3 that is 134 MB against a GEMM
        of 137 GFLOP: a few per cent of the time, which is what fusion can save in a compute-bound GEMM.

Variants
  cpu/numpy      baseline  numpy.matmul, then bias and GELU in float32 NumPy
  gpu/torch      baseline  torch eager: addmm (cuBLAS, TF32 off) into C, then an in-place GELU kernel
  gpu/compile    baseline  torch.compile of the same function (Inductor: cuBLAS GEMM + one Triton pointwise)
  gpu/unfused    rung 1    chapter 5's best GEMM rung, then a separate bias + GELU kernel over C
  gpu/fused      rung 2    the same GEMM kernel built with ``epilogue=``: bias + GELU applied in registers
                           before the (16-byte) store of C. One kernel, no second pass over C.

The fused kernel is not a copy: ``kernels_src.ops.gemm.make_vec`` builds both from one source, and
``epilogue=None`` removes the bias read and the activation at compile time.
"""
from __future__ import annotations

import math

import numpy as np
from ..compiler import cuda, float32

from .. import device
from ..device import ceil_div
from ..registry import define_op, register
from ..registry import sprinkle as _sprinkle
from . import gemm

K_TANH = np.float32(math.sqrt(2.0 / math.pi))
C_TANH = np.float32(0.044715)
F1 = np.float32(1.0)
F2 = np.float32(2.0)


def reference(A, B, bias):
    """float64 oracle: gelu_tanh(A @ B + bias)."""
    x = A @ B + bias
    with np.errstate(over="ignore", invalid="ignore"):
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def make_inputs(size, dtype, rng):
    M, N, K = size
    A, B = gemm.make_inputs(size, dtype, rng)
    return A, B, rng.standard_normal(N).astype(dtype)


def make_edge_inputs(size, dtype, rng):
    """A NaN in A (its row of C must be NaN), and bias values that push GELU to its tails: -1e4 (where
    exp(-2u) overflows to inf and gelu must give -0, not NaN), 1e4 (gelu(x) = x) and NaN."""
    A, B, bias = make_inputs(size, dtype, rng)
    _sprinkle(A, rng, [np.nan])
    _sprinkle(bias, rng, [-1e4, 1e4, np.nan, -30.0, 30.0])
    return A, B, bias


def tol(size, dtype):
    """GEMM's tolerance (gemm.gemm_tol), widened for GELU: |gelu'| <= 1.13, plus its own float32 rounding."""
    rtol, atol = gemm.gemm_tol(size, dtype)
    return max(rtol, 2e-6), 1.2 * atol + 1e-6


def flops(s):
    M, N, K = s
    return 2 * M * N * K + 10 * M * N


def _gemm_bytes(s, b):
    return gemm._cfg_bytes(gemm._warptile)(s, b) + s[1] * b  # the GEMM's tile traffic + the bias


def bytes_unfused(s, b):
    """The GEMM's traffic, then the second kernel reads C and writes it again: 2MN more floats."""
    return _gemm_bytes(s, b) + 2 * s[0] * s[1] * b


define_op(
    "gemm_bias_gelu", reference=reference, make_inputs=make_inputs, chapter=5,
    title="GEMM + bias + GELU (fused epilogue)", size_names=("M", "N", "K"), kind="compute",
    output_names=("C",), tol=tol, flops=flops, bytes=lambda s, b: (s[0] * s[2] + s[2] * s[1] + s[0] * s[1] + s[1]) * b,
    edge_inputs=make_edge_inputs,
    sizes={
        "check": [(1, 1, 1), (7, 5, 3), (33, 17, 9), (129, 131, 17), (257, 388, 132), (520, 392, 264)],
        "check_sim": [(1, 1, 1), (7, 5, 3), (33, 17, 9)],
        "bench": [(128, 128, 128)],
        # a square GEMM, and the shape of GPT-2 small's MLP up-projection for 8 x 1024 tokens
        "bench_gpu": [(4096, 4096, 4096), (8192, 3072, 768)],
        "bench_sim": [(33, 17, 9)],
    },
)


# ================================================================================================ CPU
@register("gemm_bias_gelu", "cpu", "numpy", baseline=True)
def gemm_bias_gelu_numpy(C, A, B, bias):
    """NumPy: matmul (the machine's BLAS), then bias and GELU as whole-array float32 expressions."""
    x = A @ B + bias
    u = K_TANH * (x + C_TANH * x * x * x)
    with np.errstate(over="ignore"):
        C[:] = x / (F1 + np.exp(-F2 * u))


# ================================================================================================ GPU
def gelu_tanh(x):
    """x * sigmoid(2u) with u = sqrt(2/pi) (x + 0.044715 x^3): for x << 0, exp overflows to inf and
    x / inf = -0, the right limit."""
    u = K_TANH * (x + C_TANH * x * x * x)
    return x / (F1 + math.exp(-F2 * u))


gelu_tanh_dev = cuda.jit(device=True, inline="always")(gelu_tanh)  # inlined: no call, and no driver needed to emit PTX

_fused = gemm.make_vec(**gemm.WARPTILE, epilogue=gelu_tanh_dev)
SIG_EPI = "void(float32[:, ::1], float32[::1])"
EW_THREADS = 256
EW_ITEMS = 4  # columns per thread, EW_THREADS apart (coalesced)


@cuda.jit(fastmath=True)
def bias_gelu_inplace_kernel(C, bias):
    # grid (ceil(N / (EW_THREADS * EW_ITEMS)), M): blockIdx.y is the row; each thread loads its EW_ITEMS
    # columns first, then applies GELU and stores them
    n = C.shape[1]
    r = cuda.blockIdx.y
    c0 = cuda.blockIdx.x * (EW_THREADS * EW_ITEMS) + cuda.threadIdx.x
    v = cuda.local.array(EW_ITEMS, float32)
    for k in range(EW_ITEMS):
        c = c0 + k * EW_THREADS
        v[k] = C[r, c] + bias[c] if c < n else float32(0.0)
    for k in range(EW_ITEMS):
        c = c0 + k * EW_THREADS
        if c < n:
            C[r, c] = gelu_tanh_dev(v[k])


@register("gemm_bias_gelu", "gpu", "unfused", rung=1, bytes=bytes_unfused,
          ptx=[(gemm._warptile.kernel, gemm.SIG_VEC), (bias_gelu_inplace_kernel, SIG_EPI)])
def gemm_bias_gelu_unfused(C, A, B, bias):
    """Two kernels: chapter 5's warptile GEMM writes C, then a bias + GELU kernel reads C and rewrites it.

    The GEMM rung as registered (gemm/gpu/warptile), then one elementwise kernel in place (4 columns per
    thread, coalesced). The second kernel moves 2MN floats. Predicted: the GEMM's time plus 2MN*4 bytes at
    near copy bandwidth, about 2 % slower than fused at 4096^3 and 4-6 % at 8192x3072x768."""
    M, N = C.shape
    gemm._warptile(C, A, B)
    bias_gelu_inplace_kernel[(ceil_div(N, EW_THREADS * EW_ITEMS), M), EW_THREADS](C, bias)


@register("gemm_bias_gelu", "gpu", "fused", rung=2, bytes=_gemm_bytes,
          ptx=[(_fused.kernel, gemm.SIG_VEC)])
def gemm_bias_gelu_fused(C, A, B, bias):
    """One kernel: the warptile GEMM built with ``epilogue=gelu_tanh``; bias + GELU happen in registers.

    ``make_vec(**WARPTILE, epilogue=gelu_tanh_dev)``: the accumulators get the bias (a 16-byte load per
    4 columns) and GELU just before the store, so C is written once and never read. Predicted: as fast as
    the GEMM alone within noise (GELU's ~10 FLOPs per output against 2K = 8192 for the GEMM), so 2-6 %
    faster than unfused."""
    _fused(C, A, B, bias)


# ------------------------------------------------------------------------------------ torch baselines
def _no_tf32():
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False


@register("gemm_bias_gelu", "gpu", "torch", baseline=True, requires=gemm._torch_gpu)
def gemm_bias_gelu_torch(C, A, B, bias):
    """torch eager, TF32 off: addmm (cuBLAS; the bias add may be fused into its epilogue) into C, then an
    in-place GELU (tanh) kernel."""
    import torch

    _no_tf32()
    c = gemm._as_torch(C)
    torch.addmm(gemm._as_torch(bias), gemm._as_torch(A), gemm._as_torch(B), out=c)
    torch.ops.aten.gelu_(c, approximate="tanh")


def _torch_fn(C, A, B, bias):
    import torch

    C.copy_(torch.nn.functional.gelu(A @ B + bias, approximate="tanh"))


_COMPILED: dict = {}


@register("gemm_bias_gelu", "gpu", "compile", baseline=True, requires=gemm._torch_gpu)
def gemm_bias_gelu_compile(C, A, B, bias):
    """torch.compile of gelu(A @ B + bias) written into C, TF32 off (Inductor's default mode: a cuBLAS GEMM
    and one generated Triton kernel for bias + GELU + the store)."""
    import torch

    _no_tf32()
    if "f" not in _COMPILED:
        _COMPILED["f"] = torch.compile(_torch_fn, dynamic=False)
    _COMPILED["f"](gemm._as_torch(C), gemm._as_torch(A), gemm._as_torch(B), gemm._as_torch(bias))

