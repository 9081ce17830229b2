"""Build submissions for testing an exercise: the student notebook with its answer cells filled in.

``solution_submission("ch01_axpy")`` is what a perfect student would submit: the student notebook from
``exercises/`` with each answer cell replaced by the master's solution. ``build_submission(..., answers=
{"q2": code})`` replaces chosen questions' answer cells with other code (the corpus of bad submissions
in ``tests/corpus/`` is written this way), and ``extra_cells`` adds code cells right after the imports.

A corpus answer file is Python text split into sections by ``# %% <name>`` lines: ``q1``, ``q2``, ...
replace those questions' answer cells, ``top`` is inserted as a cell after the first code cell, ``end`` is
appended at the end; questions without a section get the master's solution (``# %% stub`` as the first
line keeps every unanswered question a stub instead).
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

from .exercises import EXERCISES, SOLUTIONS

_MARKER = re.compile(r"^\s*#\s*(BEGIN|END)\s+SOLUTION\b.*$")


def _src(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def master_solutions(slug: str, solutions_dir: Path = SOLUTIONS) -> dict[str, str]:
    """{question name: the solution code of its answer cell(s)} from ``solutions/<slug>.md``."""
    import jupytext
    import yaml

    nb = jupytext.read(Path(solutions_dir) / f"{slug}.md")
    out: dict[str, list[str]] = {}
    question, in_solution = None, False
    for cell in nb.cells:
        src = _src(cell)
        if cell.cell_type == "raw":
            first = src.strip().splitlines()[0].strip().upper() if src.strip() else ""
            if first.startswith("# BEGIN QUESTION"):
                question = (yaml.safe_load("\n".join(src.splitlines()[1:])) or {}).get("name")
            elif first.startswith("# END QUESTION"):
                question = None
            elif first.startswith("# BEGIN SOLUTION"):
                in_solution = True
            elif first.startswith("# END SOLUTION"):
                in_solution = False
            continue
        if cell.cell_type == "code" and in_solution and question:
            code = "\n".join(ln for ln in src.splitlines() if not _MARKER.match(ln))
            out.setdefault(question, []).append(code)
    return {q: "\n\n".join(v) for q, v in out.items()}


def student_notebook(slug: str, exercises_dir: Path = EXERCISES):
    import jupytext

    return jupytext.read(Path(exercises_dir) / f"{slug}.md")


def answer_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code" and "otter_answer_cell" in c.get("metadata", {}).get("tags", [])]


def parse_answers(text: str) -> dict[str, str]:
    sections: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"^# %% (\w+)\s*$", line)
        if m:
            name = m.group(1)
            sections.setdefault(name, [])
            continue
        if name is not None:
            sections[name].append(line)
    return {k: "\n".join(v).strip("\n") + "\n" for k, v in sections.items()}


def build_submission(slug: str, answers: dict[str, str] | None = None, *, exercises_dir: Path = EXERCISES,
                     solutions_dir: Path = SOLUTIONS):
    """The student notebook of ``slug`` with answers filled in (see the module docstring)."""
    import nbformat

    answers = dict(answers or {})
    nb = copy.deepcopy(student_notebook(slug, exercises_dir))
    stub = "stub" in answers
    solutions = {} if stub else master_solutions(slug, solutions_dir)
    questions = list(master_solutions(slug, solutions_dir))
    cells = answer_cells(nb)
    if len(cells) != len(questions):
        raise ValueError(f"{slug}: {len(cells)} answer cells but {len(questions)} questions with solutions; "
                         "give each question exactly one solution cell")
    for q, cell in zip(questions, cells):
        if q in answers:
            cell.source = answers[q]
        elif q in solutions:
            cell.source = solutions[q]
    code_idx = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    if "top" in answers:
        pos = code_idx[1] + 1 if len(code_idx) > 1 else len(nb.cells)
        nb.cells.insert(pos, nbformat.v4.new_code_cell(answers["top"]))
    if "end" in answers:
        nb.cells.append(nbformat.v4.new_code_cell(answers["end"]))
    for c in nb.cells:
        c.pop("id", None)
    nb.metadata.pop("jupytext", None)
    return nb


def solution_submission(slug: str, **kw):
    return build_submission(slug, {}, **kw)


def write_ipynb(nb, path) -> Path:
    import nbformat

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    nb = nbformat.from_dict(nb)
    for i, c in enumerate(nb.cells):
        c["id"] = f"cell-{i}"
    nb.nbformat, nb.nbformat_minor = 4, 5
    nbformat.write(nb, path)
    return path
