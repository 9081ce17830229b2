"""``kernels doctor``: what is installed, what works, and for each problem, the fix."""
from __future__ import annotations

import platform
import sys

from . import device


def _version(mod: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(mod)
    except Exception:  # noqa: BLE001
        return None


# numba-cuda and the CUDA wheels it needs exist for Linux and Windows only (requirements.lock marks them
# `sys_platform != "darwin"`); on macOS numba's built-in numba.cuda runs the simulator, and nothing else is needed.
NUMBA_CUDA_INSTALLABLE = sys.platform != "darwin"
INSTALL_HINT = ("reinstall the pinned environment: `python make.py venv` (Windows) or delete .venv and run `make test`"
                if sys.platform == "win32" else "reinstall the pinned environment: delete .venv and run `make test`")

# Native Windows is not a tested platform (README, "Windows: WSL2"): the exercises' checks run the student's code
# in a child process that sets POSIX resource limits (the `resource` module) and is handed a pipe by file
# descriptor (`pass_fds`); Windows has neither, so every `grader.check` fails there.
WINDOWS_NATIVE = ("native Windows: the exercises' checks cannot run here (the grader's sandbox needs POSIX "
                  "resource limits and file-descriptor passing)",
                  "use WSL2 with Ubuntu and the Linux commands (README, section \"Windows: WSL2\")")


def host() -> str:
    """The platform as the README's table names it: linux, wsl2 (Linux under Windows), macos, windows."""
    if sys.platform == "darwin":
        return "macos"
    if sys.platform == "win32":
        return "windows"
    if sys.platform.startswith("linux") and "microsoft" in platform.release().lower():
        return "wsl2"
    return "linux" if sys.platform.startswith("linux") else sys.platform


def runs_here(gpu: bool, no_ptx: bool, where: str | None = None, mode: str | None = None) -> str:
    """One line: what of the course runs on this install. The README's platform table quotes these lines
    (tests/test_platforms.py checks it does, word for word)."""
    where, mode = where or host(), mode or device.MODE
    parts = ["CPU kernels", "GPU kernels on the GPU" if mode == "gpu" else
             "GPU kernels skipped (KERNELS_DEVICE=cpu)" if mode == "cpu" else "GPU kernels in the CUDA simulator"]
    parts.append("no PTX check" if no_ptx else "the PTX check (sm_90)")
    line = ", ".join(parts)
    if where == "macos":
        line += " (macOS has no numba-cuda: exercises are checked in the simulator here, and for PTX when graded)"
    elif where == "wsl2":
        line += " (Linux under WSL2: as on Linux)"
    elif where == "windows":
        line += "; not the exercises' checks (native Windows is untested: use WSL2)"
    return line


def cpu_lines() -> list[str]:
    """What the CPU path has here: the CPU and its vector instructions, whether Numba vectorizes math calls
    (Intel's SVML), and whether torch is there to be the CPU yardstick."""
    import os

    from .bench import cpu_model, simd_flags
    from .compiler import get_num_threads, using_svml

    out = [f"CPU           {cpu_model()}, {os.cpu_count()} cores, Numba uses {get_num_threads()} threads; "
           f"SIMD: {' '.join(simd_flags()) or 'unknown'}"]
    from . import compiler

    out.append(f"CPU vectors   {compiler.CPU_VECTORS}")
    svml = using_svml()
    out.append("CPU math      " + ("Intel SVML on: Numba vectorizes loops over math.exp/tanh" if svml else
               "no SVML (llvmlite on PyPI is built without it): a loop over math.exp calls the C library once per "
               "element; the course's SIMD rungs use their own vectorizable exp (kernels_src/ops/cpumath.py), so "
               "nothing is lost"))
    tv = _version("torch")
    out.append(f"torch (CPU)   {tv}: the CPU benchmarks time torch beside the course" if tv else
               "torch (CPU)   not installed (optional): CPU benchmarks skip the torch rows; the project's "
               "`torch` extra adds them")
    return out


def doctor() -> int:
    problems: list[tuple[str, str]] = []
    print(f"Python        {platform.python_version()} ({sys.executable})")
    if sys.version_info < (3, 11):
        problems.append(("Python is older than 3.11", "install Python 3.11 or newer and rerun `make test`"))
    np_v, nb_v, nc_v = _version("numpy"), _version("numba"), _version("numba-cuda")
    print(f"numpy         {np_v}")
    print(f"numba         {nb_v}")
    if nc_v:
        print(f"numba-cuda    {nc_v}")
    elif not NUMBA_CUDA_INSTALLABLE:
        print("numba-cuda    not installed: it has no macOS build; numba's built-in numba.cuda runs the simulator")
    else:
        print("numba-cuda    NOT INSTALLED")
        problems.append(("numba-cuda is missing (no PTX check, no real GPU)",
                         f"{INSTALL_HINT} (it pins numba-cuda[cu13]==0.30.4 on Linux and Windows)"))
    if nc_v and np_v and tuple(int(x) for x in np_v.split(".")[:2]) >= (2, 5):
        problems.append((f"numpy {np_v}: numba-cuda 0.30 cannot compile kernels with numpy 2.5",
                         "pip install 'numpy<2.5' (the course pins 2.3.5)"))
    for line in cpu_lines():
        print(line)
    ok, why = device.probe_gpu()
    print(f"GPU           {'yes: ' if ok else 'no: '}{why}")
    print(f"kernels mode  {device.MODE} ({device.REASON})")
    from . import compiler

    print(f"compiler      {compiler.NAME} {compiler.version()} ({compiler.REASON}): {compiler.TRADE_OFFS[compiler.NAME if compiler.NAME != 'numba-cuda-mlir' else 'mlir']}")
    if device.MODE == "gpu":
        info = device.describe()
        print(f"device        {info['name']}, compute capability {info['compute_capability']}, "
              f"{info['multiprocessors']} SMs")
    print(f"simulator     {'ON: GPU kernels run as Python threads, small sizes only' if device.SIMULATED else 'off'}")
    if not ok and device.MODE != "cpu":
        print("              (that is fine for the course: every GPU exercise is graded in the simulator)")
    from .ptx import compile_registry_subprocess, unavailable

    no_ptx = unavailable()
    if no_ptx:
        print(f"PTX (sm_90)   skipped: {no_ptx}")
    else:
        try:
            res = compile_registry_subprocess("axpy")
            good = all(r.ok for r in res) and res
            print(f"PTX (sm_90)   {'works' if good else 'FAILED'}: compiled {sum(r.ok for r in res)} of {len(res)} "
                  "axpy kernels with NVVM")
            if not good:
                problems.append(("PTX compilation failed: " + "; ".join(r.message for r in res if not r.ok)[:300],
                                 f"{INSTALL_HINT}, so that numba-cuda[cu13] brings NVVM"))
        except Exception as e:  # noqa: BLE001
            print(f"PTX (sm_90)   FAILED: {str(e).splitlines()[-1] if str(e) else type(e).__name__}")
            problems.append(("cannot compile to PTX", f"{INSTALL_HINT}, so that numba-cuda[cu13] brings NVVM"))
    print(f"runs here     {runs_here(ok, bool(no_ptx))}")
    if host() == "windows":
        problems.append(WINDOWS_NATIVE)
    if problems:
        print("\nProblems:")
        for what, fix in problems:
            print(f"  - {what}\n    fix: {fix}")
        return 1
    print("\nNo problems found.")
    return 0
