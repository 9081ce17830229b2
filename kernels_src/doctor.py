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


def doctor() -> int:
    problems: list[tuple[str, str]] = []
    print(f"Python        {platform.python_version()} ({sys.executable})")
    if sys.version_info < (3, 11):
        problems.append(("Python is older than 3.11", "install Python 3.11 or newer and rerun `make test`"))
    np_v, nb_v, nc_v = _version("numpy"), _version("numba"), _version("numba-cuda")
    print(f"numpy         {np_v}")
    print(f"numba         {nb_v}")
    print(f"numba-cuda    {nc_v or 'NOT INSTALLED'}")
    if not nc_v:
        problems.append(("numba-cuda is missing", "pip install 'numba-cuda[cu13]' (or run `make test`, which does)"))
    if np_v and tuple(int(x) for x in np_v.split(".")[:2]) >= (2, 5):
        problems.append((f"numpy {np_v}: numba-cuda 0.30 cannot compile kernels with numpy 2.5",
                         "pip install 'numpy<2.5' (the course pins 2.3.5)"))
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
    from .ptx import compile_registry_subprocess

    try:
        res = compile_registry_subprocess("axpy")
        good = all(r.ok for r in res) and res
        print(f"PTX (sm_90)   {'works' if good else 'FAILED'}: compiled {sum(r.ok for r in res)} of {len(res)} "
              "axpy kernels with NVVM")
        if not good:
            problems.append(("PTX compilation failed: " + "; ".join(r.message for r in res if not r.ok)[:300],
                             "pip install 'numba-cuda[cu13]' so NVVM is available"))
    except Exception as e:  # noqa: BLE001
        print(f"PTX (sm_90)   FAILED: {str(e).splitlines()[-1] if str(e) else type(e).__name__}")
        problems.append(("cannot compile to PTX", "pip install 'numba-cuda[cu13]' so NVVM is available"))
    if problems:
        print("\nProblems:")
        for what, fix in problems:
            print(f"  - {what}\n    fix: {fix}")
        return 1
    print("\nNo problems found.")
    return 0
