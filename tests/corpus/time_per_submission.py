"""Benchmark: time per submission, the whole grade (checks + the otter notebook run), for a corpus case or the solution:

    .venv/bin/python tests/corpus/time_per_submission.py solution 3
    .venv/bin/python tests/corpus/time_per_submission.py hang_everywhere 3
    .venv/bin/python tests/corpus/time_per_submission.py ch02_regression/numpy_shortcut 3
    .venv/bin/python tests/corpus/time_per_submission.py ch09_attention/solution 3 --no-otter --json out.json
    .venv/bin/python tests/corpus/time_per_submission.py ch12_optimizers/solution 1 --processes

prints each run (wall seconds, CPU seconds of the grading processes, the load average when it started) and the
median and worst wall seconds (jobs=2, default time limits). A bare name is a case (or the solution) of
ch01_axpy, `slug/name` one of tests/corpus/<slug>/ (or `slug/solution`). On a shared machine the wall time
follows the load; the CPU seconds do not. ``--processes`` also counts the sandboxed grading processes of each
run by mode (plan, exec, ptx) with their summed wall seconds: where the time goes."""
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _grading_support import autograder, corpus_submission  # noqa: E402
from kernels_src.grading import sandbox  # noqa: E402
from kernels_src.grading.submission import grade_submission  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--")]
name = args[0]
runs = int(args[1]) if len(args) > 1 else 1
otter = "--no-otter" not in sys.argv
out_json = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
processes: list = []
if "--processes" in sys.argv:
    _run = sandbox.run

    def _counted(job, *a, **k):
        t = time.perf_counter()
        try:
            return _run(job, *a, **k)
        finally:
            processes.append((job.get("mode", "?"), time.perf_counter() - t))

    sandbox.run = _counted
slug, _, case = name.rpartition("/")
slug = slug or "ch01_axpy"
ag = autograder(slug)
rows = []
for r in range(runs):
    d = Path(tempfile.mkdtemp())
    sub = corpus_submission(case, d, slug)
    load = os.getloadavg()[0]
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    s0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    processes.clear()
    rec = grade_submission(sub, ag, jobs=2, run_otter=otter)
    wall = time.perf_counter() - t0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    s1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime) + (s1.ru_utime + s1.ru_stime - s0.ru_utime - s0.ru_stime)
    rows.append({"run": r, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load_1min": round(load, 2),
                 "score": rec.score, "possible": rec.possible,
                 "otter": rec.results["extra_data"].get("otter", {}).get("status")})
    if "--processes" in sys.argv:
        modes = sorted({m for m, _ in processes})
        rows[-1]["processes"] = {m: [sum(1 for x, _ in processes if x == m),
                                     round(sum(s for x, s in processes if x == m), 2)] for m in modes}
    print(name, json.dumps(rows[-1]), flush=True)
walls = [x["wall_s"] for x in rows]
summary = {"name": name, "runs": runs, "otter": otter, "median_wall_s": statistics.median(walls),
           "worst_wall_s": max(walls), "median_cpu_s": statistics.median(x["cpu_s"] for x in rows),
           "cores": os.cpu_count(), "rows": rows}
print(f"{name}: runs {runs} median {summary['median_wall_s']:.1f}s worst {summary['worst_wall_s']:.1f}s "
      f"(CPU {summary['median_cpu_s']:.1f}s, {os.cpu_count()} cores, load {[x['load_1min'] for x in rows]})")
if out_json:
    Path(out_json).write_text(json.dumps(summary, indent=1))
