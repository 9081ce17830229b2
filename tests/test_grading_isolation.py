"""An exception at the top level of one answer cell costs only the questions that need what that cell failed
to define (the grader loads the notebook cell by cell, as Jupyter runs it), and the write record of the race
detector tells kernel stores from host writes."""
import numpy as np
import pytest

from _grading_support import grade_answers
from kernels_src import device
from kernels_src.grading import corpus

SLUG = "ch01_axpy"


@pytest.mark.slow
@pytest.mark.parametrize("question", list(corpus.master_solutions(SLUG)))
def test_a_raise_at_the_top_of_one_answer_cell_costs_only_that_question(question, tmp_path):
    solutions = corpus.master_solutions(SLUG)
    answers = {question: "raise RuntimeError('cell stopped on purpose')\n\n" + solutions[question]}
    rec = grade_answers(SLUG, answers, tmp_path)
    for q, (score, possible) in rec.per_question.items():
        if q == question:
            assert score == 0, (q, rec.per_question)
        else:
            assert score == possible, (q, rec.per_question, rec.results["tests"])
    text = "\n".join(t.get("output", "") for t in rec.results["tests"] if t["name"] == question)
    assert "cell stopped on purpose" in text and "the rest of that cell did not run" in text, text


needs_sim = pytest.mark.skipif(not device.SIMULATED, reason="the write record needs the CUDA simulator")
cuda = device.cuda


@cuda.jit
def _half_kernel(out, x):
    i = cuda.grid(1)
    if i < out.size // 2:
        out[i] = 2 * x[i]


@cuda.jit
def _atomic_kernel(out, x):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(out, i % out.size, x[i])


@needs_sim
def test_write_record_tells_kernel_stores_from_host_writes():
    from kernels_src.grading.racecheck import instrumented

    x = cuda.to_device(np.arange(8, dtype=np.float32))
    out = cuda.to_device(np.full(8, np.nan, np.float32))
    with instrumented() as s:
        s.watch([out])
        _half_kernel[1, 8](out, x)
        out[6] = 1.0  # the host writes one element after the launch
        rec = s.writes()[0]
    assert rec.kernel.tolist() == [True] * 4 + [False] * 4
    assert rec.host.tolist() == [False] * 6 + [True, False]


@needs_sim
def test_write_record_counts_a_kernel_store_that_keeps_the_value():
    """The host zeroes the output (fine), the kernel adds zeros atomically: every element is the kernel's."""
    from kernels_src.grading.racecheck import instrumented

    x = cuda.to_device(np.zeros(8, np.float32))
    out = cuda.to_device(np.full(4, np.nan, np.float32))
    with instrumented() as s:
        s.watch([out])
        out.copy_to_device(np.zeros(4, np.float32))
        _atomic_kernel[1, 8](out, x)
        rec = s.writes()[0]
    assert rec.kernel.all() and not rec.host.any()


def test_the_runtime_copy_holds_every_module_of_the_compiler_door():
    """A sandboxed student process imports kernels_src.compiler: a module of the door missing from the grader's
    runtime copy makes every submission fail to import (it happened once, when inline_ptx.py was added)."""
    from pathlib import Path

    from kernels_src.grading.sandbox import RUNTIME_FILES

    door = Path(__file__).resolve().parents[1] / "kernels_src" / "compiler"
    missing = sorted(f"compiler/{p.name}" for p in door.glob("*.py") if f"compiler/{p.name}" not in RUNTIME_FILES)
    assert not missing, f"add these to grading/sandbox.py RUNTIME_FILES: {missing}"
