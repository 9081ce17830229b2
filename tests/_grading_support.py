"""Shared by the tests/test_grading_*.py files: each exercise's autograder (ch01_axpy by default), generated
once per process, and the corpora of bad submissions (tests/corpus/<slug>/, one directory per exercise)."""
import functools
import json
import os
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "corpus"


def corpus_slugs() -> list[str]:
    """The exercises with a corpus: each directory of tests/corpus/ that holds an expected.json."""
    return sorted(d.name for d in CORPUS.iterdir() if (d / "expected.json").is_file())


@functools.lru_cache(maxsize=None)
def corpus_expected(slug: str) -> dict:
    """{case: its expected outcome} from tests/corpus/<slug>/expected.json."""
    return json.loads((CORPUS / slug / "expected.json").read_text())


def corpus_files(slug: str) -> set[str]:
    """The names of the cases in tests/corpus/<slug>/ (each ``*.py`` or ``*.ipynb`` file)."""
    return {p.stem for p in (CORPUS / slug).iterdir() if p.suffix in (".py", ".ipynb")}


def corpus_cases() -> list[tuple[str, str]]:
    """Every (slug, case) of every corpus, sorted."""
    return [(slug, name) for slug in corpus_slugs() for name in sorted(corpus_expected(slug))]


@functools.lru_cache(maxsize=None)
def generated(slug: str = "ch01_axpy") -> Path:
    """A temporary directory holding exercises/ and build/ freshly generated from solutions/<slug>.md.

    Generated once per test session, not once per pytest-xdist worker: under tests/conftest.py's session folder
    (``KERNELS_TEST_SHARED``) the first worker to finish one moves it into place and the others take it
    (about 2.5 CPU seconds an exercise, the jupytext and otter-assign work). Tests only read it."""
    from kernels_src.grading import exercises

    shared = os.environ.get("KERNELS_TEST_SHARED")
    root = Path(shared) / "generated" if shared and Path(shared).is_dir() else None
    if root is not None and (root / slug / "done").is_file():
        return root / slug
    if root is not None:
        root.mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{slug}.tmp-" if root else "kgrading-test-", dir=root))
    exercises.generate([slug], tmp / "exercises", tmp / "build", zip_=True, quiet=True)
    if root is None:
        return tmp
    (tmp / "done").write_text("")
    try:
        os.rename(tmp, root / slug)  # atomic; fails when another worker's copy is already in place
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return root / slug


def autograder(slug: str = "ch01_axpy") -> Path:
    return generated(slug) / "build" / slug


def corpus_submission(name: str, dest: Path, slug: str = "ch01_axpy") -> Path:
    """The corpus entry ``name`` as a notebook file under ``dest``."""
    from kernels_src.grading import corpus

    src = CORPUS / slug / f"{name}.py"
    if src.exists():
        nb = corpus.build_submission(slug, corpus.parse_answers(src.read_text()))
        return corpus.write_ipynb(nb, Path(dest) / f"{name}.ipynb")
    if name == "solution":
        return corpus.write_ipynb(corpus.solution_submission(slug), Path(dest) / "solution.ipynb")
    path = CORPUS / slug / f"{name}.ipynb"
    out = Path(dest) / path.name
    out.write_bytes(path.read_bytes())
    return out


def outputs_by_question(results: dict) -> dict:
    """{question: its output text} from a Gradescope results dict."""
    return {t["name"]: t.get("output", "") for t in results.get("tests", []) if "max_score" in t}


def grade_answers(slug: str, answers: dict, tmp_path: Path, questions=None):
    """Grade a submission made of ``answers`` (question -> code) to exercise ``slug`` (no otter run)."""
    from kernels_src.grading import corpus
    from kernels_src.grading.submission import grade_submission

    nb = corpus.write_ipynb(corpus.build_submission(slug, answers), Path(tmp_path) / f"{slug}.ipynb")
    return grade_submission(nb, autograder(slug), jobs=2, run_otter=False, questions=questions)
