"""The student's path through JupyterLab, in a real (headless) browser.

`make lab` is started on a free port in a temporary directory that looks like a checkout to it: a copy of
exercises/ (with otter's visible tests), and links to .venv, .jupyter and the files the Makefile's venv stamp
depends on. The repository is on the kernel's PYTHONPATH, so ``kernels_src`` imports as in the checkout,
and nothing the student types or JupyterLab saves can reach the repository's files. Then, as a student does:

1. open ``exercises/ch01_axpy.md`` from the file browser (double clicks) and wait for the kernel;
2. Run > Run All Cells;
3. the untouched stubs' visible checks (question 1 on the CPU, question 2 on the GPU, which runs in the
   CUDA simulator without a GPU) print "still the stub", and the "try it" cell prints NaNs, not
   uninitialized memory;
4. the master's answers (from solutions/ch01_axpy.md) are typed into the answer cells through JupyterLab's
   editor, Run All Cells again, and both visible checks pass.
5. the exercise's last cell ("Hand it in") refused, during that Run All, the answers typed but not saved;
   File > Save (Ctrl+S), run it again: it writes ``submissions/ch01_axpy.ipynb`` beside ``exercises/``, and
   ``kernels grade`` gives that file full marks.

Screenshots of each step go to `_build/screenshots/lab/` (look at them: a passing test can still look
wrong). The browser is the ``browser`` fixture (tests/_browser.py): without one the test is skipped with one
line, or fails under REQUIRE_BROWSER=1.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "_build" / "screenshots" / "lab"
SLUG = "ch01_axpy"
CPU_Q, GPU_Q = "q1", "q2"   # q1: axpy_cpu (@njit); q2: axpy_kernel + axpy_gpu (@cuda.jit)
STUB_TEXT = "still the stub (`...`)"  # kernels_src/grading/planrun.py: what a visible check says for a stub
START_S = 120       # `make lab` answering
KERNEL_S = 120      # the notebook open and its kernel idle
RUN_ALL_S = 240     # one Run All Cells (numba compiles, the simulator runs the GPU checks)

LINKED = (".venv", ".jupyter", "pyproject.toml", "requirements.lock")  # what `make lab` reads in its directory
# User settings for the temporary JupyterLab: no news/update pop-up over the notebook, and no autosave
# (the notebook is a temporary copy anyway; this keeps the typed answer in the browser only).
USER_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                         "checkForUpdates": False},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
}


# ------------------------------------------------------------------------------------------- the server
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def make_lab(root_dir: Path, tmp: Path):
    """`make lab` serving ``root_dir`` on a free port; yields the URL of /lab (with its token). The server
    (its whole process group: make, jupyter, kernels) is always stopped."""
    port, token = _free_port(), secrets.token_hex(16)
    settings = tmp / "user-settings"
    for rel, value in USER_SETTINGS.items():
        (settings / rel).parent.mkdir(parents=True, exist_ok=True)
        (settings / rel).write_text(json.dumps(value))
    import kernels_src

    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"), IPYTHONDIR=str(tmp / "ipython"),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               # The kernel picks its device as a student's does (kernels_src.device); without a GPU
               # that is the CUDA simulator, so say so explicitly.
               KERNELS_DEVICE="gpu" if kernels_src.device.MODE == "gpu" else "sim")
    env.pop("NUMBA_ENABLE_CUDASIM", None)  # kernels_src.device sets it from KERNELS_DEVICE
    # The Makefile's recipe serves its working directory (--notebook-dir=.) with JupyterLab's config from
    # ./.jupyter and runs ./.venv/bin/jupyter: run it in root_dir, which links to those.
    for name in LINKED:
        (root_dir / name).symlink_to(ROOT / name)
    lab_args = f"--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token={token} --ServerApp.port_retries=0"
    log = open(tmp / "lab.log", "w+")
    proc = subprocess.Popen(["make", "-s", "-f", str(ROOT / "Makefile"), "lab", f"LAB_ARGS={lab_args}"],
                            cwd=root_dir, env=env, text=True, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + START_S
        while True:
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/api/status",
                                             headers={"Authorization": f"token {token}"})
                with urllib.request.urlopen(req, timeout=10):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise AssertionError(f"`make lab` did not answer within {START_S} s:\n{log.read()[-4000:]}")
                time.sleep(0.5)
        try:
            yield f"http://127.0.0.1:{port}/lab?token={token}"
        except BaseException:
            log.seek(0)
            print(f"--- the end of `make lab`'s log:\n{log.read()[-6000:]}")
            raise
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # make may exit before its children (jupyter, the kernel): make sure none is left.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


# ------------------------------------------------------------------------------------------ the page
# The notebook's code cells as a student sees them: input text, prompt, output text (textContent, so
# cells outside the viewport count too).
_CELLS = """() => Array.from(document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell')).map(c => ({
  input: (c.querySelector('.cm-content') || {}).textContent || '',
  prompt: ((c.querySelector('.jp-InputPrompt') || {}).textContent || '').trim(),
  output: Array.from(c.querySelectorAll('.jp-OutputArea-output')).map(o => o.textContent).join('\\n'),
}))"""

_IDLE = """() => {
  const ind = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator');
  return !!ind && ind.getAttribute('data-status') === 'idle';
}"""


def _cells(page) -> list[dict]:
    return page.evaluate(_CELLS)


def _cell_index(cells, needle: str, *, whole: bool = False) -> int:
    hits = [i for i, c in enumerate(cells) if (c["input"].strip() == needle if whole else needle in c["input"])]
    assert len(hits) == 1, f"expected one code cell {'reading' if whole else 'containing'} {needle!r}, found {len(hits)}"
    return hits[0]


def _code_cell(page, index: int):
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell").nth(index)


def _describe(cells) -> str:
    return "\n".join(f"[{i}] {c['prompt']} {c['input'][:60]!r} -> {c['output'][:300]!r}" for i, c in enumerate(cells))


def _run_all(page) -> list[dict]:
    """Run > Run All Cells from the menu bar; returns the code cells once the run is over. JupyterLab marks
    every queued cell [*] at once, and unmarks the rest when a cell raises; so the run is over when no
    cell is marked any more and the kernel is idle."""
    before = [c["prompt"] for c in _cells(page)]
    page.locator(".jp-Notebook").first.click(position={"x": 5, "y": 5})  # focus the notebook
    page.locator("#jp-menu-panel .lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    started = False
    deadline = time.monotonic() + RUN_ALL_S
    while True:
        cells = _cells(page)
        prompts = [c["prompt"] for c in cells]
        busy = any("*" in p for p in prompts)
        started = started or busy or prompts != before
        if started and not busy and page.evaluate(_IDLE):
            return cells
        if time.monotonic() > deadline:
            raise AssertionError(f"Run All Cells did not {'finish' if started else 'start'} within {RUN_ALL_S} s:\n"
                                 + _describe(cells))
        page.wait_for_timeout(250)


def _type_answer(page, index: int, code: str) -> None:
    """Replace the answer cell's text as a student does: click into its editor, select all, type."""
    editor = _code_cell(page, index).locator(".cm-content")
    editor.scroll_into_view_if_needed()
    editor.click()
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.press("Delete")
    # insert_text types the text as one input (as a paste does): the editor's auto-indent on Enter
    # would otherwise indent every typed line once more.
    page.keyboard.insert_text(code)
    typed = _cells(page)[index]["input"]
    assert re.sub(r"\s", "", typed) == re.sub(r"\s", "", code), f"the editor holds {typed!r}, not the answer"
    page.keyboard.press("Escape")  # leave edit mode


def _run_cell(page, index: int) -> list[dict]:
    """Run one code cell (click into it, Shift+Enter) and return the cells once it has run."""
    before = _cells(page)[index]["prompt"]
    editor = _code_cell(page, index).locator(".cm-content")
    editor.scroll_into_view_if_needed()
    editor.click()
    page.keyboard.press("Shift+Enter")
    deadline = time.monotonic() + RUN_ALL_S
    while True:
        cells = _cells(page)
        prompt = cells[index]["prompt"]
        if prompt != before and "*" not in prompt and page.evaluate(_IDLE):
            return cells
        if time.monotonic() > deadline:
            raise AssertionError(f"cell {index} did not run within {RUN_ALL_S} s:\n{_describe(cells)}")
        page.wait_for_timeout(250)


def _grade_full_marks(folder: Path, tmp: Path) -> None:
    """`kernels grade FOLDER` (without otter's notebook run) gives the one submission in it full marks for the
    questions answered here (CPU_Q, GPU_Q) and none for the others, still stubs."""
    import csv
    import sys

    from _grading_support import generated

    book = tmp / "gradebook.csv"
    r = subprocess.run([sys.executable, "-m", "kernels_src", "grade", str(folder), "--autograder",
                        str(generated(SLUG) / "build" / SLUG), "--no-otter", "--jobs", "1", "--out", str(book)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = list(csv.DictReader(book.open()))
    assert len(rows) == 1 and rows[0]["exercise"] == SLUG, rows
    results = json.loads(next((tmp / "gradebook_results").rglob("results.json")).read_text())
    points = {t["name"]: (t.get("score", 0), t["max_score"]) for t in results["tests"] if "max_score" in t}
    assert {CPU_Q, GPU_Q} < set(points), points
    for q, (score, most) in points.items():
        want = most if q in (CPU_Q, GPU_Q) else 0
        assert most > 0 and score == want, f"{q}: {score} of {most} points, expected {want}: {rows}"


def _shot(page, name: str, index: int | None = None) -> None:
    if index is not None:
        _code_cell(page, index).scroll_into_view_if_needed()
        page.wait_for_timeout(300)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"))


# ------------------------------------------------------------------------------------------------ test
@pytest.mark.browser
@pytest.mark.slow
def test_student_runs_an_exercise_in_jupyterlab(browser, tmp_path):
    from kernels_src.grading.corpus import answer_cells, master_solutions, student_notebook

    answers = master_solutions(SLUG)
    assert {CPU_Q, GPU_Q} <= set(answers), f"solutions/{SLUG}.md has no answers for {CPU_Q}, {GPU_Q}"
    root = tmp_path / "home"
    shutil.copytree(ROOT / "exercises", root / "exercises", ignore=shutil.ignore_patterns("__pycache__", ".*"))
    for stale in SHOTS.glob("*.png"):
        stale.unlink()

    t_start = time.monotonic()
    with make_lab(root, tmp_path) as url:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        try:
            page_errors: list[str] = []
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            page.goto(url, wait_until="domcontentloaded", timeout=60_000)

            # 1. Open the exercise from the file browser, as a student does: double-click the folder,
            #    then the notebook. The .md opens as a notebook (.jupyter/labconfig, set by `make lab`).
            listing = page.locator("#filebrowser .jp-DirListing-content")
            listing.locator(".jp-DirListing-itemText", has_text=re.compile(r"^exercises$")).dblclick(timeout=60_000)
            listing.locator(".jp-DirListing-itemText", has_text=re.compile(rf"^{SLUG}\.md$")).dblclick(timeout=30_000)
            page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .cm-content",
                         has_text="grader.check_all()").wait_for(timeout=KERNEL_S * 1000)
            page.wait_for_function(_IDLE, timeout=KERNEL_S * 1000)
            print(f"lab answering, notebook open, kernel idle: {time.monotonic() - t_start:.0f} s")
            cells = _cells(page)
            q1_answer = _cell_index(cells, "def axpy_cpu")
            q2_answer = _cell_index(cells, "def axpy_kernel")
            q1_check = _cell_index(cells, f'grader.check("{CPU_Q}")', whole=True)
            q2_check = _cell_index(cells, f'grader.check("{GPU_Q}")', whole=True)
            try_q1 = _cell_index(cells, "axpy_cpu(out, np.float32(2.0), x, y)")
            submit_cell = _cell_index(cells, f'submit("{SLUG}.md")')
            _shot(page, "01_opened")

            # 2.-3. Run All with the stubs untouched: each visible check says "still the stub".
            t0 = time.monotonic()
            cells = _run_all(page)
            print(f"Run All Cells with the stubs: {time.monotonic() - t0:.0f} s")
            _shot(page, "02_stub_q1_cpu", q1_check)
            _shot(page, "03_stub_q2_gpu", q2_check)
            for q, i, names in ((CPU_Q, q1_check, ["axpy_cpu"]), (GPU_Q, q2_check, ["axpy_gpu", "axpy_kernel"])):
                out = cells[i]["output"]
                assert STUB_TEXT in out and all(f"`{n}`" in out for n in names), \
                    f"{q}'s check on the stub does not say {STUB_TEXT!r} for {names}:\n{_describe(cells)}"
            # The "try it" cell shows that the stub wrote nothing: NaNs, not np.empty's leftovers.
            assert re.search(r"\[\s*nan(\s+nan){4}\s*\]", cells[try_q1]["output"]), \
                f"the try-it cell after the stub prints {cells[try_q1]['output']!r}, not five NaNs"

            # 4. The master's answers typed into the answer cells; Run All again; both checks pass.
            _type_answer(page, q1_answer, answers[CPU_Q])
            _type_answer(page, q2_answer, answers[GPU_Q])
            t0 = time.monotonic()
            cells = _run_all(page)
            print(f"Run All Cells with the answers: {time.monotonic() - t0:.0f} s")
            _shot(page, "04_answer_q1_cpu", q1_check)
            _shot(page, "05_answer_q2_gpu", q2_check)
            for q, i in ((CPU_Q, q1_check), (GPU_Q, q2_check)):
                out = cells[i]["output"]
                assert f"{q} passed!" in out and STUB_TEXT not in out, \
                    f"{q}'s check does not pass with the master's answer:\n{_describe(cells)}"
            assert "[1. 3. 5. 7. 9.]" in cells[try_q1]["output"], cells[try_q1]["output"]

            # 5. Hand it in (the exercise's last cell, kernels_src/tools/submit.py). Run All ran it with the
            #    answers typed but not saved: it refused, and said to save. Save, run it again: it writes
            #    submissions/ch01_axpy.ipynb beside exercises/, which `kernels grade` grades to full marks.
            out = cells[submit_cell]["output"]
            assert "not submitted" in out and "save the notebook" in out and "axpy_cpu" in out, \
                f"the hand-in cell did not refuse the unsaved answers:\n{_describe(cells)}"
            page.locator(".jp-Notebook").first.click(position={"x": 5, "y": 5})
            page.keyboard.press("ControlOrMeta+s")
            page.wait_for_function("() => !document.querySelector('.lm-TabBar-tab.lm-mod-current.jp-mod-dirty')",
                                   timeout=30_000)  # the tab's "unsaved" dot is gone
            cells = _run_cell(page, submit_cell)
            _shot(page, "06_submitted", submit_cell)
            out = cells[submit_cell]["output"]
            submission = root / "submissions" / f"{SLUG}.ipynb"
            assert f"wrote {submission}" in out, f"the hand-in cell after saving:\n{_describe(cells)}"
            assert not page_errors, f"JupyterLab page errors: {page_errors}"
        except Exception:
            with contextlib.suppress(Exception):
                _shot(page, "99_failed")  # what the page showed when the test failed
            raise
        finally:
            context.close()

    # The file the hand-in cell wrote is what the grader takes: the master's answers score full marks.
    _grade_full_marks(root / "submissions", tmp_path)

    # The answers were typed into the temporary copy only: the repository's exercise is still the stub.
    # (Other files under exercises/ may change meanwhile: `make exercises` regenerates them.)
    stubs = [c.source for c in answer_cells(student_notebook(SLUG)) if "def axpy_cpu" in c.source]
    assert stubs and stubs[0].rstrip().endswith("..."), f"exercises/{SLUG}.md's answer cell changed: {stubs}"
