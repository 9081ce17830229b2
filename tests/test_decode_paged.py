"""Paged-KV decode (issue 24): K and V read through a block table. The reference is checked against the
contiguous decode reference on a cache the test scatters into pages itself; make_inputs is checked to make
inputs that catch a kernel ignoring the table or reading past a length; and every registered variant that runs
here (CPU, simulator; bfly on a real GPU) against the float64 reference on shuffled tables, odd page sizes and
lengths that are not multiples of the page."""
import numpy as np
import pytest

import kernels_src
from kernels_src import device, parity
from kernels_src.ops import decode_attention as da
from kernels_src.ops import decode_paged as dp

OP = kernels_src.get_op("decode_attention_paged")


def _scatter(k, v, lengths, page, rng):
    """A contiguous cache (B,Hkv,L,D) written into a pool of pages in a random physical order (the test's own
    scatter, not the module's gather)."""
    b_n, hkv, l_max, d = k.shape
    mb = -(-l_max // page)
    nb = b_n * mb + 2
    perm = rng.permutation(nb).astype(np.int32)
    table = perm[:b_n * mb].reshape(b_n, mb).copy()
    kp = np.full((nb, page, hkv, d), np.nan, k.dtype)
    vp = np.full((nb, page, hkv, d), np.nan, v.dtype)
    for b in range(b_n):
        for j in range(mb):
            rows = slice(j * page, min(l_max, (j + 1) * page))
            n_r = rows.stop - rows.start
            kp[table[b, j], :n_r] = np.transpose(k[b, :, rows], (1, 0, 2))
            vp[table[b, j], :n_r] = np.transpose(v[b, :, rows], (1, 0, 2))
    return kp, vp, table


@pytest.mark.parametrize("size,page", [((2, 4, 2, 37, 8), 16), ((3, 6, 3, 50, 5), 7), ((1, 1, 1, 1, 3), 16)])
def test_reference_matches_the_contiguous_reference(size, page):
    rng = np.random.default_rng(0)
    q, k, v, n = da.make_inputs(size, np.dtype(np.float64), rng)
    kp, vp, table = _scatter(k, v, n, page, rng)
    np.testing.assert_allclose(dp.reference(q, kp, vp, table, n), da.reference(q, k, v, n), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("size", OP.sizes["check"] + OP.sizes["check_sim"])
def test_inputs_are_shuffled_and_poisoned(size):
    q, kp, vp, table, n = dp.make_inputs(size, np.dtype(np.float32), np.random.default_rng(1))
    b_n, hq, hkv, l_max, d, page = size
    assert table.dtype == np.int32 and table.shape == (b_n, -(-l_max // page))
    assert kp.shape[0] > table.size  # spare blocks that no sequence owns
    if table.size > 2:
        assert not np.array_equal(table.ravel(), np.arange(table.size)), "physical order must differ from logical"
    for b in range(b_n):
        used = -(-int(n[b]) // page)
        owned = table[b, :used]
        rows = np.concatenate([kp[owned[j]][: min(page, int(n[b]) - j * page)] for j in range(used)])
        assert np.isfinite(rows).all()
        tail = kp[owned[-1]][int(n[b]) - (used - 1) * page:]
        assert np.isnan(tail).all(), "rows past the length must be NaN"
        assert np.isnan(kp[table[b, used:]]).all(), "table entries past the last page must point at NaN pages"


def test_inputs_catch_a_kernel_that_ignores_the_table():
    """Reading page j of sequence b as physical block b * MB + j (no table) gives another answer (or NaN)."""
    size = (2, 4, 2, 37, 8, 16)
    q, kp, vp, table, n = dp.make_inputs(size, np.dtype(np.float32), np.random.default_rng(2))
    ident = np.arange(table.size, dtype=np.int32).reshape(table.shape)
    good = dp.reference(q, kp, vp, table, n)
    bad = dp.reference(q, kp, vp, ident, n)
    assert not np.allclose(good, bad, equal_nan=False)


def _variants():
    return [v for v in kernels_src.variants("decode_attention_paged")]


@pytest.mark.parametrize("key", [v.key for v in _variants()])
def test_variant_against_reference(key, sim_greenlets):
    v = kernels_src.get_variant(key)
    ok, why = v.available()
    if not ok:
        pytest.skip(why)
    sizes = OP.sizes["check_sim"] if (v.backend == "gpu" and device.SIMULATED) else OP.sizes["check"]
    for i, size in enumerate(sizes):
        inputs = dp.make_inputs(size, np.dtype(np.float32), np.random.default_rng(10 + i))
        ref = dp.reference(*parity.to_float64(inputs))
        out = [np.full(ref.shape, np.nan, np.float32)]
        with device.simulator_speedup():
            got = parity.run_variant(v, inputs, out)[0]
        assert not np.isnan(got).any(), f"{key} {size}: NaN (a row past a length, or a page not in the table)"
        rtol, atol = parity.resolve_tol(OP.tol, "float32", size)
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol, err_msg=f"{key} {size}")
