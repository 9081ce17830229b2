"""Decode rung 9 (decode_attention/gpu/bfly_fused, and the paged op's bfly_fused): the merge folded into the last
block of each head. Its results are checked against the float64 reference by tests/test_registry.py and
tests/test_decode_paged.py on a real GPU (it needs shuffles and cuda.threadfence, which the simulator lacks);
here, what the last block's plain loads rely on: every head's partials start on a 128-byte line of their own."""
import numpy as np
import pytest

import kernels_src
from kernels_src.ops import decode_attention as dec


@pytest.mark.parametrize("b_n,hq,hkv,s,d", [(1, 32, 8, 32, 128), (2, 4, 2, 3, 16), (3, 6, 3, 5, 12),
                                             (1, 1, 1, 1, 4), (2, 8, 2, 33, 64)])
def test_fused_scratch_gives_each_head_its_own_lines(b_n, hq, hkv, s, d):
    o_part, lse, cnt = dec.fused_scratch(b_n, hq, hkv, s, d)
    assert o_part.shape[:3] == (b_n, hq, s) and o_part.shape[3] >= d
    assert lse.shape[:2] == (b_n, hq) and lse.shape[2] >= s
    assert (o_part.shape[2] * o_part.shape[3] * 4) % 128 == 0  # one head's partial outputs: whole lines
    assert (lse.shape[2] * 4) % 128 == 0  # one head's lse values: whole lines
    assert cnt.shape == (b_n * hkv,) and cnt.dtype == np.int32
    assert not cnt.copy_to_host().any()  # the counters start at 0 (each launch leaves them at 0)


def test_rung_9_is_registered_after_rung_8_and_needs_a_real_gpu():
    v = kernels_src.get_variant("decode_attention/gpu/bfly_fused")
    assert v.rung == kernels_src.get_variant("decode_attention/gpu/bfly").rung + 1
    p = kernels_src.get_variant("decode_attention_paged/gpu/bfly_fused")
    if kernels_src.device.SIMULATED:
        assert not v.available()[0] and not p.available()[0]


def test_one_kernel_factory_serves_decode_and_paged():
    """The paged op's butterfly kernels come from decode_attention's factory with the paged loader (item 3 of
    issue 24): its module no longer has a kernel body of its own."""
    import inspect

    from kernels_src.ops import decode_paged as dp

    src = inspect.getsource(dp.make_paged_bfly_kernel)
    assert "dec.make_bfly_kernel(" in src and "butterfly_level" not in inspect.getsource(dp)
