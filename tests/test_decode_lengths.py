"""Decode attention on a cache filled only in part (issue 23): the grid is sized for the allocated cache L,
the work for the filled length n read from the device. Every registered decode_attention variant that runs
here, on caches whose rows past n are NaN (a kernel that reads one gives NaN), against the float64
reference; and the split kernels' partial results: splits past the filled rows are empty (lse = -inf)
and the filled rows are spread over all splits."""
import math

import numpy as np
import pytest

import kernels_src
from kernels_src import device, parity
from kernels_src.ops import decode_attention as da

OP = kernels_src.get_op("decode_attention")
# (B, Hq, Hkv, L, D): caches long enough that the host's chunk (from L) exceeds one tile in the simulator
SIZE = (3, 2, 1, 600, 4)
LENGTHS = (1, 97, 400)
SHORT = (1, 33, 97)  # for the simulated rows rung (two barriers per row and head in the simulator: slow)


def _inputs(size, lengths, seed=0):
    b_n, hq, hkv, l_max, d = size
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b_n, hq, d)).astype(np.float32)
    k = rng.standard_normal((b_n, hkv, l_max, d)).astype(np.float32)
    v = rng.standard_normal((b_n, hkv, l_max, d)).astype(np.float32)
    n = np.array(lengths, np.int32)
    for b in range(b_n):
        k[b, :, n[b]:] = np.nan
        v[b, :, n[b]:] = np.nan
    return q, k, v, n


def _variants():
    return [v for v in kernels_src.variants("decode_attention") if not v.baseline]


@pytest.mark.parametrize("key", [v.key for v in _variants()])
def test_short_lengths_in_a_long_cache(key, sim_greenlets):  # results only (races: tests/test_registry.py)
    v = kernels_src.get_variant(key)
    ok, why = v.available()
    if not ok:
        pytest.skip(why)
    inputs = _inputs(SIZE, SHORT if (device.SIMULATED and v.name == "splitk_rows") else LENGTHS)
    ref = da.reference(*parity.to_float64(inputs))
    out = [np.full(ref.shape, np.nan, np.float32)]
    with device.simulator_speedup():
        got = parity.run_variant(v, inputs, out)[0]
    assert not np.isnan(got).any(), f"{key} read a row past its sequence's length (NaN in the output)"
    rtol, atol = parity.resolve_tol(OP.tol, "float32", SIZE)
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)


def test_splits_follow_the_filled_length():
    """The split kernel's partials on the device: with S splits sized from L, sequence b uses
    ceil(n_b / c_b) of them (c_b = n_b / S in whole tiles, at most the host's chunk), and every other
    split is empty (lse = -inf, O = 0), read by nothing."""
    cuda = device.cuda
    q, k, v, n = _inputs(SIZE, LENGTHS, seed=1)
    b_n, hq, hkv, l_max, d = SIZE
    s, chunk = da.n_splits(b_n, hkv, l_max, target_blocks=32)  # the simulator's grid, on any device
    assert chunk > da.TILE  # the case the change is about: one split of the full cache spans several tiles
    o_part = cuda.to_device(np.full((b_n, hq, s, d), np.nan, np.float32))
    lse = cuda.to_device(np.full((b_n, hq, s), np.nan, np.float32))
    dq, dk, dv, dn = (cuda.to_device(a) for a in (q, k, v, n))
    with device.simulator_speedup():
        da.launch_decode(o_part, lse, dq, dk, dv, dn, s, chunk)
    lse_h, op_h = lse.copy_to_host(), o_part.copy_to_host()
    for b, nb in enumerate(n):
        c = min(chunk, math.ceil(math.ceil(nb / s) / da.TILE) * da.TILE)
        used = math.ceil(nb / c)
        if nb == 97:  # a full-cache chunk would put these rows in one split; spread, they take 4
            assert used == 4 > math.ceil(nb / chunk), "the filled rows are not spread over the splits"
        assert np.all(np.isfinite(lse_h[b, :, :used])), f"sequence {b}: a split with rows has no lse"
        assert np.all(lse_h[b, :, used:] == -np.inf), f"sequence {b}: a split past n = {nb} is not empty"
        assert np.all(op_h[b, :, used:] == 0.0)
