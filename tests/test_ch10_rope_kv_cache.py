"""Chapter 10: RoPE and the KV cache. Properties of the rotation (hypothesis), the two pair conventions
and the permutation between them, the backward, the fused cache write, incremental decoding against full
causal attention, and split-K determinism."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels_src
from kernels_src import device, parity
from kernels_src.figures import rope as fig
from kernels_src.ops import decode_attention as da
from kernels_src.ops import rope

SETTINGS = settings(max_examples=40, deadline=None)


def _cache(n_pos, r, dtype=np.float64):
    return rope.cos_sin_cache(n_pos, r, dtype=dtype)


def _vec(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape)


half_dims = st.integers(1, 16).map(lambda k: 2 * k)


@SETTINGS
@given(r=half_dims, m=st.integers(0, 500), n=st.integers(0, 500), shift=st.integers(0, 500),
       seed=st.integers(0, 2**31), interleaved=st.booleans())
def test_score_depends_only_on_relative_position(r, m, n, shift, seed, interleaved):
    """<R_m q, R_n k> = <R_{m+s} q, R_{n+s} k>: the score sees only m - n."""
    cos, sin = _cache(1001, r)
    q, k = _vec(seed, (2, 1, 1, r))

    def score(a, b):
        qm = rope.rotate(q, np.array([a]), cos, sin, interleaved)
        kn = rope.rotate(k, np.array([b]), cos, sin, interleaved)
        return float(np.sum(qm * kn))

    assert score(m, n) == pytest.approx(score(m + shift, n + shift), rel=1e-9, abs=1e-9)


@SETTINGS
@given(t=st.integers(1, 6), h=st.integers(1, 4), r=half_dims, extra=st.integers(0, 5), seed=st.integers(0, 2**31))
def test_rotation_preserves_norm_and_partial_rotary_passes_through(t, h, r, extra, seed):
    d = r + extra
    x, pos, cos, sin = rope.make_inputs((t, h, d, r), np.dtype("float32"), np.random.default_rng(seed))
    for variant in ("loop", "prange"):
        for op in ("rope", "rope_interleaved", "rope_bwd"):
            y = np.full_like(x, np.nan)
            kernels_src.get_variant(f"{op}/cpu/{variant}").fn(y, x, pos, cos, sin)
            np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=2e-6)
            np.testing.assert_array_equal(y[..., r:], x[..., r:])  # untouched, bit for bit
    # the reference with an exact cache: a rotation to rounding (the float32 cache has c^2 + s^2 = 1 +- 1e-7)
    cos64, sin64 = rope.cos_sin_cache(cos.shape[0], r, dtype=np.float64)
    y = rope.reference(x, pos, cos64, sin64)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x.astype(np.float64), axis=-1), rtol=1e-12)


def hf_permutation(r):
    """Index map of Hugging Face's Llama converter for one head: new row j takes old row perm[j]
    (even rows first, then odd), so that half-split on the new rows = interleaved on the old ones."""
    return np.concatenate([np.arange(0, r, 2), np.arange(1, r, 2)])


@SETTINGS
@given(t=st.integers(1, 5), h=st.integers(1, 3), r=half_dims, seed=st.integers(0, 2**31))
def test_half_split_equals_interleaved_after_the_row_permutation(t, h, r, seed):
    x, pos, cos, sin = rope.make_inputs((t, h, r, r), np.dtype("float64"), np.random.default_rng(seed))
    perm = hf_permutation(r)
    inter = rope.reference_interleaved(x, pos, cos, sin)
    half_on_permuted = rope.reference(x[..., perm], pos, cos, sin)
    np.testing.assert_allclose(half_on_permuted, inter[..., perm], rtol=1e-12, atol=1e-12)
    # and so the attention scores are the same: <P a, P b> = <a, b>
    k = _vec(seed + 1, x.shape)
    s_inter = np.einsum("thd,shd->hts", inter, rope.reference_interleaved(k, pos, cos, sin))
    s_half = np.einsum("thd,shd->hts", half_on_permuted, rope.reference(k[..., perm], pos, cos, sin))
    np.testing.assert_allclose(s_half, s_inter, rtol=1e-10, atol=1e-10)


def test_the_conventions_differ_on_the_same_weights():
    """Mixing them up is 'close but wrong': same norms, different vectors, different scores."""
    x, pos, cos, sin = rope.make_inputs((16, 2, 64, 64), np.dtype("float64"), np.random.default_rng(3))
    a = rope.reference(x, pos, cos, sin)
    b = rope.reference_interleaved(x, pos, cos, sin)
    assert np.max(np.abs(a - b)) > 0.5
    np.testing.assert_allclose(np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1))


@SETTINGS
@given(t=st.integers(1, 5), h=st.integers(1, 3), r=half_dims, extra=st.integers(0, 3), seed=st.integers(0, 2**31),
       interleaved=st.booleans())
def test_backward_is_rotation_by_minus_theta(t, h, r, extra, seed, interleaved):
    x, pos, cos, sin = rope.make_inputs((t, h, r + extra, r), np.dtype("float64"), np.random.default_rng(seed))
    dy = _vec(seed + 7, x.shape)
    fwd = rope.rotate(x, pos, cos, sin, interleaved)
    bwd = rope.rotate(dy, pos, cos, sin, interleaved, inverse=True)
    # adjoint: <R x, dy> = <x, R^T dy>, so R^T = R(-theta) is the gradient map
    assert np.sum(fwd * dy) == pytest.approx(np.sum(x * bwd), rel=1e-10, abs=1e-10)
    np.testing.assert_allclose(rope.rotate(fwd, pos, cos, sin, interleaved, inverse=True), x, atol=1e-12)


def test_backward_matches_finite_differences():
    x, pos, cos, sin = rope.make_inputs((2, 1, 8, 8), np.dtype("float64"), np.random.default_rng(0))
    dy = _vec(1, x.shape)
    grad = rope.reference_bwd(dy, pos, cos, sin)
    eps = 1e-6
    for idx in [(0, 0, 0), (1, 0, 5), (0, 0, 7)]:
        e = np.zeros_like(x)
        e[idx] = eps
        fd = (np.sum(rope.reference(x + e, pos, cos, sin) * dy) - np.sum(rope.reference(x - e, pos, cos, sin) * dy)) / (2 * eps)
        assert fd == pytest.approx(grad[idx], rel=1e-6, abs=1e-8)


@pytest.mark.parametrize("interleaved", [False, True])
def test_gpu_token_rung_runs_in_place(interleaved):
    x, pos, cos, sin = rope.make_inputs((3, 2, 12, 8), np.dtype("float32"), np.random.default_rng(5))
    cuda = device.cuda
    dx = cuda.to_device(x)
    with device.simulator_speedup():
        rope.rope_inplace(dx, cuda.to_device(pos), cuda.to_device(cos), cuda.to_device(sin), interleaved)
    ref = rope.rotate(x, pos, cos, sin, interleaved)
    np.testing.assert_allclose(dx.copy_to_host(), ref, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("key", ["cpu/loop", "gpu/token"])
def test_fused_cache_write_touches_only_its_rows(key):
    size = (2, 3, 4, 2, 8, 9)
    qkv, start, cos, sin, hkv, l_max = rope.make_inputs_kv(size, np.dtype("float32"), np.random.default_rng(2))
    q_ref, k_ref, v_ref = rope.reference_kv(qkv, start, cos, sin, hkv, l_max)
    sentinel = np.float32(123.0)
    q = np.zeros(q_ref.shape, np.float32)
    k = np.full(k_ref.shape, sentinel, np.float32)
    v = np.full(v_ref.shape, sentinel, np.float32)
    var = kernels_src.get_variant(f"rope_kv_write/{key}")
    if var.backend == "gpu":
        cuda = device.cuda
        d = [cuda.to_device(a) for a in (q, k, v, qkv, start, cos, sin)]
        var.fn(*d, hkv, l_max)
        q, k, v = (a.copy_to_host() for a in d[:3])
    else:
        var.fn(q, k, v, qkv, start, cos, sin, hkv, l_max)
    written = ~np.isnan(k_ref)
    np.testing.assert_allclose(q, q_ref, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(k[written], k_ref[written], rtol=1e-5, atol=2e-6)
    np.testing.assert_array_equal(v[written], v_ref[written].astype(np.float32))
    assert np.all(k[~written] == sentinel) and np.all(v[~written] == sentinel)


# ------------------------------------------------------------------------- incremental decoding
@pytest.mark.parametrize("decode", ["cpu/loop", "cpu/prange", "gpu/block", "gpu/splitk"])
def test_incremental_decoding_equals_full_causal_attention(decode):
    """Token by token: the fused RoPE + cache write puts token t at row t, decode attention reads rows
    0..t. At every step the output equals row t of full causal attention, within 2e-5 (float32)."""
    t_n, c, hq, hkv, d, l_max = 7, 16, 4, 2, 8, 9
    rng = np.random.default_rng(11)
    x = rng.standard_normal((t_n, c))
    wq, wk, wv = (rng.standard_normal((c, h * d)) / math.sqrt(c) for h in (hq, hkv, hkv))
    cos, sin = rope.cos_sin_cache(l_max, d)
    full = fig.causal_attention_with_rope(x, wq, wk, wv, hq, hkv, cos.astype(np.float64), sin.astype(np.float64))
    k_cache = np.full((1, hkv, l_max, d), np.nan, np.float32)
    v_cache = np.full((1, hkv, l_max, d), np.nan, np.float32)
    write = kernels_src.get_variant("rope_kv_write/cpu/loop").fn
    dec = kernels_src.get_variant(f"decode_attention/{decode}")
    for t in range(t_n):
        qkv = np.concatenate([x[t] @ wq, x[t] @ wk, x[t] @ wv]).reshape(1, 1, hq + 2 * hkv, d).astype(np.float32)
        q = np.empty((1, hq, 1, d), np.float32)
        write(q, k_cache, v_cache, qkv, np.array([t], np.int32), cos, sin, hkv, l_max)
        o = np.full((1, hq, d), np.nan, np.float32)
        lengths = np.array([t + 1], np.int32)
        out = parity.run_variant(dec, (q[:, :, 0], k_cache, v_cache, lengths), [o])[0]
        np.testing.assert_allclose(out[0], full[t], rtol=2e-5, atol=2e-5, err_msg=f"step {t}")


def test_splitk_is_deterministic_and_independent_of_the_split():
    size = (2, 4, 2, 70, 8)
    q, k, v, lengths = da.make_inputs(size, np.dtype("float32"), np.random.default_rng(4))
    cuda = device.cuda
    dq, dk, dv, dl = (cuda.to_device(a) for a in (q, k, v, lengths))
    ref = da.reference(*parity.to_float64((q, k, v, lengths)))
    outs = []
    for splits_wanted in (1, 3, 3, 8):
        chunk = math.ceil(math.ceil(70 / splits_wanted) / da.TILE) * da.TILE
        s = math.ceil(70 / chunk)
        o = cuda.to_device(np.full((2, 4, 8), np.nan, np.float32))
        op_, lse = cuda.device_array((2, 4, s, 8), np.float32), cuda.device_array((2, 4, s), np.float32)
        with device.simulator_speedup():
            da.launch_decode(op_, lse, dq, dk, dv, dl, s, chunk)
            da.merge_kernel[8, 32](o, op_, lse)
        outs.append(o.copy_to_host())
        np.testing.assert_allclose(outs[-1], ref, rtol=2e-5, atol=2e-5)
    assert np.array_equal(outs[1], outs[2])  # same split, same bits


def test_merging_two_halves_equals_attention_over_the_whole():
    rng = np.random.default_rng(9)
    q, k, v = rng.standard_normal(8), rng.standard_normal((50, 8)), rng.standard_normal((50, 8))

    def part(lo, hi):
        s = k[lo:hi] @ q
        m = s.max()
        p = np.exp(s - m)
        return (p / p.sum()) @ v[lo:hi], m + np.log(p.sum())

    (o1, l1), (o2, l2) = part(0, 20), part(20, 50)
    o_part = np.stack([o1, o2])[None, None]
    lse = np.array([l1, l2])[None, None]
    whole = part(0, 50)[0]
    np.testing.assert_allclose(da.reference_merge(o_part, lse)[0, 0], whole, rtol=1e-12)
    out = np.empty((1, 1, 8), np.float32)
    da.attn_merge_cpu(out, o_part.astype(np.float32), lse.astype(np.float32))
    np.testing.assert_allclose(out[0, 0], whole, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------- numbers the chapter states
def test_angle_precision_claims():
    e = fig.angle_errors([100, 1000, 60000, 70000, 131072])
    assert np.all(np.isfinite(e["float16"][:3])) and np.all(np.isinf(e["float16"][3:]))  # 65504 is float16's max
    assert np.all(e["bfloat16 (truncated)"][:3] > e["float16"][:3])  # 8 mantissa bits vs 11
    assert np.all(e["float32"] < 1e-2)


def test_kv_bytes_per_token():
    rows = {r["model"]: r for r in fig.kv_table()}
    assert rows["Llama-2-7B"]["per_token_bytes"] == 2 * 32 * 128 * 2 * 32 == 512 * 1024
    assert rows["Llama-3-8B"]["per_token_bytes"] == 128 * 1024
    assert rows["Llama-2-70B"]["per_layer_bytes"] == 2 * 8 * 128 * 2
