"""Chapter 12: optimizers. Multi-step trajectories against the float64 references, the edge cases the
ops module documents (zero, huge and NaN gradients, wd = 0, the first step's bias correction), the
multi-tensor chunk table, clipping, and the mixed-precision helpers."""
import math

import numpy as np
import pytest

import kernels_src
from kernels_src import device, parity
from kernels_src.figures import optim as fig
from kernels_src.ops import optim

H = optim.CHECK_HYPER
HYPER = (H["lr"], H["beta1"], H["beta2"], H["eps"], H["wd"])


def _run(v, outs, inputs):
    return parity.run_variant(v, inputs, [parity.poison(np.empty_like(o)) for o in outs])


def _keys(op, baselines=False):
    return [v.key for v in kernels_src.get_op(op).variants if baselines or not v.baseline]


def _available(key):
    v = kernels_src.get_variant(key)
    ok, why = v.available()
    if not ok:
        pytest.skip(why)
    return v


def _grads(n, steps, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for _ in range(steps)]


@pytest.mark.parametrize("key", _keys("adamw") + _keys("adam"))
def test_adam_trajectory_10_steps(key):
    """10 steps from p0 with m = v = 0, outputs fed back in: the float32 kernel stays within 1e-5 of the
    float64 trajectory (errors do not compound: every step re-reads its own rounded state)."""
    v = _available(key)
    n = 37 if device.SIMULATED and v.backend == "gpu" else 1001
    p = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    m = np.zeros(n, np.float32)
    vv = np.zeros(n, np.float32)
    grads = _grads(n, 10)
    ref_fn = optim.adamw_reference if v.op == "adamw" else optim.adam_l2_reference
    ref = optim.trajectory(ref_fn, (p.astype(np.float64), m.astype(np.float64), vv.astype(np.float64)),
                           [g.astype(np.float64) for g in grads], HYPER)
    state = (p, m, vv)
    for t, g in enumerate(grads, start=1):
        state = tuple(_run(v, state, (state[0], g, state[1], state[2], t, *HYPER)))
    for name, got, r in zip(("p", "m", "v"), state, ref[-1]):
        rep = parity.compare(name, got, r, 1e-5, 1e-6)
        assert rep.ok, "\n".join(rep.lines())


@pytest.mark.parametrize("nesterov", [0, 1])
@pytest.mark.parametrize("key", _keys("sgd_momentum"))
def test_sgd_trajectory_10_steps(key, nesterov):
    v = _available(key)
    n = 37 if device.SIMULATED and v.backend == "gpu" else 1001
    p = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    b = np.zeros(n, np.float32)
    grads = _grads(n, 10, seed=3)
    hyper = (0.05, 0.9, 0.01, nesterov)
    ref = optim.trajectory(optim.sgd_momentum_reference, (p.astype(np.float64), b.astype(np.float64)),
                           [g.astype(np.float64) for g in grads], hyper, with_step=False)
    state = (p, b)
    for g in grads:
        state = tuple(_run(v, state, (state[0], g, state[1], *hyper)))
    for name, got, r in zip(("p", "b"), state, ref[-1]):
        rep = parity.compare(name, got, r, 1e-5, 1e-6)
        assert rep.ok, "\n".join(rep.lines())


def test_nesterov_differs_from_heavy_ball_and_sgd():
    p, g, b = np.ones(3), np.array([1.0, -2.0, 0.5]), np.array([0.3, 0.3, 0.3])
    hb = optim.sgd_momentum_reference(p, g, b, 0.1, 0.9, 0.0, False)[0]
    ne = optim.sgd_momentum_reference(p, g, b, 0.1, 0.9, 0.0, True)[0]
    np.testing.assert_allclose(hb, p - 0.1 * (0.9 * b + g))
    np.testing.assert_allclose(ne, p - 0.1 * (g + 0.9 * (0.9 * b + g)))
    plain = optim.sgd_momentum_reference(p, g, b, 0.1, 0.0, 0.0, False)[0]
    np.testing.assert_allclose(plain, p - 0.1 * g)


# ----------------------------------------------------------------------------------- edge cases
def _adamw_case(g, p=None, m=None, v=None, step=1, wd=H["wd"]):
    n = len(g)
    p = np.ones(n) if p is None else p
    m = np.zeros(n) if m is None else m
    v = np.zeros(n) if v is None else v
    return tuple(np.asarray(a, dtype=np.float32) for a in (p, g, m, v)) + (step, H["lr"], H["beta1"], H["beta2"],
                                                                            H["eps"], wd)


def _edge_check(key, inputs):
    v = _available(key)
    op = kernels_src.get_op(v.op)
    refs = parity.reference_outputs(op, inputs)
    with np.errstate(all="ignore"):
        got = parity.run_variant(v, inputs, parity.empty_outputs(refs, "float32"))
    for name, gg, r in zip(op.output_names, got, refs):
        rep = parity.compare(name, gg, r, 1e-5, 1e-6)
        assert rep.ok, "\n".join(rep.lines())
    return got, refs


@pytest.mark.parametrize("key", _keys("adamw"))
def test_zero_gradient_with_zero_state_only_decays(key):
    got, _ = _edge_check(key, _adamw_case(np.zeros(5)))
    np.testing.assert_array_equal(got[1], 0.0)
    np.testing.assert_allclose(got[0], 1.0 - H["lr"] * H["wd"], rtol=1e-7)


@pytest.mark.parametrize("key", _keys("adamw"))
def test_huge_gradients_move_p_by_about_lr(key):
    g = np.array([1e18, -1e18, 3e17, 1.0, -1e-30])
    got, refs = _edge_check(key, _adamw_case(g, wd=0.0))
    step = np.abs(got[0] - 1.0)
    assert np.all(step[:4] <= H["lr"] * 1.0001) and np.all(step[:4] >= H["lr"] * 0.99)


def test_fp32_gradient_square_overflows_beyond_1e19():
    """The documented limit: above ~1.8e19, g*g is inf in float32, so v = inf and the step is 0."""
    g = np.float32(1e20)
    with np.errstate(over="ignore"):
        assert np.isinf(g * g)


@pytest.mark.parametrize("key", _keys("adamw"))
def test_first_step_is_lr_times_sign(key):
    g = np.array([3.0, -0.02, 1e-4, 250.0])
    got, _ = _edge_check(key, _adamw_case(g, wd=0.0))
    np.testing.assert_allclose(got[0], 1.0 - H["lr"] * np.sign(g), rtol=1e-5)


def test_first_step_without_bias_correction_is_3x_larger():
    g = np.array([1.0, -5.0, 0.1])
    with_bc, without = optim.first_update_reference(g, 1e-3, 0.9, 0.999, 1e-8)
    np.testing.assert_allclose(without / with_bc, (1 - 0.9) / math.sqrt(1 - 0.999), rtol=1e-5)  # eps: not exact


def test_wd_zero_adamw_equals_adam():
    rng = np.random.default_rng(4)
    p, g, m, v = (rng.standard_normal(9) for _ in range(4))
    v = v * v
    a = optim.adamw_reference(p, g, m, v, 3, 0.01, 0.9, 0.999, 1e-8, 0.0)
    b = optim.adam_l2_reference(p, g, m, v, 3, 0.01, 0.9, 0.999, 1e-8, 0.0)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    # with wd > 0 they differ: L2 decay is divided by sqrt(v), decoupled decay is not
    a = optim.adamw_reference(p, g, m, v, 3, 0.01, 0.9, 0.999, 1e-8, 0.1)
    b = optim.adam_l2_reference(p, g, m, v, 3, 0.01, 0.9, 0.999, 1e-8, 0.1)
    assert not np.allclose(a[0], b[0])


@pytest.mark.parametrize("key", _keys("adamw") + _keys("sgd_momentum"))
def test_nan_gradient_propagates_to_that_element_only(key):
    """The documented choice: a NaN gradient makes that parameter (and its state) NaN, nothing else."""
    v = _available(key)
    if v.op == "adamw":
        inputs = _adamw_case(np.array([1.0, np.nan, -1.0, 0.0]))
    else:
        inputs = (np.ones(4, np.float32), np.array([1.0, np.nan, -1.0, 0.0], np.float32), np.zeros(4, np.float32),
                  0.1, 0.9, 0.0, 1)
    got, _ = _edge_check(key, inputs)
    for out in got:
        assert np.isnan(out[1]) and np.isfinite(out[[0, 2, 3]]).all()


@pytest.mark.parametrize("key", _keys("adamw_clip"))
def test_clip_nan_gradient_poisons_everything(key):
    """With global-norm clipping one NaN makes the norm NaN, so every parameter becomes NaN (as torch's
    clip_grad_norm_ followed by a step does, unless error_if_nonfinite=True)."""
    v = _available(key)
    inputs = _adamw_case(np.array([1.0, np.nan, -1.0, 0.0])) + (1.0,)
    with np.errstate(all="ignore"):
        got, _ = _edge_check(key, inputs)
    assert np.isnan(got[0]).all()


@pytest.mark.parametrize("key", _keys("adamw_clip"))
def test_clip_scale_applies_only_above_max_norm(key):
    g = np.array([3.0, 4.0])  # norm 5
    for max_norm, scale in ((10.0, 1.0), (1.0, 1.0 / (5.0 + 1e-6))):
        assert optim.clip_scale(g, max_norm) == pytest.approx(scale)
        _edge_check(key, _adamw_case(g, step=2) + (max_norm,))


def test_edge_inputs_cover_both_ops():
    rng = np.random.default_rng(0)
    a = optim.make_edge_inputs((50,), np.dtype("float32"), rng)
    s = optim.make_edge_inputs((50, 1), np.dtype("float32"), rng)
    assert len(a) == 10 and a[4] == 1 and np.isnan(a[1]).sum() == 1 and np.nanmax(np.abs(a[1])) >= 1e18
    assert len(s) == 7 and np.isnan(s[1]).sum() == 1


# ----------------------------------------------------------------------------- layouts and tables
def test_chunk_table_covers_every_parameter_once():
    lengths = (5, 40000, 1, 16384, 16385)
    t = optim.chunk_table(lengths, 16384)  # any chunk size: here 16384
    assert t[:, 1].max() <= 16384 and t[:, 1].min() >= 1
    covered = np.zeros(sum(lengths), int)
    for o, n in t:
        covered[o:o + n] += 1
    assert (covered == 1).all()
    assert len(t) == 1 + 3 + 1 + 1 + 2


def test_tensor_lengths_and_gpt_layout():
    lens = optim.tensor_lengths(64, 10000)
    assert len(lens) == 64 and sum(lens) == 10000 and min(lens) >= 1
    gpt = optim.gpt_lengths()
    assert len(gpt) == 148 and 124e6 < sum(gpt) < 125e6  # GPT-2 small (tied output embedding)


def test_state_bytes_per_param():
    """28 B/param per fp32 AdamW step: read p, g, m, v and write p, m, v."""
    op = kernels_src.get_op("adamw")
    assert op.bytes((1000,), 4) == 28 * 1000
    assert kernels_src.get_op("sgd_momentum").bytes((1000, 0), 4) == 20 * 1000


# ----------------------------------------------------------------------------- mixed precision
def test_bf16_rounding_and_truncation():
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-9, -2.5, np.inf], dtype=np.float32)
    near = optim.round_bf16(x)
    trunc = optim.round_bf16(x, mode="truncate")
    assert near[0] == 1.0 and trunc[1] == 1.0
    assert near[1] == 1.0  # a tie: rounds to even (1.0)
    assert near[2] == np.float32(1.0 + 2**-7) and trunc[2] == np.float32(1.0 + 2**-8) or trunc[2] == 1.0
    assert near[3] == -2.5 and np.isinf(near[4])


def test_update_vanishes_at_half_ulp():
    p = np.array([1.0, 1.0, 1024.0, 1024.0])
    u = np.array([2**-12, 2**-10, 0.4, 0.6])  # fp16 ulp at 1 is 2^-10, at 1024 it is 1
    np.testing.assert_array_equal(optim.update_vanishes(p, u, "float16"), [1, 0, 1, 0])
    assert optim.ulp(1.0, "float16") == 2**-10 and optim.ulp(1.0, "bfloat16") == 2**-7


def test_master_weights_fix_the_stall():
    f16 = fig.train_low_precision("float16", master=False)
    bf16 = fig.train_low_precision("bfloat16", master=False)
    f16m = fig.train_low_precision("float16", master=True)
    f32 = fig.train_low_precision("float32", master=False)
    assert bf16[-1] > 10 * f16m[-1] and f16[-1] > f16m[-1]  # stalls without a master copy
    assert f16m[-1] < 2 * f32[-1] + 1e-6


def test_2d_trajectories_reach_the_minimum():
    for kind in ("sgd", "heavy_ball", "nesterov", "adam", "adamw"):
        path = fig.run_2d(kind, steps=300)
        assert fig.bowl(path[-1]) < 1e-2 * fig.bowl(path[0]), kind
