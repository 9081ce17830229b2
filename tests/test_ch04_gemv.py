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
    ("gemv/cpu/prange", (7, 2100)),        # K = 7 rows shared by the threads, private copies of y
    ("gemv_wx/cpu/prange", (9, 130)),      # 3 row blocks of 64
])
def test_rungs_across_blocks(key, size):
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
