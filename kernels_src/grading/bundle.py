"""What the grader runs of a notebook: its imports, definitions and constants, never its other statements.

A student's notebook mixes the answer (functions, kernels, constants such as ``THREADS = 128``) with
demos, prints, timing loops and ``grader.check(...)`` calls. The grader runs only the first kind, in a
fresh process, so a slow demo, a stray ``while True`` or a crash in a scratch cell cannot cost the
student the questions they answered. The rule, applied to every top-level statement of every code cell
in order (later definitions replace earlier ones, as in the notebook):

- kept: ``import``/``from ... import`` (except otter), ``def``, ``class``, ``raise``, and assignments
  (``X = ...``, ``X: int = ...``, ``X += ...``) unless the right-hand side calls a function defined in
  the notebook or launches a kernel (``k[blocks, threads](...)``); ``if``/``try`` blocks made only of
  such statements;
- skipped: everything else: expressions (calls, prints, ``grader.check``), loops, ``with``, ``assert``,
  IPython magics and shell escapes, cell magics (``%%time`` cells), and lines that use otter.

A cell with a syntax error is skipped, and the note is shown with any failure it causes. The same rule
is used for a submitted notebook file and for the cells typed so far in a live Jupyter session, so a
visible check in the notebook and the autograder see the same code.
"""
from __future__ import annotations

import ast
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

HEADER = "# The code the grader runs: the imports, definitions and constants of your notebook.\n"


@dataclass
class Bundle:
    source: str  # the module text the sandbox runs
    line_map: list = field(default_factory=list)  # bundle line (1-based, index+1) -> (cell number, line in cell)
    notes: list = field(default_factory=list)  # student-facing notes: skipped cells with syntax errors, ...
    defined: list = field(default_factory=list)  # top-level names defined by def/class/assignment

    @property
    def sha(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]

    def where(self, lineno: int) -> str:
        """'cell 7, line 3' for a line of the bundle (1-based), or '' if unknown."""
        if 1 <= lineno <= len(self.line_map) and self.line_map[lineno - 1]:
            cell, line = self.line_map[lineno - 1]
            return f"cell {cell}, line {line}"
        return ""

    def line_text(self, lineno: int) -> str:
        lines = self.source.splitlines()
        return lines[lineno - 1].strip() if 1 <= lineno <= len(lines) else ""

    def to_json(self) -> dict:
        return {"source": self.source, "line_map": self.line_map, "notes": self.notes, "defined": self.defined}

    @classmethod
    def from_json(cls, d: dict) -> "Bundle":
        return cls(d["source"], [tuple(x) if x else None for x in d["line_map"]], list(d["notes"]), list(d["defined"]))


def _ipython_to_python(src: str) -> str:
    """Turn IPython syntax (``%magic``, ``!cmd``, ``x?``) into plain Python calls."""
    if not any(ch in src for ch in "%!?"):
        return src
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:  # pragma: no cover  (IPython is part of the course environment)
        return src
    try:
        return TransformerManager().transform_cell(src)
    except Exception:  # noqa: BLE001
        return src


def _calls(node: ast.AST):
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            yield n


def _root_name(expr: ast.AST) -> str | None:
    while isinstance(expr, (ast.Attribute, ast.Subscript, ast.Call)):
        expr = expr.value if not isinstance(expr, ast.Call) else expr.func
    return expr.id if isinstance(expr, ast.Name) else None


def _mentions_otter(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in ("otter", "grader"):
            return True
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in n.names] + ([n.module] if isinstance(n, ast.ImportFrom) and n.module else [])
            if any(m == "otter" or m.startswith("otter.") for m in mods):
                return True
    return False


# The hand-in cell at the end of every exercise (kernels_src/tools/submit.py) is not the student's code: the
# grader's process does not have that module, and needs nothing from it.
HAND_IN_MODULE = "kernels_src.tools.submit"


def _keep(stmt: ast.stmt, user_functions: set) -> bool:
    if _mentions_otter(stmt):
        return False
    if isinstance(stmt, ast.ImportFrom) and stmt.module == HAND_IN_MODULE:
        return False
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                         ast.Raise, ast.Pass)):
        return True
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        value = stmt.value
        if value is None:
            return True
        for call in _calls(value):
            if isinstance(call.func, ast.Subscript):  # kernel[blocks, threads](...) launches a kernel
                return False
            if _root_name(call.func) in user_functions:  # runs the student's own code: a demo, not a constant
                return False
        return True
    if isinstance(stmt, ast.If):
        return all(_keep(s, user_functions) for s in stmt.body + stmt.orelse)
    if isinstance(stmt, ast.Try):
        body = stmt.body + stmt.orelse + stmt.finalbody + [s for h in stmt.handlers for s in h.body]
        return all(_keep(s, user_functions) for s in body)
    return False


def _defined_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    targets = []
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        targets = [stmt.target]
    out = []
    for t in targets:
        for n in ast.walk(t):
            if isinstance(n, ast.Name):
                out.append(n.id)
    return out


def from_cells(cells: list[tuple[int, str]]) -> Bundle:
    """Build a bundle from ``[(cell_number, source), ...]`` (code cells only, in execution order)."""
    parsed = []
    notes = []
    for number, src in cells:
        if src.lstrip().startswith("%%"):
            first = src.strip().splitlines()[0] if src.strip() else ""
            if not first.startswith(("%%time", "%%timeit", "%%capture")):
                continue
            notes.append(f"cell {number} starts with {first.split()[0]}: the grader skips the whole cell")
            continue
        py = _ipython_to_python(src)
        try:
            tree = ast.parse(py)
        except SyntaxError as e:
            notes.append(f"cell {number} has a syntax error (line {e.lineno}: {e.msg}) and was skipped")
            continue
        parsed.append((number, py, tree))
    user_functions = {s.name for _, _, tree in parsed for s in tree.body
                      if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
    lines_out = [HEADER.rstrip("\n")]
    line_map: list = [None]
    defined: list[str] = []
    for number, py, tree in parsed:
        src_lines = py.splitlines()
        kept = [s for s in tree.body if _keep(s, user_functions)]
        if not kept:
            continue
        lines_out.append(f"# --- cell {number} ---")
        line_map.append(None)
        for s in kept:
            start = min([s.lineno] + [d.lineno for d in getattr(s, "decorator_list", [])])
            for ln in range(start, s.end_lineno + 1):
                lines_out.append(src_lines[ln - 1] if ln - 1 < len(src_lines) else "")
                line_map.append((number, ln))
            defined += [n for n in _defined_names(s) if n not in defined]
    return Bundle("\n".join(lines_out) + "\n", line_map, notes, defined)


def notebook_cells(nb) -> list[tuple[int, str]]:
    """``[(cell number (1-based, all cells counted), source)]`` for the code cells of an nbformat notebook."""
    out = []
    for i, cell in enumerate(nb.get("cells", []), start=1):
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        if isinstance(src, list):
            src = "".join(src)
        out.append((i, src))
    return out


def from_notebook(nb) -> Bundle:
    return from_cells(notebook_cells(nb))


def read_notebook(path) -> "object":
    """Read an ``.ipynb`` (or a jupytext ``.md``/``.py``) file as an nbformat notebook.

    Raises ``ValueError`` with a student-facing message when the file is not a readable notebook."""
    import nbformat

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path.name} is not a text file (is it really a notebook?)") from None
    if not text.strip():
        raise ValueError(f"{path.name} is empty")
    if path.suffix in (".md", ".py"):
        import jupytext

        try:
            return jupytext.reads(text, fmt=path.suffix[1:])
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"{path.name} could not be read as a jupytext notebook: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path.name} is not valid notebook JSON (line {e.lineno}: {e.msg}); "
                         "was it saved completely?") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise ValueError(f"{path.name} is JSON but not a Jupyter notebook (no list of cells)")
    try:
        return nbformat.reads(text, as_version=4)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"{path.name} is not a valid Jupyter notebook: {str(e).splitlines()[0]}") from None


def from_ipython_history() -> Bundle | None:
    """The cells executed so far in the running IPython kernel (``In``), or None outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return None
    ip = get_ipython()
    if ip is None:
        return None
    history = list(ip.user_ns.get("In", []) or [])
    return from_cells([(i, src) for i, src in enumerate(history) if i > 0 and src])
