"""GEMM epilogue (chapter 5, section "GEMM epilogue"): gemm_bias_gelu beyond the generic registry tests.

The fused kernel must be chapter 5's GEMM kernel built with an epilogue (not a copy), correct on the
16-byte path and on edge tiles, including the edge values (NaN, GELU's far tails).
"""
import numpy as np
import pytest

import kernels_src
from kernels_src import parity
from kernels_src.ops import epilogue, gemm
from kernels_src.registry import get_op

OP = get_op("gemm_bias_gelu")


@pytest.mark.parametrize("edge", [False, True])
@pytest.mark.parametrize("key,size", [
    ("gemm_bias_gelu/gpu/fused", (128, 132, 20)),    # a full block (16-byte path, 16-byte bias loads) + an edge block
    ("gemm_bias_gelu/gpu/unfused", (33, 20, 8)),
    ("gemm_bias_gelu/cpu/numpy", (65, 31, 17)),
])
def test_epilogue_variants(key, size, edge, sim_race_checked):  # and race-free at these sizes
    rep = parity.check_variant(kernels_src.get_variant(key), OP, size, seed=3, edge=edge)
    if rep.skipped:
        pytest.skip(rep.skipped)
    assert rep.ok, str(rep)


def test_fused_is_the_gemm_kernel_with_an_epilogue():
    cfg = dict(epilogue._fused.config)
    assert cfg.pop("epilogue") == "gelu_tanh"
    assert cfg == {k: v for k, v in gemm._warptile.config.items() if k != "epilogue"}


def test_reference_tails():
    A = np.zeros((1, 1))
    B = np.zeros((1, 1))
    out = epilogue.reference(A, B, np.array([-1e4]))
    assert out[0, 0] == 0.0
    assert epilogue.reference(A, B, np.array([1e4]))[0, 0] == pytest.approx(1e4)
    assert np.isnan(epilogue.reference(A, B, np.array([np.nan]))[0, 0])
