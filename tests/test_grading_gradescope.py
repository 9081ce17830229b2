"""The Gradescope autograder zip, run in a recreated /autograder layout (with this environment, offline)."""
import json
import os
import re
import stat
import subprocess
import sys
import zipfile
from importlib import metadata

import pytest

from _grading_support import ROOT, autograder, corpus_submission


def _unzip(dest):
    with zipfile.ZipFile(autograder() / "autograder.zip") as z:
        z.extractall(dest)
        return {i.filename: i for i in z.infolist()}


def test_zip_contents_and_pinned_requirements(tmp_path):
    infos = _unzip(tmp_path)
    for name in ("setup.sh", "run_autograder", "requirements.txt", "otter_config.json", "tests/q1.py",
                 "course/pyproject.toml", "course/kernels_src/__init__.py", "course/kernels_src/grading/worker.py"):
        assert name in infos, name
    for name in ("setup.sh", "run_autograder"):
        assert (infos[name].external_attr >> 16) & stat.S_IXUSR, f"{name} is not executable"
    assert subprocess.run(["bash", "-n", str(tmp_path / "setup.sh")]).returncode == 0
    setup = (tmp_path / "setup.sh").read_text()
    assert "pip install --no-cache-dir --no-deps -r requirements.txt" in setup and "./course" in setup
    reqs = [ln for ln in (tmp_path / "requirements.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[^=\s]+", r) for r in reqs), reqs
    pins = dict(r.split("==") for r in reqs)
    lock = dict(ln.split(";")[0].strip().split("==") for ln in (ROOT / "requirements.lock").read_text().splitlines()
                if "==" in ln)  # (a pin may carry a platform marker: `numba-cuda==0.30.4 ; sys_platform != "darwin"`)
    lock = {re.sub(r"[-_.]+", "-", k).lower(): v for k, v in lock.items()}
    for pkg in ("numpy", "numba", "numba-cuda", "otter-grader", "jupytext", "ipykernel", "nvidia-nvvm"):
        try:
            want = metadata.version(pkg)
        except metadata.PackageNotFoundError:  # the macOS set (no CUDA wheels): the zip takes the Linux pin
            want = lock[pkg]
        assert pins[pkg] == want, pkg
    assert "appnope" not in pins  # Gradescope runs Linux, whatever machine built the zip
    # Only what grading needs: no browser driver, no site or documentation builder, no test runner
    for name in ("playwright", "greenlet", "sphinx", "alabaster", "sphinxcontrib-jsmath", "jupyter-book", "pytest",
                 "matplotlib", "jupyterlab", "hypothesis"):
        assert name not in pins, f"{name} is in the autograder's requirements.txt"
    _assert_closed(pins)
    for k, v in pins.items():
        if k in lock:
            assert lock[k] == v, f"{k}: zip pins {v}, requirements.lock has {lock[k]}"
    assert "hidden=True" in (tmp_path / "tests" / "q1.py").read_text()


def _assert_closed(pins):
    """setup.sh installs requirements.txt with --no-deps: every requirement of a pinned package (judged for Linux)
    must be pinned too, or be one that grading leaves out on purpose (NOT_FOR_GRADING)."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    from kernels_src.grading.exercises import NOT_FOR_GRADING

    env = dict(default_environment(), sys_platform="linux", platform_system="Linux", os_name="posix",
               platform_machine="x86_64", extra="")
    unmet = []
    for name in pins:
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:  # the macOS set: the CUDA wheels are pinned from the lock
            continue
        for text in requires:
            req = Requirement(text)
            key = re.sub(r"[-_.]+", "-", req.name).lower()
            if (req.marker is None or req.marker.evaluate(env)) and key not in pins and key not in NOT_FOR_GRADING:
                unmet.append(f"{name} needs {text}")
    assert not unmet, unmet


def _run_autograder(tmp_path, submission_file):
    root = tmp_path / "autograder"
    (root / "source").mkdir(parents=True)
    (root / "submission").mkdir()
    (root / "results").mkdir()
    with zipfile.ZipFile(autograder() / "autograder.zip") as z:
        z.extractall(root / "source")
    if submission_file is not None:
        (root / "submission" / submission_file.name).write_bytes(submission_file.read_bytes())
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), KERNELS_AUTOGRADER_PYTHON=sys.executable)
    p = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads((root / "results" / "results.json").read_text())


@pytest.mark.slow
def test_run_autograder_grades_the_solution(tmp_path):
    res = _run_autograder(tmp_path, corpus_submission("solution", tmp_path))
    scores = {t["name"]: (t["score"], t["max_score"]) for t in res["tests"] if "max_score" in t}
    assert scores == {"q1": (3, 3), "q2": (3, 3), "q3": (3, 3), "q4": (2, 2)}, json.dumps(res, indent=1)[:3000]
    assert res["score"] == 11
    public = [t for t in res["tests"] if t["name"] == "Public Tests"][0]
    assert public["visibility"] == "visible" and public["status"] == "passed"
    assert all(t["visibility"] == "after_published" for t in res["tests"] if "max_score" in t)
    assert res["extra_data"]["otter"]["status"] == "ok"  # otter ran the notebook, and agreed


@pytest.mark.slow
@pytest.mark.parametrize("case", ["malformed", None])
def test_run_autograder_always_writes_a_result(tmp_path, case):
    res = _run_autograder(tmp_path, corpus_submission(case, tmp_path) if case else None)
    assert res["score"] == 0
    assert "could not be graded" in res["output"]
