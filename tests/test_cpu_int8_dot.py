"""The int8 dot-product intrinsics (kernels_src/compiler/cpuint8.py: ``vload_i8x32_i16``, ``vdot_i8x32``, ``vdot_q4x32``)
and the GEMV rungs built on them (``qgemv_q8_0/cpu/packed_q8act``, ``qgemv_q4_0/cpu/packed_q8act``, issue 36),
checked against NumPy's int64 dot products.

- each block's 16 int32 pair sums are exact, on random int8 data and on the worst case (weights -128 and -127,
  x = -127, and -128 everywhere, which the quantizer never makes but vpmaddwd takes exactly);
- both code paths: ``llvm.x86.avx2.pmadd.wd`` where the compile target has AVX2 (its machine code holds
  ``vpmaddwd``), and the generic LLVM IR a CPU without AVX2 gets (a subprocess compiling for a generic x86-64);
- the GEMV kernel at odd block counts (nb = 1, 3, 5) and N not a multiple of 4, against the float64 reference of
  what it computes (int8 x, its scales), and on the worst case.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kernels_src.ops  # noqa: F401  (registers every op)
from kernels_src.compiler import cpuint8, njit
from kernels_src.compiler.cpuint8 import vcvt16, vdot_i8x32, vdot_q4x32, vload_i8x32_i16
from kernels_src.compiler.cpusimd import vstore16
from kernels_src.ops import quant as Q

QK = 32


def _make_pairs():
    """A fresh dispatcher (cache off), so that it is compiled under the DOT_PATH in effect when first called."""
    @njit(cache=False)
    def pairs(out, w, x):
        # out (nb*16,) float32: block b's 16 int32 pair sums of w[32b:32b+32] * x[32b:32b+32] (|sum| <= 2**15,
        # exact in float32)
        for b in range(x.size // QK):
            vstore16(out, b * 16, vcvt16(vdot_i8x32(w, b * QK, vload_i8x32_i16(x, b * QK))))

    return pairs


def _make_q4_pairs():
    @njit(cache=False)
    def pairs(out, u8, x):
        # out (nb*16,) float32: Q4_0 block b (bytes u8[16b:16b+16]) times x[32b:32b+32], 16 pair sums
        for b in range(x.size // QK):
            vstore16(out, b * 16, vcvt16(vdot_q4x32(u8, b * 16, vload_i8x32_i16(x, b * QK))))

    return pairs


def _q4_weights(u8):
    """GGML's Q4_0 order: block byte j holds element j (low nibble) and element j + 16 (high nibble); value q - 8."""
    blocks = u8.reshape(-1, 16).astype(np.int64)
    return np.concatenate([(blocks & 15) - 8, (blocks >> 4) - 8], axis=1).reshape(-1)


def _pair_sums_ref(w, x):
    p = w.astype(np.int64) * x.astype(np.int64)
    return p.reshape(-1, 2).sum(1)


CASES = {
    "random": lambda rng, nb: (rng.integers(-128, 128, nb * QK).astype(np.int8),
                               rng.integers(-127, 128, nb * QK).astype(np.int8)),
    "worst_-128_-127": lambda rng, nb: (np.full(nb * QK, -128, np.int8), np.full(nb * QK, -127, np.int8)),
    "worst_-127_-127": lambda rng, nb: (np.full(nb * QK, -127, np.int8), np.full(nb * QK, -127, np.int8)),
    "all_-128": lambda rng, nb: (np.full(nb * QK, -128, np.int8), np.full(nb * QK, -128, np.int8)),
    "mixed_extremes": lambda rng, nb: (rng.choice(np.array([-128, -127, 127], np.int8), nb * QK),
                                       rng.choice(np.array([-127, 127], np.int8), nb * QK)),
}


def _check_pairs(pairs, name, nb):
    w, x = CASES[name](np.random.default_rng(nb), nb)
    out = np.full(nb * 16, np.nan, np.float32)
    pairs(out, w, x)
    want = _pair_sums_ref(w, x)
    assert np.array_equal(out.astype(np.int64), want), (name, nb, np.flatnonzero(out != want)[:5])
    # the block dot products, summed from the lanes as the GEMV does (once per block here)
    dots = out.astype(np.int64).reshape(nb, 16).sum(1)
    assert np.array_equal(dots, (w.astype(np.int64) * x.astype(np.int64)).reshape(nb, QK).sum(1))


@pytest.mark.parametrize("nb", [1, 3, 5])
@pytest.mark.parametrize("name", list(CASES))
def test_vdot_i8x32_exact(name, nb):
    _check_pairs(_make_pairs(), name, nb)


@pytest.mark.parametrize("path", ["avx2", "generic"])
def test_vdot_i8x32_both_paths_in_process(path, monkeypatch):
    if path == "avx2" and not cpuint8._target_has_avx2():
        pytest.skip("this compile target has no AVX2")
    monkeypatch.setattr(cpuint8, "DOT_PATH", path)
    pairs = _make_pairs()
    for name in CASES:
        for nb in (1, 3):
            _check_pairs(pairs, name, nb)
    if cpuint8._X86:
        asm = pairs.inspect_asm(pairs.signatures[0])
        assert ("vpmaddwd" in asm) == (path == "avx2"), asm.count("vpmaddwd")


Q4_CASES = {
    "random": lambda rng, nb: (rng.integers(0, 256, nb * 16).astype(np.uint8),
                               rng.integers(-127, 128, nb * QK).astype(np.int8)),
    "worst_-8_-127": lambda rng, nb: (np.zeros(nb * 16, np.uint8), np.full(nb * QK, -127, np.int8)),
    "worst_7_-128": lambda rng, nb: (np.full(nb * 16, 0xFF, np.uint8), np.full(nb * QK, -128, np.int8)),
    "lo_hi_apart": lambda rng, nb: (np.full(nb * 16, 0xF0, np.uint8), rng.integers(-127, 128, nb * QK).astype(np.int8)),
}


@pytest.mark.parametrize("path", ["avx2", "generic"])
@pytest.mark.parametrize("name", list(Q4_CASES))
def test_vdot_q4x32_exact_both_paths(name, path, monkeypatch):
    if path == "avx2" and not cpuint8._target_has_avx2():
        pytest.skip("this compile target has no AVX2")
    monkeypatch.setattr(cpuint8, "DOT_PATH", path)
    pairs = _make_q4_pairs()
    for nb in (1, 3, 5):
        u8, x = Q4_CASES[name](np.random.default_rng(nb), nb)
        out = np.full(nb * 16, np.nan, np.float32)
        pairs(out, u8, x)
        want = _pair_sums_ref(_q4_weights(u8), x)
        assert np.array_equal(out.astype(np.int64), want), (name, nb, np.flatnonzero(out != want)[:5])


def test_generic_path_on_a_cpu_without_avx2(tmp_path):
    """Numba compiling for a generic x86-64 (no AVX2): DOT_PATH is "generic", and the rung still matches."""
    if not cpuint8._X86:
        pytest.skip("x86 only")
    code = textwrap.dedent("""
        import numpy as np
        import kernels_src.ops
        from kernels_src.compiler import cpuint8
        from kernels_src.registry import get_variant, get_op
        assert cpuint8.DOT_PATH == "generic", cpuint8.DOT_PATH
        from kernels_src.ops import quant as Q
        rng = np.random.default_rng(3)
        K, N = 96, 7
        x, Wq = get_op("qgemv_q8_0").make_inputs((K, N), "float32", rng)
        y = np.full(N, np.nan, np.float32)
        get_variant("qgemv_q8_0/cpu/packed_q8act").fn(y, x, Wq)
        xq = np.empty(K, np.int8); xd = np.empty(K // 32, np.float32)
        Q.quantize_x_q8(xq, xd, x)
        qs, d = Q.repack_cpu(Wq, "q8_0")
        want = ((qs.astype(np.float64).reshape(N, -1, 32) * xq.reshape(-1, 32)).sum(-1)
                * d.astype(np.float64) * xd).sum(-1)
        assert np.allclose(y, want, rtol=1e-5, atol=1e-3), (y, want)
        asm = Q._rows4_q8_0_q8act.inspect_asm(Q._rows4_q8_0_q8act.signatures[0])
        assert "ymm" not in asm and "vpmaddwd" not in asm  # no AVX at all: the generic IR's SSE2 code
        x, Wq = get_op("qgemv_q4_0").make_inputs((K, N), "float32", rng)
        get_variant("qgemv_q4_0/cpu/packed_q8act").fn(y, x, Wq)
        Q.quantize_x_q8(xq, xd, x)
        qs, d = Q.repack_cpu(Wq, "q4_0")
        b = qs.reshape(N, -1, 16).astype(np.int64)
        w = np.concatenate([(b & 15) - 8, (b >> 4) - 8], axis=2)
        want = ((w * xq.reshape(-1, 32)).sum(-1) * d.astype(np.float64) * xd).sum(-1)
        assert np.allclose(y, want, rtol=1e-5, atol=1e-3), (y, want)
        print("ok")
    """)
    env = dict(os.environ, NUMBA_CPU_NAME="generic", NUMBA_CACHE_DIR=str(tmp_path))  # features "": SSE2 only
    env.pop("NUMBA_CPU_FEATURES", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]


def _gemv_ref(xq, xd, qs, d):
    N = qs.shape[0]
    return ((qs.astype(np.float64).reshape(N, -1, QK) * xq.astype(np.float64).reshape(-1, QK)).sum(-1)
            * d.astype(np.float64) * xd.astype(np.float64)).sum(-1)


@pytest.mark.parametrize("nb", [1, 3, 5])
@pytest.mark.parametrize("N", [1, 5, 8, 13])
def test_rows4_q8act_kernel_odd_blocks_and_rows(nb, N):
    rng = np.random.default_rng(10 * nb + N)
    K = nb * QK
    qs = rng.integers(-128, 128, (N, K)).astype(np.int8)
    xq = rng.integers(-127, 128, K).astype(np.int8)
    d = rng.random((N, nb)).astype(np.float32)
    xd = rng.random(nb).astype(np.float32)
    y = np.full(N, np.nan, np.float32)
    Q._rows4_q8_0_q8act(y, xq, xd, qs, d)
    want = _gemv_ref(xq, xd, qs, d)
    # float32 sums of nb exact block terms: a few ulps of the terms' size
    scale = (np.abs(qs.astype(np.float64).reshape(N, -1, QK) * xq.reshape(-1, QK)).sum(-1) * d * xd).sum(-1)
    assert np.all(np.abs(y - want) <= 4e-7 * nb * scale + 1e-30), np.abs(y - want).max()


def test_rows4_q8act_kernel_worst_case():
    """Weights -128/-127 and x = -127 everywhere: every block's dot product is its largest, +32*128*127 or so."""
    nb, N = 3, 6
    K = nb * QK
    qs = np.full((N, K), -127, np.int8)
    qs[::2] = -128
    xq = np.full(K, -127, np.int8)
    d = np.ones((N, nb), np.float32)
    xd = np.ones(nb, np.float32)
    y = np.full(N, np.nan, np.float32)
    Q._rows4_q8_0_q8act(y, xq, xd, qs, d)
    assert np.array_equal(y.astype(np.float64), _gemv_ref(xq, xd, qs, d))  # every term an integer < 2**24
    assert y[0] == nb * 32 * 128 * 127


@pytest.mark.parametrize("nb", [1, 3, 5])
@pytest.mark.parametrize("N", [1, 5, 8, 13])
def test_rows4_q4_0_q8act_kernel_odd_blocks_and_rows(nb, N):
    rng = np.random.default_rng(100 + 10 * nb + N)
    K = nb * QK
    qs = rng.integers(0, 256, (N, K // 2)).astype(np.uint8)
    xq = rng.integers(-127, 128, K).astype(np.int8)
    d = rng.random((N, nb)).astype(np.float32)
    xd = rng.random(nb).astype(np.float32)
    y = np.full(N, np.nan, np.float32)
    Q._rows4_q4_0_q8act(y, xq, xd, qs, d)
    w = np.stack([_q4_weights(r) for r in qs]).reshape(N, nb, QK)
    terms = (w * xq.astype(np.int64).reshape(nb, QK)).sum(-1) * d.astype(np.float64) * xd
    want = terms.sum(-1)
    assert np.all(np.abs(y - want) <= 4e-7 * nb * np.abs(terms).sum(-1) + 1e-30), np.abs(y - want).max()
