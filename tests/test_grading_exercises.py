"""Every master notebook in solutions/: its generated exercise is committed and up to date, hidden
tests never reach exercises/, every question has visible and hidden checks, and the solution scores
full marks. New exercises (solutions/chNN_*.md) are picked up automatically."""
import ast

import pytest

from _grading_support import ROOT, generated
from kernels_src.grading import corpus, exercises
from kernels_src.grading.cli import compare_trees
from kernels_src.grading.submission import grade_submission, load_autograder

MASTERS = sorted((ROOT / "solutions").glob("ch[0-9][0-9]_*.md"))
SLUGS = [m.stem for m in MASTERS]


def test_there_is_at_least_one_exercise():
    assert "ch01_axpy" in SLUGS


@pytest.mark.parametrize("slug", SLUGS)
def test_committed_exercise_is_up_to_date(slug):
    drift = compare_trees(generated(slug) / "exercises", exercises.EXERCISES, [slug])
    assert not drift, "regenerating changes the committed exercises (run `make exercises`):\n" + "\n".join(drift)


def test_generation_is_deterministic(tmp_path):
    exercises.generate(["ch01_axpy"], tmp_path / "a", tmp_path / "ba", quiet=True)
    exercises.generate(["ch01_axpy"], tmp_path / "b", tmp_path / "bb", quiet=True)
    assert not compare_trees(tmp_path / "a", tmp_path / "b", ["ch01_axpy"])
    za, zb = (tmp_path / d / "ch01_axpy" / "autograder.zip" for d in ("ba", "bb"))
    assert za.read_bytes() == zb.read_bytes()


def _hidden_test_functions(ag_source):
    names, bodies = set(), []
    for f in sorted((ag_source / "tests").glob("*.py")):
        tree = ast.parse(f.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                for d in node.decorator_list:
                    if isinstance(d, ast.Call) and any(k.arg == "hidden" and getattr(k.value, "value", False)
                                                       for k in d.keywords):
                        names.add(node.name)
                        bodies.append(ast.unparse(node.body[-1]))
    return names, bodies


@pytest.mark.parametrize("slug", SLUGS)
def test_hidden_tests_never_ship_in_exercises(slug):
    source = generated(slug) / "build" / slug / "source"
    names, bodies = _hidden_test_functions(source)
    assert names, f"{slug} has no hidden tests"
    shipped = "\n".join(p.read_text(errors="replace") for p in exercises.EXERCISES.rglob("*") if p.is_file())
    for name in names:
        assert name not in shipped, f"hidden test {name} appears in exercises/"
    for body in bodies:
        assert body not in shipped, f"a hidden check appears in exercises/: {body}"
    for marker in ("# BEGIN SOLUTION", "# END SOLUTION", "hidden=True", "BEGIN TEST CONFIG"):
        assert marker not in shipped, f"{marker!r} leaked into exercises/"


@pytest.mark.parametrize("slug", SLUGS)
def test_every_question_has_visible_and_hidden_checks(slug):
    ag = load_autograder(generated(slug) / "build" / slug)
    assert ag.plan
    for q, cases in ag.plan.items():
        assert cases and all(cases), f"{slug}/{q}: a test case without a check_cpu/check_gpu call"
        hidden = [s.hidden for case in cases for s in case]
        assert any(hidden) and not all(hidden), f"{slug}/{q}: needs a visible and a hidden (hidden=True) check"


@pytest.mark.slow
@pytest.mark.parametrize("slug", SLUGS)
def test_solution_scores_full_marks(slug, tmp_path):
    nb = corpus.write_ipynb(corpus.solution_submission(slug), tmp_path / f"{slug}.ipynb")
    rec = grade_submission(nb, generated(slug) / "build" / slug, jobs=2, run_otter=False)
    assert rec.possible > 0
    assert rec.score == rec.possible, "\n".join(t.get("output", "") for t in rec.results["tests"])


@pytest.mark.slow
@pytest.mark.parametrize("slug", SLUGS)
def test_untouched_stubs_score_zero_with_a_clear_message(slug, tmp_path):
    from _grading_support import grade_answers

    rec = grade_answers(slug, {"stub": ""}, tmp_path)
    assert rec.possible > 0 and rec.score == 0
    out = "\n".join(t.get("output", "") for t in rec.results["tests"])
    assert "still the stub" in out
