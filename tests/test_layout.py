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


# Modules that may name numba: the door itself, the device choice and simulator fixes it relies on, and the
# grader, which inspects compiled code (object mode, the dispatcher's overloads) rather than compiling kernels.
_DOOR = ("compiler/", "device.py", "simulator.py", "grading/")


def test_every_kernel_module_goes_through_the_compiler_door():
    """No module of the library imports numba (numba.cuda, numba's types, njit) except through
    kernels_src.compiler: one place decides which compiler builds the course's kernels (numba-cuda or its
    successor numba-cuda-mlir), so switching it cannot miss a module."""
    pkg = ROOT / "kernels_src"
    bad = {}
    for p in sorted(pkg.rglob("*.py")):
        rel = p.relative_to(pkg).as_posix()
        if rel.startswith(_DOOR):
            continue
        found = [m for m in _imports(p) if m.split(".")[0] in ("numba", "numba_cuda", "numba_cuda_mlir")]
        if found:
            bad[rel] = found
    assert not bad, ("modules that import numba around kernels_src.compiler (import cuda, the scalar types, "
                     f"njit/prange and the intrinsics from kernels_src.compiler instead): {bad}")


def test_the_door_test_can_fail(tmp_path):
    """The door test reads imports from the syntax tree: an import inside a function is seen too."""
    f = tmp_path / "k.py"
    f.write_text("def f():\n    from numba import cuda\n    import numba.core.types as t\n")
    assert [m for m in _imports(f) if m.startswith("numba")] == ["numba", "numba.core.types"]
