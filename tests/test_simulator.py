"""The CUDA simulator follows CUDA's math rules (kernels_src/simulator.py): where Python's math raises,
a simulated kernel gets what a GPU returns (inf, 0 or nan), and host code still gets Python's math."""
import math
import threading
from math import exp as imported_exp

import numpy as np
import pytest

from kernels_src import device
from kernels_src.simulator import CUDA_MATH

cuda = device.cuda
needs_sim = pytest.mark.skipif(not device.SIMULATED, reason="the fixes apply to the CUDA simulator only")

INF, NAN = math.inf, math.nan


@pytest.mark.parametrize("name, args, want", [
    ("exp", (710.0,), INF), ("expm1", (1e4,), INF), ("exp2", (2000.0,), INF),
    ("pow", (10.0, 400.0), INF), ("pow", (0.0, -1.0), INF), ("pow", (-8.0, 1 / 3), NAN),
    ("cosh", (1e4,), INF), ("sinh", (-1e4,), -INF), ("log", (0.0,), -INF), ("log", (-1.0,), NAN),
    ("log2", (0.0,), -INF), ("log10", (-2.0,), NAN), ("log1p", (-1.0,), -INF), ("sqrt", (-1.0,), NAN),
    ("cos", (INF,), NAN), ("sin", (-INF,), NAN), ("acos", (2.0,), NAN), ("atanh", (1.0,), INF),
    ("fmod", (1.0, 0.0), NAN), ("ldexp", (1.0, 5000), INF), ("gamma", (0.0,), INF), ("gamma", (-3.0,), NAN),
    ("gamma", (200.0,), INF), ("lgamma", (0.0,), INF), ("floor", (INF,), INF), ("log", (0.0, 2.0), -INF),
])
def test_cuda_math_returns_ieee_values_where_python_raises(name, args, want):
    with pytest.raises((OverflowError, ValueError, ZeroDivisionError)):
        getattr(math, name)(*args)
    got = getattr(CUDA_MATH, name)(*args)
    assert (math.isnan(got) and math.isnan(want)) or got == want, (name, args, got)


def test_cuda_math_is_python_math_where_python_does_not_raise():
    rng = np.random.default_rng(0)
    for name in ("exp", "expm1", "log", "sqrt", "tanh", "erf", "cos", "atan2", "pow", "lgamma", "floor"):
        for _ in range(20):
            args = (float(abs(rng.standard_normal()) * 10 + 0.1),) * (2 if name in ("atan2", "pow") else 1)
            assert getattr(CUDA_MATH, name)(*args) == getattr(math, name)(*args)


@cuda.jit
def _gelu_tanh_kernel(out, x):
    # x / (1 + exp(-2u)) is the right limit on a GPU for every u: exp overflows to inf, x / inf = -0
    i = cuda.grid(1)
    if i < x.size:
        u = 0.7978845608028654 * (x[i] + 0.044715 * x[i] * x[i] * x[i])
        out[i] = x[i] / (1.0 + math.exp(-2.0 * u))


@cuda.jit
def _imported_names_kernel(out, x):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = imported_exp(x[i]) + math.log(x[i] - x[i])  # exp overflow and log(0)


@needs_sim
def test_simulated_kernel_overflows_to_inf_like_a_gpu():
    x = np.array([-1000.0, -20.0, 0.0, 3.0, 1000.0])
    out = np.full_like(x, np.nan)
    with device.simulator_speedup():
        _gelu_tanh_kernel[1, 8](out, x)
    u = 0.7978845608028654 * (x + 0.044715 * x**3)
    with np.errstate(over="ignore"):
        want = x / (1.0 + np.exp(-2.0 * u))
    np.testing.assert_array_equal(out, want)
    assert out[0] == 0.0 and math.copysign(1, out[0]) == -1  # -1000 / inf = -0, as on the GPU


@needs_sim
def test_names_imported_from_math_follow_cuda_too_and_host_math_is_restored():
    x = np.array([800.0, 1.0])
    out = np.zeros_like(x)
    _imported_names_kernel[1, 2](out, x)
    assert math.isnan(out[0]) and out[1] == -INF  # inf + (-inf) = nan; exp(1) + log(0) = -inf
    # after the launch this module's host code sees Python's math again
    assert globals()["math"] is math and globals()["imported_exp"] is math.exp
    with pytest.raises(OverflowError):
        imported_exp(800.0)


@needs_sim
def test_concurrent_blocks_keep_cuda_math_until_the_last_thread_leaves():
    """Many threads enter and leave device functions at different times: the swap is reference-counted."""
    from kernels_src.simulator import cuda_math_for

    def probe():
        return math.exp(1000.0)

    errors, go = [], threading.Barrier(16)

    def worker(k):
        go.wait()
        for _ in range(50):
            with cuda_math_for(probe):
                try:
                    assert probe() == INF
                except Exception as e:  # noqa: BLE001
                    errors.append(e)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert globals()["math"] is math


# --------------------------------------------------------------- threads_as_greenlets (the seed sweep's engine)
@cuda.jit
def _block_sum_kernel(out, counts, x):
    """A tree sum in shared memory (barriers in a loop), syncthreads_count, and a 2-D block: the engine's
    barrier must hold every thread until all arrive, or the sums come out wrong."""
    s = cuda.shared.array(64, np.float64)
    t = cuda.threadIdx.x + cuda.blockDim.x * cuda.threadIdx.y
    i = cuda.blockIdx.x * 64 + t
    s[t] = x[i] if i < x.size else 0.0
    cuda.syncthreads()
    step = 32
    while step > 0:
        if t < step:
            s[t] += s[t + step]
        cuda.syncthreads()
        step //= 2
    n = cuda.syncthreads_count(i < x.size and x[i] > 0)
    if t == 0:
        out[cuda.blockIdx.x] = s[0]
        counts[cuda.blockIdx.x] = n


@cuda.jit
def _raises_in_one_thread(out):
    t = cuda.threadIdx.x
    cuda.syncthreads()
    if t == 5:
        out[100] = 1.0  # out of bounds
    out[t] = t


@needs_sim
@pytest.mark.parametrize("engine", ["os_threads", "greenlets"])
def test_block_barriers_hold_in_both_engines(engine):
    from kernels_src.simulator import threads_as_greenlets

    pytest.importorskip("greenlet")
    x = np.random.default_rng(3).standard_normal(64 * 3 - 7)
    out, counts = np.full(3, np.nan), np.zeros(3, np.int64)
    import contextlib

    with (threads_as_greenlets() if engine == "greenlets" else contextlib.nullcontext()):
        _block_sum_kernel[3, (16, 4)](out, counts, x)
    padded = np.concatenate([x, np.zeros(7)]).reshape(3, 64)
    np.testing.assert_allclose(out, padded.sum(axis=1), rtol=1e-12)
    np.testing.assert_array_equal(counts, (padded > 0).sum(axis=1))


@needs_sim
def test_greenlet_engine_reports_a_thread_error_and_restores_the_simulator():
    from numba.cuda.simulator import kernel, kernelapi

    from kernels_src.simulator import threads_as_greenlets

    pytest.importorskip("greenlet")
    before = (kernel.BlockManager.run, kernelapi.threading)
    with pytest.raises(IndexError) as e:
        with threads_as_greenlets():
            _raises_in_one_thread[1, 8](np.zeros(8))
    assert "tid=[5, 0, 0]" in "".join(getattr(e.value, "__notes__", [])), e.value
    assert (kernel.BlockManager.run, kernelapi.threading) == before
    out = np.zeros(8)
    _block_sum_kernel[1, 64](out, np.zeros(1, np.int64), np.ones(64))  # the OS-thread engine works again
    assert out[0] == 64


@cuda.jit
def _mma_one_tile(out, A, B, lanes):
    """One warp multiplies a 16x8 A by an 8x8 B with the simulated mma.sync (a warp barrier); lanes >= `lanes`
    return before it (`lanes` < 32: a GPU would hang)."""
    from kernels_src.compiler import mma_tf32

    lane = cuda.threadIdx.x
    if lane >= lanes:
        return
    g, t = lane >> 2, lane & 3
    d0, d1, d2, d3 = mma_tf32(A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4], B[t, g], B[t + 4, g],
                              0.0, 0.0, 0.0, 0.0)
    out[g, 2 * t], out[g, 2 * t + 1], out[g + 8, 2 * t], out[g + 8, 2 * t + 1] = d0, d1, d2, d3


@needs_sim
def test_greenlet_engine_gathers_a_warp_at_mma_and_refuses_a_partial_warp():
    from kernels_src.compiler.inline_ptx import tf32_round_bits  # noqa: F401  (loads the mma emulation)
    from kernels_src.simulator import threads_as_greenlets

    pytest.importorskip("greenlet")
    rng = np.random.default_rng(0)
    A, B = rng.integers(-4, 5, (16, 8)).astype(np.float32), rng.integers(-4, 5, (8, 8)).astype(np.float32)
    out = np.full((16, 8), np.nan, np.float32)
    with threads_as_greenlets():
        _mma_one_tile[1, 32](out, A, B, 32)
        np.testing.assert_array_equal(out, A.astype(np.float64) @ B)  # small integers: exact in tf32
        with pytest.raises(RuntimeError, match="a GPU would hang"):
            _mma_one_tile[1, 32](out, A, B, 20)


_SIM_THREADS_CHILD = """
import threading
import numpy as np
started = []
_start = threading.Thread.start
def start(self):
    started.append(type(self).__name__)
    return _start(self)
threading.Thread.start = start
from kernels_src import device
from kernels_src.device import cuda

@cuda.jit
def rev(out, x):
    s = cuda.shared.array(32, np.float64)
    t = cuda.threadIdx.x
    s[t] = x[cuda.blockIdx.x * 32 + t]
    cuda.syncthreads()
    out[cuda.blockIdx.x * 32 + t] = s[31 - t]

x = np.arange(64.0)
want = x.reshape(2, 32)[:, ::-1].ravel()
ok = []
def launch():
    out = np.full(64, np.nan)
    rev[2, 32](out, x)
    ok.append(bool((out == want).all()))
launch()
sim = started.count("BlockThread")
print(device.SIM_THREADS, sim, ok)
"""


@pytest.mark.parametrize("wanted, engine, threads", [("", "os", 64), ("greenlets", "greenlets", 0)])
def test_sim_threads_chooses_how_simulated_blocks_run(run_python, wanted, engine, threads):
    """KERNELS_SIM_THREADS=greenlets (what the site's build sets): no OS thread per CUDA thread, the same results
    (a block reversed through shared memory across a barrier); unset, the simulator's own OS threads."""
    pytest.importorskip("greenlet")
    r = run_python(_SIM_THREADS_CHILD, {"KERNELS_DEVICE": "sim", "KERNELS_SIM_THREADS": wanted})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == [engine, str(threads), "[True]"], r.stdout


def test_sim_threads_refuses_a_value_it_does_not_know(run_python):
    r = run_python("import kernels_src.device", {"KERNELS_DEVICE": "sim", "KERNELS_SIM_THREADS": "banana"})
    assert r.returncode != 0 and "KERNELS_SIM_THREADS='banana' is not one of os, greenlets" in r.stderr
