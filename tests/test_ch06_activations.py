"""Chapter 6: activations and the bias + GELU fusion.

The registry-wide tests (test_registry.py) already check every rung against its float64 reference on
awkward sizes. These tests check the oracles themselves (each backward reference against a finite
difference of its forward reference), the float32 formulation choices the chapter teaches, and the
fusion bookkeeping.
"""
import numpy as np
import pytest

import kernels_src
from kernels_src import parity
from kernels_src.ops import activations as act
from kernels_src.registry import Variant

FWD_BWD = [(act.relu_ref, act.relu_bwd_ref), (act.gelu_ref, act.gelu_bwd_ref),
           (act.gelu_tanh_ref, act.gelu_tanh_bwd_ref), (act.silu_ref, act.silu_bwd_ref)]


@pytest.mark.parametrize("fwd,bwd", FWD_BWD, ids=lambda f: getattr(f, "__name__", ""))
def test_backward_references_match_finite_differences(fwd, bwd):
    rng = np.random.default_rng(0)
    x = 3 * rng.standard_normal(2000)
    x = x[np.abs(x) > 1e-3]  # ReLU has a kink at 0
    dy = rng.standard_normal(x.size)
    h = 1e-6
    numeric = dy * (fwd(x + h) - fwd(x - h)) / (2 * h)
    np.testing.assert_allclose(bwd(dy, x), numeric, rtol=1e-6, atol=1e-8)


def test_swiglu_backward_reference_matches_finite_differences():
    rng = np.random.default_rng(1)
    g, u, dy = (rng.standard_normal(500) for _ in range(3))
    h = 1e-6
    dg, du = act.swiglu_bwd_ref(dy, g, u)
    np.testing.assert_allclose(dg, dy * (act.swiglu_ref(g + h, u) - act.swiglu_ref(g - h, u)) / (2 * h), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(du, dy * (act.swiglu_ref(g, u + h) - act.swiglu_ref(g, u - h)) / (2 * h), rtol=1e-6, atol=1e-8)


def test_gelu_reference_is_the_erf_definition():
    import math

    x = np.linspace(-5, 5, 101)
    want = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x])
    np.testing.assert_allclose(act.gelu_ref(x), want, rtol=1e-12, atol=1e-15)


def test_tanh_gelu_is_a_different_function_at_float32_precision():
    x, exact, err = act.gelu_tanh_error()
    assert 1e4 * np.finfo(np.float32).eps > np.max(np.abs(err)) > 100 * np.finfo(np.float32).eps


def test_stable_float32_forms_keep_the_tail():
    """For x in [-9, -4] the textbook 1 + erf form rounds to 0 in float32; the erfc form used by the
    kernels stays within a few ulp of the float64 reference, as the chapter's plot claims."""
    x = np.linspace(-9, -4, 51).astype(np.float32)
    y = np.empty_like(x)
    act.CPU_LOOPS["gelu"](y, x)
    ref = act.gelu_ref(x.astype(np.float64))
    assert np.all(ref < 0) and np.all(y < 0)
    np.testing.assert_allclose(y, ref, rtol=2e-5)
    y2 = np.empty_like(x)
    act.CPU_LOOPS["gelu_tanh"](y2, x)
    ref2 = x.astype(np.float64) / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (x + 0.044715 * x.astype(np.float64) ** 3)))
    ok = ref2 < -1e-37  # where the true value is still a normal float32
    np.testing.assert_allclose(y2[ok], ref2[ok], rtol=2e-5)


def test_the_wrong_gelu_fails_the_tanh_op():
    """Using the exact GELU where the tanh approximation is specified must fail the check."""
    loop = act.CPU_LOOPS["gelu"]
    wrong = Variant("gelu_tanh", "cpu", "wrong_function", lambda y, x: loop(y, x))
    rep = parity.check_variant(wrong, kernels_src.get_op("gelu_tanh"), (1000,))
    assert not rep.ok


def test_fusion_byte_counts():
    m, n = 16384, 4096
    un, fu = act.bias_gelu_bytes_unfused((m, n), 4), act.bias_gelu_bytes_fused((m, n), 4)
    assert un == (4 * m * n + n) * 4 and fu == (2 * m * n + n) * 4
    v = kernels_src.get_variant("bias_gelu/gpu/unfused")
    assert v.bytes is act.bias_gelu_bytes_unfused  # the pair's GB/s counts both passes
    assert kernels_src.get_variant("bias_gelu/gpu/fused").bytes is None


def test_every_activation_has_both_gpu_rungs():
    for name in ["relu", "relu_bwd", "gelu", "gelu_bwd", "gelu_tanh", "gelu_tanh_bwd", "silu", "silu_bwd",
                 "swiglu", "swiglu_bwd"]:
        names = {v.key for v in kernels_src.variants(name)}
        assert {f"{name}/cpu/loop", f"{name}/gpu/thread", f"{name}/gpu/ilp4"} <= names


def test_ilp4_handles_partial_blocks():
    """Sizes around a multiple of 4 x block size (32 threads in the simulator: 128 elements per block)."""
    op = kernels_src.get_op("silu")
    v = kernels_src.get_variant("silu/gpu/ilp4")
    for n in (127, 128, 129, 131):
        rep = parity.check_variant(v, op, (n,))
        assert rep.ok or rep.skipped, str(rep)


@pytest.mark.parametrize("n", [1, 3, 4, 9, 257])
def test_vec4_rung_handles_the_ragged_tail(n):
    """The vec4 kernels do n // 4 groups with 16-byte loads and the last n % 4 elements one at a time."""
    for key in ("gelu/gpu/vec4", "gelu_bwd/gpu/vec4"):
        v = kernels_src.get_variant(key)
        rep = parity.check_variant(v, kernels_src.get_op(v.op), (n,))
        assert rep.ok, str(rep)


def test_fusion_profile_counts_the_bytes_the_chapter_says():
    """Committed Nsight Compute data: the unfused pair moves ~2x the fused minimum, the fused rungs ~1x,
    and the fused_v4 rung executes fewer instructions per element than the fused one."""
    from kernels_src import plots
    from kernels_src.figures import rowwise as viz

    rows = {r["variant"]: r for r in viz.ncu_rows(plots.load_json(plots.DATA / "h100/bias_gelu_ncu.json"))}
    assert 1.8 < rows["unfused"]["dram_over_min"] < 2.1
    assert 0.9 < rows["fused"]["dram_over_min"] < 1.1
    assert rows["fused_v4"]["inst_per_elem"] < rows["fused"]["inst_per_elem"]
