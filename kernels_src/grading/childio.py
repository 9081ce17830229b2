"""The sandboxed process's plumbing, shared by its modes (:mod:`.child`): progress notes, the result file, where a
line of ``submission.py`` is in the notebook, and an exception as a record the grader can show.

Nothing here reads a reference or an input: it only writes what the process found, in its own directory."""
from __future__ import annotations

import json
import os
import sys
import traceback

SUBMISSION = "submission.py"


def _progress(text: str) -> None:
    try:
        with open("progress.txt", "w", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        pass


def _finish(result: dict, outputs: dict | None = None) -> None:
    import numpy as np

    if outputs:
        try:
            np.savez("outputs.npz", **outputs)
        except Exception as e:  # noqa: BLE001
            result.setdefault("notes", []).append(f"could not save outputs: {e}")
    tmp = "result.json.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(result, default=str))
    os.replace(tmp, "result.json")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ----------------------------------------------------------------------------------- locations
class Where:
    """Maps lines of submission.py back to the notebook's cells (line_map comes from the bundle)."""

    def __init__(self, line_map):
        self.line_map = line_map or []
        try:
            with open(SUBMISSION, encoding="utf-8") as f:
                self.lines = f.read().splitlines()
        except OSError:
            self.lines = []

    def __call__(self, line: int, file: str | None = None) -> str:
        if file is not None and os.path.basename(file) != SUBMISSION:
            return f"{os.path.basename(file)} line {line}"
        text = self.lines[line - 1].strip() if 1 <= line <= len(self.lines) else ""
        loc = ""
        if 1 <= line <= len(self.line_map) and self.line_map[line - 1]:
            cell, ln = self.line_map[line - 1]
            loc = f"cell {cell}, line {ln}"
        else:
            loc = f"line {line}"
        return f"{loc}: `{text}`" if text else loc


def _student_line(tb) -> int | None:
    """The last traceback frame that is in the student's code."""
    line = None
    for fr, ln in traceback.walk_tb(tb):
        if os.path.basename(fr.f_code.co_filename) == SUBMISSION:
            line = ln
    return line


def _exc_info(e: BaseException, where: Where) -> dict:
    import errno

    line = _student_line(e.__traceback__)
    msg = str(e).strip()
    if isinstance(e, OSError) and e.errno == errno.EFBIG:
        from .sandbox import OUTPUT_LIMIT

        return {"type": "OutputLimit", "message": f"your code printed more than {OUTPUT_LIMIT >> 20} MB of output "
                "(the limit); print less", "line": line, "where": where(line) if line else ""}
    if len(msg) > 800:
        msg = msg[:800] + " ..."
    return {"type": _type_name(e), "message": msg, "line": line, "where": where(line) if line else ""}


def _type_name(e: BaseException) -> str:
    """The exception's class name; for a private class (NumPy's ``_ArrayMemoryError``), its first public base."""
    for cls in type(e).__mro__:
        if not cls.__name__.startswith("_"):
            return cls.__name__
    return type(e).__name__
