"""The library's dependencies point one way (../shared/STYLE.md, habits 12-13): an op module defines kernels
and what grading needs to know about them (edge inputs, exercise-only ops) through the registry, and never
imports the grader."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            out.append("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return out


def test_no_op_module_imports_the_grader():
    bad = {p.name: [m for m in _imports(p) if "grading" in m]
           for p in sorted((ROOT / "kernels_src" / "ops").glob("*.py"))}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"ops modules import kernels_src.grading (use kernels_src.registry instead): {bad}"


def test_no_module_is_named_after_a_chapter():
    """Chapters get renumbered; topics don't (figure modules live in kernels_src/figures/, one per topic)."""
    import re

    bad = [str(p.relative_to(ROOT)) for p in (ROOT / "kernels_src").rglob("*.py") if re.search(r"ch\d", p.stem)]
    assert not bad, f"modules named by chapter number: {bad}"
