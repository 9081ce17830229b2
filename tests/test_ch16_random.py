"""Chapter 16: Philox-4x32-10 against its published known answers on every backend, dropout's edge cases and mask
statistics, sampling's rules (ties, top-k, top-p, greedy), reproducibility, and bad input."""
import math

import numpy as np
import pytest

from kernels_src import device
from kernels_src.ops import philox as P
from kernels_src.ops import sampling as S

KAT_CTR = np.array([c for c, _, _ in P.KAT], dtype=np.uint32)
KAT_OUT = np.array([o for _, _, o in P.KAT], dtype=np.uint32)


def _kat_each(fn):
    """Run a (out, ctr, key) launcher on each known-answer line (each has its own key)."""
    got = []
    for ctr, key, _ in P.KAT:
        out = np.zeros((1, 4), np.uint32)
        fn(out, np.array([ctr], np.uint32), np.array(key, np.uint32))
        got.append(out[0])
    return np.array(got)


def test_kat_reference_and_rounds():
    for ctr, key, exp in P.KAT:
        assert tuple(int(v) for v in P.philox_np([ctr], key)[0]) == exp
    for ctr, key, exp in P.KAT7:
        assert tuple(int(v) for v in P.philox_np([ctr], key, rounds=7)[0]) == exp


def test_kat_cpu():
    np.testing.assert_array_equal(_kat_each(P.philox_cpu), KAT_OUT)
    np.testing.assert_array_equal(_kat_each(P.philox_cpu_par), KAT_OUT)


@pytest.mark.skipif(not device.GPU_VARIANTS_RUN, reason=device.REASON)
def test_kat_gpu_or_simulator():
    np.testing.assert_array_equal(_kat_each(P.philox_gpu), KAT_OUT)
    if device.MODE == "gpu":
        np.testing.assert_array_equal(_kat_each(P.philox_gpu_mulhi), KAT_OUT)


def test_stream_layout_and_uniform_rule():
    bits = P.stream_bits(5, 9, 10)
    blk = P.philox_np([[1, 0, 9, 0]], [5, 0])[0]  # group 1 = elements 4..7
    np.testing.assert_array_equal(bits[4:8], blk)
    u = P.uniforms(5, 9, 10)
    assert np.all((u >= 0) & (u < 1)) and np.all(u == (bits >> 8) * 2.0 ** -24)
    assert np.all(u.astype(np.float32) == u)  # exactly representable in float32
    assert not np.array_equal(P.stream_bits(5, 10, 8), P.stream_bits(5, 9, 8))  # offset changes the stream


def test_uniform_cpu_bits_match_reference():
    u = np.empty(1003, np.float32)
    P.uniform_cpu_par(u, 2**63 + 11, 2**40 + 3, u.size)
    np.testing.assert_array_equal(u, P.uniforms(2**63 + 11, 2**40 + 3, u.size))


def test_dropout_p0_p1_and_scale():
    x = np.random.default_rng(0).standard_normal(1001).astype(np.float32)
    y = np.empty_like(x)
    P.dropout_cpu_par(y, x, 0.0, 1, 2)
    np.testing.assert_array_equal(y, x)  # p = 0: everything kept, scale exactly 1
    P.dropout_cpu_par(y, x, 1.0, 1, 2)
    assert np.all(y == 0) and not np.signbit(y).any()  # p = 1: +0 everywhere, no division by zero
    p = 0.3
    P.dropout_cpu_par(y, x, p, 1, 2)
    keep = P.keep_mask(p, 1, 2, x.size)
    np.testing.assert_array_equal(y[~keep], 0)
    np.testing.assert_allclose(y[keep], x[keep] / (1 - p), rtol=2.5e-7)


def test_dropout_drops_nan_and_backward_uses_same_mask():
    x = np.full(64, np.nan, np.float32)
    y = np.empty_like(x)
    P.dropout_cpu(y, x, 0.5, 3, 4)
    keep = P.keep_mask(0.5, 3, 4, 64)
    assert np.all(y[~keep] == 0) and np.all(np.isnan(y[keep]))
    dy = np.ones(64, np.float32)
    dx = np.empty_like(dy)
    P.dropout_cpu_par(dx, dy, 0.5, 3, 4)
    np.testing.assert_array_equal(dx != 0, keep)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_kept_fraction_within_binomial_bound(p):
    """The kept count of n = 2^18 elements is Binomial(n, 1 - p): within 5 standard deviations (fails with
    probability < 1e-6 for a right generator; a wrong threshold by 1 % of p is 10+ deviations off)."""
    n = 1 << 18
    x = np.ones(n, np.float32)
    y = np.empty_like(x)
    P.dropout_cpu_par(y, x, p, 1234, 0)
    kept = int(np.count_nonzero(y))
    sd = math.sqrt(n * p * (1 - p))
    assert abs(kept - n * (1 - p)) < 5 * sd, (kept, n * (1 - p), sd)
    # and the uniforms themselves: each of 16 bins holds ~n/16 (chi-square with 15 degrees of freedom < 50)
    h = np.histogram(P.uniforms(99, 0, n), bins=16, range=(0, 1))[0]
    assert ((h - n / 16) ** 2 / (n / 16)).sum() < 50


@pytest.mark.skipif(not device.GPU_VARIANTS_RUN, reason=device.REASON)
def test_dropout_gpu_matches_cpu_bits():
    x = np.random.default_rng(1).standard_normal(131).astype(np.float32)
    yc, yg = np.empty_like(x), np.empty_like(x)
    P.dropout_cpu(yc, x, 0.4, 77, 5)
    for fn in (P.dropout_gpu_thread4, P.dropout_gpu_vec4):
        fn(yg, x, 0.4, 77, 5)
        np.testing.assert_array_equal(yg, yc)


@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan"), "a"])
def test_dropout_bad_p(p):
    with pytest.raises(ValueError, match="p"):
        P.dropout(np.ones(4, np.float32), p, 0)


def test_bad_seed():
    with pytest.raises(ValueError, match="2\\^64"):
        P.dropout(np.ones(4, np.float32), 0.5, -1)


# --------------------------------------------------------------------------------------------- sampling
def _all_rungs(logits, *args):
    out = {"ref": S.sample_ref(logits.astype(np.float64), *args)}
    fns = [S.sample_cpu_sort, S.sample_cpu_select] + ([S.sample_gpu_block] if device.GPU_VARIANTS_RUN else [])
    for fn in fns:
        ids = np.full(logits.shape[0], -7, np.int32)
        fn(ids, logits, *args)
        out[fn.__name__] = ids
    return out


def test_sampling_ties_greedy_and_topk(sim_race_checked):  # the GPU rung also race-free
    logits = np.array([[1.0, 3.0, 3.0, 0.0, 3.0], [-0.0, 0.0, -1.0, -np.inf, -5.0]], np.float32)
    for name, ids in _all_rungs(logits, 0.0, 0, 1.0, 1, 0).items():
        np.testing.assert_array_equal(ids, [1, 0], err_msg=name)  # argmax, smallest index; -0.0 ties +0.0
    for step in range(8):  # top_k = 1 is greedy whatever the draw
        for name, ids in _all_rungs(logits, 1.0, 1, 1.0, 1, step).items():
            np.testing.assert_array_equal(ids, [1, 0], err_msg=name)


def test_sampling_tie_rule_at_the_cut(sim_race_checked):  # the GPU rung also race-free
    """Equal logits: top-k = 2 keeps the two smallest indices of the tie; top-p = 0.5 of four equal weights keeps
    exactly two (weights 1.0: sums are exact in any order)."""
    logits = np.zeros((1, 4), np.float32)
    seen_k, seen_p = set(), set()
    for step in range(40):
        for name, ids in _all_rungs(logits, 1.0, 2, 1.0, 3, step).items():
            seen_k.add(int(ids[0]))
        for name, ids in _all_rungs(logits, 1.0, 0, 0.5, 3, step).items():
            seen_p.add(int(ids[0]))
    assert seen_k == {0, 1} and seen_p == {0, 1}


def test_sampling_reproducible_and_rungs_agree(sim_greenlets):  # the GPU rung's race test: the two tests above
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((4, 300)).astype(np.float32)
    a = _all_rungs(logits, 0.8, 20, 0.9, 42, 7)
    for name, ids in a.items():
        np.testing.assert_array_equal(ids, a["ref"], err_msg=name)
    b = S.sample(logits, 0.8, 20, 0.9, seed=42, step=7)
    np.testing.assert_array_equal(b, a["ref"])
    steps = {tuple(S.sample(logits, 1.0, 0, 1.0, seed=42, step=s)) for s in range(6)}
    assert len(steps) > 1  # a new step draws new tokens


def test_sampling_frequencies_follow_softmax():
    logits = np.log(np.array([[0.5, 0.3, 0.2]], np.float32))
    n = 3000
    ids = np.array([S.sample(logits, 1.0, 0, 1.0, seed=9, step=s)[0] for s in range(n)])
    freq = np.bincount(ids, minlength=3) / n
    assert np.all(np.abs(freq - [0.5, 0.3, 0.2]) < 5 * np.sqrt(0.25 / n)), freq
    ids = np.array([S.sample(logits, 1.0, 0, 0.75, seed=9, step=s)[0] for s in range(300)])
    assert set(ids.tolist()) == {0, 1}  # top-p 0.75: 0.5 < 0.75 <= 0.8, the 0.2 token is cut


@pytest.mark.parametrize("kw,match", [({"temperature": -1.0}, "temperature"), ({"temperature": float("nan")}, "temperature"),
                                      ({"top_k": -1}, "top_k"), ({"top_k": 1.5}, "top_k"),
                                      ({"top_p": 0.0}, "top_p"), ({"top_p": 1.01}, "top_p")])
def test_sampling_bad_parameters(kw, match):
    with pytest.raises(ValueError, match=match):
        S.sample(np.zeros((1, 3), np.float32), **kw)


def test_sampling_nan_logits():
    with pytest.raises(ValueError, match="NaN"):
        S.sample(np.array([[0.0, np.nan]], np.float32))
