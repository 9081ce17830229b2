"""The corpus of bad submissions (tests/corpus/ch01_axpy/): each gets its expected score and message.

Most cases grade only the question they break (the others are the master's solution); the cases that
attack the notebook run itself (os._exit at top level, patching numpy and the checker) also go through
otter. Every case must produce a complete record: no exception escapes the grader. That the solutions
score full marks is tested in test_grading_exercises.py (every exercise) and test_grading_gradescope.py.
"""
import json

import pytest

from _grading_support import CORPUS, autograder, corpus_submission, outputs_by_question
from kernels_src.grading import sandbox
from kernels_src.grading.submission import grade_submission

EXPECTED = json.loads((CORPUS / "ch01_axpy" / "expected.json").read_text())


def test_every_corpus_file_has_an_expected_outcome():
    files = {p.stem for p in (CORPUS / "ch01_axpy").iterdir() if p.suffix in (".py", ".ipynb")}
    assert files <= set(EXPECTED), f"no expected outcome for {sorted(files - set(EXPECTED))}"
    assert set(EXPECTED) <= files


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_case(name, tmp_path, monkeypatch):
    exp = EXPECTED[name]
    if "timeout" in exp:
        monkeypatch.setattr(sandbox, "DEFAULT_TIMEOUT", float(exp["timeout"]))
    sub = corpus_submission(name, tmp_path)
    rec = grade_submission(sub, autograder(), jobs=2, run_otter=exp.get("otter", False), questions=exp["questions"])
    if "max_seconds" in exp:  # a hanging question stops after its first timeout
        assert rec.seconds < exp["max_seconds"], f"{name}: graded in {rec.seconds:.1f} s"
    outputs = outputs_by_question(rec.results)
    got = {q: rec.per_question[q][0] for q in exp["scores"]}
    assert got == exp["scores"], f"{name}: scores {got}, expected {exp['scores']}\n{json.dumps(outputs, indent=1)[:6000]}"
    assert rec.status == exp.get("status", "graded")
    for q, phrases in exp.get("contains", {}).items():
        for phrase in phrases:
            assert phrase in outputs[q], f"{name}/{q}: {phrase!r} not in the feedback:\n{outputs[q][:4000]}"
    for q, phrases in exp.get("absent", {}).items():
        for phrase in phrases:
            assert phrase not in outputs[q], f"{name}/{q}: {phrase!r} should not be in the feedback:\n{outputs[q][:4000]}"
    for phrase in exp.get("output", []):
        assert phrase in rec.results.get("output", ""), f"{name}: {phrase!r} not in:\n{rec.results.get('output')}"
    # a complete Gradescope record, whatever the submission did
    assert isinstance(rec.results["score"], (int, float)) and rec.results["tests"]
    assert rec.results["extra_data"]["seed"] == rec.seed
