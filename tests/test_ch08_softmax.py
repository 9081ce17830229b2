"""Chapter 8: softmax. The stability claims (which rungs give NaN on which rows), the fully-masked-row
convention, the online recurrence, and the backward oracle."""
import warnings

import numpy as np
import pytest

import kernels_src
from kernels_src import device, parity
from kernels_src.figures import rowwise as viz
from kernels_src.figures import rowwise_bench
from kernels_src.ops import softmax as sm


def test_reference_rows_sum_to_one_and_masked_rows_are_zero():
    x = np.array([[1.0, 2.0, 3.0], [-np.inf, -np.inf, -np.inf], [-np.inf, 0.0, -np.inf], [1e4, -1e4, 1e4]])
    y = sm.reference(x)
    np.testing.assert_allclose(y.sum(-1), [1, 0, 1, 1])
    np.testing.assert_array_equal(y[1], 0.0)
    np.testing.assert_array_equal(y[2], [0.0, 1.0, 0.0])
    np.testing.assert_allclose(y[3], [0.5, 0.0, 0.5])
    e = np.exp([1.0, 2.0, 3.0])
    np.testing.assert_allclose(y[0], e / e.sum(), rtol=1e-15)


def _hard_rows():
    return {"large": (1e4 * np.sign(np.random.default_rng(0).standard_normal((4, 33)))).astype(np.float32),
            "masked": np.full((3, 33), -np.inf, dtype=np.float32)}


@pytest.mark.parametrize("case", ["large", "masked"])
def test_naive_cpu_gives_nan(case):
    x = _hard_rows()[case]
    y = np.full_like(x, 7.0)
    with np.errstate(all="ignore"):
        sm.softmax_naive(y, x)
    assert np.isnan(y).any()


def _stable_keys():
    return [v.key for v in kernels_src.get_op("softmax").variants if v.name != "naive" and not v.baseline]


@pytest.mark.parametrize("case", ["large", "masked"])
@pytest.mark.parametrize("key", _stable_keys())
def test_stable_rungs_match_reference_on_hard_rows(key, case):
    v = kernels_src.get_variant(key)
    ok, why = v.available()
    if not ok:
        pytest.skip(why)
    x = _hard_rows()[case]
    op = kernels_src.get_op("softmax")
    ref = parity.reference_outputs(op, (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = parity.run_variant(v, (x,), parity.empty_outputs(ref, "float32"))
    rep = parity.compare("y", out[0], ref[0], *sm.TOL)
    assert rep.ok, "\n".join(rep.lines())


@pytest.mark.gpu
def test_naive_gpu_gives_nan_on_large_logits():
    x = _hard_rows()["large"]
    y = device.cuda.to_device(np.zeros_like(x))
    sm.softmax_naive_gpu(y, device.cuda.to_device(x))
    assert np.isnan(y.copy_to_host()).any()


def test_online_recurrence_gives_max_and_sum():
    x = np.random.default_rng(5).normal(0, 3, 200)
    ms, ss = viz.online_trace(x)
    np.testing.assert_allclose(ms, np.maximum.accumulate(x))
    np.testing.assert_allclose(ss[-1], np.sum(np.exp(x - x.max())), rtol=1e-12)
    assert ss.min() >= 1.0  # the running max's own term is always 1


def test_merging_partial_softmax_states():
    """The (max, sum) merge used by the GPU rungs, replayed in float64: halves merged = whole row."""
    x = np.random.default_rng(6).normal(0, 5, 101)

    def state(v):
        m = v.max()
        return m, np.exp(v - m).sum()

    (m1, s1), (m2, s2) = state(x[:40]), state(x[40:])
    m = max(m1, m2)
    np.testing.assert_allclose(s1 * np.exp(m1 - m) + s2 * np.exp(m2 - m), state(x)[1], rtol=1e-12)


def test_backward_reference_matches_finite_differences():
    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal((2, 6)), rng.standard_normal((2, 6))
    y = sm.reference(x)
    h = 1e-6
    num = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        num[idx] = (np.sum(dy * sm.reference(xp)) - np.sum(dy * sm.reference(xm))) / (2 * h)
    np.testing.assert_allclose(sm.reference_bwd(dy, y), num, rtol=1e-6, atol=1e-9)


def test_benchmark_inputs_are_safe_for_every_rung():
    """make_inputs masks entries but never a whole row, and keeps logits far below exp's overflow."""
    (x,) = sm.make_inputs((64, 1000), np.dtype("float32"), np.random.default_rng(0))
    assert np.isfinite(x).any(axis=1).all()
    assert np.nanmax(x[np.isfinite(x)]) < 60


def test_profile_plan_parses_and_covers_the_ladder():
    plan = rowwise_bench.parse_plan(rowwise_bench.PROFILE_PLAN)
    ops = {op: vs for op, _, vs in plan}
    assert {"naive", "safe", "online", "vec4"} <= set(ops["softmax"])
    assert rowwise_bench.parse_plan("softmax@3x36:naive,vec4") == [("softmax", (3, 36), ["naive", "vec4"])]


def test_committed_profile_shows_one_dram_pass_per_rung():
    """The chapter's claim: every forward rung moves about the minimum DRAM bytes (re-reads hit L2)."""
    from kernels_src import plots

    res = plots.load_json(plots.DATA / "h100/softmax_ncu.json")
    rows = viz.ncu_rows(res)
    assert {r["variant"] for r in rows} >= {"naive", "safe", "online", "regs", "vec4"}
    for r in rows:
        assert 0.9 < r["dram_over_min"] < 1.1, r


@pytest.mark.parametrize("size", [(3, 8), (2, 36), (5, 132)])
def test_vec4_rungs_on_rows_a_multiple_of_four(size):
    """The 16-byte path (rows of 4k elements) of the forward and backward vec4 rungs, outputs poisoned."""
    for key in ("softmax/gpu/vec4", "softmax_bwd/gpu/vec4"):
        v = kernels_src.get_variant(key)
        rep = parity.check_variant(v, kernels_src.get_op(v.op), size)
        assert rep.ok, str(rep)


def _bwd_cpu_keys():
    return [v.key for v in kernels_src.get_op("softmax_bwd").variants if v.backend == "cpu" and not v.baseline]


@pytest.mark.parametrize("size", [(1, 1), (2, 1), (3, 17), (7, 33), (5, 130)])
@pytest.mark.parametrize("key", _bwd_cpu_keys())
def test_softmax_bwd_cpu_rungs_on_awkward_shapes(key, size):
    """Every CPU rung of the backward (the 'pipe' rung's chunk ends included: a chunk of one row, rows fewer than
    threads) against the float64 reference, outputs poisoned."""
    v = kernels_src.get_variant(key)
    rep = parity.check_variant(v, kernels_src.get_op("softmax_bwd"), size)
    assert rep.ok, str(rep)
