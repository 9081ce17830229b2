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
from kernels_src.ops import optim_mixed as om

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


def _inf_weight_case(key, wd=H["wd"]):
    """p = [+inf, -inf, 1, -2] with finite gradients, in the calling convention of the variant's op."""
    v = _available(key)
    p = np.array([np.inf, -np.inf, 1.0, -2.0])
    g = np.array([0.5, -0.25, 1.0, 0.0])
    m, vv = 0.1 * np.ones(4), 0.04 * np.ones(4)
    base = _adamw_case(g, p=p, m=m, v=vv, step=3, wd=wd)
    if v.op == "adamw_multi":
        return base[:4] + ((1, 3),) + base[4:]
    if v.op == "adamw_clip":
        return base + (100.0,)  # ||g|| < 100: no clipping
    return base


def _torch_adamw_by_hand(p, g, m, v, step, lr, b1, b2, eps, wd):
    """torch.optim.AdamW's single-tensor arithmetic written out in float32 NumPy (not the code under test):
    ``if weight_decay != 0: param.mul_(1 - lr * weight_decay)``, then the moments, then
    ``param.addcdiv_(exp_avg, denom, value=-step_size)`` with denom = sqrt(v) / sqrt(bc2) + eps."""
    f = np.float32
    if wd != 0:
        p = p * f(1 - lr * wd)
    m = m * f(b1) + g * f(1 - b1)
    v = v * f(b2) + g * g * f(1 - b2)
    denom = np.sqrt(v) / f(math.sqrt(1 - b2**step)) + f(eps)
    return p - f(lr / (1 - b1**step)) * m / denom, m, v


@pytest.mark.parametrize("wd", [H["wd"], 0.0])
@pytest.mark.parametrize("key", _keys("adamw") + _keys("adamw_multi") + _keys("adamw_clip"))
def test_infinite_weight_stays_infinite(key, wd):
    """torch's rule for an infinite weight: AdamW multiplies p by 1 - lr wd (and only when wd != 0), so +-inf
    stays +-inf and its m, v are its gradient's, finite. Before the fix the kernels computed g + 0 * p (Adam's L2
    term with l2 = 0): NaN, which made p, m and v NaN. Checked against the float64 reference and against torch's
    arithmetic written out by hand."""
    inputs = _inf_weight_case(key, wd)
    with np.errstate(all="ignore"):
        got, _ = _edge_check(key, inputs)
    p, m, v = got
    assert p[0] == np.inf and p[1] == -np.inf
    assert np.isfinite(m).all() and np.isfinite(v).all() and np.isfinite(p[2:]).all()
    hyper = (3, H["lr"], H["beta1"], H["beta2"], H["eps"], wd)
    tp, tm, tv = _torch_adamw_by_hand(*(np.asarray(a, np.float32) for a in (inputs[0], inputs[1], inputs[2], inputs[3])),
                                      *hyper)
    np.testing.assert_array_equal(p[:2], tp[:2])
    np.testing.assert_allclose(p[2:], tp[2:], rtol=1e-6)
    np.testing.assert_allclose(m, tm, rtol=1e-6)
    np.testing.assert_allclose(v, tv, rtol=1e-6)


@pytest.mark.parametrize("key", _keys("adam"))
def test_adam_l2_infinite_weight(key):
    """Adam's L2 decay puts wd p into the gradient: an infinite weight gives infinite m and v and the step
    inf / inf = NaN (torch: grad.add(param, alpha=wd), the same arithmetic); with wd = 0 torch skips the term
    and the weight stays infinite, so must every rung (0 * inf would be NaN)."""
    with np.errstate(all="ignore"):
        got, _ = _edge_check(key, _inf_weight_case(key))
    p, m, v = got
    assert np.isnan(p[:2]).all() and m[0] == np.inf and m[1] == -np.inf and (v[:2] == np.inf).all()
    assert np.isfinite(p[2:]).all()
    with np.errstate(all="ignore"):
        got, _ = _edge_check(key, _inf_weight_case(key, wd=0.0))
    assert got[0][0] == np.inf and got[0][1] == -np.inf and np.isfinite(got[1]).all()


@pytest.mark.parametrize("key", _keys("sgd_momentum"))
def test_sgd_infinite_weight_without_decay_stays_infinite(key):
    """torch.optim.SGD adds wd p to the gradient only when wd != 0: at wd = 0 an infinite weight stays infinite and
    its momentum finite (the rungs computed g + 0 * inf = NaN before)."""
    inputs = (np.array([np.inf, -np.inf, 1.0], np.float32), np.array([0.5, -0.5, 1.0], np.float32),
              np.array([0.1, 0.1, 0.1], np.float32), 0.1, 0.9, 0.0, 1)
    with np.errstate(all="ignore"):
        got, _ = _edge_check(key, inputs)
    assert got[0][0] == np.inf and got[0][1] == -np.inf and np.isfinite(got[1]).all()


@pytest.mark.parametrize("key", _keys("adamw_mixed"))
def test_mixed_infinite_master_weight_stays_infinite(key):
    """The mixed-precision step follows the same rule: an infinite fp32 master weight stays infinite and its bf16
    copy is bf16's inf (0x7F80 / 0xFF80)."""
    v = _available(key)
    op = kernels_src.get_op(v.op)
    rng = np.random.default_rng(5)
    p, g16, m, vv, step, *hyper = op.make_inputs((8,), np.dtype("float32"), rng)
    p[:2] = [np.inf, -np.inf]
    inputs = (p, g16, m, vv, step, *hyper)
    refs = parity.reference_outputs(op, inputs)
    with np.errstate(all="ignore"):
        got = parity.run_variant(v, inputs, parity.empty_outputs(refs, "float32"))
    for name, gg, r in zip(op.output_names, got, refs):
        rep = parity.compare(name, gg, r, 1e-5, 1e-6)
        assert rep.ok, "\n".join(rep.lines())
    assert got[0][0] == np.inf and got[0][1] == -np.inf and int(got[3][0]) == 0x7F80 and int(got[3][1]) == 0xFF80
    assert np.isfinite(got[1]).all() and np.isfinite(got[2]).all()


def test_edge_inputs_hold_infinite_weights():
    rng = np.random.default_rng(1)
    for size, make in [((50,), optim.make_edge_inputs), ((3, 50), optim.make_edge_inputs_multi),
                       ((50,), optim.make_edge_inputs_clip)]:
        p = make(size, np.dtype("float32"), rng)[0]
        assert (p == np.inf).sum() == 1 and (p == -np.inf).sum() == 1
    for name in ("adam", "adamw", "adamw_multi", "adamw_clip"):
        from kernels_src.registry import find_edge_inputs

        assert find_edge_inputs(kernels_src.get_op(name), module_fallback=False) is not None


@pytest.mark.parametrize("key", _keys("adamw_clip"))
def test_clip_nan_gradient_poisons_everything(key):
    """With global-norm clipping one NaN makes the norm NaN, so every parameter becomes NaN (as torch's
    clip_grad_norm_ followed by a step does, unless error_if_nonfinite=True)."""
    v = _available(key)
    inputs = _adamw_case(np.array([1.0, np.nan, -1.0, 0.0])) + (1.0,)
    with np.errstate(all="ignore"):
        got, _ = _edge_check(key, inputs)
    assert np.isnan(got[0]).all()


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("key", _keys("adamw_clip"))
def test_clip_inf_gradient_zeroes_the_finite_ones(key, sign):
    """The one rule (torch's clip_grad_norm_ then AdamW): an inf makes the norm inf and the scale
    max_norm / inf = 0. Finite gradients become 0, so their parameters only decay (m = v = 0 here, so the Adam
    term is 0/eps = 0); the inf one becomes 0 * inf = NaN, so that parameter alone is NaN. Before the fix the
    CPU loop used scale = inf and turned every parameter into NaN."""
    _available(key)
    g = np.array([1.0, sign * np.inf, -1.0, 0.0, 3.0])
    with np.errstate(all="ignore"):
        got, _ = _edge_check(key, _adamw_case(g) + (1.0,))
    p, m, v = got
    finite = [0, 2, 3, 4]
    np.testing.assert_allclose(p[finite], 1.0 - H["lr"] * H["wd"], rtol=1e-7)  # decay only: the step was 0
    assert (m[finite] == 0).all() and (v[finite] == 0).all()
    assert np.isnan(p[1]) and np.isnan(m[1]) and np.isnan(v[1])


def test_clip_rule_matches_torch_arithmetic():
    """What torch computes, written out with NumPy (not with the code under test): total_norm = inf,
    clip_coef = max_norm / (inf + 1e-6) = 0, clamped to at most 1, then grads * 0."""
    g = np.array([2.0, np.inf, -0.5], dtype=np.float32)
    with np.errstate(all="ignore"):
        coef = min(np.float32(1.0), np.float32(1.0) / (np.float32(np.inf) + np.float32(1e-6)))
        torch_like = g * coef
        ours = optim.clip_scale(g, 1.0) * g.astype(np.float64)
    assert coef == 0.0
    np.testing.assert_array_equal(np.isnan(torch_like), [False, True, False])
    np.testing.assert_array_equal(ours, torch_like)
    assert np.isnan(optim.clip_scale(np.array([1.0, np.nan, np.inf]), 1.0))  # NaN wins over inf


def test_clip_two_pass_is_registered_deterministic_rung():
    v = kernels_src.get_variant("adamw_clip/gpu/two_pass")
    assert v.rung == 3 and "deterministic" in v.doc and v.ptx


@pytest.mark.skipif(not device.GPU_VARIANTS_RUN, reason="GPU variants are off")
def test_two_pass_norm_matches_float64_and_repeats():
    """The two-pass sum of g^2 (per-block partials, then one block in a fixed order) against float64, and the
    same bits on every run (the simulator cannot show the atomic pass varying; the H100 measurement does)."""
    n = 3001 if device.SIMULATED else 1 << 20
    gh = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    g = device.cuda.to_device(gh)
    bits = optim.clip_sumsq_bits(g, True, 3)
    assert len(set(bits)) == 1
    val = float(np.uint32(bits[0]).view(np.float32))
    assert abs(val - np.sum(gh.astype(np.float64) ** 2)) <= 1e-5 * val


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
def test_multi_tensor_chunk_is_2048():
    """The chapter says 2,048 parameters per chunk (torch and apex use 65,536): the code must agree."""
    assert optim.CHUNK == 2048
    t = optim.chunk_table((5000, 3), optim.CHUNK)
    assert t[:, 1].tolist() == [2048, 2048, 904, 3]


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


# ----------------------------------------------------------------------------- bf16 bits, SR, mixed AdamW
def _bits_from_scratch(x):
    """bf16 round-to-nearest-even written independently of optim_mixed: Python integers on each bit pattern."""
    out = []
    for u in np.asarray(x, dtype=np.float32).view(np.uint32).tolist():
        if (u & 0x7F800000) == 0x7F800000 and (u & 0x7FFFFF):
            out.append(0x7FC0)
            continue
        low, high = u & 0xFFFF, u >> 16
        if low > 0x8000 or (low == 0x8000 and high & 1):
            high += 1
        out.append(high)
    return np.array(out, dtype=np.uint16)


def test_bf16_rne_bits_against_python_ints_and_arithmetic():
    rng = np.random.default_rng(0)
    (x,) = om.make_edge_inputs_round((5000,), np.dtype("float32"), rng)
    h = om.bf16_bits_rne(x)
    np.testing.assert_array_equal(h, _bits_from_scratch(x))
    a = om.bf16_round_arith(x)  # the float64 frexp/round-half-even oracle
    b = om.bf16_value(h)
    assert ((a == b) | (np.isnan(a) & np.isnan(b))).all()
    # ties: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> even (1); 1 + 3 * 2^-8 -> 1 + 2^-6 (even)
    t = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8)], dtype=np.float32)
    np.testing.assert_array_equal(om.bf16_value(om.bf16_bits_rne(t)), [1.0, 1 + 2**-6, -1.0])
    assert om.bf16_bits_rne(np.float32(3.4028235e38)) == 0x7F80  # the largest float32 rounds up to inf


@pytest.mark.parametrize("key", ["adamw_bf16/cpu/loop", "adamw_bf16/gpu/fused4", "adamw_bf16/gpu/vec"])
def test_kernel_rounding_matches_numpy_bits(key):
    """With g = m = v = 0 the Adam term is exactly 0/eps = 0, so p' = float32(p (1 - lr wd)): the kernel's
    bf16 rounding of that known float32 must equal NumPy bit manipulation (RNE by Python integers, SR by adding
    the Philox stream's low 16 bits), with no tolerance and no boundary avoidance."""
    v = _available(key)
    n = 37 if device.SIMULATED and v.backend == "gpu" else 4099
    rng = np.random.default_rng(7)
    w = om.bf16_bits_rne(rng.standard_normal(n))
    z = np.zeros(n, np.float32)
    zero16 = np.zeros(n, np.uint16)
    lr, wd, seed, step = 0.01, 0.37, 12345, 3
    for sr in (0, 1):
        inputs = (w, zero16, z, z, step, lr, 0.9, 0.999, 1e-8, wd, seed, sr)
        got = _run(v, [np.empty(n, np.uint16), z, z], inputs)[0]
        p_new = (om.bf16_value(w).astype(np.float32) * np.float32(1 - lr * wd)).astype(np.float32)
        r = om.sr_bits(seed, step, n)
        u = p_new.view(np.uint32).astype(np.uint64)
        want = ((u + (r & 0xFFFF)) >> 16) if sr else _bits_from_scratch(p_new)
        np.testing.assert_array_equal(got, np.asarray(want, dtype=np.uint16))



def test_adamw_bf16_vec_is_bit_identical_to_fused4():
    """The wide-access rung computes the same float32 steps and roundings as fused4 (the same Philox call per
    group of 4): every output bit must agree, for RNE and SR, on sizes with every tail length (n % 4) and on
    the edge inputs (inf weights, NaN gradients, zero state)."""
    fused4, vec = _available("adamw_bf16/gpu/fused4"), _available("adamw_bf16/gpu/vec")
    op = kernels_src.get_op("adamw_bf16")
    sizes = (1, 2, 3, 4, 37) if device.SIMULATED else (1, 2, 3, 4, 5, 6, 7, 1023, 4099, 65538)
    for n in sizes:
        for sr in (0, 1):
            for make in (op.make_inputs, om.make_edge_inputs_bf16):
                ins = make((n, sr), np.dtype("float32"), np.random.default_rng(n))
                outs = [np.empty(n, np.uint16), np.empty(n, np.float32), np.empty(n, np.float32)]
                a, b = _run(fused4, outs, ins), _run(vec, outs, ins)
                for x, y in zip(a, b):
                    np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8), err_msg=f"n={n} sr={sr}")

def test_stochastic_rounding_is_unbiased_and_rne_is_not():
    x = np.full(1 << 16, 1.0 + 0.3 * 2**-7, dtype=np.float32)  # 30 % of the way from 1 to the next bf16
    r = om.sr_bits(99, 1, x.size)
    sr = om.bf16_value(om.bf16_bits_sr(x, r))
    assert set(np.unique(sr)) == {1.0, 1.0 + 2**-7}
    # mean within 6 standard deviations: sd of one draw = ulp sqrt(0.3 * 0.7)
    assert abs(sr.mean() - float(x[0])) < 6 * 2**-7 * math.sqrt(0.21 / x.size)
    assert om.bf16_value(om.bf16_bits_rne(x[:1]))[0] == 1.0  # nearest: always down


def test_mixed_inputs_keep_roundings_away_from_boundaries():
    rng = np.random.default_rng(3)
    ins = om.make_inputs_bf16((5000, 1), np.dtype("float32"), rng)
    w, m, v = optim.adamw_reference(om.bf16_value(ins[0]), om.bf16_value(ins[1]), ins[2], ins[3], *ins[4:10])
    assert om.ulps_from_boundary(w, om.sr_bits(ins[10], ins[4], w.size)).min() > om.MARGIN


def test_bytes_are_honest():
    """adamw_mixed: read p32 4 + g16 2 + m 4 + v 4, write p32 4 + m 4 + v 4 + w16 2 = 28 B; adamw_bf16: read
    2 + 2 + 4 + 4, write 2 + 4 + 4 = 22 B. Counted from the arrays the reference and inputs really have."""
    rng = np.random.default_rng(0)
    for name in ("adamw_mixed", "adamw_bf16"):
        op = kernels_src.get_op(name)
        size = (100,) if name == "adamw_mixed" else (100, 1)
        ins = op.make_inputs(size, np.dtype("float32"), rng)
        outs = parity.reference_outputs(op, ins)
        itemsize = {np.dtype(np.uint16): 2, np.dtype(np.float32): 4, np.dtype(np.float64): 4}
        moved = sum(itemsize[a.dtype] * a.size for a in ins if isinstance(a, np.ndarray))
        moved += sum(itemsize[o.dtype] * o.size for o in outs)  # float64 reference outputs are fp32 in kernels
        assert op.bytes(size, 4) == moved, name


def test_master_copy_and_sr_keep_the_weight_moving():
    steps, u = 2000, -1e-4
    assert fig.drift("bf16", steps, u)[-1] == 1.0  # every update below half an ulp: lost
    expect = 1.0 + steps * u
    assert abs(fig.drift("master", steps, u)[-1] - expect) <= 2**-8  # within half a bf16 ulp at 0.8
    walk = fig.drift("sr", steps, u, walkers=256)[-1]
    assert abs(walk.mean() - expect) < 0.01 and walk.std() > 0  # unbiased on average, noisy per weight


def test_sr_training_beats_round_to_nearest_without_master():
    rne = fig.train_low_precision("bfloat16", master=False)
    sr = fig.train_low_precision("bfloat16", master=False, sr=True)
    assert sr[-1] < 0.1 * rne[-1]


# ----------------------------------------------------------------------------- loss scaling
def test_loss_scaler_dynamic_rule():
    """Worked by hand: scale 8, growth interval 3. Steps 1-2 good, step 3 overflows (skip, halve to 4), then
    three good steps at 4 grow it back to 8 for step 7."""
    scales, skipped = om.scale_trace([0, 0, 1, 0, 0, 0, 0], scale=8.0, growth_interval=3)
    np.testing.assert_array_equal(scales, [8, 8, 8, 4, 4, 4, 8])
    np.testing.assert_array_equal(skipped, [0, 0, 1, 0, 0, 0, 0])
    scales, skipped = om.scale_trace([1, 1, 0], scale=8.0, dynamic=False)
    np.testing.assert_array_equal(scales, [8, 8, 8])  # static: never changes, but still skips
    np.testing.assert_array_equal(skipped, [1, 1, 0])


def test_loss_scaler_unscale_finds_inf_and_nan():
    s = om.LossScaler(scale=1024.0)
    g, bad = s.unscale(np.array([2048.0, -512.0]))
    np.testing.assert_array_equal(g, [2.0, -0.5])
    assert not bad
    assert s.unscale(np.array([1.0, np.inf]))[1] and s.unscale(np.array([np.nan]))[1]


def test_fp16_gradients_underflow_without_scaling():
    g = fig.gradient_sample(20_000)
    lost, _ = om.fp16_flush(g)
    lost_scaled, over = om.fp16_flush(g, 2.0**16)
    assert lost > 0.3 and lost_scaled < 0.5 * lost and over == 0.0
    assert om.fp16_flush([2.0**-25 * 0.9], 1.0)[0] == 1.0 and om.fp16_flush([2.0**-24], 1.0)[0] == 0.0


# ----------------------------------------------------------------------------- exercise ops
def test_sr_mean_tolerance_separates_sr_from_rne():
    rng = np.random.default_rng(11)
    x, r = om.make_inputs_sr_mean((200,), np.dtype("float32"), rng)
    rtol, _ = om.sr_mean_tol((200,), np.dtype("float32"))
    sr = np.array([om.bf16_value(om.bf16_bits_sr(np.full(r.shape[1], xi), ri)).mean() for xi, ri in zip(x, r)])
    assert np.all(np.abs(sr - x) <= rtol * np.abs(x))
    rne = om.bf16_value(om.bf16_bits_rne(x))
    assert np.all(np.abs(rne - x) > rtol * np.abs(x))


def test_block_partials_reference_by_loop():
    g = np.random.default_rng(2).standard_normal(600)
    nb = om.partial_blocks(g.size)
    want = np.zeros(nb)
    for b in range(nb):  # block b, thread t: i = b*T + t, then + nb*T each round
        for t in range(om.PART_THREADS):
            i = b * om.PART_THREADS + t
            while i < g.size:
                want[b] += g[i] ** 2
                i += nb * om.PART_THREADS
    np.testing.assert_allclose(om.block_partials_reference(g), want, rtol=1e-12)
