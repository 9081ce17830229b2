"""``kernels grade`` and ``kernels exercises``: the grading subcommands of the course CLI.

    kernels exercises [NAME ...] [--check]           generate exercises/ and _build/autograder/ (--check: only
                                                      report whether the committed exercises/ are up to date)
    kernels grade SUBMISSIONS [--out FILE.csv]      grade a folder (or one file) of submissions into a gradebook
          [--exercise chNN_slug | --autograder PATH] [--jobs N] [--force] [--no-otter]
                                                      (default gradebook/gradebook.csv, a folder git ignores)
    kernels grade --solution chNN_slug               grade the master's solution (must be full marks)
    kernels grade --perf NOTEBOOK [--exercise chNN_slug] [--question q1 ...] [--json FILE]
                                                      grade the speed questions of one notebook (fraction of
                                                      the roofline, measured in this run; see grading/perf.py)
    kernels grade --perf --solution chNN_slug        the same for the master's solution
    kernels grade --perf SUBMISSIONS_DIR ...         a batch: a speed column in the gradebook and Gradescope's
                                                      leaderboard field in each results.json
    kernels racecheck FILE.py KERNEL                 (see `kernels racecheck -h`)
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from ..usage import UsageError, input_path, one_of, output_dir, output_file, positive_int

# The gradebook's default home, relative to where `kernels grade` runs: a folder that .gitignore names, so grades
# never land in a commit. --out names another file; its results go beside it (<name>_results/).
DEFAULT_GRADEBOOK = Path("gradebook") / "gradebook.csv"


def _slugs() -> list[str]:
    from . import exercises

    return [p.stem for p in exercises.masters()]


def _exercise(slug: str, flag: str) -> str:
    return one_of("exercise", slug.removesuffix(".md"), _slugs(), flag)


def cmd_exercises(args) -> int:
    from . import exercises

    for name in args.names:
        _exercise(name, "NAME")
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            exercises.generate(args.names or None, Path(tmp) / "exercises", Path(tmp) / "build", zip_=False, quiet=True)
            drift = compare_trees(Path(tmp) / "exercises", exercises.EXERCISES, args.names)
        for line in drift:
            print(line)
        print("exercises/ is up to date" if not drift else "exercises/ is out of date: run `make exercises`")
        return 1 if drift else 0
    exercises.generate(args.names or None)
    return 0


def compare_trees(fresh: Path, committed: Path, names=None) -> list[str]:
    """Differences between freshly generated exercises and the committed ones (for the names generated)."""
    out = []
    for f in sorted(p for p in fresh.rglob("*") if p.is_file()):
        rel = f.relative_to(fresh)
        other = committed / rel
        if not other.exists():
            out.append(f"missing: exercises/{rel}")
        elif other.read_bytes() != f.read_bytes():
            out.append(f"differs: exercises/{rel}")
    slugs = {p.stem for p in fresh.glob("*.md")}
    for p in sorted(committed.rglob("*")):
        if not p.is_file():
            continue
        rel = p.relative_to(committed)
        slug = rel.parts[1] if rel.parts[0] == "tests" and len(rel.parts) > 2 else Path(rel.parts[0]).stem
        if slug in slugs and not (fresh / rel).exists():
            out.append(f"extra: exercises/{rel}")
    return out


def cmd_grade(args) -> int:
    if args.question and not args.perf:
        raise UsageError("--question: only with --perf")
    if args.perf and (args.solution or (args.submissions and Path(args.submissions).is_file())):
        return _grade_perf(args)
    if args.solution:
        args.solution = _exercise(args.solution, "--solution")
        output_file(args.json)
        return _grade_solution(args)
    if not args.submissions:
        raise UsageError("give a folder of submissions (or --solution chNN_slug)")
    from .batch import grade_folder
    from .exercises import BUILD

    input_path(args.submissions, "SUBMISSIONS")
    if args.exercise:
        args.exercise = _exercise(args.exercise, "--exercise")
        if not args.autograder and not (BUILD / args.exercise).is_dir():
            raise UsageError(f"--exercise {args.exercise}: its autograder {BUILD / args.exercise} is not built; "
                             f"run `kernels exercises {args.exercise}` (or `make exercises`) first")
    input_path(args.autograder, "--autograder")
    output_dir(args.results_dir, "--results-dir")
    if args.out:
        out = output_file(args.out, "--out")
    else:
        out = DEFAULT_GRADEBOOK
        out.parent.mkdir(exist_ok=True)
    summary = grade_folder(args.submissions, out, autograder=args.autograder, exercise=args.exercise, jobs=args.jobs,
                           results_dir=args.results_dir, force=args.force, run_otter=not args.no_otter,
                           progress=not args.quiet, perf=args.perf)
    print(f"graded {summary['graded']}, skipped {summary['skipped']} already graded, of {summary['total']}; "
          f"gradebook: {summary['gradebook']}; results: {summary['results_dir']}/<submission>/results.json")
    from .batch import sandbox_summary

    weaker = sandbox_summary(summary.get("sandbox_weaker") or {}, summary["graded"])
    if weaker:
        print(weaker)
    return 0


def _perf_exercises() -> dict:
    from .perf import all_specs

    return all_specs()


def _grade_perf(args) -> int:
    """``kernels grade --perf NOTEBOOK`` / ``--perf --solution chNN``: the speed questions, one report each."""
    from .perf import grade_perf

    known = _perf_exercises()
    if args.solution:
        slug = _exercise(args.solution, "--solution")
    else:
        nb_path = input_path(args.submissions, "SUBMISSIONS", "file")
        slug = args.exercise or nb_path.stem.removesuffix(".ipynb")
        slug = _exercise(slug, "--exercise" if args.exercise else "NOTEBOOK (its name; or give --exercise)")
    if slug not in known:
        raise UsageError(f"{slug} has no speed questions (those that have: {', '.join(sorted(known)) or 'none'})")
    specs = known[slug]
    for q in args.question or ():
        one_of(f"speed question of {slug}", q, [s.question for s in specs], "--question")
    specs = [s for s in specs if not args.question or s.question in args.question]
    out = output_file(args.json)
    from . import bundle as bundle_mod
    from . import corpus

    if args.solution:
        b = bundle_mod.from_notebook(corpus.solution_submission(slug))
    else:
        try:
            b = bundle_mod.from_notebook(bundle_mod.read_notebook(nb_path))
        except ValueError as e:
            raise UsageError(f"NOTEBOOK {nb_path}: {e}") from None
    verdicts = [grade_perf(s, b) for s in specs]
    for v in verdicts:
        print(v.feedback)
    total = sum(v.score for v in verdicts)
    possible = sum(s.points for s in specs if not any(v.question == s.question and v.status == "skipped"
                                                      for v in verdicts))
    print(f"{slug} speed: {total:g} / {possible:g}")
    if out:
        out.write_text(json.dumps({"exercise": slug, "verdicts": [v.to_json() for v in verdicts]}, indent=2))
    return 0


def _grade_solution(args) -> int:
    from . import corpus, exercises
    from .submission import grade_submission

    slug = args.solution
    build = exercises.BUILD / slug
    if not (build / "source").exists() or args.regenerate:
        exercises.generate([slug], quiet=True)
    with tempfile.TemporaryDirectory() as tmp:
        nb = corpus.write_ipynb(corpus.solution_submission(slug), Path(tmp) / f"{slug}.ipynb")
        rec = grade_submission(nb, build, jobs=args.jobs, run_otter=not args.no_otter)
    for t in rec.results.get("tests", []):
        if "max_score" in t:
            print(f"{t['name']}: {t['score']} / {t['max_score']}")
            if t["score"] < t["max_score"]:
                print("    " + t.get("output", "").replace("\n", "\n    "))
    print(rec.results.get("output", ""))
    print(f"{slug} solution: {rec.score} / {rec.possible} in {rec.seconds:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(rec.results, indent=2))
    return 0 if rec.possible > 0 and rec.score == rec.possible else 1


def cmd_racecheck(args) -> int:
    """Run a kernel from a Python file once under the race detector, with arguments built by a function."""
    import importlib.util

    from .racecheck import racecheck

    if input_path(args.file, "FILE", "file").suffix != ".py":
        raise UsageError(f"FILE {args.file}: not a Python file (.py)")
    spec = importlib.util.spec_from_file_location("racecheck_target", args.file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    defined = sorted(n for n, f in vars(mod).items() if callable(f) and not n.startswith("_"))
    kernel = getattr(mod, one_of(f"name in {args.file}", args.kernel, defined, "KERNEL"))
    make = getattr(mod, one_of(f"name in {args.file}", args.args, defined, "--args"))
    grid, block, *kargs = make()
    rep = racecheck(kernel, grid, block, *kargs)
    print(rep)
    return 0 if rep.ok else 1


def add_commands(sub) -> None:
    s = sub.add_parser("exercises", help="generate exercises/ and the autograder from solutions/")
    s.add_argument("names", nargs="*", help="e.g. ch01_axpy (default: all)")
    s.add_argument("--check", action="store_true", help="only check that exercises/ is up to date")
    s.set_defaults(func=cmd_exercises)

    s = sub.add_parser("grade", help="grade a folder of submissions into a gradebook (or --solution NAME)")
    s.add_argument("submissions", nargs="?", help="a folder of submissions (.ipynb/.md/.zip or one folder each)")
    s.add_argument("--out", help=f"gradebook CSV, in a folder that exists (default {DEFAULT_GRADEBOOK}, which "
                   "git ignores)")
    s.add_argument("--results-dir", help="where <id>/results.json go (default: <CSV name>_results/ next to the CSV)")
    s.add_argument("--exercise", help="grade every submission as this exercise (chNN_slug)")
    s.add_argument("--autograder", help="path to an autograder (zip, or _build/autograder/NAME)")
    s.add_argument("--jobs", type=positive_int, default=max(1, os.cpu_count() or 1), help="submissions graded at once")
    s.add_argument("--force", action="store_true", help="regrade submissions that already have results")
    s.add_argument("--no-otter", action="store_true", help="skip running the notebooks through otter (faster)")
    s.add_argument("--solution", help="grade the solution of this exercise; exit 1 unless full marks")
    s.add_argument("--regenerate", action="store_true", help="with --solution: run `make exercises` for it first")
    s.add_argument("--json", help="with --solution: also write its results.json here")
    s.add_argument("--perf", action="store_true", help="grade the speed questions (fraction of the roofline, "
                   "measured in the same run); a folder: adds a speed column and Gradescope's leaderboard")
    s.add_argument("--question", action="append", help="with --perf and one notebook: only this speed question")
    s.add_argument("-q", "--quiet", action="store_true")
    s.set_defaults(func=cmd_grade)

    s = sub.add_parser("racecheck", help="run one simulated kernel under the shared-memory race detector")
    s.add_argument("file", help="a Python file defining the kernel and a function returning (grid, block, *args)")
    s.add_argument("kernel")
    s.add_argument("--args", default="make_args", help="name of that function (default make_args)")
    s.set_defaults(func=cmd_racecheck)

