"""`kernels submit` (kernels_src/tools/submit.py): the exercise notebook a student worked in becomes the .ipynb
that the grader and Gradescope take. End to end: the master's answers, written into the exercise as a jupytext
.md (what JupyterLab saves), submitted, then graded by `kernels grade` to full marks. Bad input: one line,
exit status 2, nothing written."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SLUG = "ch01_axpy"


def _kernels(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "kernels_src", *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=300)


def _worked_exercise(home: Path, answers: dict | None = None) -> Path:
    """``home/exercises/ch01_axpy.md``: the student notebook with the master's answers (or ``answers``), as
    JupyterLab's jupytext saves it."""
    import jupytext

    from kernels_src.grading import corpus

    nb = corpus.build_submission(SLUG, answers or {})
    nb.metadata["jupytext"] = {"text_representation": {"extension": ".md", "format_name": "myst"},
                               "notebook_metadata_filter": "otter"}
    path = home / "exercises" / f"{SLUG}.md"
    path.parent.mkdir(parents=True)
    jupytext.write(nb, path, fmt="md:myst")
    return path


def test_submit_writes_the_exercise_as_an_ipynb(tmp_path):
    import nbformat

    src = _worked_exercise(tmp_path / "home")
    r = _kernels("submit", src, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "home" / "submissions" / f"{SLUG}.ipynb"   # beside exercises/, not in the cwd
    assert out.is_file() and str(out) in r.stdout, r.stdout
    assert not (tmp_path / "submissions").exists()
    nb = nbformat.read(out, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["otter"]["assignment_name"] == SLUG
    import jupytext

    want = [(c.cell_type, c.source) for c in jupytext.read(src).cells]
    assert [(c.cell_type, c.source) for c in nb.cells] == want
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
    # --out: a folder that exists; the file is named after the exercise whatever the source is called
    renamed = src.with_name("my work.md")
    renamed.write_text(src.read_text())
    (tmp_path / "out").mkdir()
    r = _kernels("submit", renamed, "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / f"{SLUG}.ipynb").read_text() == out.read_text()


@pytest.mark.parametrize("case", ["missing", "folder", "not_exercise", "bad_json", "empty", "suffix", "out_missing"])
def test_submit_refuses_bad_input_with_one_line(tmp_path, case):
    good = ROOT / "exercises" / f"{SLUG}.md"
    args = {
        "missing": [tmp_path / "nope.md"],
        "folder": [ROOT / "exercises"],
        "not_exercise": [ROOT / "README.md"],
        "bad_json": [tmp_path / "broken.ipynb"],
        "empty": [tmp_path / "empty.md"],
        "suffix": [tmp_path / "notes.txt"],
        "out_missing": [good, "--out", tmp_path / "no" / "such"],
    }[case]
    (tmp_path / "broken.ipynb").write_text('{"cells": [')
    (tmp_path / "empty.md").write_text("")
    (tmp_path / "notes.txt").write_text("hello")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    r = _kernels("submit", *args, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kernels submit: error: "), r.stderr
    assert "Traceback" not in r.stderr and not r.stdout
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_unsaved_answers_are_refused():
    """In JupyterLab the cell compares the saved file with what the kernel ran: an answer typed and run but
    not saved must not be submitted as the stub."""
    import nbformat

    from kernels_src.tools.submit import unsaved_functions

    saved = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("def axpy_cpu(out, a, x, y):\n    ...\n"),
                                           nbformat.v4.new_code_cell("def helper():\n    return 1\n")])
    answer = "def axpy_cpu(out, a, x, y):\n    for i in range(x.size):\n        out[i] = a * x[i] + y[i]\n"
    assert unsaved_functions(saved, ["import numpy as np", answer]) == ["axpy_cpu"]
    # ran the stub, then saved the same: nothing to say; a function the file does not define is not judged
    assert unsaved_functions(saved, ["def axpy_cpu(out, a, x, y):\n  ...", "def scratch():\n    pass"]) == []
    # the last version run counts: the answer, then the stub again (as saved)
    assert unsaved_functions(saved, [answer, "def axpy_cpu(out, a, x, y):\n    ..."]) == []
    saved.cells[0].source = answer
    assert unsaved_functions(saved, [answer]) == []


@pytest.mark.slow
def test_submission_of_the_masters_answers_grades_full_marks(tmp_path):
    from _grading_support import generated

    src = _worked_exercise(tmp_path / "home")
    r = _kernels("submit", src)
    assert r.returncode == 0, r.stderr
    subs = tmp_path / "home" / "submissions"
    assert [p.name for p in subs.iterdir()] == [f"{SLUG}.ipynb"]
    book = tmp_path / "gradebook.csv"
    r = _kernels("grade", subs, "--autograder", generated(SLUG) / "build" / SLUG, "--no-otter", "--jobs", "1",
                 "--out", book)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = list(csv.DictReader(book.open()))
    assert len(rows) == 1 and rows[0]["exercise"] == SLUG, rows
    score, possible = float(rows[0]["score"]), float(rows[0]["possible"])
    results = json.loads(next((tmp_path / "gradebook_results").rglob("results.json")).read_text())
    assert possible > 0 and score == possible, (rows, [t.get("output", "") for t in results["tests"]])


def test_the_grader_leaves_the_hand_in_cell_out():
    """The grader's process has only kernels_src.device and .compiler: the hand-in cell's import would be a
    'could not load' note on every submission. The bundle leaves it out, and keeps the student's imports."""
    from kernels_src.grading import bundle
    from kernels_src.grading.exercises import SUBMIT_CELL

    b = bundle.from_cells([(1, "import numpy as np\nfrom kernels_src.compiler import cuda"),
                           (2, SUBMIT_CELL.format(slug=SLUG))])
    src = b.source.split("\n", 1)[1]
    assert "import numpy as np" in src and "from kernels_src.compiler import cuda" in src
    assert "submit" not in src and not b.notes, (src, b.notes)
