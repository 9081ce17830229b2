"""The integer-vector intrinsics (kernels_src/compiler/cpuint8.py) and the rungs built on them (issue 36): what
their docstrings claim, beyond the registry's generic checks.

- ``vround_away16`` is C's roundf on every float32 that fits an int32, ties included;
- ``vfirst_absbits16`` finds the first lane of a magnitude, and says 16 when none has it;
- the ``simd`` quantize rungs are bit-exact on blocks with NaN, inf and signed zeros (GGML's first-wins max
  decides the sign of a Q4_0 scale);
- the Q4_0 GEMV rung keeps its partial sums in vectors: its machine code folds lanes once per output.
"""
import numpy as np

import kernels_src.ops  # noqa: F401  (registers every op)
from kernels_src.compiler import njit
from kernels_src.compiler.cpuint8 import vfirst_absbits16, vround_away16, vstore_bytes16
from kernels_src.compiler.cpusimd import vload16
from kernels_src.ops import quant as Q
from kernels_src.registry import get_variant


@njit(cache=False)
def _round_bytes(out, x):
    for i in range(0, x.size, 16):
        vstore_bytes16(out, i, vround_away16(vload16(x, i)))


@njit(cache=False)
def _first(x, bits):
    return vfirst_absbits16(vload16(x, 0), bits)


def test_vround_away16_is_roundf_with_ties():
    rng = np.random.default_rng(0)
    x = np.concatenate([np.arange(-130, 130) + np.float32(0.5), np.arange(-130, 130, dtype=np.float32),
                        np.float32(0.49999997) * np.array([1, -1]), [np.nextafter(np.float32(2.5), np.float32(3))],
                        rng.uniform(-127, 127, 4000)]).astype(np.float32)
    x = np.concatenate([x, np.zeros(-x.size % 16, np.float32)])
    out = np.empty(x.size, np.uint8)
    _round_bytes(out, x)
    want = (np.sign(x.astype(np.float64)) * np.floor(np.abs(x.astype(np.float64)) + 0.5)).astype(np.int64)
    assert np.array_equal(out, (want & 0xFF).astype(np.uint8))


def test_vfirst_absbits16():
    x = np.zeros(16, np.float32)
    x[5], x[9] = -3.0, 3.0
    bits = int(np.float32(3.0).view(np.int32))
    assert _first(x, bits) == 5
    assert _first(x, bits + 1) == 16


def test_quantize_simd_bit_exact_on_nan_inf_and_signed_zero_blocks():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((6, 256)).astype(np.float32)
    X[0, 3], X[1, 40], X[2, 100] = np.nan, np.inf, -np.inf
    X[3, 0:32] = -0.0  # all-zero block whose first value is -0: the Q4_0 scale is +0
    X[3, 32:64] = 0.0
    X[4, 64:96] = 0.0
    X[4, 64], X[4, 80] = -2.0, 2.0  # a tie of magnitudes: the first (-2) sets the sign
    for op, ref, bb in (("q8_0_quantize", Q.q8_0_quantize_ref, 34), ("q4_0_quantize", Q.q4_0_quantize_ref, 18)):
        out = np.full((X.shape[0], X.shape[1] // 32 * bb), 0xAB, np.uint8)
        get_variant(f"{op}/cpu/simd").fn(out, X)
        with np.errstate(invalid="ignore", over="ignore"):
            want = ref(X)
        assert np.array_equal(out, want), (op, np.argwhere(out != want)[:5])


def test_q4_0_gemv_simd_folds_lanes_once_per_output():
    src = Q._rows4_q4_0_simd.py_func.__code__.co_names
    assert "vsum16" in src and "vfma16" in src
