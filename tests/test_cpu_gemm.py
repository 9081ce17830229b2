"""The packed CPU GEMM rungs (gemm/cpu/packed, packed_par) on shapes the op's ``check`` sizes do not reach.

The check sizes keep K below one packed block (PKC), so the path that adds a second K block into C, and a
last K block shorter than PKC, are tested here; so are row counts that cross a task boundary (PMC) by one
and column counts that leave a sliver of 1 to 5 padded columns.
"""
import numpy as np
import pytest

from kernels_src import parity
from kernels_src.ops import gemm
from kernels_src.registry import get_op, get_variant

PKC, PMC = gemm.PKC, gemm.PMC
SIZES = [
    (5, 7, PKC),  # exactly one K block
    (3, 13, PKC + 1),  # a second K block one deep
    (PMC + 1, 11, 2 * PKC + 37),  # three K blocks, a task of one row, a 5-column padded sliver
    (2 * PMC + 3, 1, 1500),  # one column of C
    (1, 2 * gemm.PNR + 1, 1100),  # one row of C
]


@pytest.mark.parametrize("variant", ["packed", "packed_par"])
@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_packed_gemm_long_k(variant, size):
    v = get_variant(f"gemm/cpu/{variant}")
    rep = parity.check_variant(v, get_op("gemm"), size, "float32", seed=sum(size))
    assert rep.ok, str(rep)


def test_packed_buffers_are_padded():
    """B's slivers are PNR columns wide and PKC + PPAD deep: a partial last sliver is zero-padded, never read
    past B."""
    A = np.ones((3, 5), np.float32)
    B = np.arange(5 * 7, dtype=np.float32).reshape(5, 7)
    Bp = gemm._packed_buffers(A, B)
    gemm._pack_b(Bp, B)
    assert Bp.shape == (1, 2, gemm.PNR, PKC + gemm.PPAD)
    np.testing.assert_array_equal(Bp[0, 0, :, :5], B[:, :6].T)
    np.testing.assert_array_equal(Bp[0, 1, 0, :5], B[:, 6])
    assert not Bp[0, 1, 1:, :5].any()


# ------------------------------------------------------------------ rung 9 (zmm_par) and the intrinsics under it
from kernels_src.compiler import vfma16, vload16, vsplat16, vstore16, zmm_kernels  # noqa: E402
from kernels_src.compiler import njit  # noqa: E402

needs_zmm = pytest.mark.skipif(not zmm_kernels()[0], reason=zmm_kernels()[1] or "AVX-512")
ZKC, ZMR, ZNR = gemm.ZKC, gemm.ZMR, gemm.ZNR
ZSIZES = [
    (5, 7, ZKC),  # exactly one K block
    (3, ZNR + 1, ZKC + 1),  # a second K block one deep, a sliver of one column
    (gemm.ZMC + 1, 11, 2 * ZKC + 37),  # three K blocks, a task of one row
    (2 * gemm.ZMC + ZMR - 1, 1, 1500),  # one column of C
    (1, 2 * ZNR + 5, 1100),  # one row of C
]


@needs_zmm
@pytest.mark.parametrize("size", ZSIZES, ids=lambda s: "x".join(map(str, s)))
def test_zmm_gemm_long_k(size):
    rep = parity.check_variant(get_variant("gemm/cpu/zmm_par"), get_op("gemm"), size, "float32", seed=sum(size))
    assert rep.ok, str(rep)


@pytest.mark.parametrize("transpose", ["A", "B", "both", "C"])
def test_cpu_best_on_strided_views(transpose):
    """gemm_cpu_best (rung 9 where AVX-512 is, else rung 8) reads transposed views and writes a strided C,
    as the linear layers and conv2d call it; NaN poison in C must all be overwritten."""
    rng = np.random.default_rng(3)
    M, N, K = 67, 45, ZKC + 3
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    a = np.ascontiguousarray(A.T).T if transpose in ("A", "both") else A
    b = np.ascontiguousarray(B.T).T if transpose in ("B", "both") else B
    big = np.full((N, M), np.nan, np.float32)
    C = big.T if transpose == "C" else np.full((M, N), np.nan, np.float32)
    gemm.gemm_cpu_best(C, a, b)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    rtol, atol = gemm.gemm_tol((M, N, K), np.float32)
    np.testing.assert_allclose(C, ref, rtol=rtol, atol=atol)


@needs_zmm
def test_zmm_gemm_propagates_nan_and_inf():
    """An inf in A times a zero in B is NaN in C, as in the float64 reference; padding rows and columns do not
    leak into C."""
    rng = np.random.default_rng(5)
    M, N, K = 13, 35, 9
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    A[2, 3] = np.inf
    B[3, 4] = 0.0
    A[7, 1] = np.nan
    C = np.full((M, N), 7.0, np.float32)
    gemm.gemm_zmm_par(C, A, B)
    with np.errstate(invalid="ignore"):
        ref = A.astype(np.float64) @ B.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(C), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(C), np.isinf(ref))
    ok = np.isfinite(ref)
    np.testing.assert_allclose(C[ok], ref[ok], rtol=1e-4, atol=1e-4)


@njit(cache=False)
def _axpy16(out, x, a, y):
    for i in range(0, x.shape[0], 16):
        vstore16(out, i, vfma16(vsplat16(a), vload16(x, i), vload16(y, i)))


def test_vector_intrinsics_compute_a_fused_axpy():
    """vload16 / vsplat16 / vfma16 / vstore16 (the compiler door's 16-float vectors) against NumPy, with an
    unaligned start (a view one float in), so vload16 must not assume 64-byte alignment."""
    rng = np.random.default_rng(1)
    buf = rng.standard_normal(3 * 16 + 1).astype(np.float32)
    x = buf[1:]
    y = rng.standard_normal(48).astype(np.float32)
    out = np.full(48, np.nan, np.float32)
    _axpy16(out, x, np.float32(1.5), y)
    ref = (np.float64(1.5) * x + y).astype(np.float32)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


@needs_zmm
def test_fma_peak_loop_computes_its_chains():
    """The peak loop really does n dependent FMAs per chain: its result is the float32 recurrence a <- a*x + y."""
    from kernels_src.tools import fmapeak

    out = np.empty(16 * 12, np.float32)
    fmapeak._fma_loop(out, 1000)
    a = np.array([0.5] * 6 + [0.25] * 6, np.float64)
    x, y = np.float64(np.float32(1.0000001)), np.float64(np.float32(1e-9))
    for _ in range(1000):
        a = a * x + y
    np.testing.assert_allclose(out.reshape(12, 16), np.repeat(a[:, None], 16, axis=1), rtol=1e-5)
    assert not np.allclose(out.reshape(12, 16)[:, 0], [0.5] * 6 + [0.25] * 6, rtol=1e-5)


def test_fma_peak_ymm_loop_computes_its_chains_and_the_peak_counts_machine_instructions():
    """The AVX2 peak loop (six f32x16 chains, twelve ymm registers) is the same recurrence; the rate it reports is
    of machine FMA instructions (two per f32x16 update on 256-bit registers), the unit the vector-port model of
    figures.cpu reads a hot loop's instruction counts against."""
    from kernels_src.tools import fmapeak

    out = np.full(16 * 12, np.nan, np.float32)
    fmapeak._fma_loop_ymm(out, 1000)
    a = np.array([0.5] * 3 + [0.25] * 3, np.float64)
    x, y = np.float64(np.float32(1.0000001)), np.float64(np.float32(1e-9))
    for _ in range(1000):
        a = a * x + y
    np.testing.assert_allclose(out[:96].reshape(6, 16), np.repeat(a[:, None], 16, axis=1), rtol=1e-5)
    bits, why = fmapeak.target()
    if not bits:
        pytest.skip(why)
    r = fmapeak.fma_peak(n=200_000, repeat=1)
    assert r["bits"] == bits and r["gflops"] == pytest.approx(r["fma_per_s"] * bits / 32 * 2 / 1e9)


@needs_zmm
def test_zmm_rung_is_skipped_without_avx512(monkeypatch):
    """On a CPU without AVX-512 (the issue's AMD EPYC) rung 9 reports itself unavailable, so the best rung and
    gemm_cpu_best fall back to rung 8."""
    from kernels_src.compiler import cpusimd

    monkeypatch.setattr(cpusimd, "has_avx512", lambda: False)
    ok, why = cpusimd.zmm_kernels()
    assert not ok and "AVX-512" in why
    monkeypatch.setattr(gemm, "_ZMM_OK", None)
    assert gemm._zmm_ok() is False
    monkeypatch.setattr(gemm, "_ZMM_OK", None)


@needs_zmm
@pytest.mark.parametrize("op", ["linear_fwd", "linear_bwd_dw", "linear_bwd_dx"])
def test_linear_zmm_past_one_k_block(op):
    """The linear layers' rung 4 on rung 9 with the summed dimension past one packed block (bwd_dw sums over the
    batch M, the others over K or N), on transposed views."""
    size = (ZKC + 77, ZKC + 5, 41) if op != "linear_bwd_dx" else (37, 29, ZKC + 9)
    rep = parity.check_variant(get_variant(f"{op}/cpu/zmm"), get_op(op), size, "float32", seed=7)
    assert rep.ok, str(rep)
