"""Chapter 7: sums, maxima, LayerNorm and RMSNorm.

Beyond the registry-wide parity tests: the summation-precision claims, the norms' edge inputs (zero and
constant rows, spread below eps, magnitudes of 1e15, rows of length 1) on every rung, the epsilon
placement, the variance formula, and the backward oracles against finite differences.
"""
import math

import numpy as np
import pytest

import kernels_src
from kernels_src import device, parity
from kernels_src.grading.exercise_ops import EDGE_INPUTS
from kernels_src.ops import norms, norms_bwd, norms_fwd
from kernels_src.ops import reductions as red
from kernels_src.registry import Variant

EPS32 = np.finfo(np.float32).eps


def test_summation_orders():
    res = red.summation_errors([1 << 20], trials=3)
    assert res["naive"][0] > 10 * res["pairwise"][0]  # the naive loop is clearly worse ...
    assert res["naive"][0] < math.sqrt(1 << 20) * EPS32  # ... and within the op's tolerance
    assert res["kahan"][0] <= 2 * EPS32
    assert res["pairwise"][0] <= 2 * EPS32


def test_sum_tolerance_catches_a_dropped_element():
    op = kernels_src.get_op("reduce_sum")
    dropped = Variant("reduce_sum", "cpu", "drops_first", lambda out, x: out.__setitem__(0, np.sum(x[1:])))
    for n in (7, 127, 4099):
        assert not parity.check_variant(dropped, op, (n,)).ok


def _norm_variants():
    out = []
    for name in ("layernorm", "rmsnorm", "layernorm_bwd", "rmsnorm_bwd"):
        for v in kernels_src.get_op(name).variants:
            out.append(pytest.param(name, v.key, id=v.key))
    return out


@pytest.mark.parametrize("case", norms.EDGE_CASES)
@pytest.mark.parametrize("name,key", _norm_variants())
def test_norm_edge_inputs(name, key, case, sim_race_checked):  # GPU rungs also race-free on these rows
    v = kernels_src.get_variant(key)
    ok, why = v.available()
    if not ok:
        pytest.skip(why)
    op = kernels_src.get_op(name)
    size = (5, 1) if case == "length-1 rows" else (6, 33)
    inputs = norms.edge_inputs(name, case, size, np.dtype("float32"), np.random.default_rng(7))
    refs = parity.reference_outputs(op, inputs)
    for r in refs:
        assert np.all(np.isfinite(r))
    outs = parity.run_variant(v, inputs, parity.empty_outputs(refs, "float32"))
    x = inputs[0] if name in ("layernorm", "rmsnorm") else inputs[1]
    gamma = inputs[1] if name == "layernorm" else inputs[-1]
    rtol, atol = norms.edge_tol(case, x, gamma, None if name in ("layernorm", "rmsnorm") else inputs[0])
    for n_, g, r in zip(op.output_names, outs, refs):
        rep = parity.compare(n_, g, r, rtol, atol)
        assert rep.ok, "\n".join([f"{key} on {case}"] + rep.lines())


def test_zero_rows_give_beta_and_one_over_sqrt_eps():
    x = np.zeros((3, 16))
    gamma, beta = np.linspace(0.5, 2, 16), np.linspace(-1, 1, 16)
    y, mean, rstd = norms.ln_reference(x, gamma, beta)
    np.testing.assert_array_equal(y, np.broadcast_to(beta, y.shape))
    np.testing.assert_allclose(rstd, 1 / math.sqrt(1e-5))


def test_epsilon_outside_the_root_fails():
    """A LayerNorm that computes 1/(sqrt(var) + eps) is a different function: the check must catch it."""
    op = kernels_src.get_op("layernorm")

    def wrong(y, mean, rstd, x, gamma, beta):
        x64 = x.astype(np.float64)
        mu = x64.mean(-1)
        r = 1 / (np.sqrt(((x64 - mu[:, None]) ** 2).mean(-1)) + norms.EPS)
        y[:] = (x64 - mu[:, None]) * r[:, None] * gamma + beta
        mean[:] = mu
        rstd[:] = r

    inputs = norms.edge_inputs("layernorm", "small variance", (4, 64), np.dtype("float32"), np.random.default_rng(0))
    refs = parity.reference_outputs(op, inputs)
    outs = parity.run_variant(Variant("layernorm", "cpu", "eps_outside", wrong), inputs,
                              parity.empty_outputs(refs, "float32"))
    assert not all(parity.compare("o", g, r, 1e-5, 1e-5).ok for g, r in zip(outs, refs))


def test_one_pass_variance_cancels_and_two_pass_does_not():
    from kernels_src.figures import rowwise as viz

    rows = {r["offset"]: r for r in viz.variance_cancellation()}
    assert rows[1e4]["err_one_pass"] > 0.5  # all digits lost (it even goes negative)
    assert max(r["err_two_pass"] for r in rows.values()) < 1e-5


def test_backward_references_match_finite_differences():
    rng = np.random.default_rng(3)
    m, n = 3, 7
    x, gamma, beta, dy = (rng.standard_normal((m, n)), rng.standard_normal(n), rng.standard_normal(n),
                          rng.standard_normal((m, n)))
    h = 1e-6

    def num_grad(f, a):
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            ap, am = a.copy(), a.copy()
            ap[idx] += h
            am[idx] -= h
            g[idx] = (np.sum(dy * f(ap)) - np.sum(dy * f(am))) / (2 * h)
        return g

    _, mean, rstd = norms.ln_reference(x, gamma, beta)
    dx, dg, db = norms.ln_bwd_reference(dy, x, mean, rstd, gamma)
    np.testing.assert_allclose(dx, num_grad(lambda a: norms.ln_reference(a, gamma, beta)[0], x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dg, num_grad(lambda a: norms.ln_reference(x, a, beta)[0], gamma), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(db, num_grad(lambda a: norms.ln_reference(x, gamma, a)[0], beta), rtol=1e-5, atol=1e-7)
    _, rstd2 = norms.rms_reference(x, gamma)
    dx2, dg2 = norms.rms_bwd_reference(dy, x, rstd2, gamma)
    np.testing.assert_allclose(dx2, num_grad(lambda a: norms.rms_reference(a, gamma)[0], x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dg2, num_grad(lambda a: norms.rms_reference(x, a)[0], gamma), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm"])
def test_several_rows_per_block(name, monkeypatch):
    """The rows-per-block configuration (used on the GPU for RMSNorm) in the simulator's smem rung."""
    if not device.GPU_VARIANTS_RUN:
        pytest.skip(device.REASON)
    fam = "ln" if name == "layernorm" else "rms"
    monkeypatch.setitem(norms.ROWS, fam, 2)
    monkeypatch.setattr(norms_fwd, "ROWS_IN_SIM", True)
    op = kernels_src.get_op(name)
    v = kernels_src.get_variant(f"{name}/gpu/regs")
    for size in ((1, 1), (3, 7), (5, 33)):  # an odd M leaves the last block one row short
        rep = parity.check_variant(v, op, size)
        assert rep.ok or rep.skipped, str(rep)


def test_grader_edge_inputs_are_defined():
    for name in ("layernorm", "rmsnorm", "layernorm_bwd", "rmsnorm_bwd", "softmax"):
        assert name in EDGE_INPUTS
        inputs = EDGE_INPUTS[name]((8, 33), np.dtype("float32"), np.random.default_rng(0))
        refs = parity.reference_outputs(kernels_src.get_op(name), inputs)
        assert all(r.shape for r in refs)


@pytest.mark.parametrize("name", ["layernorm_bwd", "rmsnorm_bwd"])
def test_backward_long_row_fallback(name, monkeypatch):
    """Rows longer than the register rungs can hold go to the streaming kernel (any length) instead of
    raising. A small forced threshold sends the simulator's short rows down that path."""
    if not device.GPU_VARIANTS_RUN:
        pytest.skip(device.REASON)
    monkeypatch.setattr(norms_bwd, "BWD_REG_MAX_N", 8)
    op = kernels_src.get_op(name)
    calls = []
    real = norms_bwd._bwd_stream
    monkeypatch.setattr(norms_bwd, "_bwd_stream", lambda *a: (calls.append(a[0]), real(*a))[1])
    for vname in ("regs", "vec4"):
        v = kernels_src.get_variant(f"{name}/gpu/{vname}")
        for size in ((3, 7), (4, 33), (2, 36)):
            calls.clear()
            rep = parity.check_variant(v, op, size)
            assert rep.ok, str(rep)
            assert bool(calls) == (size[1] > 8), (vname, size, calls)  # the fallback ran exactly when forced


def test_vec_config_covers_the_row():
    """The 16-byte rungs' (threads, groups): every element of the row has a slot, on the GPU too."""
    for n in (1, 3, 4, 7, 33, 36, 257, 1000, 4096, 4099, 12289):
        t, g = norms.vec_config(n, 16)
        assert 4 * t * g >= n


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm"])
def test_vec4_several_rows_per_block(name, monkeypatch):
    """VEC_ROWS > 1 (a tuning option on the GPU) in the simulator's shared-memory version."""
    if not device.GPU_VARIANTS_RUN:
        pytest.skip(device.REASON)
    fam = "ln" if name == "layernorm" else "rms"
    monkeypatch.setitem(norms.VEC_ROWS, fam, 2)
    monkeypatch.setattr(norms_fwd, "ROWS_IN_SIM", True)
    op = kernels_src.get_op(name)
    v = kernels_src.get_variant(f"{name}/gpu/vec4")
    for size in ((1, 1), (3, 7), (3, 36)):
        rep = parity.check_variant(v, op, size)
        assert rep.ok or rep.skipped, str(rep)
