"""Rung 4 of the tensor-core GEMMs (gemm_tc.make_wide_kernel, variant mma_wide) on the paths the op's own
simulator sizes never reach: those sizes are smaller than one 128 x 128 block, so every block there is an edge
block and runs the guarded loop. Here a whole block lies inside C, so the unguarded 16-byte loads, the hot
loop and the hand-over to the guarded loop for the last, partial, K tile all run, in the three regimes of the
number of full K tiles (0 hot-loop iterations, 1, and K a multiple of the tile depth), against the float64
reference with the op's tolerance, outputs poisoned (kernels_src.parity). The shared layouts (rows m and m + 8
interleaved, swizzled chunks, k reordered inside a tile, TF32 columns permuted) are wrong by whole products if
any of them disagrees between the loader, the fragment reads and the epilogue."""
import numpy as np
import pytest

from kernels_src import device
from kernels_src.ops import gemm_tc
from kernels_src.parity import check_variant
from kernels_src.registry import get_op, variants

pytestmark = [pytest.mark.skipif(device.MODE not in ("gpu", "sim"), reason="needs a GPU or the CUDA simulator"),
              pytest.mark.slow,
              pytest.mark.usefixtures("sim_greenlets")]  # results against float64 (races: tests/test_registry.py)

# (op, size, edge values?): K in words (TF32: values; FP16/BF16: values / 2) is 36 (2 full tiles of 16 and a
# partial one), 32 (2 full, no partial) and 20 (1 full: the hot loop runs no iteration).
CASES = [
    ("gemm_tf32", (128, 128, 36), False),
    ("gemm_tf32", (128, 128, 36), True),  # NaN, infinities and huge values through the unguarded loads
    ("gemm_f16", (128, 128, 64), False),
    ("gemm_bf16", (128, 128, 40), False),
]


def _wide(op):
    (v,) = [v for v in variants(op, "gpu") if v.name == "mma_wide"]
    return v


@pytest.mark.parametrize("op, size, edge", CASES)
def test_mma_wide_full_blocks_match_float64(op, size, edge):
    rep = check_variant(_wide(op), get_op(op), size, edge=edge)
    assert rep.ok, str(rep)


def test_the_cases_take_the_fast_path():
    """The sizes above do reach the hot loop: a full block (rows 16-byte aligned) and at least one full K tile,
    as the kernel decides it (``full``, ``nfull``)."""
    for op, (M, N, K), _ in CASES:
        fmt = op.split("_")[1]
        k = gemm_tc.make_wide_kernel(fmt)
        BM, BN = k.tile
        KW = K if fmt == "tf32" else -(-K // 8) * 4  # words of a row, FP16/BF16 padded to 8 values
        fast_ok = (K % 4 == 0 and N % 4 == 0) if fmt == "tf32" else True
        assert fast_ok and M >= BM and N >= BN and KW // 16 >= 1, (op, M, N, K)
    nfull = {(op, s): (s[2] if op == "gemm_tf32" else s[2] // 2) // 16 for op, s, _ in CASES}
    partial = {(op, s): (s[2] if op == "gemm_tf32" else s[2] // 2) % 16 for op, s, _ in CASES}
    assert {1, 2} <= set(nfull.values()) and 0 in partial.values() and any(partial.values())


def test_a_wrong_k_order_would_be_caught():
    """The oracle is not blind to the k reordering: products of A and B with their k slots paired differently
    (the mistake a disagreeing layout makes) differ from the true product by O(1) for standard-normal inputs."""
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((128, 36)), rng.standard_normal((36, 128))
    perm = np.arange(36)
    perm[[0, 1]] = perm[[1, 0]]
    rtol, atol = gemm_tc.tc_tol("tf32")((128, 128, 36), None)
    err = np.abs(A[:, perm] @ B - A @ B)
    assert np.max(err - atol - rtol * np.abs(A @ B)) > 0.5
