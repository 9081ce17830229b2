"""Grade one submission: the trusted side of the autograder (used by Gradescope and `kernels grade`).

Otter-grader runs a notebook and its tests in one Jupyter kernel, so code in the notebook can reach
the tests (patch numpy, the checker, otter itself) or kill the kernel. Here, the score does not depend
on that kernel:

1. **Plan.** The autograder's test files (hidden ones included; ours, trusted) are loaded with otter and
   their test functions run in *plan mode*: each ``check_cpu``/``check_gpu`` call records its spec.
2. **Verdicts.** The submitted file is read here (a malformed or empty notebook gets 0 and a message),
   reduced to its imports, definitions and constants (:mod:`.bundle`), and every check of the plan runs
   in its own sandboxed process (:mod:`.checks`), with a fresh seed, a time limit and a memory limit.
3. **Otter.** ``otter run``'s grading process executes the notebook with the tests, in a child process
   with a time limit and a memory limit; there the checks only display the verdicts of step 2. This
   produces the executed notebook's errors and otter's own view of the scores.
4. **Merge.** Each otter test case passes if and only if its checks' verdicts passed; otter's
   ``GradingResults`` turns that into Gradescope's ``results.json`` (points per case, public/hidden
   visibility). If the notebook's own run disagrees (it claims a pass the verdicts deny), or crashed or
   timed out, the record says so, and the verdicts still count.

Nothing a submission does can stop a record from being written: every failure becomes a message.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import io
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

# jsonschema (under nbformat and otter) imports the optional rfc3987_syntax when it is installed, and that package
# builds 39 lark grammars while it loads: about 1.4 CPU seconds in every process that imports otter or nbformat
# (this grader, otter's run, and the notebook's kernel, which runs `import otter`). Nothing here validates an IRI
# (the notebook schema has no "format" at all), so jsonschema is told the package is absent. See SKIP_IMPORTS.
SLOW_OPTIONAL_MODULES = ("rfc3987_syntax",)
SKIP_IMPORTS = "import sys\nfor _m in %r:\n    sys.modules.setdefault(_m, None)\n" % (SLOW_OPTIONAL_MODULES,)
for _m in SLOW_OPTIONAL_MODULES:
    sys.modules.setdefault(_m, None)

from . import VERDICTS_ENV, collect_plan  # noqa: E402
from .bundle import Bundle, from_notebook, read_notebook  # noqa: E402
from .checks import CheckSpec, Verdict, batch_key, run_checks  # noqa: E402

# Seconds for otter to run the notebook. Unset: it follows the checks' time limit (see notebook_timeout).
NOTEBOOK_TIMEOUT = float(os.environ["KERNELS_NOTEBOOK_TIMEOUT"]) if os.environ.get("KERNELS_NOTEBOOK_TIMEOUT") else None
NOTEBOOK_MEMORY = int(os.environ.get("KERNELS_NOTEBOOK_MEMORY_MB", "6144")) << 20


@dataclass
class Autograder:
    source: Path  # the unpacked autograder: tests/, otter_config.json, exercise.json
    slug: str
    config: dict
    plan: dict  # test file name -> [[CheckSpec, ...] for each test case]
    test_paths: dict  # test file name -> path

    @property
    def specs(self) -> list[CheckSpec]:
        seen, out = set(), []
        for cases in self.plan.values():
            for specs in cases:
                for s in specs:
                    if s.key not in seen:
                        seen.add(s.key)
                        out.append(s)
        return out


def load_autograder(path) -> Autograder:
    """An autograder from its unpacked ``source`` directory, its build directory, or its zip."""
    path = Path(path)
    if path.suffix == ".zip":
        tmp = Path(tempfile.mkdtemp(prefix="kautograder-"))
        with zipfile.ZipFile(path) as z:
            z.extractall(tmp)
        path = tmp
    if (path / "source" / "tests").is_dir():
        path = path / "source"
    if not (path / "tests").is_dir():
        raise FileNotFoundError(f"{path} is not an autograder (no tests/ directory); run `make exercises`")
    from otter.nbmeta_config import NBMetadataConfig
    from otter.test_files import create_test_file

    config = json.loads((path / "otter_config.json").read_text()) if (path / "otter_config.json").exists() else {}
    info = json.loads((path / "exercise.json").read_text()) if (path / "exercise.json").exists() else {}
    plan, paths = {}, {}
    for f in sorted((path / "tests").glob("*.py")):
        tf = create_test_file(str(f), NBMetadataConfig())
        cases = []
        for tc in tf.test_cases:
            with collect_plan() as specs:
                with contextlib.redirect_stdout(io.StringIO()):
                    tc.body.call_func({})
            cases.append(list(specs))
        plan[tf.name] = cases
        paths[tf.name] = f
    slug = info.get("slug") or config.get("assignment_name") or path.parent.name
    return Autograder(path, slug, config, plan, paths)


def find_notebook(path: Path) -> Path | None:
    """The notebook of a submission: the file itself, or the one notebook in a directory."""
    path = Path(path)
    if path.is_file():
        return path
    for pattern in ("*.ipynb", "*.md", "*.py"):
        found = sorted(p for p in path.glob(pattern) if p.name not in ("__init__.py",) and not p.name.startswith("."))
        if pattern == "*.md":
            found = [p for p in found if p.name.lower() not in ("readme.md",)]
        if found:
            return found[0]
    return None


@dataclass
class GradeRecord:
    submission: str
    results: dict  # Gradescope results.json
    score: float
    possible: float
    per_question: dict = field(default_factory=dict)  # name -> (score, possible)
    seconds: float = 0.0
    status: str = "graded"  # graded | unreadable | error
    seed: int = 0
    sha256: str = ""
    flags: list = field(default_factory=list)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return ""
    return h.hexdigest()


def notebook_timeout(ag: Autograder, verdicts: dict) -> float:
    """How long otter may run the notebook: ``KERNELS_NOTEBOOK_TIMEOUT`` if set, else the checks' time limit,
    and half of it when a check already timed out (the notebook runs the same code, so it most likely hangs
    too; its run only adds notes, never points). A hanging submission then costs about 1.5 check limits."""
    if NOTEBOOK_TIMEOUT:
        return NOTEBOOK_TIMEOUT
    from . import sandbox

    limit = max([s.timeout or sandbox.DEFAULT_TIMEOUT for s in ag.specs] or [sandbox.DEFAULT_TIMEOUT])
    if any(v.timed_out for v in verdicts.values()):
        return max(10.0, limit / 2)
    return limit


def run_verdicts(ag: Autograder, bundle: Bundle, seed: int, jobs: int = 1, questions=None) -> dict[str, Verdict]:
    """Every check of the plan, one question's checks in order (visible first) and questions in parallel. Once
    a check of a question times out, the question's remaining checks are not run: each would only wait out
    its own time limit on the same hanging code."""
    groups, seen = [], set()
    for q, cases in ag.plan.items():
        if questions is not None and q not in questions:
            continue
        group = []
        for case in cases:
            for s in case:
                if s.key not in seen:
                    seen.add(s.key)
                    group.append(s)
        if group:
            groups.append(group)

    def batch(specs):
        try:
            return run_checks(specs, bundle, seed=seed)
        except Exception as e:  # noqa: BLE001  (a grader bug: never the student's fault, never a crash)
            return [Verdict(spec.key, spec.title, False,
                            f"{spec.title}: the grader failed on this check (not your fault; tell your instructor): "
                            f"{type(e).__name__}: {e}", seed, status="error") for spec in specs]

    def question(group):
        out, stopped = {}, None
        batches: dict = {}
        for spec in group:  # checks of the same code run together: one plan run and one exec run
            batches.setdefault(batch_key(spec), []).append(spec)
        for specs in batches.values():
            if stopped is not None:
                for spec in specs:
                    out[spec.key] = Verdict(spec.key, spec.title, False,
                                            f"{spec.title}: not run, because {stopped.title} did not finish in time "
                                            "(the same code would hang here too)", seed, status="fail")
                continue
            for spec, v in zip(specs, batch(specs)):
                out[spec.key] = v
                if v.timed_out and stopped is None:
                    stopped = v
        return out

    verdicts: dict = {}
    if jobs <= 1 or len(groups) <= 1:
        for g in groups:
            verdicts.update(question(g))
        return verdicts
    with cf.ThreadPoolExecutor(max_workers=jobs) as pool:
        for part in pool.map(question, groups):
            verdicts.update(part)
    return verdicts


def _results(ag: Autograder, case_outcomes: dict, output: str, extra: dict) -> tuple[dict, dict]:
    """Gradescope results from otter's test files, with our pass/fail and messages per test case."""
    from otter.run.run_autograder.autograder_config import AutograderConfig
    from otter.test_files import GradingResults, create_test_file
    from otter.test_files.abstract_test import TestCaseResult
    from otter.nbmeta_config import NBMetadataConfig

    files = []
    per_question = {}
    for name, path in ag.test_paths.items():
        tf = create_test_file(str(path), NBMetadataConfig())
        tf.test_case_results = []
        for i, tc in enumerate(tf.test_cases):
            passed, message = case_outcomes[(name, i)]
            tf.test_case_results.append(TestCaseResult(test_case=tc, message=message, passed=passed))
        files.append(tf)
        per_question[name] = (round(tf.score, 5), round(tf.possible, 5))
    gr = GradingResults(files)
    gr.set_output(output)
    try:
        cfg = AutograderConfig(dict(ag.config))
    except Exception:  # noqa: BLE001
        cfg = AutograderConfig({})
    res = gr.to_gradescope_dict(cfg)
    res.setdefault("score", round(gr.total, 5))
    res["extra_data"] = extra
    return res, per_question


def grade_submission(submission, autograder, *, jobs: int = 1, run_otter: bool = True,
                     seed: int | None = None, questions=None) -> GradeRecord:
    """Grade one submission (a notebook file, or a directory holding one). Never raises for student input.

    ``questions`` (e.g. ``["q2"]``) grades only those; the others score 0 as "not graded" (for tests)."""
    t0 = time.perf_counter()
    ag = autograder if isinstance(autograder, Autograder) else load_autograder(autograder)
    submission = Path(submission)
    seed = seed if seed is not None else (int(os.environ["KERNELS_GRADING_SEED"]) if os.environ.get(
        "KERNELS_GRADING_SEED") else secrets.randbits(31))
    nb_path = find_notebook(submission)
    sha = _sha256(nb_path) if nb_path else ""
    notes: list[str] = []
    verdicts: dict[str, Verdict] = {}
    status = "graded"
    nb = None
    problem = ""
    if nb_path is None:
        problem = "no notebook found in the submission (expected one .ipynb file)"
    else:
        try:
            nb = read_notebook(nb_path)
        except ValueError as e:
            problem = str(e)
        if nb is not None and not any(c.get("cell_type") == "code" and str(c.get("source", "")).strip()
                                      for c in nb.get("cells", [])):
            problem = f"{nb_path.name} has no code: the notebook is empty"
    if problem:
        status = "unreadable"
        notes.append(f"Your submission could not be graded: {problem}. Every question scores 0.")
    else:
        name = (nb.get("metadata", {}).get("otter", {}) or {}).get("assignment_name")
        if name and name != ag.slug:
            notes.append(f"This notebook says it is for assignment {name!r}, but it was graded as {ag.slug!r}.")
        bundle = from_notebook(nb)
        otter_box: dict = {}
        pending = None
        if run_otter:  # the notebook run starts now, alongside the checks; it shows their verdicts when ready
            pending = _Pending()
            thread = threading.Thread(target=lambda: otter_box.update(_run_otter(nb, ag, {}, pending)), daemon=True)
            thread.start()
        try:
            verdicts = run_verdicts(ag, bundle, seed, jobs, questions)
        finally:
            if pending is not None:
                pending.verdicts = verdicts
                pending.event.set()
                thread.join()
        notes += [f"Note: {n}." for n in bundle.notes]
    otter_view = {}
    if run_otter and nb is not None and not problem:
        otter_view = otter_box
        notes += otter_view.get("notes", [])
    case_outcomes = {}
    disagreements = []
    for name, cases in ag.plan.items():
        for i, specs in enumerate(cases):
            if problem:
                case_outcomes[(name, i)] = (False, f"❌ not graded: {problem}")
                continue
            if questions is not None and name not in questions:
                case_outcomes[(name, i)] = (False, "not graded in this run")
                continue
            vs = [verdicts[s.key] for s in specs]
            passed = all(v.passed for v in vs) if vs else False
            msg = "\n\n".join(v.feedback for v in vs) if vs else "this test case has no checks (an exercise bug)"
            case_outcomes[(name, i)] = (passed, ("✅ " if passed else "❌ ") + msg)
    for q, claimed in (otter_view.get("scores") or {}).items():
        if claimed.get("passed_all") and not all(ok for (n, _), (ok, _) in case_outcomes.items() if n == q):
            disagreements.append(q)
    if disagreements:
        notes.append("The notebook's own run reported passing " + ", ".join(disagreements) + ", but the isolated "
                     "grader did not: the isolated grader's result counts (did the notebook change numpy, the "
                     "checker or otter?).")
    flags = sorted({f for v in verdicts.values() for f in v.flags})
    weak = sorted({w for v in verdicts.values() for w in v.sandbox} | set(otter_view.get("sandbox") or []))
    if weak:  # said in one line, to the student and in the record (issue 28: say when the sandbox is weaker)
        from .confine import weakness_line

        notes.insert(0, weakness_line(weak))
    seconds = time.perf_counter() - t0
    header = [f"Graded {ag.slug}: seed {seed} (inputs are random; the seed reproduces them)."]
    output = "\n".join(header + notes)
    extra = {"seed": seed, "sha256": sha, "seconds": round(seconds, 2), "exercise": ag.slug, "status": status,
             "flags": flags, "sandbox_weaker": weak, "notebook": nb_path.name if nb_path else "",
             "verdicts": {k: {"passed": v.passed, "status": v.status, "title": v.title, "seconds": round(v.seconds, 2)}
                          for k, v in verdicts.items()},
             "otter": {k: v for k, v in otter_view.items() if k in ("status", "scores", "seconds", "timeout")}}
    try:
        results, per_question = _results(ag, case_outcomes, output, extra)
    except Exception as e:  # noqa: BLE001
        results = {"score": 0, "output": output + f"\nThe grader failed to assemble the results: {e}",
                   "tests": [], "extra_data": extra}
        per_question, status = {}, "error"
    score = sum(s for s, _ in per_question.values())
    possible = sum(p for _, p in per_question.values())
    return GradeRecord(str(submission), results, round(score, 5), round(possible, 5), per_question, seconds, status,
                       seed, sha, flags)


# ------------------------------------------------------------------------------------- otter run
def _display_tests(ag: Autograder, dest: Path) -> None:
    """The autograder's test files for the otter run, each test's body replaced by a display of the grader's
    verdicts for its checks (by key): the notebook run never holds the hidden checks' sizes or options."""
    import ast

    dest.mkdir(parents=True, exist_ok=True)
    for name, path in ag.test_paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        cases = ag.plan.get(name, [])
        i = 0
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and any(
                    isinstance(d, ast.Call) and getattr(d.func, "id", "") == "test_case" for d in node.decorator_list)):
                continue
            specs = cases[i] if i < len(cases) else []
            i += 1
            fn = "check_gpu" if any(sp.kind == "gpu" for sp in specs) else "check_cpu"
            keys = [sp.key for sp in specs]
            node.body = ast.parse(f"from kernels_src.grading import {fn}\n{fn}(verdict_keys={keys!r})").body
        (dest / path.name).write_text(ast.unparse(tree) + "\n", encoding="utf-8")


class _Pending:
    """Verdicts that the notebook run, started before them, waits for."""

    def __init__(self):
        self.event = threading.Event()
        self.verdicts: dict = {}


def _run_otter(nb, ag: Autograder, verdicts: dict, pending: _Pending | None = None) -> dict:
    """Run otter's grading process on the notebook in a child process; return what it reported.

    With ``pending``, the run starts before the verdicts exist: the notebook's check cells wait for the
    verdicts file, written here once ``pending.event`` is set, and the time limit (which depends on the
    verdicts: half of it after a check timed out) counts from the start of the run."""
    import nbformat

    view = {"notes": []}
    tmp = Path(tempfile.mkdtemp(prefix="kotter-"))
    t0 = time.perf_counter()
    try:
        root = tmp / "autograder"
        for d in ("source", "submission", "results"):
            (root / d).mkdir(parents=True)
        _display_tests(ag, root / "source" / "tests")
        cfg = dict(ag.config, logo=False, print_summary=False)
        cfg["assignment_name"] = ag.slug
        (root / "source" / "otter_config.json").write_text(json.dumps(cfg))
        (root / "submission_metadata.json").write_text("{}")
        nb = nbformat.from_dict(json.loads(json.dumps(nb)))
        nb.metadata.setdefault("otter", {})["assignment_name"] = ag.slug
        nb.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3", "language": "python"})
        nb.metadata["kernelspec"]["name"] = "python3"
        for i, c in enumerate(nb.cells):
            c["id"] = f"cell-{i}"
        nb.nbformat, nb.nbformat_minor = 4, 5
        nbformat.write(nb, root / "submission" / f"{ag.slug}.ipynb")
        vfile = tmp / "verdicts.json"

        def write_verdicts(vs):
            part = tmp / "verdicts.json.part"
            part.write_text(json.dumps({k: v.to_json() for k, v in vs.items()}))
            os.replace(part, vfile)

        if pending is None:
            write_verdicts(verdicts)
        from . import sandbox

        runtime = sandbox.runtime_dir()
        site = tmp / "site"  # its sitecustomize spares the notebook's kernel the slow optional imports
        site.mkdir()
        (site / "sitecustomize.py").write_text(SKIP_IMPORTS)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELS_GRADING_SEED", "KERNELS_BENCH"))}
        # the notebook's kernel imports kernels_src from the runtime copy: no references, helpers or data there
        hard = 20 * max([sp.timeout or sandbox.DEFAULT_TIMEOUT for sp in ag.specs] or [sandbox.DEFAULT_TIMEOUT])
        env.update({VERDICTS_ENV: str(vfile), "KERNELS_VERDICTS_WAIT": str(hard), "KERNELS_DEVICE": "sim",
                    "PYTHONUNBUFFERED": "1",
                    "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": str(site) + os.pathsep + runtime, "HOME": str(tmp),
                    "JUPYTER_RUNTIME_DIR": str(tmp / ".jupyter-runtime"), "IPYTHONDIR": str(tmp / ".ipython"),
                    "MPLCONFIGDIR": str(tmp / ".mpl"), "NUMBA_CACHE_DIR": str(tmp / ".numba"), "TMPDIR": str(tmp)})
        real = str(Path(__file__).resolve().parents[2])
        boot = (f"import sys; sys.path.insert(0, {real!r}); from kernels_src.grading.submission import main; "
                "raise SystemExit(main())")
        cmd = [sys.executable, "-c", boot, "--otter-child", str(root), str(NOTEBOOK_MEMORY), str(tmp), runtime]
        with open(tmp / "otter.log", "wb") as log:
            p = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
            limit = None
            while True:
                if limit is None and (pending is None or pending.event.is_set()):
                    vs = verdicts if pending is None else pending.verdicts
                    if pending is not None:
                        write_verdicts(vs)
                    limit = notebook_timeout(ag, vs)
                    view["timeout"] = limit
                remaining = t0 + (limit if limit is not None else hard) - time.perf_counter()
                if remaining <= 0:
                    _kill_group(p)
                    rc = None
                    break
                try:
                    rc = p.wait(timeout=min(remaining, 0.25))
                    break
                except subprocess.TimeoutExpired:
                    continue
            if limit is None:
                limit = hard
        view["seconds"] = round(time.perf_counter() - t0, 2)
        summary = None
        try:
            summary = json.loads((root / "results" / "summary.json").read_text())
        except (OSError, ValueError):
            pass
        from .confine import weaknesses

        if not sandbox.CONFINE:
            view["sandbox"] = weaknesses(None, net=False)
        elif isinstance(summary, dict) and isinstance(summary.get("confined"), list):
            view["sandbox"] = weaknesses([str(x) for x in summary["confined"]], net=False)
        if rc is None:
            view["status"] = "timeout"
            view["notes"].append(f"Your notebook did not finish running within {limit:g} s (an infinite "
                                 "loop or a very slow cell?); the questions were graded from its definitions anyway.")
        elif summary is None or summary.get("failed") or summary.get("error"):
            view["status"] = "crashed"
            view["notes"].append("Running your notebook from top to bottom stopped early (a cell ended the Python "
                                 "process: os._exit(), a crash, or too much memory); the questions were graded "
                                 "from its definitions anyway.")
        else:
            view["status"] = "ok"
            view["scores"] = summary.get("scores", {})
            errs = summary.get("errors", [])
            course = [e for e in errs if e["ename"] in ("ModuleNotFoundError", "ImportError")
                      and "kernels_src" in e["evalue"]]
            errs = [e for e in errs if e not in course]
            if course:
                view["notes"].append("Cells that import the course's library beyond kernels_src.device and "
                                     "kernels_src.compiler (cells " + ", ".join(str(e["cell"]) for e in course[:5])
                                     + ") do not run under the autograder: its references, helpers and "
                                     "measurements are kept away from submitted code.")
            if errs:
                shown = "; ".join(f"cell {e['cell']}: {e['ename']}: {e['evalue'][:200]}" for e in errs[:3])
                view["notes"].append(f"Running your notebook from top to bottom raised {len(errs)} error(s): {shown}.")
    except Exception as e:  # noqa: BLE001
        view["status"] = "error"
        view["notes"].append(f"(The grader could not run your notebook through otter: {type(e).__name__}: {e}.)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return view


def _kill_group(p):
    import signal

    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        p.kill()
    p.wait()


def _otter_child(root: str, memory: int, scratch: str | None = None, runtime: str | None = None) -> int:
    """In the child: confinement and limits, then otter's own grading process; write a small summary."""
    import resource

    from .sandbox import CONFINE, OUTPUT_LIMIT

    from otter.run.run_autograder import main as run_autograder

    confined = None
    if scratch and CONFINE:  # the notebook runs in here: it may write only this run's directory
        from .confine import confine, skipped_from_env

        confined = confine(scratch, read=[runtime] if runtime else [], uid=None, net=False, skip=skipped_from_env())

    for lim, val in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, 8 * OUTPUT_LIMIT)):
        try:
            resource.setrlimit(lim, (val, resource.getrlimit(lim)[1]))
        except (ValueError, OSError):
            pass
    summary = {"scores": {}, "errors": [], "confined": confined}
    try:
        run_autograder(root, otter_run=True, logo=False, print_summary=False)
    except BaseException as e:  # noqa: BLE001
        summary["failed"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        print(f"otter failed: {summary['failed']}")
    try:
        import dill

        with open(os.path.join(root, "results", "results.pkl"), "rb") as f:
            gr = dill.load(f)
        for name, tf in gr.results.items():
            summary["scores"][name] = {"score": tf.score, "possible": tf.possible, "passed_all": tf.passed_all}
        nb = getattr(gr, "notebook", None)
        if nb is not None:
            from .bundle import HAND_IN_MODULE

            for i, c in enumerate(nb.cells):
                if HAND_IN_MODULE in "".join(c.get("source", "")):
                    continue  # the exercise's hand-in cell: the autograder has no hand-in tool, and needs none
                for o in c.get("outputs", []) if c.get("cell_type") == "code" else []:
                    if o.get("output_type") == "error":
                        summary["errors"].append({"cell": i, "ename": str(o.get("ename")), "evalue": str(o.get("evalue"))})
    except BaseException as e:  # noqa: BLE001
        summary["error"] = f"{type(e).__name__}: {e}"
    tmp = os.path.join(root, "results", "summary.json.tmp")
    with open(tmp, "w") as f:
        json.dump(summary, f)
    os.replace(tmp, os.path.join(root, "results", "summary.json"))
    return 0


# ------------------------------------------------------------------------------------- Gradescope
def write_json_atomic(path: Path, data) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def self_test(source: str) -> int:
    ag = load_autograder(source)
    print(f"{ag.slug}: {len(ag.specs)} checks in {len(ag.plan)} questions")
    for s in ag.specs:
        print("  ", s.title, s.op, s.sizes or "default sizes")
    return 0 if ag.specs else 1


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--otter-child"]:
        return _otter_child(argv[1], int(argv[2]), *(argv[3:5]))
    if argv[:1] == ["--self-test"]:
        return self_test(argv[1])
    print("usage: python -m kernels_src.grading.submission --self-test SOURCE  (Gradescope's entry is "
          "python -m kernels_src.grading.gradescope ROOT)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
