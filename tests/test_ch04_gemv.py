"""Chapter 4 (GEMV): what the generic registry tests do not cover: K spanning several split-K chunks
and blocks, the two layouts agreeing with each other's reference, and a tolerance that can fail."""
import numpy as np
import pytest

import kernels_src
from kernels_src import parity
from kernels_src.ops import gemv
from kernels_src.registry import Variant, get_op


@pytest.mark.parametrize("key,size", [
    ("gemv/gpu/splitk_grid", (1537, 33)),   # 4 K chunks of 512 (the last partial), 2 column blocks
    ("gemv/gpu/splitk", (100, 65)),        # 3 column blocks, K not a multiple of 16 slices
    ("gemv_wx/gpu/block_per_row", (700, 3)),  # K > 256 threads: each thread sums 2-3 terms
    ("gemv_wx/gpu/warp_per_row_smem", (70, 9)),  # 2 blocks of 8 rows (the second mostly empty), 2-3 k per lane
    ("gemv_wx/gpu/warp_per_row", (70, 9)),
    ("gemv_wx/gpu/warp_per_row_vec4", (516, 9)),  # 129 groups of 4: one unrolled trip, then a tail group
    ("gemv_wx/gpu/warp_per_row_vec4", (13, 5)),   # K % 4 != 0: the scalar fallback
    ("gemv/cpu/prange", (7, 2100)),        # K = 7 rows shared by the threads, private copies of y
    ("gemv_wx/cpu/prange", (9, 130)),      # 3 row blocks of 64
])
def test_rungs_across_blocks(key, size, sim_race_checked):  # and race-free at these sizes
    v = kernels_src.get_variant(key)
    rep = parity.check_variant(v, get_op(v.op), size, seed=3)
    if rep.skipped:
        pytest.skip(rep.skipped)
    assert rep.ok, str(rep)


def test_layouts_are_transposes():
    """x W with W (K,N) equals W^T x: the two ops' references agree on transposed data."""
    rng = np.random.default_rng(0)
    x, W = gemv.inputs_xw((13, 7), np.dtype(np.float32), rng)
    np.testing.assert_allclose(gemv.ref_xw(x.astype(np.float64), W.astype(np.float64)),
                               gemv.ref_wx(np.ascontiguousarray(W.T).astype(np.float64), x.astype(np.float64)))


def test_tolerance_catches_a_dropped_term():
    def drops_first_row(y, x, W):
        y[:] = x[1:] @ W[1:]

    rep = parity.check_variant(Variant("gemv", "cpu", "bug", drops_first_row), get_op("gemv"), (257, 33))
    assert not rep.ok


@pytest.mark.parametrize("size", [(1, 1), (4, 1), (8, 5), (13, 5), (516, 9), (1028, 3)])
def test_vec4_indexing_in_the_simulator(size):
    """The 16-byte-load kernel's indexing (unrolled trips, tail groups, partial last block, the K % 4
    fallback), run with its shared-memory warp sum, which the simulator can execute; y is poisoned."""
    if not kernels_src.device.GPU_VARIANTS_RUN:
        pytest.skip(kernels_src.device.REASON)
    rng = np.random.default_rng(5)
    W, x = gemv.inputs_wx(size, np.dtype(np.float32), rng)
    y = np.full(size[1], np.nan, dtype=np.float32)
    gemv.launch_vec4(y, W, x, shfl=False)
    ref = gemv.ref_wx(W.astype(np.float64), x.astype(np.float64))
    rtol, atol = gemv.gemv_tol(size, np.float32)
    np.testing.assert_allclose(y, ref, rtol=rtol, atol=atol)


def test_vec4_falls_back_when_misaligned():
    """A view whose data starts 4 bytes past a 16-byte boundary takes the scalar path."""
    a = np.zeros(9, dtype=np.float32)
    off = 0 if a.__array_interface__["data"][0] % 16 == 0 else None
    if off is None:
        pytest.skip("the host allocation is not 16-byte aligned")
    assert gemv._aligned16(a) and not gemv._aligned16(a[1:])
