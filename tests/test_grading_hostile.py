"""One hostile submission (or more) per hole class of issue 28, written from the class descriptions, each graded as
intended: no wrong pass, no lost record, no batch ended by a submission, each failure costing only its question.

1. the host computes the answer and the kernel only copies it;
2. NumPy/BLAS reached through entry points a list would miss;
3. code inside an object-mode block;
4. the course's own code reached at run time (sys.modules, an import, the master solution read and executed);
5. work done while the notebook loads (the job's inputs, a reference, the committed measurements);
6. files the grader reads later, written by student code;
7. the grading process itself killed by student code;
8. inputs that cannot tell right from wrong, and prompt rules not enforced (here: np.max; the mutants of every
   exercise are in test_grading_mutants.py).
"""
import json
import os
import signal
import sys

import pytest

from _grading_support import ROOT, autograder, corpus_submission, grade_answers, outputs_by_question
from kernels_src.grading import confine, corpus, sandbox

SLUG = "ch01_axpy"
KERNEL = '''
@cuda.jit
def axpy_kernel(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = {body}
'''
COPY_KERNEL = KERNEL.format(body="t[i]").replace("(out, a, x, y)", "(out, t)")
PROTECTED = pytest.mark.skipif(not confine.landlock_abi() and os.geteuid() == 0,
                               reason="no Landlock here: nothing would stop a hostile submission")


def _grade(answers, tmp_path, questions):
    rec = grade_answers(SLUG, answers, tmp_path, questions=questions)
    return rec, outputs_by_question(rec.results)


def _zero(rec, outs, q, *phrases):
    assert rec.per_question[q][0] == 0, (q, rec.per_question, outs.get(q, "")[:3000])
    for p in phrases:
        assert p in outs[q], f"{p!r} not in:\n{outs[q][:4000]}"


# ---------------------------------------------------------------------------------------------------- 1
HOST_ANSWERS = {
    "device_copy": COPY_KERNEL + '''
def axpy_gpu(out, a, x, y):
    t = cuda.to_device((a * x.copy_to_host() + y.copy_to_host()).astype(np.float32))
    axpy_kernel[ceil_div(out.size, 128), 128](out, t)
''',
    "host_array_arg": COPY_KERNEL + '''
def axpy_gpu(out, a, x, y):
    t = np.empty(out.size, np.float32)
    np.multiply(x.copy_to_host(), a, out=t)
    np.add(t, y.copy_to_host(), out=t)
    axpy_kernel[ceil_div(out.size, 128), 128](out, t)
''',
    "kernel_rewrites_host_answer": KERNEL.format(body="out[i] * float32(1.0)") + '''
def axpy_gpu(out, a, x, y):
    out.copy_to_device((a * x.copy_to_host() + y.copy_to_host()).astype(np.float32))
    axpy_kernel[ceil_div(out.size, 128), 128](out, a, x, y)
''',
    "scalar_from_host": '''
@cuda.jit
def axpy_kernel(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


def axpy_gpu(out, a, x, y):
    hx = x.copy_to_host()
    for i in range(out.size):  # one launch per element, each given the host's answer as "a"
        axpy_kernel[1, 1](out[i:i + 1], np.float32(hx[i] * a + y.copy_to_host()[i]), x[i:i + 1] * 0, y[i:i + 1] * 0)
''',
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(HOST_ANSWERS))
def test_class1_host_computes_the_kernel_copies(case, tmp_path):
    rec, outs = _grade({"q2": HOST_ANSWERS[case]}, tmp_path, ["q2"])
    _zero(rec, outs, "q2")
    assert ("computed from the inputs" in outs["q2"] or "on the host" in outs["q2"]
            or "only your kernels may compute" in outs["q2"]), outs["q2"][:3000]


# ---------------------------------------------------------------------------------------------------- 2
NUMPY_ANSWERS = {
    "global_alias_in_njit": ('''
_f = getattr(np, "vd" + "ot")


@njit
def axpy_cpu(out, a, x, y):
    s = _f(x, x)
    for i in range(out.size):
        out[i] = a * x[i] + y[i] + 0 * s
''', "q1", "vdot"),
    "c_level_entry_in_kernel": (KERNEL.format(body="np._core.multiarray.dot(x, y) * 0 + a * x[i] + y[i]") + '''
def axpy_gpu(out, a, x, y):
    axpy_kernel[ceil_div(out.size, 128), 128](out, a, x, y)
''', "q2", "dot"),
    "linalg_module_in_njit": ('''
la = np.linalg


@njit
def axpy_cpu(out, a, x, y):
    n = la.norm(x)
    for i in range(out.size):
        out[i] = a * x[i] + y[i] + 0 * n
''', "q1", "linalg"),
    "einsum_by_another_name": ('''
from numpy import einsum as combine


@njit
def axpy_cpu(out, a, x, y):
    for i in range(out.size):
        out[i] = a * x[i] + y[i]
    out[0] = combine("i,i->", x, y) * 0 + out[0]
''', "q1", "einsum"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(NUMPY_ANSWERS))
def test_class2_numpy_through_other_entry_points(case, tmp_path):
    code, q, phrase = NUMPY_ANSWERS[case]
    rec, outs = _grade({q: code}, tmp_path, [q])
    _zero(rec, outs, q, phrase)


# ---------------------------------------------------------------------------------------------------- 3
@pytest.mark.slow
def test_class3_object_mode_block(tmp_path):
    code = '''
import numba


@njit
def axpy_cpu(out, a, x, y):
    with numba.objmode():
        out[:] = np.add(np.multiply(a, x), y)
'''
    rec, outs = _grade({"q1": code}, tmp_path, ["q1"])
    _zero(rec, outs, "q1", "object mode")


# ---------------------------------------------------------------------------------------------------- 4
@pytest.mark.slow
def test_class4_course_code_and_master_solution_at_run_time(tmp_path):
    solutions = str(ROOT / "solutions" / f"{SLUG}.md")
    q2 = KERNEL.format(body="out[i]") + f'''
def axpy_gpu(out, a, x, y):
    import importlib, sys
    ref = None
    for name, m in list(sys.modules.items()):
        if name.startswith("kernels_src.ops") and hasattr(m, "reference"):
            ref = m.reference
    try:
        ref = ref or importlib.import_module("kernels_src.ops.axpy").reference
    except Exception:
        src = open({solutions!r}).read()  # the master solution, then its code
        exec(src.split("def axpy_gpu")[0], globals())
    out.copy_to_device(np.asarray(ref(a, x.copy_to_host(), y.copy_to_host()), np.float32))
    axpy_kernel[ceil_div(out.size, 128), 128](out, a, x, y)
'''
    q1 = f'''
exec(open({solutions!r}).read().split("```{{code-cell}} ipython3")[2].split("```")[0])
'''
    rec, outs = _grade({"q1": q1, "q2": q2}, tmp_path, ["q1", "q2"])
    _zero(rec, outs, "q1")
    _zero(rec, outs, "q2")


# ---------------------------------------------------------------------------------------------------- 5
@pytest.mark.slow
def test_class5_work_while_the_notebook_loads(tmp_path):
    bench = ROOT / "book" / "data" / "bench" / "h100" / "axpy_gpu.json"
    top = f'''
import glob, io, sys
ANSWER = np.zeros(4099, np.float32)  # to be filled with the answer, if the inputs can be found
STASH = None
for f in glob.glob("*.npz"):  # the job's own inputs, if any were lying around
    z = np.load(f)
    STASH = [z[k] for k in z.files]
if STASH is None:
    STASH = np.load(io.BytesIO(sys.stdin.buffer.read()))  # or on stdin
MEASURED = open({str(bench)!r}).read()
'''
    q2 = '''
@cuda.jit
def axpy_kernel(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = ANSWER[i]


def axpy_gpu(out, a, x, y):
    axpy_kernel[ceil_div(out.size, 128), 128](out, a, x, y)
'''
    q4 = '''
import json
T = json.loads(open("''' + str(bench) + '''").read())
LAUNCH_US = 4.0
GBPS = 2800.0


@njit
def predict_axpy_us(us, n):
    for i in range(n.size):
        us[i] = LAUNCH_US + 12.0 * n[i] / (GBPS * 1e3)
'''
    rec, outs = _grade({"top": top, "q2": q2, "q4": q4}, tmp_path, ["q1", "q2", "q4"])
    _zero(rec, outs, "q2", "reads the global `ANSWER`")
    _zero(rec, outs, "q4", "PermissionError")
    assert rec.per_question["q1"][0] == rec.per_question["q1"][1]  # the failing top cell costs nothing else


# ---------------------------------------------------------------------------------------------------- 6, 7
def _forge_and_kill(targets):
    return f'''
import os, signal
for _t in {targets!r}:
    try:
        with open(_t, "a") as _f:
            _f.write("forged by a submission\\n")
    except Exception:
        pass


def _graders():
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                with open(f"/proc/{{pid}}/cmdline", "rb") as f:
                    cmd = f.read()
            except Exception:
                continue
            if b"pytest" in cmd or b"kernels_src.grading" in cmd or b"boot.py" in cmd:
                out.append(int(pid))
    return out


for _p in _graders() + [os.getppid()]:
    try:
        os.kill(_p, signal.SIGKILL)
    except Exception:
        pass
'''


@pytest.mark.slow
@PROTECTED
def test_class6_and_7_forged_files_and_killed_grader_lose_no_record(tmp_path):
    from kernels_src.grading.batch import grade_folder

    ag = autograder(SLUG)
    bench = ROOT / "book" / "data" / "bench" / "h100" / "axpy_gpu.json"
    tests_q1 = ag / "source" / "tests" / "q1.py"
    sentinel = tmp_path / "sentinel.txt"
    before = {p: p.read_bytes() for p in (bench, tests_q1)}
    code = _forge_and_kill([str(bench), str(tests_q1), str(sentinel)])
    subs = tmp_path / "subs"  # one folder per student, as a Gradescope export has them
    for sid in ("hostile", "solution", "selfkill"):
        (subs / sid).mkdir(parents=True)
    nb = corpus.build_submission(SLUG, {"top": code, "end": code})
    corpus.write_ipynb(nb, subs / "hostile" / "hostile.ipynb")
    corpus_submission("solution", subs / "solution")
    kill = "import os, signal\n_k = os.kill(os.getpid(), signal.SIGKILL)  # an assignment: the grader runs it\n"
    corpus.write_ipynb(corpus.build_submission(SLUG, {"top": kill}), subs / "selfkill" / "selfkill.ipynb")
    out = tmp_path / "gradebook.csv"
    grade_folder(subs, out, autograder=ag, jobs=2, run_otter=True, progress=False)
    res = json.loads((tmp_path / "gradebook_results" / "selfkill" / "results.json").read_text())
    assert res["score"] == 0 and res["tests"], res  # it ended its own process: its own record, scored 0
    # the grader (this process) is alive, no file it reads changed, and both records are complete
    assert {p: p.read_bytes() for p in before} == before
    assert not sentinel.exists()
    for sid in ("hostile", "solution"):
        res = json.loads((tmp_path / "gradebook_results" / sid / "results.json").read_text())
        scores = {t["name"]: (t["score"], t["max_score"]) for t in res["tests"] if "max_score" in t}
        assert scores and all(s == m for s, m in scores.values()), (sid, scores, res.get("output"))


# ---------------------------------------------------------------------------------------------------- 8
@pytest.mark.slow
def test_class8_a_prompt_rule_is_enforced(tmp_path):
    """ch08's prompt forbids np.max on whole arrays: an @njit answer that uses it scores 0."""
    code = corpus.master_solutions("ch08_softmax")["q1"]
    assert "def softmax_online_cpu" in code
    bad = code.replace("def softmax_online_cpu(y, x):", "def softmax_online_cpu(y, x):\n    big = np.max(x)", 1)
    assert bad != code
    rec = grade_answers("ch08_softmax", {"q1": bad}, tmp_path, questions=["q1"])
    outs = outputs_by_question(rec.results)
    assert rec.per_question["q1"][0] == 0 and "np.max" in outs["q1"], outs["q1"][:3000]


@pytest.mark.slow
def test_class8_a_sorting_rule_is_enforced(tmp_path):
    """ch15's prompt forbids np.argsort and np.sort: a stable radix pass done by np.argsort scores 0, named."""
    code = ("import numpy as np\nfrom numba import njit\n\n\n@njit\ndef radix_pass(keys_out, vals_out, keys, vals, shift):\n"
            "    d = np.empty(keys.size, np.int64)\n    for i in range(keys.size):\n        d[i] = (keys[i] >> shift) & 15\n"
            "    order = np.argsort(d, kind='mergesort')\n    for i in range(keys.size):\n"
            "        keys_out[i] = keys[order[i]]\n        vals_out[i] = vals[order[i]]\n")
    rec = grade_answers("ch15_scan_histogram_sort", {"q3": code}, tmp_path, questions=["q3"])
    outs = outputs_by_question(rec.results)
    assert rec.per_question["q3"][0] == 0 and "argsort" in outs["q3"], outs["q3"][:3000]


# ------------------------------------------------------------------------------------- the sandbox itself
@PROTECTED
def test_the_sandbox_cannot_read_the_course_or_write_outside(tmp_path):
    """A plan run whose notebook tries each forbidden thing at load time: each statement must raise."""
    outside = tmp_path / "outside.txt"
    attempts = {
        "read_solution": f"A = open({str(ROOT / 'solutions' / 'ch01_axpy.md')!r}).read()",
        "read_measurements": f"B = open({str(ROOT / 'book' / 'data' / 'bench' / 'h100' / 'axpy_gpu.json')!r}).read()",
        "import_reference": "from kernels_src.ops.axpy import reference",
        "import_registry": "import kernels_src.registry",
        "write_outside": f"C = open({str(outside)!r}, 'w').write('x')",
        "connect": "import socket\nD = socket.create_connection(('127.0.0.1', 22), timeout=2)",
        "kill_grader": f"E = __import__('os').kill({os.getpid()}, 0)",
    }
    cells = [(i + 1, code) for i, code in enumerate(attempts.values())]
    cells.append((len(cells) + 1, "import numpy as np\nfrom numba import njit\n@njit\ndef f(out, x):\n    out[0] = x[0]"))
    from kernels_src.grading import bundle

    b = bundle.from_cells(cells)
    job = {"mode": "plan", "backend": "cpu", "function": "f", "kernels": [], "n_outputs": 1, "n_inputs": 1,
           "args": [], "cases": [], "racecheck": False, "forbid": [], "allow": [], "line_map": b.line_map}
    res = sandbox.run(job, b.source, timeout=120)
    assert res.status == "ok", (res.status, res.message, res.output_tail)
    errors = {e["cell"]: e["type"] for e in res.payload.get("load_errors", [])}
    for i, name in enumerate(attempts, start=1):
        assert i in errors, f"{name} succeeded inside the sandbox ({res.payload.get('confined')})"
    assert not outside.exists()
    assert any("Landlock" in c for c in res.payload.get("confined", [])), res.payload.get("confined")


def test_the_notebook_run_never_holds_the_hidden_checks(tmp_path):
    """The otter run of a notebook gets test files that only display the grader's verdicts, by key."""
    from kernels_src.grading.submission import _display_tests, load_autograder

    ag = load_autograder(autograder(SLUG))
    _display_tests(ag, tmp_path / "tests")
    for f in sorted((tmp_path / "tests").glob("*.py")):
        text = f.read_text()
        assert "verdict_keys=" in text and "sizes=" not in text and "edge=True" not in text, text
        original = (ag.source / "tests" / f.name).read_text()
        assert text.count("@test_case(") == original.count("@test_case(")
