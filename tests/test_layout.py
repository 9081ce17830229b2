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


# Modules that may name numba: the door itself, the device choice (target.py, which reloads numba's config when
# numba came first) and the simulator fixes it relies on, and the grader, which inspects compiled code (object
# mode, the dispatcher's overloads) rather than compiling kernels.
_DOOR = ("compiler/", "target.py", "device.py", "simulator.py", "grading/")


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


# ------------------------------------------------------------------------------------ one-way dependencies
# The library's layers, low to high (../shared/STYLE.md, habit 12): a module imports only from its own layer
# or below. Modules not named here (bench, the package's __init__) are not held to an order.
LAYER = {"paths": 1, "target": 1, "simulator": 1, "device": 1, "compiler": 1,
         "registry": 2,
         "parity": 3, "ptx": 3, "usage": 3,                     # usage: the command line's argument checks
         "ops": 4, "runtime": 4,                                # the dispatcher serves the model
         "dist": 4,                                             # collectives: ranks, schedules, NCCL
         "model": 5,
         "tools": 6, "figures": 6, "plots": 6, "doctor": 6, "mlp": 6, "pitfalls": 6, "benchall": 6,
         "cli": 7, "grading": 7,
         "__main__": 8}
# Imports that still run upward, each with why. The list only shrinks: an entry that no longer holds fails
# the test, so that a fixed one cannot come back unnoticed. (Empty: dispatch.explain, which drove the model from
# the runtime, moved up to model/explain.py.)
KNOWN_UPWARD: dict = {}


def _component_imports(path: Path) -> set[str]:
    """The top-level parts of kernels_src (``ops``, ``cli``, ``model``, ...) that a module imports."""
    rel = path.relative_to(ROOT / "kernels_src").parts
    package = list(rel[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            if node.module:
                full = [base + node.module.split(".")]
            else:
                full = [base + [a.name] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kernels_src."):
            full = [node.module.split(".")[1:]]
        elif isinstance(node, ast.Import):
            full = [a.name.split(".")[1:] for a in node.names if a.name.startswith("kernels_src.")]
        else:
            continue
        out |= {f[0].removesuffix(".py") for f in full if f}
    return out


def _component(path: Path) -> str:
    rel = path.relative_to(ROOT / "kernels_src").parts
    return rel[0].removesuffix(".py")


def test_dependencies_point_one_way():
    """No module imports from a layer above its own (the tools never import the CLI; an op never imports the
    model, the model never the figures or the tools), apart from KNOWN_UPWARD."""
    found = {}
    for p in sorted((ROOT / "kernels_src").rglob("*.py")):
        me = _component(p)
        if me not in LAYER:
            continue
        for other in _component_imports(p) - {me}:
            if LAYER.get(other, 0) > LAYER[me]:
                found[(p.relative_to(ROOT / "kernels_src").as_posix(), other)] = f"{me} -> {other}"
    new = {k: v for k, v in found.items() if k not in KNOWN_UPWARD}
    assert not new, f"imports that run up the layers (move the function they need down a level): {new}"
    gone = set(KNOWN_UPWARD) - set(found)
    assert not gone, f"fixed, so take them off KNOWN_UPWARD: {sorted(gone)}"


def test_only_the_entry_point_imports_the_cli():
    """The CLI sits on top: its subcommands' modules (tools, grading) are imported by it, never the reverse.
    Shared argument helpers (parse_sizes, the checks of bad input) live in kernels_src/usage.py."""
    importers = sorted(p.relative_to(ROOT / "kernels_src").as_posix() for p in (ROOT / "kernels_src").rglob("*.py")
                       if _component(p) != "cli" and "cli" in _component_imports(p))
    assert importers == ["__main__.py"], importers


# ------------------------------------------------------------------------------------------------ no circles
def _module_of(parts: list[str]) -> Path | None:
    """The file of a kernels_src module named by its parts (a package is its __init__.py)."""
    base = ROOT / "kernels_src" / Path(*parts) if parts else ROOT / "kernels_src"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _file_imports(path: Path) -> set[Path]:
    """The files of kernels_src that one module imports (inside functions too), each package as its
    __init__.py; ``from . import x`` names the module x when there is one."""
    rel = list(path.relative_to(ROOT / "kernels_src").parts)
    package = rel[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            mod = base + (node.module.split(".") if node.module else [])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kernels_src"):
            mod = node.module.split(".")[1:]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("kernels_src.") and (f := _module_of(a.name.split(".")[1:])):
                    out.add(f)
            continue
        else:
            continue
        named = [f for a in node.names if (f := _module_of(mod + [a.name]))]
        found = named if len(named) == len(node.names) else named + [_module_of(mod)]
        out |= {f for f in found if f is not None and f != path}
    return out


def _circles(graph: dict) -> list[list[str]]:
    """Strongly connected components of more than one file (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


# Circles that still stand, by the folder they sit in (each owned by that folder's next change).
KNOWN_CIRCLE_FOLDERS = {"grading/": "the grader's modules still import each other (issue 29; its owner untangles them)"}


def test_no_module_imports_itself_in_a_circle():
    """No two files of the library import each other, directly or around a loop (an import inside a function
    counts: it still ties the two files together). A package's __init__.py that only hands names on is left
    out, and so is a submodule's import of its own package's __init__.py (Python runs that first whenever the
    submodule is imported: the compiler door's intrinsics read which compiler it chose)."""
    pkg = ROOT / "kernels_src"
    faces = {p for p in pkg.rglob("__init__.py") if not [n for n in ast.parse(p.read_text()).body
                                                        if isinstance(n, (ast.FunctionDef, ast.ClassDef))]}
    graph = {}
    for p in sorted(pkg.rglob("*.py")):
        if p in faces:
            continue
        graph[p.relative_to(pkg).as_posix()] = sorted(f.relative_to(pkg).as_posix() for f in _file_imports(p)
                                                      if f not in faces and f != p.parent / "__init__.py")
    circles = [c for c in _circles(graph) if not any(all(f.startswith(k) for f in c) for k in KNOWN_CIRCLE_FOLDERS)]
    assert not circles, f"files that import each other (move what both need below them): {circles}"


def test_the_circle_finder_can_fail():
    g = {"a.py": ["b.py"], "b.py": ["c.py"], "c.py": ["a.py"], "d.py": ["a.py"]}
    assert _circles(g) == [["a.py", "b.py", "c.py"]]
    assert _circles({"a.py": ["b.py"], "b.py": []}) == []


def test_the_readme_lists_every_chapter_of_the_book():
    """The README's chapter table is a newcomer's map: every chapter in _toc.yml has its row, in order, and no row
    names a chapter the book does not have."""
    import re

    toc = re.findall(r"file:\s*notebooks/(ch\d+_\w+)", (ROOT / "_toc.yml").read_text())
    book = [int(re.match(r"ch(\d+)", name).group(1)) for name in toc]
    for name in toc:  # each chapter's own heading gives its number
        head = re.search(r"^# (\d+)\. ", (ROOT / "notebooks" / f"{name}.md").read_text(), re.M)
        assert head and int(head.group(1)) == int(name[2:4]), f"{name}: its heading is not '# {int(name[2:4])}. ...'"
    readme = (ROOT / "README.md").read_text().split("## Chapters", 1)[1].split("\n## ", 1)[0]
    rows = [int(n) for n in re.findall(r"^\| (\d+) \|", readme, re.M)]
    assert rows == book, f"README's chapter table lists {rows}; _toc.yml has {book}"
