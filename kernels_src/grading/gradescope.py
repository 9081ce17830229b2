"""Gradescope's entry (``run_autograder`` runs ``python -m kernels_src.grading.gradescope ROOT``) and the speed
part of a graded record, shared with the instructor's batch (:mod:`.batch`).

It sits above :mod:`.submission` (exact answers) and :mod:`.perf` (speed questions), so neither imports the
other's caller: the exact-answer grading and the speed grading meet here.
"""
from __future__ import annotations

import os
import sys
import threading
import traceback
from pathlib import Path

from . import perf, submission

NO_GPU_GRADESCOPE_LINE = ("Speed: no speed score on this grading machine (it has no GPU; the grader's simulator "
                          "cannot time a kernel). Run `kernels grade --perf` on a GPU to see your fraction of the "
                          "roofline.")


def gradescope_speed(results: dict, root) -> None:
    """The speed part of ``run_autograder`` (the Gradescope container, ``ROOT/source`` and ``ROOT/submission``):
    on a machine with a GPU, every speed question of the exercise is graded (:func:`add_speed`: one
    test per question with its points and report, ``extra_data.speed``, and Gradescope's optional
    ``leaderboard`` field: percent of the ideal per question); without one, one line in ``output`` says that
    no speed score is given. Never raises: a failure here costs only the speed part (``extra_data.speed_error``)."""
    try:
        from .. import device

        root = Path(root)
        slug = submission.load_autograder(root / "source").slug
        specs = perf.all_specs().get(slug, [])
        if not specs:
            return
        if device.MODE != "gpu":
            results["output"] = (str(results.get("output") or "") + "\n\n" + NO_GPU_GRADESCOPE_LINE).strip()
            results.setdefault("extra_data", {})["speed"] = "not graded: no GPU"
            return
        nb = submission.find_notebook(root / "submission")
        if nb is None:
            return
        add_speed(results, nb, slug)
    except BaseException as e:  # noqa: BLE001
        results.setdefault("extra_data", {})["speed_error"] = f"{type(e).__name__}: {e}"


_perf_lock = threading.Lock()  # speed questions are timed one at a time, whatever --jobs says


def add_speed(results: dict, nb_path, slug: str) -> None:
    """Grade the speed questions of ``slug`` on the notebook and add them to Gradescope's ``results``: one test
    each (its points, its report), the ``leaderboard`` field (percent of the ideal per question) and
    ``extra_data.speed`` (the gradebook's speed column). A failure of the grader costs only the speed part."""
    from . import bundle as bundle_mod

    specs = perf.all_specs().get(slug, [])
    if not specs:
        return
    extra = results.setdefault("extra_data", {})
    try:
        b = bundle_mod.from_notebook(bundle_mod.read_notebook(nb_path))
        with _perf_lock:
            verdicts = [perf.grade_perf(s, b) for s in specs]
    except BaseException as e:  # noqa: BLE001
        extra["speed_error"] = f"{type(e).__name__}: {e}"
        return
    board, speed = [], 0.0
    for s, v in zip(specs, verdicts):
        if v.status == "skipped":
            results.setdefault("tests", []).append({"name": f"{s.question} speed", "output": v.feedback,
                                                    "visibility": "visible"})
            continue
        speed += v.score
        results.setdefault("tests", []).append({"name": f"{s.question} speed", "score": v.score,
                                                "max_score": s.points, "output": v.feedback,
                                                "visibility": "visible"})
        board.append({"name": f"{s.question} {s.function} (% of ideal)",
                      "value": round(100 * (v.fraction or 0.0), 1), "order": "desc"})
    results["score"] = round(float(results.get("score", 0)) + speed, 4)
    extra["speed"] = round(speed, 4)
    extra["possible"] = (extra.get("possible") or 0) + sum(s.points for s, v in zip(specs, verdicts)
                                                            if v.status != "skipped")
    if board:
        results["leaderboard"] = board


def gradescope_main(root: str) -> int:
    """``run_autograder``: grade ROOT/submission with ROOT/source into ROOT/results/results.json."""
    root = Path(root)
    out = root / "results" / "results.json"
    try:
        rec = submission.grade_submission(root / "submission", root / "source", jobs=max(1, os.cpu_count() or 1))
        gradescope_speed(rec.results, root)
        submission.write_json_atomic(out, rec.results)
        print(f"score {rec.score} / {rec.possible} in {rec.seconds:.1f} s")
    except BaseException as e:  # noqa: BLE001  (whatever happens, Gradescope gets a results file)
        submission.write_json_atomic(out, {"score": 0, "output": "The autograder failed on this submission (not your fault; "
                                f"your instructor has been told): {type(e).__name__}: {e}",
                                "tests": [], "extra_data": {"traceback": traceback.format_exc()[-4000:]}})
        print(traceback.format_exc(), file=sys.stderr)
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) > 1 or argv[:1] in (["-h"], ["--help"]):
        print("usage: python -m kernels_src.grading.gradescope [ROOT]  (default /autograder)", file=sys.stderr)
        return 2
    return gradescope_main(argv[0] if argv else "/autograder")


if __name__ == "__main__":
    raise SystemExit(main())
