"""kernels_src.grading: the checks every kernel exercise gets, and the autograder around otter-grader.

An exercise's test cell is a few lines::

    from kernels_src.grading import check_cpu, check_gpu
    check_cpu("axpy_cpu", op="axpy", args=("out", "a", "x", "y"))
    check_gpu("axpy_gpu", kernels=("axpy_kernel",), op="axpy", edge=True, hidden=True)

Each call grades the student's function against the op's float64 reference on fresh random inputs
(awkward shapes; edge values with ``edge=True``), with poisoned outputs and an input-mutation check. The
notebook's code is loaded in a sandboxed *plan* run that never sees the graded inputs (a GPU launcher is
called there on decoy inputs, its launches recorded); the graded kernels and ``@njit`` functions are then
rebuilt from their ``def`` text in a sandboxed *exec* run where no other line of the notebook runs, which
receives the inputs over a pipe once ready and runs them (the launches replayed by the grader), under the
race detector for GPU answers; compiled code is checked for object mode and NumPy's products and
reductions, kernels are compiled to PTX for sm_90, and the feedback is written for the student (see
:mod:`.checks`, :mod:`.kernelpack`, :mod:`.confine`). It prints the feedback and raises ``AssertionError``
when the check fails, which is what an otter exception-based test needs.

Where the code comes from, and who decides the grade, depends on where the call runs:

- in a student's notebook (``grader.check("q1")``): the cells run so far in the kernel, graded now,
  in a sandboxed child process;
- under the autograder (:mod:`kernels_src.grading.submission`): the verdicts were computed before the
  notebook ran, by the trusted grader from the submitted file; the call only shows its verdict. The
  final score comes from those verdicts, so code in the notebook that patches numpy, this module or
  otter cannot change it;
- while the autograder collects the plan of an exercise: the call only records its spec.
"""
from __future__ import annotations

import json
import os
import sys

from .spec import CheckSpec, GraderError, Verdict  # noqa: F401

__all__ = ["check_cpu", "check_gpu", "CheckSpec", "Verdict", "GraderError", "run_check", "racecheck"]

VERDICTS_ENV = "KERNELS_VERDICTS"
_plan: list | None = None  # set by collect_plan(): calls record their spec instead of running
_bundle_override = None  # set by tests / scripts that grade a given notebook interactively


def _tupled(x):
    if x is None:
        return None
    if isinstance(x, (str, bytes)):
        return (x,)
    return tuple(tuple(i) if isinstance(i, list) else i for i in x)


def check_cpu(function: str | None = None, *, op: str | None = None, sizes=None, edge: bool = False,
              hidden: bool = False, dtype: str = "float32", forbid=(), allow=(), args=(), timeout: float | None = None,
              seed: int | None = None, verdict_keys=None):
    """Grade the CPU answer ``function`` (an ``@njit`` function called as ``function(*outputs, *inputs)``).

    ``verdict_keys``: only show the grader's verdicts of these checks (the otter run's test files, which
    the autograder rewrites so that the notebook it runs never holds the hidden checks' arguments)."""
    if verdict_keys is not None:
        return _show(verdict_keys)
    spec = CheckSpec("cpu", function, op, (), _tupled(sizes), edge, hidden, dtype, False, False,
                     _tupled(forbid) or (), _tupled(allow) or (), _tupled(args) or (), timeout)
    return _dispatch(spec, seed)


def check_gpu(function: str | None = None, *, kernels=(), op: str | None = None, sizes=None, edge: bool = False,
              hidden: bool = False, dtype: str = "float32", racecheck: bool = True, ptx: bool = True, forbid=(),
              allow=(), args=(), timeout: float | None = None, seed: int | None = None, verdict_keys=None):
    """Grade the GPU answer: the launcher ``function`` (called as ``function(*outputs, *inputs)`` with
    device arrays, on decoy inputs) must launch each of ``kernels``, ``@cuda.jit`` kernels defined in the
    notebook; the grader then launches them itself on the real inputs. The kernels are always compiled to
    PTX for sm_90 (``ptx`` is kept for old test files and no longer turns that off). ``verdict_keys``: as
    for :func:`check_cpu`."""
    if verdict_keys is not None:
        return _show(verdict_keys)
    spec = CheckSpec("gpu", function, op, _tupled(kernels) or (), _tupled(sizes), edge, hidden, dtype, racecheck,
                     ptx, _tupled(forbid) or (), _tupled(allow) or (), _tupled(args) or (), timeout)
    return _dispatch(spec, seed)


def _dispatch(spec: CheckSpec, seed):
    if _plan is not None:
        _plan.append(spec)
        return None
    path = os.environ.get(VERDICTS_ENV)
    if path:
        verdict = _lookup(path, spec)
    else:
        from .bundle import from_ipython_history

        bundle = _bundle_override or from_ipython_history()
        if bundle is None:
            raise RuntimeError("check_cpu/check_gpu grade the cells of a running notebook; outside Jupyter, "
                               "use kernels_src.grading.run_check(spec, bundle) or `kernels grade`")
        from .checks import run_check

        verdict = run_check(spec, bundle, seed=seed)
    if not verdict.passed:  # otter shows the message of the failed test: print nothing twice
        raise AssertionError("\n" + verdict.feedback)
    print(verdict.feedback)
    sys.stdout.flush()
    return None


def _show(keys) -> None:
    """Show the grader's verdicts of the checks ``keys`` (the otter run): raise if one failed."""
    path = os.environ.get(VERDICTS_ENV, "")
    verdicts = [_lookup(path, CheckSpec("cpu", "?", "?"), key=k) for k in keys]
    failed = [v for v in verdicts if not v.passed]
    if failed:
        raise AssertionError("\n" + "\n\n".join(v.feedback for v in failed))
    print("\n\n".join(v.feedback for v in verdicts))
    sys.stdout.flush()
    return None


def _lookup(path: str, spec: CheckSpec, key: str | None = None) -> Verdict:
    import time

    deadline = time.monotonic() + float(os.environ.get("KERNELS_VERDICTS_WAIT", "0") or 0)
    while not os.path.exists(path) and time.monotonic() < deadline:  # the grader writes it when the checks end
        time.sleep(0.2)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return Verdict.from_json(data[key or spec.key])
    except (OSError, ValueError, KeyError):
        title = "this check" if key else spec.title
        return Verdict(key or spec.key, title, False, f"{title}: no verdict from the grader for this check "
                       "(it is graded separately; see the autograder's results)", status="error")


def run_check(spec, bundle, seed=None):
    """Grade one check of ``bundle`` (see :func:`kernels_src.grading.checks.run_check`)."""
    from .checks import run_check as _run

    return _run(spec, bundle, seed=seed)


class collect_plan:
    """``with collect_plan() as specs: <run test code>`` records the checks the code would run."""

    def __enter__(self):
        global _plan
        self._old = _plan
        _plan = []
        return _plan

    def __exit__(self, *exc):
        global _plan
        _plan = self._old
        return False


def racecheck(kernel, griddim, blockdim, *args):
    """Run a simulated kernel once under the shared-memory race detector (see :mod:`.racecheck`)."""
    from .racecheck import racecheck as _rc

    return _rc(kernel, griddim, blockdim, *args)
