"""Grade a folder of submissions: ``kernels grade SUBMISSIONS_DIR [--out gradebook/gradebook.csv]``.

A submission is a notebook file (``.ipynb``, or a jupytext ``.md``), a ``.zip`` holding one, or a
directory holding one (Gradescope's export has one directory per submission). Each is graded by
:func:`kernels_src.grading.submission.grade_submission`, several at a time, with a progress bar.

- **Results.** ``<results dir>/<submission id>/results.json`` in Gradescope's format, one per
  submission, written atomically (a temporary file, then a rename).
- **Gradebook.** ``gradebook.csv`` (by default in ``gradebook/``, which git ignores): one row per
  submission (score, points per question, status, seed, time, flags), rewritten atomically after every
  submission, so an interrupted run loses nothing.
- **Resumable.** A submission whose ``results.json`` exists and was computed from the same file (same
  SHA-256) is skipped; ``--force`` regrades everything.
- **Which exercise.** ``--exercise chNN_<slug>`` (or ``--autograder PATH``), else each notebook's
  ``otter.assignment_name`` metadata picks ``_build/autograder/<name>``.
"""
from __future__ import annotations

import concurrent.futures as cf
import csv
import io
import json
import os
import re
import shutil
import tempfile
import threading
import time
import zipfile
from pathlib import Path

from .exercises import BUILD
from .gradescope import add_speed
from .submission import (Autograder, _sha256, find_notebook, grade_submission, load_autograder,
                         write_json_atomic)

NOTEBOOK_SUFFIXES = (".ipynb", ".md", ".zip")


def discover(folder: Path) -> list[tuple[str, Path]]:
    """[(submission id, path)] in a stable order."""
    folder = Path(folder)
    if folder.is_file():
        return [(_safe_id(folder.stem), folder)]
    items = []
    for p in sorted(folder.iterdir()):
        if p.name.startswith(".") or p.name.lower() in ("readme.md",):
            continue
        if p.is_dir() or p.suffix in NOTEBOOK_SUFFIXES:
            items.append((_safe_id(p.stem if p.is_file() else p.name), p))
    return items


def _safe_id(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@-]+", "_", name)[:120] or "submission"


def _exercise_of(nb_path: Path) -> str | None:
    from .bundle import read_notebook

    try:
        nb = read_notebook(nb_path)
    except ValueError:
        return None
    return (nb.get("metadata", {}).get("otter", {}) or {}).get("assignment_name")


class Gradebook:
    def __init__(self, csv_path: Path, results_dir: Path):
        self.csv_path, self.results_dir = Path(csv_path), Path(results_dir)
        self.lock = threading.Lock()

    def rows(self) -> list[dict]:
        rows = []
        for f in sorted(self.results_dir.glob("*/results.json")):
            try:
                r = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            extra = r.get("extra_data", {})
            row = {"submission": f.parent.name, "exercise": extra.get("exercise", ""),
                   "score": r.get("score", 0), "possible": extra.get("possible", ""),
                   "status": extra.get("status", ""), "seed": extra.get("seed", ""),
                   "seconds": extra.get("seconds", ""), "flags": "; ".join(extra.get("flags", []))}
            if "speed" in extra:
                row["speed"] = extra["speed"]
            for t in r.get("tests", []):
                if "max_score" in t:
                    row[t["name"]] = t.get("score", 0)
            rows.append(row)
        return rows

    def write(self) -> None:
        with self.lock:
            rows = self.rows()
            base = ["submission", "exercise", "score", "possible"]
            questions = sorted({k for r in rows for k in r} - set(base) - {"status", "seed", "seconds", "flags"})
            cols = base + questions + ["status", "seed", "seconds", "flags"]
            buf = io.StringIO()
            w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow(r)
            self.csv_path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=self.csv_path.name + ".", dir=self.csv_path.parent)
            with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
                f.write(buf.getvalue())
            os.replace(tmp, self.csv_path)


def grade_folder(folder, out_csv, *, autograder=None, exercise: str | None = None, jobs: int = 2,
                 results_dir=None, force: bool = False, run_otter: bool = True, progress: bool = True,
                 perf: bool = False) -> dict:
    out_csv = Path(out_csv)
    results_dir = Path(results_dir) if results_dir else out_csv.with_name(out_csv.stem + "_results")
    book = Gradebook(out_csv, results_dir)
    cache: dict[str, Autograder] = {}
    cache_lock = threading.Lock()
    fixed = None
    if autograder or exercise:
        fixed = load_autograder(autograder or BUILD / exercise)

    def autograder_for(nb_path: Path | None) -> Autograder | None:
        if fixed is not None:
            return fixed
        name = _exercise_of(nb_path) if nb_path else None
        if not name:
            return None
        with cache_lock:
            if name not in cache:
                try:
                    cache[name] = load_autograder(BUILD / name)
                except FileNotFoundError:
                    return None
            return cache[name]

    items = discover(Path(folder))
    todo, skipped = [], 0
    for sid, path in items:
        res = results_dir / sid / "results.json"
        if not force and res.exists():
            try:
                old = json.loads(res.read_text())
                nb = find_notebook(path) if path.suffix != ".zip" else path
                if old.get("extra_data", {}).get("sha256") == (_sha256(nb) if nb else None) and nb:
                    skipped += 1
                    continue
            except (OSError, ValueError):
                pass
        todo.append((sid, path))

    def one(item):
        sid, path = item
        t0 = time.perf_counter()
        tmp = None
        try:
            sub = path
            if path.suffix == ".zip":
                tmp = Path(tempfile.mkdtemp(prefix="ksub-"))
                try:
                    with zipfile.ZipFile(path) as z:
                        z.extractall(tmp)
                    sub = tmp
                except zipfile.BadZipFile:
                    sub = path  # graded as an unreadable notebook
            nb = find_notebook(sub)
            ag = autograder_for(nb)
            if ag is None:
                results = {"score": 0, "tests": [], "output": "Could not tell which exercise this submission is for "
                           "(no otter.assignment_name in the notebook); grade it with --exercise.",
                           "extra_data": {"status": "unknown_exercise", "seconds": round(time.perf_counter() - t0, 2),
                                          "sha256": _sha256(nb) if nb else ""}}
            else:
                rec = grade_submission(sub, ag, jobs=1, run_otter=run_otter)
                results = rec.results
                results.setdefault("extra_data", {})["possible"] = rec.possible
                if path.suffix == ".zip":
                    results["extra_data"]["sha256"] = _sha256(path)
                if perf:
                    add_speed(results, nb, ag.slug)
        except BaseException as e:  # noqa: BLE001  (one submission never stops the batch)
            results = {"score": 0, "tests": [], "output": f"The grader failed on this submission: {type(e).__name__}: "
                       f"{e}", "extra_data": {"status": "error", "seconds": round(time.perf_counter() - t0, 2)}}
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        write_json_atomic(results_dir / sid / "results.json", results)
        book.write()
        return sid, results

    done = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="grading", unit="submission")
    with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(one, it) for it in todo]
        for fut in cf.as_completed(futures):
            done.append(fut.result())
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    book.write()
    weaker: dict = {}  # what the sandbox lacked on this machine -> how many submissions of this run it concerns
    for _, res in done:
        for w in (res.get("extra_data") or {}).get("sandbox_weaker") or []:
            weaker[w] = weaker.get(w, 0) + 1
    return {"graded": len(done), "skipped": skipped, "total": len(items), "gradebook": str(out_csv),
            "results_dir": str(results_dir), "sandbox_weaker": weaker}


def sandbox_summary(weaker: dict, graded: int) -> str:
    """The batch summary's line on the sandbox ('' when every submission got all of it)."""
    if not weaker:
        return ""
    from .confine import weakness_line

    n = max(weaker.values())
    return f"{weakness_line(list(weaker))} ({n} of {graded} submission(s) graded so.)"
