"""`kernels grade SUBMISSIONS --out gradebook.csv`: parallel, resumable, atomic, one results.json each."""
import csv
import json
import subprocess
import sys
import zipfile

import pytest

from _grading_support import autograder, corpus_submission
from kernels_src.grading.batch import grade_folder


@pytest.mark.slow
def test_batch_grading_resumes_and_writes_everything(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    corpus_submission("wrong_math", subs)
    corpus_submission("malformed", subs)
    stub = corpus_submission("stub", tmp_path)
    with zipfile.ZipFile(subs / "carol.zip", "w") as z:  # a zipped submission
        z.write(stub, "ch01_axpy.ipynb")
    (subs / "dave").mkdir()  # one folder per student, as Gradescope exports them
    corpus_submission("raise_in_answer_cell", subs / "dave")  # q2's cell raises: the others still count
    out = tmp_path / "gradebook.csv"
    ag = autograder()

    s1 = grade_folder(subs, out, autograder=ag, jobs=2, run_otter=False, progress=False)
    assert (s1["graded"], s1["skipped"], s1["total"]) == (4, 0, 4)
    rows = {r["submission"]: r for r in csv.DictReader(out.open())}
    assert set(rows) == {"wrong_math", "malformed", "carol", "dave"}
    wm = json.loads((tmp_path / "gradebook_results" / "wrong_math" / "results.json").read_text())
    # Full marks for every question but the broken one (points read from the results, not typed here).
    points = {t["name"]: t["max_score"] for t in wm["tests"] if "max_score" in t}
    assert set(points) >= {"q1", "q2"}, points
    all_but = {q: sum(v for k, v in points.items() if k != q) for q in ("q1", "q2")}
    assert float(rows["wrong_math"]["score"]) == all_but["q1"] and rows["wrong_math"]["q1"] == "0", \
        json.dumps(wm)[:3000]
    assert float(rows["malformed"]["score"]) == 0 and rows["malformed"]["status"] == "unreadable"
    assert float(rows["carol"]["score"]) == 0 and float(rows["dave"]["score"]) == all_but["q2"]
    results = tmp_path / "gradebook_results"
    for sid in rows:
        res = json.loads((results / sid / "results.json").read_text())
        assert "score" in res and "tests" in res
    assert sorted(p.name for p in results.rglob("*") if p.is_file()) == ["results.json"] * 4  # no temp files left
    assert not list(tmp_path.glob("gradebook.csv.*"))

    s2 = grade_folder(subs, out, autograder=ag, jobs=2, run_otter=False, progress=False)
    assert (s2["graded"], s2["skipped"]) == (0, 4)  # resumed: nothing to do

    (subs / "wrong_math.ipynb").write_bytes(stub.read_bytes())  # a resubmission: this file changed
    s3 = grade_folder(subs, out, autograder=ag, jobs=2, run_otter=False, progress=False)
    assert (s3["graded"], s3["skipped"]) == (1, 3)
    rows = {r["submission"]: r for r in csv.DictReader(out.open())}
    assert float(rows["wrong_math"]["score"]) == 0 and float(rows["dave"]["score"]) == all_but["q2"]


def test_cli_grade_help_and_exercises_check():
    p = subprocess.run([sys.executable, "-m", "kernels_src", "grade", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "--out" in p.stdout and "--solution" in p.stdout
    p = subprocess.run([sys.executable, "-m", "kernels_src", "exercises", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "--check" in p.stdout
