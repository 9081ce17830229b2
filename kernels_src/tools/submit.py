"""Make the file to hand in: ``kernels submit exercises/ch01_axpy.md`` writes ``submissions/ch01_axpy.ipynb``.

The exercises are jupytext Markdown notebooks; the grader (`kernels grade`) and Gradescope's autograder take
a Jupyter notebook (``.ipynb``). This command converts one exercise into exactly that: the notebook's cells
and its ``otter`` metadata (which names the exercise), in nbformat 4, validated, outputs left out (the
grader runs the code itself). The file is named after the exercise, whatever the source file is called.

Where it goes: ``--out DIR`` (a folder that exists), else ``submissions/`` beside the ``exercises/`` folder
that holds the notebook (the top of the checkout; git ignores it), else ``submissions/`` in the current
folder. The same function runs from the last cell of every exercise in JupyterLab::

    from kernels_src.tools.submit import submit
    submit("ch01_axpy.md")

There it also compares the saved file with the cells this kernel ran: a function that was run in a version
the saved file does not hold means the notebook was not saved, and nothing is written (save, run the cell
again). Bad input (no such file, not a notebook, not a course exercise) is one line and exit status 2.
"""
from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

from ..usage import UsageError


def _read(path: Path):
    """The notebook in ``path`` (.md/.py jupytext or .ipynb) as an nbformat v4 node; UsageError if it is none."""
    import nbformat

    if not path.exists():
        raise UsageError(f"{path}: no such file")
    if path.is_dir():
        raise UsageError(f"{path}: is a folder; name the exercise notebook in it (e.g. exercises/ch01_axpy.md)")
    if path.suffix not in (".md", ".ipynb"):
        raise UsageError(f"{path}: not an exercise notebook (a .md from exercises/, or an .ipynb)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file") from None
    if not text.strip():
        raise UsageError(f"{path}: is empty")
    try:
        if path.suffix == ".md":
            import jupytext

            nb = jupytext.reads(text, fmt="md:myst")
        else:
            nb = nbformat.reads(text, as_version=4)
    except Exception as e:  # noqa: BLE001  (any parse error: one line)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UsageError(f"{path}: cannot be read as a notebook ({first})") from None
    return nb


def _exercise_name(nb, path: Path) -> str:
    name = (nb.metadata.get("otter") or {}).get("assignment_name")
    if not isinstance(name, str) or not re.fullmatch(r"ch\d\d_[A-Za-z0-9_]+", name):
        raise UsageError(f"{path}: not a course exercise (its metadata names no otter assignment); "
                         "submit the notebook from exercises/")
    return name


def _default_out(path: Path) -> Path:
    folder = path.resolve().parent
    return folder.parent / "submissions" if folder.name == "exercises" else Path.cwd() / "submissions"


def _defs(source: str) -> dict[str, str]:
    """Top-level function names defined by a cell, each with the cell's text (whitespace-normalized)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    norm = re.sub(r"\s+", " ", source).strip()
    return {n.name: norm for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def unsaved_functions(nb, history: list[str]) -> list[str]:
    """Functions that the kernel last ran (``history``: its cells, oldest first) in a version that no code cell
    of the saved notebook ``nb`` holds: the answers typed and run but not saved."""
    ran: dict[str, str] = {}
    for src in history:
        ran.update(_defs(src))
    saved: dict[str, set[str]] = {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            for name, norm in _defs(cell.source).items():
                saved.setdefault(name, set()).add(norm)
    return sorted(name for name, norm in ran.items() if name in saved and norm not in saved[name])


def _kernel_history() -> list[str] | None:
    """The cells this IPython kernel ran, oldest first; None outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return None
    ip = get_ipython()
    if ip is None:
        return None
    return [s for s in ip.user_ns.get("In", []) if s]


def make_submission(notebook, out_dir=None) -> Path:
    """Write the submission of ``notebook`` (path of an exercise .md or .ipynb) into ``out_dir`` (default: see
    the module) and return its path. UsageError (one line) on bad input."""
    import nbformat

    path = Path(notebook)
    nb = _read(path)
    name = _exercise_name(nb, path)
    if out_dir is not None:
        out = Path(out_dir)
        if not out.is_dir():
            raise UsageError(f"--out {out_dir}: no such folder (create it first, or leave --out out)")
    else:
        out = _default_out(path)
        out.mkdir(exist_ok=True)
    history = _kernel_history()
    if history:
        stale = unsaved_functions(nb, history)
        if stale:
            raise UsageError(f"{path.name} on disk does not hold the {', '.join(stale)} you ran last: save the "
                             "notebook (File > Save, or Ctrl+S), then run this cell again")
    keep = {k: nb.metadata[k] for k in ("kernelspec", "language_info", "otter") if k in nb.metadata}
    sub = nbformat.v4.new_notebook(metadata=keep)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            new = nbformat.v4.new_code_cell(cell.source, metadata=dict(cell.get("metadata", {})))
        elif cell.cell_type == "markdown":
            new = nbformat.v4.new_markdown_cell(cell.source, metadata=dict(cell.get("metadata", {})))
        else:
            new = nbformat.v4.new_raw_cell(cell.source, metadata=dict(cell.get("metadata", {})))
        new.id = f"cell-{i}"  # the same file for the same notebook (nbformat draws random ids)
        sub.cells.append(new)
    nbformat.validate(sub)
    target = out / f"{name}.ipynb"
    if target.resolve() == path.resolve():
        raise UsageError(f"{path}: is already the submission file; name the exercise notebook instead")
    target.write_text(json.dumps(sub, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return target


def submit(notebook, out_dir=None) -> None:
    """The last cell of every exercise: make the submission and say where it is (one line on a problem).
    (The grader leaves this module's import out of what it runs: grading/bundle.py, HAND_IN_MODULE.)"""
    try:
        target = make_submission(notebook, out_dir)
    except UsageError as e:
        print(f"not submitted: {e}", file=sys.stderr)
        return
    print(f"wrote {target}\nUpload this file to Gradescope. To grade it here first: "
          f"kernels grade {target.parent} --exercise {target.stem}")


def add_parser(sub) -> None:
    s = sub.add_parser("submit", help="write the .ipynb to hand in for an exercise (submissions/chNN_slug.ipynb)")
    s.add_argument("notebook", help="the exercise notebook, e.g. exercises/ch01_axpy.md")
    s.add_argument("--out", help="the folder to write it into (default: submissions/ beside exercises/)")
    s.set_defaults(func=cmd_submit)


def cmd_submit(args) -> int:
    target = make_submission(args.notebook, args.out)
    print(f"wrote {target}: upload it to Gradescope (grade it here: kernels grade {target.parent} "
          f"--exercise {target.stem})")
    return 0
