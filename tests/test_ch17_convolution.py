"""Chapter 17's own promises: the convolution convention (torch's cross-correlation), the oracles themselves
(a brute-force loop, and the backward ones as exact adjoints of the forward), the im2col byte count, pooling's
NaN and padding rules, the real GPU's tile shapes run in the simulator, and clear errors on bad input.
(Parity of every registered rung on awkward shapes is in tests/test_registry.py.)"""
import numpy as np
import pytest

from kernels_src import device
from kernels_src.ops import conv, pool
from kernels_src.parity import poison


def brute_conv2d(x, w, stride, pad):
    """The defining formula, one output at a time, in float64 (independent of conv.reference's slicing)."""
    N, C, H, W = x.shape
    K, _, R, S = w.shape
    P, Q = (H + 2 * pad - R) // stride + 1, (W + 2 * pad - S) // stride + 1
    y = np.zeros((N, K, P, Q))
    for n in range(N):
        for k in range(K):
            for p in range(P):
                for q in range(Q):
                    t = 0.0
                    for c in range(C):
                        for r in range(R):
                            for s in range(S):
                                h, v = p * stride - pad + r, q * stride - pad + s
                                if 0 <= h < H and 0 <= v < W:
                                    t += float(x[n, c, h, v]) * float(w[k, c, r, s])
                    y[n, k, p, q] = t
    return y


@pytest.mark.parametrize("size", [(1, 1, 5, 4, 1, 3, 3, 1, 1), (2, 3, 7, 6, 2, 3, 2, 2, 1), (1, 2, 4, 4, 3, 5, 5, 1, 2)])
def test_reference_is_the_formula(size):
    x, w, stride, pad = conv.make_inputs(size, np.float32, np.random.default_rng(1))
    np.testing.assert_allclose(conv.reference(x, w, stride, pad), brute_conv2d(x, w, stride, pad), rtol=1e-12, atol=1e-12)


def test_convention_is_cross_correlation_not_convolution():
    """A filter with a single 1 to the right of its centre reads the input one column to the right: the
    filter is not flipped (a true convolution would read one to the left)."""
    x = np.arange(20, dtype=np.float32).reshape(1, 1, 4, 5)
    w = np.zeros((1, 1, 3, 3), np.float32)
    w[0, 0, 1, 2] = 1.0
    y = conv.reference(x, w, 1, 1)[0, 0]
    expect = np.zeros((4, 5))
    expect[:, :4] = x[0, 0, :, 1:]  # y[p, q] = x[p, q + 1], zero past the right edge
    np.testing.assert_array_equal(y, expect)
    for fn in (conv.conv2d_direct_cpu, conv.conv2d_im2col_cpu, conv.conv2d_im2row_cpu, conv.conv2d_numpy):
        out = poison(np.empty((1, 1, 4, 5), np.float32))
        fn(out, x, w, 1, 1)
        np.testing.assert_array_equal(out[0, 0], expect)


@pytest.mark.parametrize("size", [(2, 3, 7, 6, 4, 3, 3, 1, 1), (1, 2, 9, 8, 3, 3, 2, 2, 1), (2, 1, 5, 5, 2, 5, 5, 1, 2),
                                  (1, 2, 8, 7, 2, 2, 3, 3, 0)])
def test_backward_oracles_are_the_adjoints(size):
    """<conv(x, w), dy> = <x, dx(dy, w)> = <w, dw(x, dy)> for random x, w, dy: dx and dw are the exact
    transposes of the forward map (the dot-product test), so the two backward oracles are right."""
    N, C, H, W, K, R, S, stride, pad = size
    rng = np.random.default_rng(7)
    x, w, _, _ = conv.make_inputs(size, np.float64, rng)
    y = conv.reference(x, w, stride, pad)
    dy = rng.standard_normal(y.shape)
    lhs = float(np.sum(y * dy))
    dx = conv.reference_dx(dy, w, H, W, stride, pad)
    dw = conv.reference_dw(x, dy, R, S, stride, pad)
    assert dx.shape == x.shape and dw.shape == w.shape
    assert float(np.sum(x * dx)) == pytest.approx(lhs, rel=1e-10)
    assert float(np.sum(w * dw)) == pytest.approx(lhs, rel=1e-10)


def test_dx_is_a_transposed_convolution():
    """dx equals a stride-1 convolution of dy with zeros inserted between its elements (stride - 1 of them),
    padded by R - 1 - pad, with the filter flipped in space and its K and C axes swapped."""
    N, C, H, W, K, R, S, stride, pad = 1, 2, 9, 9, 3, 3, 3, 2, 1
    rng = np.random.default_rng(3)
    dy, w, *_ = conv.make_inputs_dx((N, C, H, W, K, R, S, stride, pad), np.float64, rng)
    P, Q = dy.shape[2:]
    up = np.zeros((N, K, (P - 1) * stride + 1, (Q - 1) * stride + 1))
    up[:, :, ::stride, ::stride] = dy
    extra = H - ((P - 1) * stride - 2 * pad + R)  # rows no window reached (output_padding)
    up = np.pad(up, ((0, 0), (0, 0), (R - 1 - pad, R - 1 - pad + extra), (S - 1 - pad, S - 1 - pad + extra)))
    wt = w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)
    np.testing.assert_allclose(conv.reference(up, wt, 1, 0), conv.reference_dx(dy, w, H, W, stride, pad), atol=1e-12)


def test_im2col_bytes_at_the_bench_shape():
    """The chapter's count: the (C R S, N P Q) matrix is 576 x 100352 floats, 231 MB, 9x the 25.7 MB input."""
    N, C, H, W, K, R, S, stride, pad = conv.BENCH2D
    col = C * R * S * N * 56 * 56 * 4
    assert col == 231_211_008
    assert conv.im2col_extra_bytes(conv.BENCH2D) == 2 * col + 2 * K * N * 56 * 56 * 4
    assert col / (N * C * H * W * 4) == 9.0
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 5)).astype(np.float32)
    assert conv.im2col_numpy(x, 3, 3, 1, 1).shape == (3 * 9, 2 * 6 * 5)


def test_offset_table_is_the_im2col_index_map():
    """The implicit GEMM's table reproduces every in-bounds entry of the im2col matrix from a per-pixel base."""
    C, H, W, R, S, stride, pad = 3, 7, 6, 3, 2, 2, 1
    x = np.random.default_rng(5).standard_normal((2, C, H, W)).astype(np.float32)
    col = conv.im2col_numpy(x, R, S, stride, pad)
    tab = conv.offset_table_host(C, R, S, H, W)
    P, Q = conv.out_len(H, R, stride, pad), conv.out_len(W, S, stride, pad)
    flat = x.reshape(-1)
    for j in range(col.shape[1]):
        n, pq = divmod(j, P * Q)
        h0, w0 = (pq // Q) * stride - pad, (pq % Q) * stride - pad
        for crs in range(col.shape[0]):
            h, v = h0 + tab[1, crs], w0 + tab[2, crs]
            want = flat[n * C * H * W + h0 * W + w0 + tab[0, crs]] if (0 <= h < H and 0 <= v < W) else 0.0
            assert col[crs, j] == want


def test_maxpool_nan_and_padding_rules():
    x = np.array([[[[1.0, np.nan, -3.0], [-5.0, -6.0, -7.0], [-8.0, -9.0, -2.0]]]], np.float32)
    ref = pool.reference_max(x, 2, 2, 1, 1)
    # windows of 2 x 2 over x padded by one -inf row/column: the padding never wins, a NaN wins its windows
    expect = np.array([[1, np.nan, np.nan, -3], [1, np.nan, np.nan, -3], [-5, -5, -2, -2], [-8, -8, -2, -2]])
    np.testing.assert_array_equal(ref[0, 0], expect)
    for fn in (pool.maxpool_par, pool.maxpool_numpy):
        out = poison(np.empty((1, 1, 4, 4), np.float32))
        fn(out, x, 2, 2, 1, 1)
        np.testing.assert_array_equal(out[0, 0], expect)
    avg = pool.reference_avg(np.ones((1, 1, 3, 3), np.float32), 3, 3, 1, 1)
    assert avg[0, 0, 0, 0] == pytest.approx(4 / 9)  # a corner window holds 4 ones and 5 zeros of padding


def test_real_gpu_tile_shapes_in_the_simulator():
    """The H100's configurations (implicit GEMM 64 x 128 x 8 and 64 x 256 x 8 with 128 threads, the 16 x 16 x 8 halo tile)
    on small shapes, so the kernels the GPU runs are checked where no GPU is."""
    if not device.SIMULATED:
        pytest.skip("simulator only (on a GPU the registered rungs run these shapes already)")
    rng = np.random.default_rng(2)
    for size in [(1, 3, 7, 9, 5, 3, 3, 1, 1), (2, 2, 9, 8, 3, 3, 3, 2, 1)]:
        x, w, stride, pad = conv.make_inputs(size, np.float32, rng)
        ref = conv.reference(x, w, stride, pad)
        rtol, atol = conv.sum_tol(lambda s: s[1] * s[5] * s[6])(size, np.float32)
        y = poison(np.empty(ref.shape, np.float32))
        conv._implicit_gpu(y, x, w, stride, pad)
        np.testing.assert_allclose(y, ref, rtol=rtol, atol=atol)
        y = poison(np.empty(ref.shape, np.float32))
        conv._implicit_vec_gpu(y, x, w, stride, pad)
        np.testing.assert_allclose(y, ref, rtol=rtol, atol=atol)
        y = poison(np.empty(ref.shape, np.float32))  # a thread per pixel column (rung 5 has two per thread)
        conv.make_implicit_vec(BM=64, BN=128, BK=8, TM=8, TN=8)(y, x, w, stride, pad)
        np.testing.assert_allclose(y, ref, rtol=rtol, atol=atol)
        kern = conv.tiled_kernel(size[5], size[6], stride, gpu=True)
        TILE, KB, NT = kern.geometry
        assert (TILE, KB) == (conv.TILE_GPU, conv.KB_GPU)
        y = poison(np.empty(ref.shape, np.float32))
        N, K, P, Q = y.shape
        kern[(conv.ceil_div(P, TILE) * conv.ceil_div(Q, TILE), conv.ceil_div(K, KB), N), NT](y, x, w, pad)
        np.testing.assert_allclose(y, ref, rtol=rtol, atol=atol)


def test_conv1d_filter_longer_than_the_halo_buffer():
    """conv1d's tiled rung stages at most HALO_MAX taps at once: a 70-tap filter takes two chunks."""
    size = (1, 2, 90, 2, conv.HALO_MAX + 6, 1, 3)
    x, w, stride, pad = conv.make_inputs_1d(size, np.float32, np.random.default_rng(4))
    ref = conv.reference_1d(x, w, stride, pad)
    y = poison(np.empty(ref.shape, np.float32))
    conv.conv1d_tiled_gpu(y, x, w, stride, pad)
    device.synchronize()
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-4)


def test_bad_inputs_raise_clear_errors():
    x = np.zeros((1, 3, 5, 5), np.float32)
    with pytest.raises(ValueError, match="stride"):
        conv.conv2d_direct_cpu(np.zeros((1, 1, 3, 3), np.float32), x, np.zeros((1, 3, 3, 3), np.float32), 0, 0)
    with pytest.raises(ValueError, match="channels"):
        conv.conv2d_direct_cpu(np.zeros((1, 1, 3, 3), np.float32), x, np.zeros((1, 2, 3, 3), np.float32), 1, 0)
    with pytest.raises(ValueError, match="does not fit"):
        conv.conv2d_direct_cpu(np.zeros((1, 1, 1, 1), np.float32), x, np.zeros((1, 3, 7, 7), np.float32), 1, 0)


# ---------------------------------------------------------------- CPU rungs built on the course's GEMM (issue 36)
GEMM_SHAPES = [(1, 1, 1, 1, 1, 1, 1, 1, 0), (2, 3, 7, 6, 5, 3, 3, 1, 1), (1, 2, 9, 8, 3, 3, 2, 2, 1),
               (2, 1, 5, 5, 2, 5, 5, 1, 2), (1, 2, 11, 10, 7, 2, 3, 3, 0), (3, 5, 13, 7, 67, 3, 3, 2, 2),
               (1, 70, 6, 5, 9, 1, 1, 1, 0)]  # 70 channels: S C runs and GEMM depths past one vector, K past a tile


def _tol(terms):
    return 8.0 * terms * np.finfo(np.float32).eps + 1e-6


@pytest.mark.parametrize("size", GEMM_SHAPES)
def test_gemm_rungs_match_the_float64_oracles(size):
    """conv2d im2row_gemm, dw im2row_gemm and dx gemm_row2im against the float64 references on awkward shapes
    (1s, primes, strides that leave input rows unread, pad >= R / 2, K past the GEMM's register tile), every
    output poisoned first, so an output the rung never writes fails."""
    N, C, H, W, K, R, S, stride, pad = size
    rng = np.random.default_rng(11)
    x, w, _, _ = conv.make_inputs(size, np.float32, rng)
    ref = conv.reference(x, w, stride, pad)
    y = poison(np.empty(ref.shape, np.float32))
    conv.conv2d_im2row_cpu(y, x, w, stride, pad)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=_tol(C * R * S))
    dy = rng.standard_normal(ref.shape).astype(np.float32)
    dw = poison(np.empty_like(w))
    conv.dw_im2col_cpu(dw, x, dy, R, S, stride, pad)
    np.testing.assert_allclose(dw, conv.reference_dw(x, dy, R, S, stride, pad), rtol=1e-5,
                               atol=_tol(N * ref.shape[2] * ref.shape[3]))
    dx = poison(np.empty_like(x))
    conv.dx_gemm_cpu(dx, dy, w, H, W, stride, pad)
    np.testing.assert_allclose(dx, conv.reference_dx(dy, w, H, W, stride, pad), rtol=1e-5, atol=_tol(K * R * S))


@pytest.mark.parametrize("size", [(1, 1, 1, 1, 1, 1, 0), (2, 3, 17, 5, 5, 1, 2), (1, 4, 23, 3, 4, 3, 1),
                                  (3, 2, 10, 7, 3, 2, 0), (2, 33, 50, 2, 9, 1, 4)])
def test_conv1d_im2row_view_matches_the_oracle(size):
    """conv1d's im2row matrix is a strided view of the padded NLC input (overlapping rows): right for strides
    that do not divide L + 2 pad - R, for pad = 0, and with the view's last row ending on the buffer's end."""
    rng = np.random.default_rng(5)
    x, w, stride, pad = conv.make_inputs_1d(size, np.float32, rng)
    ref = conv.reference_1d(x, w, stride, pad)
    x0 = x.copy()
    y = poison(np.empty(ref.shape, np.float32))
    conv.conv1d_im2row_cpu(y, x, w, stride, pad)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=_tol(size[1] * size[4]))
    np.testing.assert_array_equal(x, x0)  # the view is read, never written


def test_gemm_rungs_nan_reaches_exactly_the_windows_that_hold_it():
    """A NaN in x makes NaN exactly the outputs whose window covers it (and every dw entry that multiplies it);
    the zero border of the NHWC copy must not invent NaNs, and the GEMM's zero padding must not hide one."""
    size = (2, 3, 9, 8, 4, 3, 3, 2, 1)
    N, C, H, W, K, R, S, stride, pad = size
    rng = np.random.default_rng(2)
    x, w, _, _ = conv.make_inputs(size, np.float32, rng)
    x[1, 2, 4, 5] = np.nan
    ref = conv.reference(x, w, stride, pad)
    y = poison(np.empty(ref.shape, np.float32))
    conv.conv2d_im2row_cpu(y, x, w, stride, pad)
    assert 0 < np.isnan(ref).sum() < ref.size
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    dy = rng.standard_normal(ref.shape).astype(np.float32)
    dy[0, 1, 2, 3] = np.inf
    dx = poison(np.empty_like(x))
    conv.dx_gemm_cpu(dx, dy, w, H, W, stride, pad)
    dref = conv.reference_dx(dy, w, H, W, stride, pad)
    np.testing.assert_array_equal(np.isinf(dx), np.isinf(dref))
    np.testing.assert_array_equal(np.isnan(dx), np.isnan(dref))


def test_row2im_is_race_free():
    """dx's scatter runs with every thread on the same output image: each task owns padded input rows, so
    repeated runs give bit-identical results (a race on the += would lose or reorder additions)."""
    size = (1, 8, 16, 16, 8, 3, 3, 1, 1)
    rng = np.random.default_rng(4)
    dy, w, H, W, stride, pad = conv.make_inputs_dx(size, np.float32, rng)
    first = np.empty((1, 8, 16, 16), np.float32)
    conv.dx_gemm_cpu(first, dy, w, H, W, stride, pad)
    for _ in range(5):
        again = poison(np.empty_like(first))
        conv.dx_gemm_cpu(again, dy, w, H, W, stride, pad)
        np.testing.assert_array_equal(again, first)
    np.testing.assert_allclose(first, conv.reference_dx(dy, w, H, W, stride, pad), rtol=1e-5, atol=1e-4)
