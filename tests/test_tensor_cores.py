"""The tensor-core intrinsics (kernels_src.compiler.inline_ptx: mma_tf32, mma_f16, mma_bf16, to_tf32, pack_*x2)
against float64 products worked out in NumPy, in a one-warp kernel (the real instruction on a GPU, the
emulation in the simulator); the formats' host helpers (gemm_tc) against bit-level definitions; the PTX."""
import os
import subprocess
import sys

import numpy as np
import pytest

from kernels_src import device
from kernels_src.compiler import (cuda, exp2_approx, ldmatrix_x4, ldmatrix_x4_trans, mma_bf16, mma_f16, mma_tf32,
                                  pack_bf16x2, pack_f16x2, to_tf32, uint32)
from kernels_src.compiler.inline_ptx import frag_a, frag_b, frag_c, tf32_round_bits
from kernels_src.ops import gemm_tc

needs_kernels = pytest.mark.skipif(device.MODE not in ("gpu", "sim"), reason="needs a GPU or the CUDA simulator")


# ------------------------------------------------------------------------------------- the fragment maps
def test_fragment_maps_cover_each_tile_once():
    """Every element of A, B and C is held by exactly one (lane, register[, half]) pair."""
    for k in (8, 16):
        halves = 1 if k == 8 else 2
        seen_a = [frag_a(ln, r, k)[0] * k + frag_a(ln, r, k)[1] + h for ln in range(32) for r in range(4)
                  for h in range(halves)]
        assert sorted(seen_a) == list(range(16 * k))
        seen_b = [(frag_b(ln, r, k)[0] + h) * 8 + frag_b(ln, r, k)[1] for ln in range(32) for r in range(2)
                  for h in range(halves)]
        assert sorted(seen_b) == list(range(k * 8))
    seen_c = [frag_c(ln, r)[0] * 8 + frag_c(ln, r)[1] for ln in range(32) for r in range(4)]
    assert sorted(seen_c) == list(range(128))


def test_the_ptx_isa_examples():
    """Spot values from the PTX ISA's fragment figures: lane 5 is group 1, thread 1 in its group."""
    assert frag_c(5, 0) == (1, 2) and frag_c(5, 3) == (9, 3)
    assert frag_a(5, 2, 8) == (1, 5) and frag_a(5, 3, 16) == (9, 10)
    assert frag_b(5, 1, 8) == (5, 1) and frag_b(5, 1, 16) == (10, 1)


# ------------------------------------------------------------------------------------------- host formats
def test_tf32_rounding_is_nearest_ties_away():
    one = np.float32(1.0)
    ulp = 2.0 ** -10  # TF32 spacing in [1, 2)
    x = np.array([1 + ulp / 2, 1 + ulp / 2 - 2 ** -23, -(1 + ulp / 2), 1 + 1.5 * ulp, np.inf, -np.inf, np.nan],
                 np.float32)
    got = gemm_tc.tf32_round(x)
    assert got[0] == one + ulp and got[1] == one and got[2] == -(one + ulp) and got[3] == one + 2 * ulp
    assert np.isposinf(got[4]) and np.isneginf(got[5]) and np.isnan(got[6])
    bits = x[:4].view(np.uint32)
    assert [tf32_round_bits(int(b)) for b in bits] == list(got[:4].view(np.uint32))


def test_bf16_round_trip_over_every_pattern():
    """Each of the 65536 bf16 patterns decodes to a float32 that encodes back to itself (NaNs to a NaN)."""
    pats = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    vals = gemm_tc.bf16_values(pats)
    back = gemm_tc.bf16_bits(vals)
    nan = np.isnan(vals)
    assert np.array_equal(back[~nan], pats[~nan])
    assert np.isnan(gemm_tc.bf16_values(back[nan])).all()


def test_bf16_rounds_to_nearest_even():
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, 3.4e38, -0.0], np.float32)
    got = gemm_tc.bf16_values(gemm_tc.bf16_bits(x))
    assert got[0] == 1.0 and got[1] == 1 + 4 * 2 ** -8 and got[2] == 1 + 2 ** -7
    assert np.isposinf(got[3])  # above bf16's largest finite value (~3.39e38) after rounding: inf
    assert got[4] == 0 and np.signbit(got[4])


def test_fp16_overflow_is_inf():
    """FP16 holds at most 65504: 70000 stored as fp16 is inf, and a product that uses it is inf, not large."""
    with np.errstate(over="ignore"):
        x = np.float32(70000.0).astype(np.float16)
        X = np.full((1, 1), 70000.0, np.float32).astype(np.float16)
    assert np.isinf(x)
    W = np.full((1, 1), 0.5, np.float16)
    assert np.isposinf(gemm_tc.reference_nt(X, W)[0, 0])


# ------------------------------------------------------------------------------ the instructions in a warp
def _make_one_mma(kind):
    """One warp: D = A B + C through the fragment maps written out by hand (16x8 tiles; K = 8 or 16)."""
    pk = pack_f16x2 if kind == "f16" else pack_bf16x2
    mma = mma_f16 if kind == "f16" else mma_bf16

    @cuda.jit
    def one_mma(D, A, B, C):
        lane = cuda.threadIdx.x
        g = lane >> 2
        t = lane & 3
        c0 = C[g, 2 * t]
        c1 = C[g, 2 * t + 1]
        c2 = C[g + 8, 2 * t]
        c3 = C[g + 8, 2 * t + 1]
        if kind == "tf32":
            d0, d1, d2, d3 = mma_tf32(A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4], B[t, g], B[t + 4, g],
                                      c0, c1, c2, c3)
        else:
            a0 = pk(A[g, 2 * t], A[g, 2 * t + 1])
            a1 = pk(A[g + 8, 2 * t], A[g + 8, 2 * t + 1])
            a2 = pk(A[g, 2 * t + 8], A[g, 2 * t + 9])
            a3 = pk(A[g + 8, 2 * t + 8], A[g + 8, 2 * t + 9])
            b0 = pk(B[2 * t, g], B[2 * t + 1, g])
            b1 = pk(B[2 * t + 8, g], B[2 * t + 9, g])
            d0, d1, d2, d3 = mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
        D[g, 2 * t] = d0
        D[g, 2 * t + 1] = d1
        D[g + 8, 2 * t] = d2
        D[g + 8, 2 * t + 1] = d3

    return one_mma


ONE_MMA = {kind: _make_one_mma(kind) for kind in ("tf32", "f16", "bf16")}


@cuda.jit
def _round_kernel(out, x):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = to_tf32(x[i])


def _operands(kind, rng):
    k = 8 if kind == "tf32" else 16
    A = rng.standard_normal((16, k)).astype(np.float32)
    B = rng.standard_normal((k, 8)).astype(np.float32)
    C = rng.standard_normal((16, 8)).astype(np.float32)
    if kind == "tf32":  # values already TF32, so the product of any two is exact in float64
        A, B = gemm_tc.tf32_round(A), gemm_tc.tf32_round(B)
    elif kind == "f16":
        A, B = A.astype(np.float16).astype(np.float32), B.astype(np.float16).astype(np.float32)
    else:
        A, B = gemm_tc.bf16_values(gemm_tc.bf16_bits(A)), gemm_tc.bf16_values(gemm_tc.bf16_bits(B))
    return A, B, C


@needs_kernels
@pytest.mark.parametrize("kind", ["tf32", "f16", "bf16"])
def test_mma_matches_a_float64_product(kind):
    """Inputs exactly representable in the format, so the only error is the float32 sum: a wrong fragment map
    (a transposed tile, swapped halves) moves whole products and fails by ~1, not by ~1e-6."""
    rng = np.random.default_rng(7)
    for trial in range(2 if device.SIMULATED else 20):
        A, B, C = _operands(kind, rng)
        D = cuda.to_device(np.full((16, 8), np.nan, np.float32))  # poisoned
        ONE_MMA[kind][1, 32](D, cuda.to_device(A), cuda.to_device(B), cuda.to_device(C))
        want = A.astype(np.float64) @ B.astype(np.float64) + C
        got = D.copy_to_host()
        k = A.shape[1]
        bound = 4 * k * np.finfo(np.float32).eps * (np.abs(A) @ np.abs(B) + np.abs(C))
        assert np.all(np.abs(got - want) <= bound), (kind, trial, np.abs(got - want).max())


@needs_kernels
def test_mma_tf32_reads_only_the_top_19_bits():
    """Unrounded float32 inputs: the tensor core ignores the low 13 bits (truncation), which the emulation
    copies. The product then matches float64 on the truncated values, not on the rounded ones."""
    rng = np.random.default_rng(3)
    A, B, C = (rng.standard_normal(s).astype(np.float32) for s in ((16, 8), (8, 8), (16, 8)))
    trunc = lambda x: (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)  # noqa: E731
    D = cuda.to_device(np.full((16, 8), np.nan, np.float32))
    ONE_MMA["tf32"][1, 32](D, cuda.to_device(A), cuda.to_device(B), cuda.to_device(C))
    want = trunc(A).astype(np.float64) @ trunc(B).astype(np.float64) + C
    bound = 32 * np.finfo(np.float32).eps * (np.abs(A) @ np.abs(B) + np.abs(C))
    assert np.all(np.abs(D.copy_to_host() - want) <= bound)


@needs_kernels
def test_to_tf32_matches_the_host_rounding():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(256 if device.SIMULATED else 1 << 16).astype(np.float32) * 1e3
    x[:6] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1 + 2 ** -11]
    out = cuda.to_device(np.zeros_like(x))
    _round_kernel[(x.size + 127) // 128, 128](out, cuda.to_device(x))
    got, want = out.copy_to_host(), gemm_tc.tf32_round(x)
    assert np.array_equal(got.view(np.uint32)[3:], want.view(np.uint32)[3:])
    assert np.isposinf(got[0]) and np.isneginf(got[1]) and np.isnan(got[2])


@needs_kernels
def test_a_warp_cut_short_is_an_error_in_the_simulator():
    if not device.SIMULATED:
        pytest.skip("on a GPU this is undefined behaviour, not an error")
    D = cuda.to_device(np.zeros((16, 8), np.float32))
    A = cuda.to_device(np.zeros((16, 8), np.float32))
    with pytest.raises(Exception, match="32 lanes"):
        ONE_MMA["tf32"][1, 16](D, A, cuda.to_device(np.zeros((8, 8), np.float32)), D)


def test_the_intrinsics_compile_to_mma_sync():
    code = ("from kernels_src.compiler import cuda; import tests.test_tensor_cores as t; "
            "sig = 'void(float32[:, ::1], float32[:, ::1], float32[:, ::1], float32[:, ::1])'; "
            "[print(cuda.compile_ptx(k.py_func, sig, cc=(9, 0))[0]) for k in t.ONE_MMA.values()]; "
            "print(cuda.compile_ptx(t._exp2_kernel.py_func, 'void(float32[::1], float32[::1])', cc=(9, 0))[0]); "
            "[print(cuda.compile_ptx(k.py_func, 'void(uint32[:, ::1], uint32[:, ::1])', cc=(9, 0))[0]) "
            "for k in t.LDM.values()]")
    p = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, KERNELS_DEVICE="ptx"), capture_output=True,
                       text=True, timeout=600, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if p.returncode != 0 and "NVVM" in p.stderr and "not" in p.stderr.lower():
        pytest.skip(f"no NVVM to compile PTX with: {p.stderr.strip().splitlines()[-1]}")
    assert p.returncode == 0, p.stderr[-2000:]
    for text in ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", "mma.sync.aligned.m16n8k16.row.col.f32.f16",
                 "mma.sync.aligned.m16n8k16.row.col.f32.bf16", "cvt.rn.f16x2.f32", "cvt.rn.bf16x2.f32",
                 "ex2.approx.ftz.f32", "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                 "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"):
        assert text in p.stdout, text


@cuda.jit
def _exp2_kernel(out, x):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = exp2_approx(x[i])


@needs_kernels
def test_exp2_approx():
    """ex2.approx.ftz.f32 (flash attention's exponent): within 2^-21 relative of 2^x, 2^-inf = 0 (a masked score
    gives a zero weight, never NaN), 2^0 = 1."""
    x = np.array([-np.inf, 0.0, -1.0, -0.5, -10.25, -100.0, 3.0, -0.001], np.float32)
    out = cuda.to_device(np.full_like(x, np.nan))
    _exp2_kernel[1, 32](out, cuda.to_device(x))
    got = out.copy_to_host().astype(np.float64)
    want = np.exp2(x.astype(np.float64))
    assert got[0] == 0.0 and got[1] == 1.0
    assert np.all(np.abs(got - want) <= 2.0 ** -21 * want)


def _make_ldm_kernel(trans):
    ld = ldmatrix_x4_trans if trans else ldmatrix_x4

    @cuda.jit
    def ldm(out, rows):
        """rows (32, 4) uint32: row r of matrix m (8 values of 16 bits) is rows[8m + r]; stored in shared memory
        32 bytes apart; lane l points ldmatrix at row l."""
        sm = cuda.shared.array(256, uint32)
        lane = cuda.threadIdx.x
        for k in range(4):
            sm[8 * lane + k] = rows[lane, k]
        cuda.syncthreads()
        r0, r1, r2, r3 = ld(sm, 8 * lane)
        out[lane, 0] = r0
        out[lane, 1] = r1
        out[lane, 2] = r2
        out[lane, 3] = r3

    return ldm


LDM = {t: _make_ldm_kernel(t) for t in (False, True)}


@needs_kernels
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_x4_gives_the_fragments(trans):
    """Lane l gets, in register m, row l // 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix m (low half first);
    with .trans the same of the transposed matrix. Expected values worked out here from the PTX ISA's figure."""
    rng = np.random.default_rng(11)
    mats = rng.integers(0, 1 << 16, size=(4, 8, 8), dtype=np.uint32)  # matrix, row, column (16-bit values)
    rows = (mats[:, :, 0::2] | (mats[:, :, 1::2] << 16)).reshape(32, 4).astype(np.uint32)
    out = cuda.to_device(np.zeros((32, 4), np.uint32))
    LDM[trans][1, 32](out, cuda.to_device(rows))
    got = out.copy_to_host()
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for m in range(4):
            M = mats[m].T if trans else mats[m]
            assert got[lane, m] == M[g, 2 * t] | (M[g, 2 * t + 1] << 16), (lane, m)
