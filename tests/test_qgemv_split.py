"""Chapter 11's rung 8 (qgemv_packed.packed_split): the quantized GEMV shaped for a decode step's small products.

Its shape rule (rows per block, warps per row) is checked on the capstone's products; the kernel is run in the
CUDA simulator against the float64 reference with every split it can take (one warp per row, several warps
sharing a row, splits with no chunk at all, rows past the end), on outputs poisoned with NaN first."""
import zlib

import numpy as np
import pytest

from kernels_src import parity
from kernels_src.compiler import cuda
from kernels_src.ops import qgemv_packed as P
from kernels_src.ops.quant import QUANT, qgemv_ref, qgemv_tol
from kernels_src.registry import get_op, get_variant


@pytest.mark.parametrize("fmt,K,shape", [
    ("q4_0", 768, (8, 1)),     # 24 chunks: one warp a row, 8 rows a block
    ("q4_0", 3072, (2, 3)),    # 96 chunks: three warps a row (the MLP's down projection)
    ("q8_0", 768, (4, 2)),     # 48 chunks of 16 weights: two warps a row
    ("q8_0", 3072, (1, 6)),
    ("q4_0", 8192, (1, 8)),    # 256 chunks: capped at SPLIT_MAX warps, each lane loops
    ("q4_0", 32, (8, 1)),
])
def test_split_shape_on_the_capstone_products(fmt, K, shape):
    assert P.split_shape(fmt, K) == shape
    R, S = shape
    C = K // (16 if fmt == "q8_0" else 32)
    assert R * S <= P.SPLIT_WARPS and (S == P.SPLIT_MAX or 32 * S >= C)  # one chunk a lane unless capped


def _run(fmt, K, N, R, S, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(K).astype(np.float32)
    Wq = QUANT[fmt](rng.standard_normal((N, K)).astype(np.float32))
    qs, d = P.repack_host(Wq, fmt)
    y = cuda.to_device(np.full(N, np.nan, np.float32))  # poisoned: an output never written stays NaN
    P.launch_split(y, cuda.to_device(x), cuda.to_device(qs), cuda.to_device(d), fmt, R, S)
    got = y.copy_to_host()
    want = qgemv_ref(fmt)(x, Wq)
    rtol, atol = qgemv_tol((K, N), np.float32)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return got


@pytest.mark.parametrize("fmt", ["q4_0", "q8_0"])
@pytest.mark.parametrize("K,N,R,S", [
    (96, 5, 1, 1),     # fewer chunks than lanes
    (160, 7, 3, 2),    # a second warp per row with nothing to do; a last block with one row past the end
    (64, 3, 2, 3),     # splits past the row's chunks
])
def test_forced_splits_match_reference(fmt, K, N, R, S, sim_greenlets):
    _run(fmt, K, N, R, S, zlib.crc32(f"{fmt}{K}{N}{R}{S}".encode()))


@pytest.mark.parametrize("fmt,K,N", [("q4_0", 1056, 3), ("q8_0", 544, 5)])
def test_registered_rung_splits_long_rows(fmt, K, N, sim_greenlets):
    """Rows longer than 32 chunks take S = 2 by the rule: the registered launcher, checked by parity."""
    assert P.split_shape(fmt, K)[1] == 2
    v = get_variant(f"qgemv_{fmt}/gpu/packed_split")
    rep = parity.check_variant(v, get_op(v.op), (K, N), "float32", seed=zlib.crc32(f"{fmt}{K}".encode()))
    assert rep.ok and not rep.skipped, str(rep)


def test_rows_loop_past_the_split_cap(sim_greenlets):
    """More chunks than 32 * S lanes: each lane sums several chunks (rung 8 at 8192^2 does, with S = 8)."""
    _run("q4_0", 32 * 70, 2, 1, 2, 7)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["q4_0", "q8_0"])
@pytest.mark.parametrize("K,N", [(768, 2304), (768, 768), (768, 3072), (3072, 768), (768, 96), (8192, 37)])
def test_decode_shapes_on_the_gpu(fmt, K, N):
    _run(fmt, K, N, None, None, K + N)
