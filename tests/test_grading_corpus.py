"""The corpora of bad submissions (tests/corpus/<slug>/, one per exercise): each case gets its expected score
and message.

Most cases grade only the question they break (the others are the master's solution); the cases that
attack the notebook run itself (os._exit at top level, patching numpy and the checker) also go through
otter. Every case must produce a complete record: no exception escapes the grader. That the solutions
score full marks is tested in test_grading_exercises.py (every exercise) and test_grading_gradescope.py.
"""
import json

import pytest

from _grading_support import autograder, corpus_cases, corpus_expected, corpus_files, corpus_slugs, \
    corpus_submission, outputs_by_question
from kernels_src.grading import sandbox
from kernels_src.grading.submission import grade_submission


def test_there_are_corpora():
    assert {"ch01_axpy", "ch02_regression"} <= set(corpus_slugs())


@pytest.mark.parametrize("slug", corpus_slugs())
def test_every_corpus_file_has_an_expected_outcome(slug):
    files, expected = corpus_files(slug), set(corpus_expected(slug))
    assert files <= expected, f"{slug}: no expected outcome for {sorted(files - expected)}"
    assert expected <= files, f"{slug}: no file for {sorted(expected - files)}"


@pytest.mark.slow
@pytest.mark.parametrize("slug,name", corpus_cases(), ids=[f"{s}/{n}" for s, n in corpus_cases()])
def test_corpus_case(slug, name, tmp_path, monkeypatch):
    exp = corpus_expected(slug)[name]
    case = f"{slug}/{name}"
    if "timeout" in exp:
        monkeypatch.setattr(sandbox, "DEFAULT_TIMEOUT", float(exp["timeout"]))
    sub = corpus_submission(name, tmp_path, slug)
    rec = grade_submission(sub, autograder(slug), jobs=2, run_otter=exp.get("otter", False),
                           questions=exp["questions"])
    if "max_seconds" in exp:  # a hanging question stops after its first timeout
        assert rec.seconds < exp["max_seconds"], f"{case}: graded in {rec.seconds:.1f} s"
    outputs = outputs_by_question(rec.results)
    got = {q: rec.per_question[q][0] for q in exp["scores"]}
    assert got == exp["scores"], f"{case}: scores {got}, expected {exp['scores']}\n{json.dumps(outputs, indent=1)[:6000]}"
    assert rec.status == exp.get("status", "graded")
    for q, phrases in exp.get("contains", {}).items():
        for phrase in phrases:
            assert phrase in outputs[q], f"{case}/{q}: {phrase!r} not in the feedback:\n{outputs[q][:4000]}"
    for q, phrases in exp.get("absent", {}).items():
        for phrase in phrases:
            assert phrase not in outputs[q], f"{case}/{q}: {phrase!r} should not be in the feedback:\n{outputs[q][:4000]}"
    for phrase in exp.get("output", []):
        assert phrase in rec.results.get("output", ""), f"{case}: {phrase!r} not in:\n{rec.results.get('output')}"
    # a complete Gradescope record, whatever the submission did
    assert isinstance(rec.results["score"], (int, float)) and rec.results["tests"]
    assert rec.results["extra_data"]["seed"] == rec.seed
