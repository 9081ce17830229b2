"""ReLU forward and backward for the chapter-3 MLP (chapter 6 treats activations in general).

Shapes: Z (M,N) -> H (M,N)                 H = max(Z, 0)
        G (M,N), Z (M,N) -> dZ (M,N)        dZ = G * [Z > 0]     (the derivative at 0 is taken as 0)

Cost:   forward N*M comparisons over 8MN bytes; backward MN multiplies over 12MN bytes: memory-bound.

Ladder (elementwise ops have a short one)
  cpu/numpy    baseline: np.maximum / G * (Z > 0) (a boolean temporary)
  cpu/loop     rung 1  one @njit pass
  gpu/thread   rung 1  one thread per element on a 2D grid of 16 x 16 blocks, bounds-guarded
"""
import numpy as np
from ..compiler import cuda, njit, prange

from ..device import ceil_div
from ..registry import define_op, register, sprinkle


def ref_relu(Z):
    return np.maximum(Z, 0.0)


def ref_relu_bwd(G, Z):
    return G * (Z > 0)


def inputs_relu(size, dtype, rng):
    M, N = size
    Z = rng.standard_normal((M, N)).astype(dtype)
    Z.flat[:: 7] = 0  # exact zeros: the derivative convention at 0 is part of what is checked
    return (Z,)


def inputs_relu_bwd(size, dtype, rng):
    (Z,) = inputs_relu(size, dtype, rng)
    return rng.standard_normal(Z.shape).astype(dtype), Z


def edges_relu(size, dtype, rng):
    """NaN must stay NaN (as in NumPy and torch), infinities and signed zeros."""
    (Z,) = inputs_relu(size, dtype, rng)
    return (sprinkle(Z, rng, [np.nan, np.inf, -np.inf, -0.0]),)


def edges_relu_bwd(size, dtype, rng):
    """Z at NaN, infinities and -0 (derivative 0 there, 1 at +inf); G finite (see activations' relu_bwd)."""
    G, Z = inputs_relu_bwd(size, dtype, rng)
    return G, sprinkle(Z, rng, [np.nan, np.inf, -np.inf, -0.0])


SIZES = {"check": [(1, 1), (1, 7), (3, 5), (17, 33), (300, 64), (257, 129)],
         "check_sim": [(1, 1), (3, 5), (17, 20)],
         "bench": [(300, 64), (4096, 1024)],
         "bench_gpu": [(300, 64), (4096, 1024), (16384, 4096)],
         "bench_sim": [(16, 16)]}

# Exact: no rounding happens in max(z, 0) or g * 1 / g * 0, so the default float32 tolerance is ample.
define_op("relu_mlp_fwd", reference=ref_relu, make_inputs=inputs_relu, chapter=3, size_names=("M", "N"),
          title="ReLU forward (chapter 3's MLP)", output_names=("H",), kind="memory",
          flops=lambda s: s[0] * s[1], bytes=lambda s, b: 2 * s[0] * s[1] * b, sizes=SIZES, edge_inputs=edges_relu)
define_op("relu_mlp_bwd", reference=ref_relu_bwd, make_inputs=inputs_relu_bwd, chapter=3, size_names=("M", "N"),
          title="ReLU backward (chapter 3's MLP)", output_names=("dZ",), kind="memory",
          flops=lambda s: s[0] * s[1], bytes=lambda s, b: 3 * s[0] * s[1] * b, sizes=SIZES, edge_inputs=edges_relu_bwd)


@register("relu_mlp_fwd", "cpu", "numpy", baseline=True)
def relu_fwd_numpy(H, Z):
    """np.maximum into the output."""
    np.maximum(Z, 0, out=H)


@njit(cache=True)
def _relu_fwd_loop(H, Z):
    M, N = Z.shape
    for m in range(M):
        for n in range(N):
            z = Z[m, n]
            H[m, n] = 0.0 if z <= 0 else z  # NaN propagates (NaN <= 0 is false), as in NumPy


@register("relu_mlp_fwd", "cpu", "loop", rung=1)
def relu_fwd_loop(H, Z):
    """One compiled pass; about NumPy's speed (both stream 2 arrays)."""
    _relu_fwd_loop(H, Z)


@register("relu_mlp_bwd", "cpu", "numpy", baseline=True, bytes=lambda s, b: (3 * b + 2) * s[0] * s[1])
def relu_bwd_numpy(dZ, G, Z):
    """NumPy: a boolean mask Z > 0 (a temporary), then a multiply."""
    np.multiply(G, Z > 0, out=dZ)


@njit(cache=True)
def _relu_bwd_loop(dZ, G, Z):
    M, N = Z.shape
    for m in range(M):
        for n in range(N):
            dZ[m, n] = G[m, n] if Z[m, n] > 0 else 0.0


@register("relu_mlp_bwd", "cpu", "loop", rung=1)
def relu_bwd_loop(dZ, G, Z):
    """One compiled pass, no mask array: 3 arrays streamed instead of 3 plus a temporary."""
    _relu_bwd_loop(dZ, G, Z)


@njit(cache=True, parallel=True)
def _relu_fwd_prange(H, Z):
    M, N = Z.shape
    for m in prange(M):
        for n in range(N):
            z = Z[m, n]
            H[m, n] = 0.0 if z <= 0 else z


@njit(cache=True, parallel=True)
def _relu_bwd_prange(dZ, G, Z):
    M, N = Z.shape
    for m in prange(M):
        for n in range(N):
            dZ[m, n] = G[m, n] if Z[m, n] > 0 else 0.0


@register("relu_mlp_fwd", "cpu", "prange", rung=2)
def relu_fwd_prange(H, Z):
    """Rung 1's rows over the cores (issue 36): the loop is already packed compares and blends (kernels asm),
    and one core cannot pull the whole DRAM bandwidth; predict >= 70 % of copy (rung 1 ~58 %)."""
    _relu_fwd_prange(H, Z)


@register("relu_mlp_bwd", "cpu", "prange", rung=2)
def relu_bwd_prange(dZ, G, Z):
    """Rung 1's rows over the cores: 3 arrays streamed by every core; predict >= 70 % of copy (rung 1 ~58 %)."""
    _relu_bwd_prange(dZ, G, Z)


TILE = 16
F2 = "float32[:, ::1]"


@cuda.jit
def relu_fwd_kernel(H, Z):
    n, m = cuda.grid(2)
    if m < Z.shape[0] and n < Z.shape[1]:
        z = Z[m, n]
        H[m, n] = np.float32(0.0) if z <= 0 else z  # NaN fails "<= 0": it propagates, as in NumPy


@cuda.jit
def relu_bwd_kernel(dZ, G, Z):
    n, m = cuda.grid(2)
    if m < Z.shape[0] and n < Z.shape[1]:
        dZ[m, n] = G[m, n] if Z[m, n] > 0 else np.float32(0.0)


def _grid(shape):
    return (ceil_div(shape[1], TILE), ceil_div(shape[0], TILE)), (TILE, TILE)


@register("relu_mlp_fwd", "gpu", "thread", rung=1, ptx=[(relu_fwd_kernel, f"void({F2}, {F2})")])
def relu_fwd_thread(H, Z):
    """One thread per element, coalesced along rows: memory-bound, predicted near copy bandwidth for
    large arrays and launch-bound (a few microseconds) for the MLP's 300 x 64."""
    grid, block = _grid(Z.shape)
    relu_fwd_kernel[grid, block](H, Z)


@register("relu_mlp_bwd", "gpu", "thread", rung=1, ptx=[(relu_bwd_kernel, f"void({F2}, {F2}, {F2})")])
def relu_bwd_thread(dZ, G, Z):
    """One thread per element; reads G and Z, writes dZ. Same prediction as the forward."""
    grid, block = _grid(Z.shape)
    relu_bwd_kernel[grid, block](dZ, G, Z)
