"""Chapter 15's own promises: the float scan's error model, the histogram's clamp rule, the sort's stability,
top-k's tie rule, and clear errors on bad input. (Parity of every rung is in tests/test_registry.py.)"""
import math

import numpy as np
import pytest

from kernels_src.ops import histogram, scan, sort
from kernels_src.parity import poison


def test_error_model_bounds_the_sequential_float_scan():
    """The worst rung (one running float32 total) stays inside the stated model, and the model is tight
    enough that a dropped element fails it."""
    rng = np.random.default_rng(0)
    n = 50_000
    (x,) = scan.make_inputs((n,), np.float32, rng)
    exact = scan.reference(x)
    out = poison(np.empty(n, np.float32))
    scan.scan_seq(out, x, False)
    rtol, atol = scan.scan_tol((n,), np.dtype(np.float32))
    err = np.abs(out - exact)
    assert np.all(err <= atol + rtol * np.abs(exact))
    assert err.max() > 0  # float32 really rounds: the tolerance is doing work
    dropped = exact - x[0]  # every output missing x[0]
    assert np.all(np.abs(dropped - exact)[:1000] > atol + rtol * np.abs(exact[:1000]))
    assert rtol == pytest.approx((math.sqrt(n) + 8) * np.finfo(np.float32).eps)


def test_integer_scans_are_exact_and_wrap():
    x = np.array([2**31 - 1, 1, -5], np.int32)
    out = poison(np.empty(3, np.int32))
    scan.scan_seq(out, x, False)
    assert out.tolist() == [2**31 - 1, -(2**31), -(2**31) - 5 + 2**32]
    assert scan.scan_tol((3,), np.dtype(np.int32)) == (0.0, 0.0)
    ex = poison(np.empty(3, np.int32))
    scan.scan_seq(ex, x, True)
    assert ex.tolist() == [0, 2**31 - 1, -(2**31)]


def test_histogram_clamp_rule():
    x = np.array([-7, 0, 3, 4, 100, -(2**31), 2**31 - 1], np.int32)
    expect = [3, 0, 0, 1, 3]  # below 0 -> bin 0; >= bins -> bin bins - 1
    assert histogram.reference(x, 5).tolist() == expect
    for fn in (histogram.hist_numpy, histogram.hist_seq_cpu, histogram.hist_private_cpu):
        counts = poison(np.empty(5, np.int32))
        fn(counts, x, 5)
        assert counts.tolist() == expect, fn.__name__
        assert counts.sum() == x.size


@pytest.mark.parametrize("fn", [sort.sort_lsd_cpu, sort.sort_lsd_prange_cpu])
def test_radix_sort_is_stable(fn):
    rng = np.random.default_rng(3)
    n = 20_000
    keys = rng.integers(0, 3, n).astype(np.uint32) * np.uint32(0x01010101)  # three keys, every byte differs
    vals = np.arange(n, dtype=np.int32)
    ko, vo = poison(np.empty(n, np.uint32)), poison(np.empty(n, np.int32))
    fn(ko, vo, keys, vals)
    assert np.all(np.diff(ko.astype(np.int64)) >= 0)
    for k in np.unique(keys):  # within one key, the values (input positions) come out increasing
        assert np.all(np.diff(vo[ko == k]) > 0)
    assert np.array_equal(vo, np.argsort(keys, kind="stable"))


def test_topk_tie_rule():
    x = np.array([1.0, np.nan, 3.0, -0.0, 3.0, 0.0, np.inf, np.nan, 1.0], np.float32)
    v, i = sort.reference_topk(x, 9)
    # NaN above +inf, NaNs in index order; then inf; equal 3.0s by index; -0.0 and 0.0 equal, by index
    assert i.tolist() == [1, 7, 6, 2, 4, 0, 8, 3, 5]
    for fn in (sort.topk_radix_cpu, sort.topk_numpy):
        for k in (0, 1, 4, 9):
            values, idx = poison(np.empty(k, np.float32)), poison(np.empty(k, np.int32))
            fn(values, idx, x, k)
            assert idx.tolist() == i[:k].tolist(), (fn.__name__, k)
            np.testing.assert_array_equal(values, x[i[:k]])


def test_desc_key_orders_like_the_tie_rule():
    x = np.array([-np.inf, -1.5, -0.0, 0.0, 1e-45, 2.0, np.inf, np.nan], np.float32)
    keys = sort.desc_key_np(x)
    assert keys[2] == keys[3]  # -0.0 == 0.0
    assert np.all(np.diff(keys.astype(np.int64)[[7, 6, 5, 4, 3, 1, 0]]) > 0)
    cpu = np.empty_like(keys)
    sort.desc_key(x, cpu)
    assert np.array_equal(cpu, keys)


def test_bad_inputs_raise_clear_errors():
    x = np.array([1, 2], np.int32)
    with pytest.raises(ValueError, match="bins must be >= 1"):
        histogram.hist_seq_cpu(np.empty(0, np.int32), x, 0)  # no bins: nothing to clamp into
    with pytest.raises(ValueError, match="counts has 3 elements"):
        histogram.hist_private_cpu(np.empty(3, np.int32), x, 4)
    with pytest.raises(ValueError, match="must be int32"):
        histogram.hist_numpy(np.empty(4, np.int32), x.astype(np.int64), 4)
    for k in (-1, 4):
        with pytest.raises(ValueError, match="k must be in"):
            sort.topk_radix_cpu(np.empty(3, np.float32), np.empty(3, np.int32), np.ones(3, np.float32), k)
