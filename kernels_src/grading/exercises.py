"""Generate the student exercises and the autograder from the master notebooks (``make exercises``).

For each ``solutions/chNN_<slug>.md`` (jupytext MyST, otter-assign format v1):

1. convert it to ``.ipynb`` in a temporary directory and run ``otter assign`` on it (no test run, no PDF);
2. write the student notebook, solutions replaced by stubs, as MyST text to ``exercises/chNN_<slug>.md``
   (its init cell points otter at ``exercises/tests/chNN_<slug>/``), and the *public* tests there;
3. write the autograder, with the hidden tests, outside ``exercises/``, under
   ``_build/autograder/chNN_<slug>/``: ``source/`` (the unpacked autograder, used by ``kernels grade``)
   and ``autograder.zip`` (for Gradescope: ``setup.sh`` installs pinned packages from PyPI and the
   course library, ``run_autograder`` grades ``/autograder/submission`` into
   ``/autograder/results/results.json``).

Generation is deterministic (no timestamps, no cell ids, sorted zip entries with a fixed date), so a test
can regenerate into a temporary directory and compare with the committed ``exercises/``.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
BUILD = ROOT / "_build" / "autograder"
# What the autograder needs at grading time; requirements.txt pins these and everything they depend on,
# at the versions installed here (which requirements.lock fixes).
GRADING_PACKAGES = ["numpy", "numba", "numba-cuda", "tqdm", "otter-grader", "jupytext", "ipykernel", "nbconvert",
                    "nbformat", "nvidia-cuda-nvcc", "nvidia-cuda-nvrtc", "nvidia-nvvm", "cuda-bindings",
                    "cuda-pathfinder"]
# Declared by otter-grader's dependencies but never used to grade: Playwright (nbconvert[webpdf], a PDF export
# through Chromium; the autograder writes no PDF) and Sphinx (fica's documentation directive). They and what only
# they need stay out of requirements.txt, which setup.sh installs with --no-deps so that pip does not add them back.
NOT_FOR_GRADING = ("playwright", "sphinx")
ZIP_DATE = (2020, 1, 1, 0, 0, 0)

INIT_CELL = '''# Initialize Otter: grader.check("q1") runs the visible checks of question 1 (tests/{slug}/).
# See ../book/how_grading_works.md for what is checked and how the autograder grades.
import otter

grader = otter.Notebook(tests_dir="tests/{slug}")'''
# The end of every student notebook: how to hand it in (kernels_src/tools/submit.py; `kernels submit` in a terminal).
SUBMIT_TEXT = """## Hand it in

Save the notebook (*File, Save Notebook*, or Ctrl+S), then run the cell below. It writes
`submissions/{slug}.ipynb` at the top of the course folder: the file to upload to Gradescope, and the one
`kernels grade submissions/ --exercise {slug}` grades here. It refuses, with one line, if the saved file does
not hold the answers you ran. In a terminal, `kernels submit exercises/{slug}.md` does the same."""
SUBMIT_CELL = '''from kernels_src.tools.submit import submit

submit("{slug}.md")'''


def masters(names=None) -> list[Path]:
    found = sorted(SOLUTIONS.glob("ch[0-9][0-9]_*.md"))
    if names:
        want = {n.removesuffix(".md") for n in names}
        found = [p for p in found if p.stem in want]
        missing = want - {p.stem for p in found}
        if missing:
            raise SystemExit(f"no master notebook solutions/{sorted(missing)[0]}.md")
    return found


def _clean_notebook(nb, slug: str):
    """Student notebook: our init cell, no outputs, no cell ids, only the metadata that matters."""
    for cell in nb.cells:
        cell.pop("id", None)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
            src = cell.source if isinstance(cell.source, str) else "".join(cell.source)
            if src.startswith("# Initialize Otter"):
                cell.source = INIT_CELL.format(slug=slug)
        md = cell.get("metadata", {})
        for k in ("execution", "collapsed", "scrolled"):
            md.pop(k, None)
        if cell.cell_type == "markdown":  # otter locks prompts; in MyST text that is only noise
            md.pop("deletable", None)
            md.pop("editable", None)
    keep = {k: nb.metadata[k] for k in ("kernelspec", "jupytext") if k in nb.metadata}
    if "otter" in nb.metadata:  # otter checks that a submission is for this assignment
        keep["otter"] = {"assignment_name": nb.metadata["otter"].get("assignment_name", slug)}
    if "jupytext" in keep:
        keep["jupytext"] = {k: v for k, v in keep["jupytext"].items() if k in ("text_representation",)}
        keep["jupytext"]["text_representation"] = {"extension": ".md", "format_name": "myst"}
        if "otter" in keep:
            keep["jupytext"]["notebook_metadata_filter"] = "otter"
    nb.metadata = keep
    nb.nbformat, nb.nbformat_minor = 4, 5
    return nb


def _public_tests_only(src: str) -> bool:
    return "hidden=True" not in src


def generate_one(master: Path, exercises_dir: Path, build_dir: Path, *, zip_: bool = True) -> dict:
    import jupytext
    import nbformat
    from otter.assign import main as otter_assign

    slug = master.stem
    with tempfile.TemporaryDirectory(prefix="kexercise-") as tmp:
        tmp = Path(tmp)
        nb = jupytext.read(master)
        master_nb = tmp / f"{slug}.ipynb"
        nbformat.write(nb, master_nb)
        log = io.StringIO()
        cwd = os.getcwd()
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                otter_assign(str(master_nb), str(tmp / "dist"), no_pdfs=True, no_run_tests=True)
        except Exception as e:
            raise RuntimeError(f"otter assign failed on {master}: {e}\n{log.getvalue()[-3000:]}") from e
        finally:
            os.chdir(cwd)
        student = nbformat.read(tmp / "dist" / "student" / f"{slug}.ipynb", as_version=4)
        student = _clean_notebook(student, slug)
        student.cells += [nbformat.v4.new_markdown_cell(SUBMIT_TEXT.format(slug=slug)),
                          nbformat.v4.new_code_cell(SUBMIT_CELL.format(slug=slug))]
        for cell in student.cells[-2:]:
            cell.pop("id", None)
        text = jupytext.writes(student, fmt="md:myst")
        exercises_dir.mkdir(parents=True, exist_ok=True)
        out_md = exercises_dir / f"{slug}.md"
        _write_if_changed(out_md, text)
        # public tests, next to the student notebook
        pub_src = tmp / "dist" / "student" / "tests"
        pub_dst = exercises_dir / "tests" / slug
        if pub_dst.exists():
            shutil.rmtree(pub_dst)
        pub_dst.mkdir(parents=True)
        for f in sorted(pub_src.glob("*.py")):
            body = f.read_text(encoding="utf-8")
            if not _public_tests_only(body):
                raise RuntimeError(f"otter put a hidden test into the student's {f.name}; refusing to publish it")
            _write_if_changed(pub_dst / f.name, body)
        # the autograder: hidden tests included, outside exercises/
        ag = tmp / "dist" / "autograder"
        dst = build_dir / slug
        if dst.exists():
            shutil.rmtree(dst)
        source = dst / "source"
        (source / "tests").mkdir(parents=True)
        for f in sorted((ag / "tests").glob("*.py")) if (ag / "tests").exists() else []:
            shutil.copy(f, source / "tests" / f.name)
        if not any((source / "tests").iterdir()):
            _tests_from_zip(ag, source / "tests")
        config = json.loads((ag / "otter_config.json").read_text())
        (source / "otter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        (source / "exercise.json").write_text(json.dumps({"slug": slug, "master": f"solutions/{slug}.md"},
                                                         indent=2) + "\n")
        shutil.copy(tmp / "dist" / "autograder" / f"{slug}.ipynb", dst / "solution.ipynb")
        if zip_:
            _write_gradescope_files(source)
            _zip_dir(source, dst / "autograder.zip")
    return {"slug": slug, "student": out_md, "public_tests": pub_dst, "autograder": dst}


def _tests_from_zip(ag: Path, dest: Path) -> None:
    zips = sorted(ag.glob("*.zip"))
    if not zips:
        raise RuntimeError(f"otter assign produced no tests in {ag}")
    with zipfile.ZipFile(zips[0]) as z:
        for name in z.namelist():
            if name.startswith("tests/") and name.endswith(".py"):
                (dest / Path(name).name).write_bytes(z.read(name))


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


# ---------------------------------------------------------------------------------- Gradescope files
SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, to build the grading image. It installs a Python >= 3.11, the
# pinned packages of requirements.txt from PyPI (the whole set, hence --no-deps), and the course library
# shipped in this zip.
set -euo pipefail
cd /autograder/source
PY=""
for cand in python3.12 python3.11 python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        PY=$(command -v "$cand"); break
    fi
done
if [ -z "$PY" ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y python3.11 python3.11-venv
    PY=$(command -v python3.11)
fi
"$PY" -m venv /autograder/venv
/autograder/venv/bin/python -m pip install --upgrade pip
/autograder/venv/bin/python -m pip install --no-cache-dir --no-deps -r requirements.txt
/autograder/venv/bin/python -m pip install --no-cache-dir --no-deps ./course
/autograder/venv/bin/python -m ipykernel install --sys-prefix --name python3
KERNELS_BENCH_DATA=/autograder/source/course/book/data/bench \
    /autograder/venv/bin/python -m kernels_src.grading.submission --self-test /autograder/source
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission. It grades /autograder/submission into
# /autograder/results/results.json. AUTOGRADER_ROOT and KERNELS_AUTOGRADER_PYTHON let a local test run it
# in a copy of that layout with an existing environment.
ROOT="${AUTOGRADER_ROOT:-/autograder}"
PY="${KERNELS_AUTOGRADER_PYTHON:-/autograder/venv/bin/python}"
export KERNELS_BENCH_DATA="$ROOT/source/course/book/data/bench"
exec "$PY" -m kernels_src.grading.gradescope "$ROOT"
"""


def pinned_requirements() -> str:
    """requirements.txt: the grading packages and their whole dependency closure, at installed versions, less
    NOT_FOR_GRADING and what only they depend on."""
    from importlib import metadata

    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    # Gradescope grades on Linux: judge the packages' markers there, whatever machine builds the zip.
    env = dict(default_environment(), sys_platform="linux", platform_system="Linux", os_name="posix",
               platform_machine="x86_64")
    seen: dict[str, str] = {}
    todo = [(p, ()) for p in GRADING_PACKAGES]
    extras_for = {"otter-grader": ("grading",), "numba-cuda": ("cu13",)}
    while todo:
        name, extras = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in NOT_FOR_GRADING:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if key in seen and not extras:
            continue
        seen[key] = dist.version
        extras = tuple(extras) + extras_for.get(key, ())
        for req_text in dist.requires or []:
            req = Requirement(req_text)
            ok = False
            for extra in ("",) + tuple(extras):
                if req.marker is None or req.marker.evaluate(dict(env, extra=extra)):
                    ok = True
                    break
            if ok:
                todo.append((req.name, tuple(req.extras)))
    # Built on a Mac, numba-cuda and its CUDA wheels are not installed (none exists for macOS), yet the
    # autograder needs them for its PTX check: take them from requirements.lock, whose lines marked
    # `sys_platform != "darwin"` are exactly that set.
    if "numba-cuda" not in seen:
        for line in (ROOT / "requirements.lock").read_text().splitlines():
            pin, _, marker = (x.strip() for x in line.partition(";"))
            if "==" in pin and marker.replace("'", '"') == 'sys_platform != "darwin"':
                name, version = pin.split("==")
                seen.setdefault(re.sub(r"[-_.]+", "-", name).lower(), version)
    lines = [f"{k}=={v}" for k, v in sorted(seen.items())]
    return ("# Pinned from the course environment (requirements.lock) by `make exercises`.\n"
            + "\n".join(lines) + "\n")


def _write_gradescope_files(source: Path) -> None:
    (source / "setup.sh").write_text(SETUP_SH)
    (source / "run_autograder").write_text(RUN_AUTOGRADER)
    (source / "requirements.txt").write_text(pinned_requirements())
    course = source / "course"
    course.mkdir()
    for name in ("pyproject.toml", "README.md"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, course / name)
    shutil.copytree(ROOT / "kernels_src", course / "kernels_src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    # The committed benchmark data: predict-then-measure questions are graded against it. The package is
    # installed (not editable) there, so run_autograder points KERNELS_BENCH_DATA at this copy.
    shutil.copytree(ROOT / "book" / "data" / "bench", course / "book" / "data" / "bench",
                    ignore=shutil.ignore_patterns("*.tmp"))


def _zip_dir(src: Path, dest: Path) -> None:
    files = sorted(p for p in src.rglob("*") if p.is_file())
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as z:
        for p in files:
            rel = p.relative_to(src).as_posix()
            info = zipfile.ZipInfo(rel, ZIP_DATE)
            mode = 0o755 if rel in ("setup.sh", "run_autograder") else 0o644
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, p.read_bytes())


def generate(names=None, exercises_dir: Path = EXERCISES, build_dir: Path = BUILD, zip_: bool = True,
             quiet: bool = False) -> list[dict]:
    results = []
    for m in masters(names):
        r = generate_one(m, Path(exercises_dir), Path(build_dir), zip_=zip_)
        results.append(r)
        if not quiet:
            print(f"{m.relative_to(ROOT) if m.is_relative_to(ROOT) else m} -> {r['student']}  "
                  f"(autograder: {r['autograder']})")
    return results


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="*", help="e.g. ch01_axpy (default: every solutions/chNN_*.md)")
    p.add_argument("--exercises-dir", default=str(EXERCISES))
    p.add_argument("--build-dir", default=str(BUILD))
    p.add_argument("--no-zip", action="store_true")
    a = p.parse_args(argv)
    generate(a.names, Path(a.exercises_dir), Path(a.build_dir), zip_=not a.no_zip)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
