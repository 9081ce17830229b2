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
