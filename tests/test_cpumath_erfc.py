"""The course's vectorizable float32 erfc (kernels_src/ops/cpumath.py): its stated error bound, its special values,
and that a loop over it compiles to SIMD instructions with no libm call."""
import math
import platform

import numpy as np
import pytest

from kernels_src.compiler import njit
from kernels_src.ops import cpumath


@njit(error_model="numpy")
def _erfc_loop(out, x):
    for i in range(x.size):
        out[i] = cpumath.erfc_f32(x[i])


def _erfc(x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.full_like(x, np.nan)  # poisoned
    _erfc_loop(out, x)
    return out.astype(np.float64)


_REF = np.vectorize(math.erfc, otypes=[np.float64])


def test_error_bound():
    x = np.linspace(-6, 4, 400_003, dtype=np.float32)
    ref = _REF(x.astype(np.float64))
    rel = np.abs(_erfc(x) - ref) / ref
    assert rel.max() <= cpumath.ERFC_MAX_REL_ERR, f"max relative error {rel.max():.3g} at x={x[rel.argmax()]}"
    # the far tail, down to erfc = 1e-36: the rounding of z*z grows the error like z^2 * 6e-8 (see erfc_f32)
    x = np.linspace(4, 9, 100_003, dtype=np.float32)
    ref = _REF(x.astype(np.float64))
    assert (np.abs(_erfc(x) - ref) / ref).max() <= 1e-5


def test_a_mutant_fails():
    # the same bound rejects a plausible mistake: the fit's last coefficient dropped
    x = np.linspace(0, 4, 10_001)
    t = 1 / (1 + 0.5 * x)
    c = [-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398, 1.48851587,
         -0.82215223]
    p = np.polynomial.polynomial.polyval(t, c)
    ref = _REF(x)
    assert (np.abs(t * np.exp(p - x * x) - ref) / ref).max() > cpumath.ERFC_MAX_REL_ERR


def test_special_values():
    got = _erfc(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 30.0, -30.0], np.float32))
    assert np.isnan(got[0])
    assert got[1:].tolist() == [0.0, 2.0, 1.0, 1.0, 0.0, 2.0]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="counts x86-64 SIMD instructions")
def test_the_loop_vectorizes_without_libm_calls():
    from kernels_src.tools.asm import classify

    _erfc(np.ones(8, np.float32))
    sig = _erfc_loop.signatures[0]
    counts = classify(_erfc_loop.inspect_asm(sig), _erfc_loop.inspect_llvm(sig))
    assert counts["widest_fp_bits"] >= 256, counts
    assert not any(("exp" in c or "erf" in c) for c in counts["calls"]), counts["calls"]
