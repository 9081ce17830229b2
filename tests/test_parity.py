"""The parity checker itself: it must fail every way a kernel can be wrong."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels_src
from kernels_src import parity
from kernels_src.device import ceil_div, cuda  # module level: the simulator swaps `cuda` in kernel globals
from kernels_src.registry import Variant

OP = kernels_src.get_op("axpy")


def _check(fn, n=1000, backend="cpu"):
    return parity.check_variant(Variant("axpy", backend, "probe", fn), OP, (n,))


def test_correct_kernel_passes():
    def good(out, a, x, y):
        out[:] = a * x + y

    assert _check(good).ok


def test_unwritten_element_fails_and_is_reported():
    def skips_last(out, a, x, y):
        out[:-1] = a * x[:-1] + y[:-1]

    rep = _check(skips_last)
    assert not rep.ok
    text = str(rep)
    assert "index (999,)" in text and "never written" in text and "1 of 1000" in text


def test_zeros_cannot_pass():
    def zeros(out, a, x, y):
        out[:] = 0

    assert not _check(zeros).ok


def test_nan_never_passes_even_with_huge_tolerance():
    def nan_first(out, a, x, y):
        out[:] = a * x + y
        out[0] = np.nan

    v = Variant("axpy", "cpu", "nan", nan_first, tol=(1e9, 1e9))
    rep = parity.check_variant(v, OP, (10,))
    assert not rep.ok and rep.outputs[0].n_nonfinite == 1


def test_inf_fails():
    def inf(out, a, x, y):
        out[:] = a * x + y
        out[-1] = np.inf

    assert not _check(inf).ok


def test_small_error_reports_max_errors():
    def slightly_off(out, a, x, y):
        out[:] = a * x + y + 1e-2

    rep = _check(slightly_off)
    assert not rep.ok
    o = rep.outputs[0]
    assert o.max_abs == pytest.approx(1e-2, rel=1e-3)
    assert "max abs err" in str(rep)


def test_input_mutation_fails():
    def clobbers(out, a, x, y):
        out[:] = a * x + y
        x[0] = 0

    rep = _check(clobbers)
    assert not rep.ok and "modified" in str(rep)


def test_exception_is_a_failure_not_a_crash():
    def boom(out, a, x, y):
        raise IndexError("oops")

    rep = _check(boom)
    assert not rep.ok and "IndexError" in str(rep)


def test_gpu_off_by_one_bounds_fails_in_simulator():
    @cuda.jit
    def k(out, a, x, y):
        i = cuda.grid(1)
        if i < out.size - 1:  # bug
            out[i] = a * x[i] + y[i]

    def launch(out, a, x, y):
        k[ceil_div(out.size, 32), 32](out, a, x, y)

    rep = _check(launch, n=37, backend="gpu")
    assert not rep.ok and "(36,)" in str(rep)


def test_nonfinite_reference_must_match_exactly():
    ref = np.array([np.nan, np.inf, -np.inf, 1.0])
    assert parity.compare("o", ref.copy(), ref, 1e-5, 1e-6).ok
    assert not parity.compare("o", np.array([0.0, np.inf, -np.inf, 1.0]), ref, 1e-5, 1e-6).ok
    assert not parity.compare("o", np.array([np.nan, -np.inf, -np.inf, 1.0]), ref, 1e-5, 1e-6).ok


def test_shape_mismatch_fails():
    rep = parity.compare("o", np.zeros(3), np.zeros(4), 1e-5, 1e-6)
    assert not rep.ok and "shape" in rep.lines()[0]


def test_tolerance_forms():
    assert parity.resolve_tol(None, np.float32) == parity.DEFAULT_TOL["float32"]
    assert parity.resolve_tol((1e-3, 1e-4), np.float32) == (1e-3, 1e-4)
    assert parity.resolve_tol({"float32": (2e-3, 0)}, np.float32) == (2e-3, 0)
    assert parity.resolve_tol(lambda s, d: (s[0] * 0.5, 0), np.float32, (5,)) == (2.5, 0)


def test_poison_values():
    assert np.isnan(parity.poison(np.zeros(3, np.float32))).all()
    assert (parity.poison(np.zeros(3, np.int32)) == np.iinfo(np.int32).min).all()


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 5000), seed=st.integers(0, 2**31 - 1))
def test_cpu_axpy_any_length(n, seed):
    for v in kernels_src.variants("axpy", "cpu"):
        if not v.available()[0]:  # torch's row where torch is not installed
            continue
        rep = parity.check_variant(v, OP, (n,), seed=seed)
        assert rep.ok, str(rep)
