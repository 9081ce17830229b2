"""CPU yardsticks: torch on the CPU, and the NumPy formula a student would write.

Most students run the course on a CPU, so the Numba CPU rungs are measured against what such a student
would otherwise reach for, in the same run:

- **torch on the CPU**, where it is installed (an optional extra: ``pip install torch``; the CPU build is
  enough). Without it the row is skipped with one line saying so. torch runs with as many threads as Numba
  (``torch.set_num_threads(numba.get_num_threads())``), so neither side gets more cores.
- **the NumPy formula**, registered in each op's module as its ``numpy`` baseline.

A torch baseline writes into the course's output array without a copy: its NumPy output is wrapped with
``torch.from_numpy`` (shared memory) and the ATen ``out=`` overload is called where torch has one
(:func:`aten_out`). Where it has none, the result is copied into the output and the baseline's docstring
says so (the copy is then part of what torch costs a user who needs the result in a given buffer).

Op modules register torch rows as::

    @register("softmax", "cpu", "torch", baseline=True, requires=torch_cpu)
    def softmax_torch_cpu(out, x):
        t = tviews(out, x)
        aten_out("_softmax", t[1], 1, False, out=t[0])
"""
from __future__ import annotations

import sys

from ..compiler import import_torch_first  # noqa: F401  (it lives in the compiler door: bench.py sits below ops)

_state: dict = {}

# Measured on the 2-core machine that builds the book: when Numba's prange thread pool (an OpenMP runtime) is
# started before torch is imported, torch's CPU kernels run 10-50x slower in that process (SDPA 0.3 ms -> 12-17
# ms; two OpenMP runtimes on the same cores), and stay slow. Imported first, torch keeps its speed next to
# Numba's kernels. A torch row measured in such a process would be no yardstick, so it is skipped instead.
LATE_IMPORT = ("torch was imported after Numba started its thread pool, which makes torch's CPU kernels 10-50x "
               "slower in this process: import torch first (kernels bench and cpuboard do)")


def torch_cpu() -> tuple[bool, str]:
    """``requires=`` for torch-on-the-CPU baselines: an importable torch (any build), with its thread count
    set to Numba's so that both sides use the same cores, imported before Numba's thread pool started."""
    if "ok" not in _state:
        import importlib.util

        from ..compiler import numba_threads_started

        if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
            _state["ok"] = (False, "torch is not installed (optional: pip install torch, the CPU build will do)")
            return _state["ok"]
        if "torch" not in sys.modules and numba_threads_started():
            return False, LATE_IMPORT
        try:
            import torch
        except ImportError:
            _state["ok"] = (False, "torch is not installed (optional: pip install torch, the CPU build will do)")
        else:
            from ..compiler import get_num_threads

            torch.set_num_threads(get_num_threads())
            _state["ok"] = (True, "")
    return _state["ok"]


def tviews(*arrays):
    """torch tensors sharing memory with NumPy arrays (no copy); scalars pass through."""
    import numpy as np
    import torch

    return [torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in arrays]


def aten_out(name: str, *args, out, **kwargs):
    """Call ATen's ``out=`` overload of ``name`` (``torch.ops.aten.<name>.out``): the result goes straight
    into ``out`` (a tensor, or a tuple of tensors for ops with several outputs)."""
    import torch

    fn = getattr(torch.ops.aten, name).out
    if isinstance(out, (tuple, list)):
        names = _OUT_NAMES.get(name)
        if names is None:
            raise KeyError(f"aten_out: say the output names of {name} in _OUT_NAMES")
        return fn(*args, **kwargs, **dict(zip(names, out)))
    return fn(*args, **kwargs, out=out)


# ATen overloads with several outputs name them; add an entry when a baseline needs one.
_OUT_NAMES = {
    "native_layer_norm": ("out0", "out1", "out2"),
    "native_layer_norm_backward": ("out0", "out1", "out2"),
}
