"""Device selection happens once per process, so each case runs in a fresh interpreter."""
import pytest


def test_auto_without_gpu_selects_simulator(run_python):
    from kernels_src.device import probe_gpu

    if probe_gpu()[0]:
        pytest.skip("this machine has a GPU")
    r = run_python("import kernels_src as k; print(k.device.MODE, k.device.SIMULATED)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["sim", "True"]


def test_simulated_launch_prints_one_line_and_restores_switch_interval(run_python):
    code = """
import sys, numpy as np
import kernels_src as k
from kernels_src.ops import axpy
before = sys.getswitchinterval()
x = np.ones(10, np.float32); out = np.empty_like(x)
axpy.axpy_thread(out, np.float32(2), x, x)
axpy.axpy_thread(out, np.float32(2), x, x)
print(out[0], sys.getswitchinterval() == before)
"""
    r = run_python(code, {"KERNELS_DEVICE": "sim"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3.0", "True"]
    notices = [ln for ln in r.stderr.splitlines() if "CUDA simulator" in ln]
    assert len(notices) == 1 and "KERNELS_DEVICE=sim" in notices[0]


def test_cpu_mode_skips_gpu_variants(run_python):
    code = """
import numpy as np
import kernels_src as k
from kernels_src import parity
reps = parity.check("axpy", backend="gpu", progress=False)
print(all(r.skipped for r in reps), len(reps) > 0)
from kernels_src.ops import axpy
try:
    axpy.axpy_thread(np.empty(3, np.float32), np.float32(1), np.ones(3, np.float32), np.ones(3, np.float32))
except RuntimeError as e:
    print("refused:", "GPU variants are off" in str(e))
"""
    r = run_python(code, {"KERNELS_DEVICE": "cpu"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", "refused:", "True"]


def test_gpu_mode_without_gpu_fails_clearly(run_python):
    from kernels_src.device import probe_gpu

    if probe_gpu()[0]:
        pytest.skip("this machine has a GPU")
    r = run_python("import kernels_src", {"KERNELS_DEVICE": "gpu"})
    assert r.returncode != 0
    assert "KERNELS_DEVICE=gpu but" in r.stderr and "Unset KERNELS_DEVICE" in r.stderr


def test_bad_mode_is_rejected(run_python):
    r = run_python("import kernels_src", {"KERNELS_DEVICE": "tpu"})
    assert r.returncode != 0 and "is not one of" in r.stderr


def test_numba_imported_before_selection_is_respected(run_python):
    code = """
import os; os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
from numba import cuda
import kernels_src as k
print(k.device.MODE, k.device.REASON)
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("sim numba.cuda was already imported in simulator mode")


def test_numba_core_imported_first_still_switches(run_python):
    """numba (not numba.cuda) already imported: the config must be reloaded for the simulator switch."""
    r = run_python("import numba\nimport kernels_src as k\nfrom numba.core import config\n"
                   "print(k.device.MODE, bool(config.ENABLE_CUDASIM))", {"KERNELS_DEVICE": "sim"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["sim", "True"]


def test_simulated_shared_arrays_are_one_per_block_even_under_contention():
    """numba's simulator creates a block's shared array on first use without a lock, so threads arriving
    together could get different arrays (seen as rare garbage sums). kernels_src makes it atomic."""
    import sys
    import threading

    import numpy as np

    from kernels_src import device

    if not device.SIMULATED:
        pytest.skip("only the simulator has this problem")
    from numba.cuda.simulator import kernelapi

    fixed = kernelapi.FakeCUDAShared.array

    def distinct_arrays(array_fn, n=64):
        shared = kernelapi.FakeCUDAShared(0)
        got, gate = [None] * n, threading.Barrier(n)

        def work(i):
            gate.wait()
            got[i] = array_fn(shared, (4,), np.float32)

        ts = [threading.Thread(target=work, args=(i,)) for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return len({id(g) for g in got})

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        assert all(distinct_arrays(fixed) == 1 for _ in range(30))
    finally:
        sys.setswitchinterval(old)
    assert fixed.simulator_original is not fixed
