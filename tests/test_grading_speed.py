"""A hanging submission costs about 1.5 check time limits: the notebook run's limit follows the checks'."""
from _grading_support import autograder
from kernels_src.grading import sandbox, submission
from kernels_src.grading.checks import Verdict
from kernels_src.grading.submission import load_autograder, notebook_timeout


def test_notebook_timeout_follows_the_check_timeouts(monkeypatch):
    ag = load_autograder(autograder())
    monkeypatch.setattr(submission, "NOTEBOOK_TIMEOUT", None)
    monkeypatch.setattr(sandbox, "DEFAULT_TIMEOUT", 60.0)
    ok = {"a": Verdict("a", "t", True, "")}
    hung = dict(ok, b=Verdict("b", "t", False, "", timed_out=True))
    assert notebook_timeout(ag, ok) == 60.0
    assert notebook_timeout(ag, hung) == 30.0
    monkeypatch.setattr(submission, "NOTEBOOK_TIMEOUT", 77.0)  # KERNELS_NOTEBOOK_TIMEOUT wins
    assert notebook_timeout(ag, hung) == 77.0
