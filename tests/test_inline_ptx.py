"""The inline-PTX intrinsics (kernels_src.compiler.inline_ptx): dp4a against an independent NumPy oracle, in a
kernel (the real instruction on a GPU, the emulation in the simulator), and in the PTX it compiles to."""
import os
import subprocess
import sys

import numpy as np
import pytest

from kernels_src import device
from kernels_src.compiler import cuda, dp4a
from kernels_src.compiler.inline_ptx import dp4a_reference

I32_MIN, I32_MAX = -(2 ** 31), 2 ** 31 - 1
EDGE = np.array([0, -1, 1, I32_MIN, I32_MAX, 0x7F7F7F7F, -0x7F7F7F80, 0x01010101, 0x80, 0x8000, 0x800000],
                dtype=np.int64).astype(np.int32)


def oracle(a, b, c):
    """NumPy: the four bytes of each word as int8, products summed in int64, plus c, wrapped to int32."""
    a8 = np.ascontiguousarray(a, dtype=np.int32).view(np.int8).reshape(-1, 4).astype(np.int64)  # little-endian
    b8 = np.ascontiguousarray(b, dtype=np.int32).view(np.int8).reshape(-1, 4).astype(np.int64)
    return ((a8 * b8).sum(axis=1) + c.astype(np.int64)).astype(np.int32)  # astype wraps modulo 2^32


def cases(n=4096, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.integers(I32_MIN, I32_MAX, n, endpoint=True).astype(np.int32)
    b = rng.integers(I32_MIN, I32_MAX, n, endpoint=True).astype(np.int32)
    c = rng.integers(I32_MIN, I32_MAX, n, endpoint=True).astype(np.int32)
    m = len(EDGE)
    a[:m * m] = np.repeat(EDGE, m)  # every pair of edge words
    b[:m * m] = np.tile(EDGE, m)
    c[: m * m: 2] = I32_MAX  # sums that wrap past the ends of int32
    c[1: m * m: 2] = I32_MIN
    return a, b, c


def test_the_oracle_on_words_worked_by_hand():
    a = np.array([0x01020304, -1, 0x7F, -0x7F7F7F80], np.int64).astype(np.int32)  # last: bytes 0x80 = -128
    b = np.array([0x01010101, -1, 0x7F, -0x7F7F7F80], np.int64).astype(np.int32)
    c = np.array([10, 0, I32_MAX, 0], np.int32)
    # 1+2+3+4 + 10;  4 * (-1)(-1);  127*127 + (2^31 - 1) wraps;  4 * (-128)(-128)
    want = np.array([20, 4, (I32_MAX + 127 * 127) - 2 ** 32, 4 * 128 * 128], np.int64).astype(np.int32)
    assert np.array_equal(oracle(a, b, c), want)


def test_the_reference_semantics_match_the_oracle():
    a, b, c = cases(2048, seed=1)
    got = np.array([dp4a_reference(x, y, z) for x, y, z in zip(a, b, c)], dtype=np.int64)
    assert np.array_equal(got, oracle(a, b, c).astype(np.int64))


@cuda.jit
def _dp4a_kernel(out, a, b, c):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = dp4a(a[i], b[i], c[i])


@pytest.mark.skipif(device.MODE not in ("gpu", "sim"), reason="needs a GPU or the CUDA simulator")
def test_dp4a_in_a_kernel_matches_the_oracle():
    n = 512 if device.SIMULATED else 1 << 20
    a, b, c = cases(n, seed=2)
    out = cuda.to_device(np.full(n, 0x5A5A5A5A, np.int32))  # poisoned: a lane that writes nothing fails
    _dp4a_kernel[(n + 127) // 128, 128](out, cuda.to_device(a), cuda.to_device(b), cuda.to_device(c))
    assert np.array_equal(out.copy_to_host(), oracle(a, b, c))


def test_dp4a_compiles_to_the_ptx_instruction():
    code = ("from kernels_src.compiler import cuda; import tests.test_inline_ptx as t; "
            "ptx, _ = cuda.compile_ptx(t._dp4a_kernel.py_func, 'void(int32[::1], int32[::1], int32[::1], int32[::1])',"
            " cc=(9, 0)); print(ptx)")
    p = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, KERNELS_DEVICE="ptx"), capture_output=True,
                       text=True, timeout=600, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if p.returncode != 0 and "NVVM" in p.stderr and "not" in p.stderr.lower():
        pytest.skip(f"no NVVM to compile PTX with: {p.stderr.strip().splitlines()[-1]}")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "dp4a.s32.s32" in p.stdout
