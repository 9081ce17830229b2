"""Chapter 15's own promises: the float scan's error model, the histogram's clamp rule, the sort's stability,
top-k's tie rule, and clear errors on bad input. (Parity of every rung is in tests/test_registry.py.)"""
import math

import numpy as np
import pytest

from kernels_src.ops import histogram, scan, segmented_scan, sort
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


# ------------------------------------------------------------------------------------------- segmented scan
def _per_segment_cumsum(x, offsets):
    """An oracle independent of the reference's doubling: one float64 (int64) cumsum per segment."""
    wide = np.float64 if x.dtype.kind == "f" else np.int64
    out = np.empty(x.size, wide)
    for a, b in zip(offsets[:-1], offsets[1:]):
        out[a:b] = np.cumsum(x[a:b], dtype=wide)
    return out if x.dtype.kind == "f" else out.astype(x.dtype)  # int64 -> int32 wraps as int32 does


def _segmented_rungs():
    from kernels_src import device

    fns = [segmented_scan.seq, segmented_scan.two_pass, segmented_scan.numpy_minus_start]
    if device.MODE in ("sim", "gpu"):
        fns.append(segmented_scan.one_block)
    return fns


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
@pytest.mark.parametrize("case", ["empty_segments", "one_segment", "every_element", "heads_at_ends"])
def test_segmented_scan_awkward_segments(case, dtype):
    rng = np.random.default_rng(11)
    n = 71  # spans three simulator tiles of 32
    (x,) = scan.make_inputs((n,), dtype, rng)
    offsets = {"empty_segments": [0, 0, 5, 5, 5, 33, 64, 64, 70, 71, 71],  # empty ones first, between, last
               "one_segment": [0, n],
               "every_element": list(range(n + 1)),
               "heads_at_ends": [0, 31, 32, 63, 64, 70, 71]}[case]
    heads = segmented_scan.heads_from_offsets(offsets, n)
    expect = _per_segment_cumsum(x, np.array(offsets))
    ref = segmented_scan.reference(x, heads)
    rtol, _ = segmented_scan.seg_tol((n,), np.dtype(dtype))
    if dtype == np.int32:
        assert np.array_equal(ref, expect)
    else:
        np.testing.assert_allclose(ref, expect, rtol=1e-12)
    if case == "one_segment":
        assert np.array_equal(ref, scan.reference(x))
    if case == "every_element":
        assert np.array_equal(ref, x.astype(ref.dtype))
    for fn in _segmented_rungs():
        out = poison(np.empty(n, dtype))
        if fn is segmented_scan.one_block:
            from kernels_src.compiler import cuda

            d_out = cuda.to_device(out)
            fn(d_out, cuda.to_device(x), cuda.to_device(heads))
            out = d_out.copy_to_host()
        else:
            fn(out, x, heads)
        if dtype == np.int32:
            assert np.array_equal(out, expect), fn.__name__
        else:
            assert np.all(np.abs(out - expect) <= rtol * np.abs(expect)), fn.__name__


def test_segmented_scan_offsets_must_be_valid():
    for bad in ([], [1, 3], [0, 2], [0, 3, 2, 4]):
        with pytest.raises(ValueError, match="offsets must start at 0"):
            segmented_scan.heads_from_offsets(bad, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_single_pass_rungs_over_many_tiles_and_misaligned(dtype):
    """Rung 5 of scan and the decoupled segmented rung on the real GPU: many tiles (the look-back walks
    windows of 32 predecessors), sizes that are not multiples of 4 or of the tile, repeated launches (epochs),
    and a view that starts 4 bytes into its buffer (the 16-byte loads must step aside)."""
    from kernels_src.compiler import cuda

    rng = np.random.default_rng(5)
    for n in (scan.DL_TILE * 40 + 3, (1 << 22) + 1):
        (x,) = scan.make_inputs((n + 1,), dtype, rng)
        heads = np.where(rng.random(n + 1) < 1e-4, 1, 0).astype(np.int32)
        heads[scan.DL_TILE * np.arange(1, 5)] = 1  # heads exactly on tile starts
        d_x, d_h = cuda.to_device(x), cuda.to_device(heads)
        rtol, _ = scan.scan_tol((n,), np.dtype(dtype))
        for views in ((d_x[:n], d_h[:n], x[:n], heads[:n]), (d_x[1:], d_h[1:], x[1:], heads[1:])):
            dx, dh, hx, hh = views
            cases = ((scan.scan_gpu_decoupled, (dx,), scan.reference(hx)),
                     (scan.scan_exclusive_gpu_decoupled, (dx,), scan.reference_exclusive(hx)),
                     (segmented_scan.decoupled, (dx, dh), segmented_scan.reference(hx, hh)))
            for _ in range(3):  # the same buffers again: the epoch, not a clear, retires old descriptors
                for fn, args, ref in cases:
                    d_out = cuda.to_device(poison(np.empty(n, dtype)))
                    fn(d_out, *args)
                    out = d_out.copy_to_host()
                    if dtype == np.int32:
                        assert np.array_equal(out, ref), (fn.__name__, n)
                    else:
                        assert np.all(np.abs(out - ref) <= rtol * np.abs(ref) + 0.0), (fn.__name__, n)
