"""Where GPU kernels run, and what the rest of the library asks about it.

The choice itself (real GPU, simulator, CPU only, PTX only; ``KERNELS_DEVICE``) is made by
:mod:`kernels_src.target`, below the compiler, before ``numba.cuda`` is imported; this module hands it on
(:data:`MODE`, :data:`SIMULATED`, ...) and adds what needs the compiler: synchronizing, describing the GPU,
the chapters' banner, the simulator's fixes and speed-up.
"""
from __future__ import annotations

import contextlib
import os
import sys

from .target import GPU_VARIANTS_RUN, MODE, MODES, REASON, SIMULATED, probe_gpu  # noqa: F401  (chosen there)
from .compiler import cuda  # the one door to the compiler (it reads the same choice from .target)

SIM_SWITCH_INTERVAL = 1e-4  # makes the simulator's thread hand-offs ~3x faster

# How a simulated block runs its threads: "os" (the simulator's own loop, one OS thread per CUDA thread; its
# interleavings can expose a race) or "greenlets" (one schedule a GPU may run, several times faster; the same
# results for a race-free kernel). The site's build asks for greenlets (book/_ext/kfs_site.py); JupyterLab, the
# tests (which choose per test) and the grader (a clean environment) run OS threads.
SIM_THREADS = os.environ.get("KERNELS_SIM_THREADS", "os").strip().lower() or "os"
if SIM_THREADS not in ("os", "greenlets"):
    raise ValueError(f"KERNELS_SIM_THREADS={SIM_THREADS!r} is not one of os, greenlets")

if SIMULATED:  # make the simulator behave like a GPU where it differs (kernels_src/simulator.py)
    from . import simulator as _simulator

    _simulator.install()
    if SIM_THREADS == "greenlets" and not _simulator.greenlets_for_good():
        SIM_THREADS = "os"  # greenlet is not installed: the simulator's own threads

if MODE == "gpu":  # small check sizes launch tiny grids on purpose; numba warns about each one
    import warnings

    # (numba-cuda raises its own NumbaPerformanceWarning class, so match the message, not the class)
    warnings.filterwarnings("ignore", message=".*[Gg]rid size .* under-utilization")

_announced = False


def announce() -> None:
    """Print, once per process, the one line that says GPU kernels are simulated and why."""
    global _announced
    if SIMULATED and not _announced:
        _announced = True
        print(f"[kernels_src] GPU kernels run in the CUDA simulator (slow, small sizes only): {REASON}.",
              file=sys.stderr)


@contextlib.contextmanager
def simulator_speedup():
    """While simulated kernels run, switch Python threads more often (about 3x faster)."""
    if not SIMULATED:
        yield
        return
    old = sys.getswitchinterval()
    sys.setswitchinterval(SIM_SWITCH_INTERVAL)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def synchronize() -> None:
    if MODE == "gpu":
        cuda.synchronize()


def describe() -> dict:
    """A small dict naming the device, for benchmark metadata and `doctor`."""
    info = {"mode": MODE, "reason": REASON, "simulated": SIMULATED}
    if MODE == "gpu":
        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        info.update(name=name, compute_capability=".".join(map(str, dev.compute_capability)),
                    multiprocessors=dev.MULTIPROCESSOR_COUNT)
    else:
        import platform

        info.update(name=f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)")
    return info


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def needs_real_gpu() -> tuple[bool, str]:
    """``requires=`` for variants using warp shuffles/votes, which the simulator does not implement."""
    if MODE != "gpu":
        return False, "warp shuffles need a real GPU (the CUDA simulator has no shfl_*_sync)"
    return True, ""


def banner() -> None:
    """The one line every chapter prints first: where this page's GPU code runs, and why."""
    if MODE == "gpu":
        print(f"GPU code on this page runs on the real GPU: {describe()['name']}.")
    elif MODE == "sim":
        print(f"GPU code on this page runs in the CUDA simulator, at small sizes ({REASON}). "
              "GPU timings shown are measured results loaded from book/data/bench/.")
    else:
        print(f"GPU code on this page is skipped ({REASON}).")
