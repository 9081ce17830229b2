"""The one choice of where GPU kernels run: the real GPU, the CUDA simulator, or nowhere.

This module sits below everything else of the library (it imports nothing of it, and never numba): both
:mod:`kernels_src.compiler` (which imports ``numba.cuda``) and :mod:`kernels_src.device` (which uses it) read
the choice from here, so the dependency runs one way: device -> compiler -> target.

The choice is made once, when this module is first imported, and *before* ``numba.cuda`` is imported, because
numba reads ``NUMBA_ENABLE_CUDASIM`` only at that moment.

    KERNELS_DEVICE=auto  (default) real GPU if a CUDA driver reports a device, else the simulator
    KERNELS_DEVICE=gpu   insist on the real GPU; fail with a clear message if there is none
    KERNELS_DEVICE=sim   force the CUDA simulator (slow, pure Python, catches out-of-bounds indexing)
    KERNELS_DEVICE=cpu   skip GPU variants altogether (numba.cuda is still importable, simulated)
    KERNELS_DEVICE=ptx   real numba.cuda without a GPU: used only to compile kernels to PTX

Probing the driver uses ``ctypes`` so that asking "is there a GPU?" never imports numba.cuda.
"""
from __future__ import annotations

import ctypes
import os
import sys

MODES = ("auto", "gpu", "sim", "cpu", "ptx")


def probe_gpu() -> tuple[bool, str]:
    """Ask the CUDA driver (not numba) whether a usable GPU exists. Returns (ok, why)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False, "no CUDA driver on this machine (libcuda.so.1 not found)"
    rc = lib.cuInit(0)
    if rc != 0:
        return False, f"the CUDA driver is present but cuInit failed (CUresult {rc})"
    count = ctypes.c_int(0)
    rc = lib.cuDeviceGetCount(ctypes.byref(count))
    if rc != 0 or count.value == 0:
        return False, "the CUDA driver reports no GPU"
    return True, f"the CUDA driver reports {count.value} GPU(s)"


def _numba_cuda_simulated() -> bool:
    from numba.core import config

    return bool(config.ENABLE_CUDASIM)


def _select() -> tuple[str, str]:
    wanted = os.environ.get("KERNELS_DEVICE", "auto").strip().lower() or "auto"
    if wanted not in MODES:
        raise ValueError(f"KERNELS_DEVICE={wanted!r} is not one of {', '.join(MODES)}")
    already = "numba.cuda" in sys.modules
    if already:
        # Too late to choose: report what numba.cuda already is.
        sim = _numba_cuda_simulated()
        if wanted == "gpu" and sim:
            raise RuntimeError("KERNELS_DEVICE=gpu, but numba.cuda was imported in simulator mode before "
                               "kernels_src; restart Python and import kernels_src first")
        if sim:
            return ("cpu" if wanted == "cpu" else "sim"), "numba.cuda was already imported in simulator mode"
        return ("ptx" if wanted == "ptx" else "gpu"), "numba.cuda was already imported with a real GPU target"
    if wanted == "auto":
        ok, why = probe_gpu()
        mode = "gpu" if ok else "sim"
        reason = why if ok else why + "; set KERNELS_DEVICE=gpu|sim|cpu to override"
    elif wanted == "gpu":
        ok, why = probe_gpu()
        if not ok:
            raise RuntimeError(f"KERNELS_DEVICE=gpu but {why}. Unset KERNELS_DEVICE to use the simulator.")
        mode, reason = "gpu", "KERNELS_DEVICE=gpu; " + why
    else:
        mode, reason = wanted, f"KERNELS_DEVICE={wanted}"
    simulate = mode in ("sim", "cpu")
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1" if simulate else "0"
    if "numba" in sys.modules:  # numba.core.config read the environment already
        from numba.core import config

        config.reload_config()
    return mode, reason


MODE, REASON = _select()
SIMULATED = MODE in ("sim", "cpu")  # numba.cuda is the simulator
GPU_VARIANTS_RUN = MODE in ("gpu", "sim")  # GPU variants are executed (really or simulated)
