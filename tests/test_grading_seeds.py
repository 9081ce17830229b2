"""No seed may cost a correct answer a mark.

The grader draws fresh inputs from a new seed on every run (edge values included: zeros, ±inf, NaN, huge
and tiny numbers). A master solution that passes on one seed and fails on another would fail some students
at random. Here every check of every exercise (visible and hidden, CPU and GPU) runs the master solution on
``N_SEEDS`` seeds (the hidden checks, which carry the edge values; the visible checks, plain random inputs at
the default sizes, get ``N_SEEDS_VISIBLE``), in this one process, GPU answers in the CUDA simulator, with the
grader's own cases
(:func:`kernels_src.grading.checks.build_cases`), poisoned outputs and tolerances.

What the sandbox adds around this (time and memory limits, the race detector, the PTX compile, the
shortcut scan) does not depend on the seed, and the solution's full-marks run covers it
(tests/test_grading_exercises.py).

The simulated GPU answers run with each block's threads as greenlets (:func:`kernels_src.simulator.
threads_as_greenlets`), not one OS thread per CUDA thread: the same checks, seeds, inputs and arithmetic, run in
a schedule a GPU may use, 10-40x faster. What a seed changes is the input values, and a correct kernel's results
do not depend on the schedule; the OS-thread schedule (with the race detector) stays with the grader, which
the full-marks run goes through.
"""
import contextlib
import importlib.util
import types

import numpy as np
import pytest

from _grading_support import ROOT, generated
from kernels_src import device, parity, simulator
from kernels_src.grading import bundle as bundle_mod
from kernels_src.grading import corpus, exercise_ops
from kernels_src.grading.checks import build_cases
from kernels_src.grading.submission import load_autograder

N_SEEDS = 50
N_SEEDS_VISIBLE = 10
SLUGS = sorted(m.stem for m in (ROOT / "solutions").glob("ch[0-9][0-9]_*.md"))
HAS_GREENLET = importlib.util.find_spec("greenlet") is not None


def _engine(slug):
    if not HAS_GREENLET or not device.SIMULATED:
        return contextlib.nullcontext()
    return simulator.threads_as_greenlets()


def _solution_module(slug):
    """The master solution's graded code (what the grader would load from a submission), as a module."""
    b = bundle_mod.from_notebook(corpus.solution_submission(slug))
    mod = types.ModuleType("submission")
    mod.__file__ = f"<{slug} solution>"
    exec(compile(b.source, mod.__file__, "exec"), mod.__dict__)  # noqa: S102  (the project's own solution)
    return mod


def _run(spec, fn, inputs, outs):
    if spec.kind == "cpu":
        fn(*outs, *inputs)
        return outs
    cuda = device.cuda
    d_in = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in inputs]
    d_out = [cuda.to_device(o) for o in outs]
    with device.simulator_speedup():
        fn(*d_out, *d_in)
    return [d.copy_to_host() for d in d_out]


def _failures(spec, fn, seed):
    op = exercise_ops.find_op(spec.op)
    bad = []
    for label, size, inputs, refs in build_cases(spec, op, seed):
        rtol, atol = parity.resolve_tol(op.tol, spec.dtype, size)
        try:
            got = _run(spec, fn, inputs, parity.empty_outputs(refs, spec.dtype))
        except Exception as e:  # noqa: BLE001
            bad.append(f"seed {seed}, {label}: raised {type(e).__name__}: {e}")
            continue
        for i, (g, r) in enumerate(zip(got, refs)):
            rep = parity.compare(f"out{i}", g, r, rtol, atol)
            unwritten = parity.is_poison(g, avoid=r) & ~np.isnan(r) if g.shape == r.shape else np.zeros(1, bool)
            if not rep.ok or unwritten.any():
                bad.append(f"seed {seed}, {label}: " + ("\n".join(rep.lines()) if not rep.ok else
                                                          f"{int(unwritten.sum())} elements never written"))
    return bad


@pytest.mark.slow
@pytest.mark.parametrize("slug", SLUGS)
def test_master_solution_passes_every_check_on_every_seed(slug):
    if not device.GPU_VARIANTS_RUN:
        pytest.skip(f"GPU answers cannot run here ({device.REASON})")
    ag = load_autograder(generated(slug) / "build" / slug)
    mod = _solution_module(slug)
    specs = {s.key: s for cases in ag.plan.values() for case in cases for s in case}
    assert specs, f"{slug} has no checks"
    failures = []
    with _engine(slug):
        for spec in specs.values():
            fn = getattr(mod, spec.function)
            for seed in range(N_SEEDS if spec.hidden else N_SEEDS_VISIBLE):
                failures += [f"{spec.title}: {f}" for f in _failures(spec, fn, seed)]
    assert not failures, f"the master solution of {slug} fails on some seeds:\n" + "\n".join(failures[:10])
