"""Time per submission, the whole grade (checks + the otter notebook run), for a corpus case or the solution:

    .venv/bin/python tests/corpus/time_per_submission.py solution 3
    .venv/bin/python tests/corpus/time_per_submission.py hang_everywhere 3
    .venv/bin/python tests/corpus/time_per_submission.py ch02_regression/numpy_shortcut 3

prints each run and the median and worst seconds (jobs=2, default time limits). A bare name is a case (or
the solution) of ch01_axpy, `slug/name` one of tests/corpus/<slug>/."""
import sys, time, tempfile, statistics, json
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from pathlib import Path
from _grading_support import corpus_submission, autograder
from kernels_src.grading.submission import grade_submission
name = sys.argv[1]; runs = int(sys.argv[2]) if len(sys.argv) > 2 else 1
slug, _, case = name.rpartition("/"); slug = slug or "ch01_axpy"
ag = autograder(slug)
ts = []
for r in range(runs):
    d = Path(tempfile.mkdtemp())
    sub = corpus_submission(case, d, slug)
    t0 = time.perf_counter()
    rec = grade_submission(sub, ag, jobs=2, run_otter=True)
    ts.append(time.perf_counter() - t0)
    print(name, r, f"{ts[-1]:.1f}s", rec.score, "/", rec.possible, rec.per_question, json.dumps(rec.results["extra_data"]["otter"]), flush=True)
print(f"{name}: runs {runs} median {statistics.median(ts):.1f}s worst {max(ts):.1f}s")
