"""The report says when the sandbox is weaker than designed (issue 28): a machine without Landlock, without a
network namespace or without a separate user for the student's process. Each missing protection is named in
one line of the submission's output (what is missing and what that means), in its record, and in the batch
summary. The missing facility is simulated with KERNELS_GRADING_CONFINE_SKIP, which makes the sandboxed
processes skip it exactly where they would apply it."""
import json

import pytest

from _grading_support import autograder, grade_answers
from kernels_src.grading import confine, corpus

SLUG = "ch01_axpy"
FULL = ["no network (empty network namespace)", "unprivileged uid 200001",
        "Landlock ABI 6: read-only system and Python, writes only to its own directory, no TCP, no signals "
        "outside its sandbox"]


def test_a_fully_confined_process_has_no_weakness():
    assert confine.weaknesses(FULL) == []
    assert confine.weakness_line([]) == ""


@pytest.mark.parametrize("drop,word", [(2, "Landlock"), (0, "network"), (1, "user")])
def test_each_missing_protection_is_named_with_what_it_means(drop, word):
    done = [d for i, d in enumerate(FULL) if i != drop]
    if drop == 2:
        done.append("no Landlock")
    lines = confine.weaknesses(done)
    assert lines and any(word in ln for ln in lines), (done, lines)
    assert all(":" in ln for ln in lines), lines  # "<what is missing>: <what that means>"
    line = confine.weakness_line(lines)
    assert line.startswith("Sandbox weaker than designed") and "\n" not in line


def test_no_landlock_and_old_kernel_name_every_hole():
    lines = " ".join(confine.weaknesses(["no Landlock"]))
    for word in ("read every file", "network", "signal"):
        assert word in lines, lines


def test_no_confinement_at_all_is_reported():
    assert "no confinement at all" in confine.weaknesses(None)[0]


def _needs_full_sandbox():
    import os

    if not (os.geteuid() == 0 and confine.landlock_abi() >= 6):
        pytest.skip(f"this machine does not give the whole sandbox ({confine.describe()})")


@pytest.mark.slow
def test_grading_without_landlock_says_so_in_the_output_and_the_record(tmp_path, monkeypatch):
    _needs_full_sandbox()
    answers = {"q1": corpus.master_solutions(SLUG)["q1"]}
    rec = grade_answers(SLUG, answers, tmp_path / "full", questions=["q1"])
    assert "Sandbox weaker" not in rec.results["output"]
    assert rec.results["extra_data"]["sandbox_weaker"] == []
    monkeypatch.setenv("KERNELS_GRADING_CONFINE_SKIP", "landlock")
    rec = grade_answers(SLUG, answers, tmp_path / "weak", questions=["q1"])
    out = rec.results["output"]
    lines = [ln for ln in out.splitlines() if "Sandbox weaker" in ln]
    assert len(lines) == 1 and "no Landlock" in lines[0], out
    assert any("no Landlock" in w for w in rec.results["extra_data"]["sandbox_weaker"])
    assert rec.per_question["q1"][0] == rec.per_question["q1"][1]  # the grade itself is unchanged


@pytest.mark.slow
def test_the_batch_summary_names_what_the_sandbox_lacked(tmp_path, monkeypatch):
    _needs_full_sandbox()
    from kernels_src.grading.batch import grade_folder, sandbox_summary

    subs = tmp_path / "subs"
    subs.mkdir()
    nb = corpus.build_submission(SLUG, {"q1": corpus.master_solutions(SLUG)["q1"]})
    corpus.write_ipynb(nb, subs / "alice.ipynb")
    monkeypatch.setenv("KERNELS_GRADING_CONFINE_SKIP", "netns,uid")
    summary = grade_folder(subs, tmp_path / "gb.csv", autograder=autograder(SLUG), jobs=1, run_otter=False,
                           progress=False)
    assert summary["graded"] == 1
    weaker = summary["sandbox_weaker"]
    assert any("network namespace" in w for w in weaker) and any("separate user" in w for w in weaker), weaker
    line = sandbox_summary(weaker, summary["graded"])
    assert "network namespace" in line and "1 of 1" in line, line
    res = json.loads((tmp_path / "gb_results" / "alice" / "results.json").read_text())
    assert res["extra_data"]["sandbox_weaker"] == sorted(weaker)
