"""What counts as a shortcut: NumPy, BLAS or the course's library doing the work an exercise asks the student to
write. Read two ways: from the source of the notebook's functions (:func:`scan_shortcuts`, in the plan run) and
from what Numba compiled (:func:`compiled_problems`, in the exec run: object mode, NumPy's products and
reductions, BLAS/LAPACK symbols, calls into the interpreter), whatever name the call was spelled with.

The names lists are also read by :mod:`.kernelpack` when it checks the functions to rebuild."""
from __future__ import annotations

import ast
import builtins
import inspect
import textwrap

FORBIDDEN_NUMPY = ("matmul", "dot", "einsum", "inner", "outer", "vdot", "tensordot", "kron", "sum", "nansum",
                   "prod", "cumsum", "cumprod", "mean", "average", "convolve", "correlate", "trace", "max", "min",
                   "amax", "amin", "nanmax", "nanmin", "argmax", "argmin", "ptp", "sort", "argsort", "lexsort",
                   "partition", "argpartition", "bincount", "histogram", "unique", "searchsorted", "digitize",
                   "array_split", "sliding_window_view")
FORBIDDEN_METHODS = ("dot", "sum", "mean", "prod", "cumsum", "cumprod", "matmul", "__matmul__", "__rmatmul__",
                     "__imatmul__", "trace", "std", "var", "max", "min", "argmax", "argmin", "ptp")
FORBIDDEN_PACKAGES = ("scipy", "torch", "cupy", "jax", "tensorflow", "sklearn", "cublas")
# Names a submission may take from the course library: the launch helpers, and the compiler door's instructions
# (16-byte loads, dp4a, the tensor cores' mma.sync and its conversions), which stand for single PTX instructions
# that Numba has no name for, not for work an exercise asks the student to write.
ALLOWED_FROM_KERNELS_SRC = ("ceil_div", "cuda", "device", "load4", "store4", "dp4a", "mma_tf32", "mma_f16", "mma_bf16",
                            "to_tf32", "pack_f16x2", "pack_bf16x2")


def _forbidden_objects(allow, extra):
    import numpy as np

    objs = {}
    for name in FORBIDDEN_NUMPY:
        if name not in allow and hasattr(np, name):
            objs[id(getattr(np, name))] = f"np.{name}"
    for dotted in extra:
        mod, _, attr = dotted.replace("np.", "numpy.", 1).rpartition(".")
        try:
            import importlib

            obj = getattr(importlib.import_module(mod), attr)
            objs[id(obj)] = dotted
        except Exception:  # noqa: BLE001
            pass
    return objs


def _source_tree(fn):
    try:
        src = textwrap.dedent(inspect.getsource(fn))
        return ast.parse(src), inspect.getsourcelines(fn)[1]
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None, 0


def _py(obj):
    """The Python function behind a numba dispatcher or a (simulated) CUDA kernel."""
    for attr in ("py_func", "fn"):
        f = getattr(obj, attr, None)
        if f is not None and inspect.isfunction(f):
            return f
    return obj if inspect.isfunction(obj) else None


def _origin(obj) -> str:
    f = _py(obj)
    mod = getattr(f, "__module__", None) or getattr(obj, "__module__", None) or ""
    if inspect.ismodule(obj):
        mod = obj.__name__
    return mod or ""


def scan_shortcuts(roots, allow=(), extra=(), where=None) -> tuple[list, list]:
    """Walk the student's functions (and the notebook functions they call) looking for shortcuts.

    Returns (problems, visited function names)."""
    import numpy as np

    forbidden = _forbidden_objects(set(allow), extra)
    methods = tuple(m for m in FORBIDDEN_METHODS if m not in allow and m.strip("_").lstrip("ri") not in allow)
    problems, seen, todo = [], set(), list(roots)
    visited = []
    while todo:
        obj = todo.pop()
        fn = _py(obj)
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        if fn.__module__ != "submission":
            continue
        visited.append(fn.__name__)
        tree, first = _source_tree(fn)
        if tree is None:
            continue
        glb = dict(vars(builtins))
        glb.update(fn.__globals__)
        for node in ast.walk(tree):
            line = first + getattr(node, "lineno", 1) - 1
            at = f" ({where(line)})" if where else ""
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) and "matmul" not in allow:
                problems.append(f"`{fn.__name__}` uses the `@` operator (NumPy's matmul){at}")
                continue
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in methods:
                base = node.func.value
                if not (isinstance(base, ast.Name) and inspect.ismodule(glb.get(base.id))):
                    problems.append(f"`{fn.__name__}` calls `.{node.func.attr}()`: NumPy does that work, not your "
                                    f"code{at}")
                continue
            if not isinstance(node, (ast.Name, ast.Attribute)) or not isinstance(getattr(node, "ctx", None), ast.Load):
                continue
            chain = []
            n = node
            while isinstance(n, ast.Attribute):
                chain.append(n.attr)
                n = n.value
            if not isinstance(n, ast.Name) or n.id not in glb:
                continue
            chain.append(n.id)
            chain.reverse()
            obj2, path = glb[n.id], [n.id]
            for part in chain[1:]:
                nxt = getattr(obj2, part, None)
                if nxt is None:
                    break
                obj2 = nxt
                path.append(part)
            dotted = ".".join(path)
            origin = _origin(obj2)
            root = origin.split(".")[0]
            ufunc_method = _UFUNC_METHODS.get((getattr(getattr(obj2, "__self__", None), "__name__", ""), path[-1])) \
                if isinstance(getattr(obj2, "__self__", None), np.ufunc) else None
            if ufunc_method and ufunc_method not in allow:
                problems.append(f"`{fn.__name__}` uses {dotted}: NumPy does the work ({ufunc_method}) instead of your "
                                f"code{at}")
            elif id(obj2) in forbidden:
                problems.append(f"`{fn.__name__}` uses {forbidden[id(obj2)]} ({dotted}): NumPy does the work "
                                f"instead of your code{at}")
            elif inspect.ismodule(obj2) and obj2 is getattr(np, "linalg", None):
                problems.append(f"`{fn.__name__}` uses np.linalg{at}")
            elif root == "kernels_src" and not any(p in ALLOWED_FROM_KERNELS_SRC for p in path[-1:]) \
                    and not (inspect.ismodule(obj2) and obj2.__name__ in ("kernels_src", "kernels_src.device")) \
                    and origin not in ("numba.cuda", "kernels_src.device"):
                problems.append(f"`{fn.__name__}` uses `{dotted}` from the course library ({origin}): the exercise "
                                f"is to write it yourself{at}")
            elif root in FORBIDDEN_PACKAGES:
                problems.append(f"`{fn.__name__}` uses `{dotted}` ({root}){at}")
            elif _origin(obj2) == "submission" and _py(obj2) is not None:
                todo.append(obj2)
    return sorted(set(problems)), visited


_SUM_LIKE = {"sum": "sum", "nansum": "sum", "prod": "prod", "nanprod": "prod", "cumsum": "cumsum",
             "nancumsum": "cumsum", "cumprod": "cumprod", "nancumprod": "cumprod", "mean": "mean",
             "nanmean": "mean", "average": "average", "std": "std", "var": "var", "nanstd": "std", "nanvar": "var",
             "trace": "trace", "max": "max", "amax": "max", "nanmax": "max", "min": "min", "amin": "min",
             "nanmin": "min", "argmax": "argmax", "argmin": "argmin", "ptp": "ptp"}
_PRODUCT_LIKE = ("dot", "vdot", "inner", "outer", "matmul", "matvec", "vecmat", "vecdot", "einsum", "einsum_path",
                 "tensordot", "kron", "convolve", "correlate", "cov", "corrcoef", "polyval", "polyfit", "multi_dot",
                 "tensorinv", "tensorsolve")
# sorting, counting and splitting: the exercises of chapters 15, 17, 18 and 21 say they are not allowed
_DATA_LIKE = ("sort", "argsort", "lexsort", "partition", "argpartition", "bincount", "histogram", "unique",
              "searchsorted", "digitize", "array_split", "sliding_window_view")
_NUMPY_FUNCS = dict(_SUM_LIKE, **{n: n for n in _PRODUCT_LIKE + _DATA_LIKE})
_ARRAY_METHODS = {"dot": "dot", "sum": "sum", "mean": "mean", "prod": "prod", "cumsum": "cumsum",
                  "cumprod": "cumprod", "trace": "trace", "std": "std", "var": "var", "max": "max", "min": "min",
                  "argmax": "argmax", "argmin": "argmin", "ptp": "ptp", "sort": "sort", "argsort": "argsort",
                  "searchsorted": "searchsorted", "__matmul__": "matmul",
                  "__rmatmul__": "matmul", "__imatmul__": "matmul"}
_UFUNC_METHODS = {("add", "reduce"): "sum", ("add", "accumulate"): "cumsum", ("add", "reduceat"): "sum",
                  ("multiply", "reduce"): "prod", ("multiply", "accumulate"): "cumprod",
                  ("multiply", "reduceat"): "prod", ("multiply", "outer"): "outer", ("matmul", "reduce"): "matmul"}


# The call monitor of the first round (a profile hook on the launcher's thread) is gone: the launcher now runs on
# decoy inputs only, and the graded functions are rebuilt where nothing else of the notebook runs (see
# kernelpack). What remains is reading what Numba compiled.
def _method_name(key) -> str:
    """The method of an array method's typing key: ``"array.sort"`` (Numba 0.60+) or ``(array type, "sort")``."""
    if isinstance(key, str) and key.startswith("array."):
        return key[len("array."):]
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], str):
        return key[1]
    return ""


def compiled_calls(fn, allow=()) -> list[str]:
    """What a compiled @njit answer calls, from Numba's own typing of it (and of the @njit functions it
    calls): NumPy's products and reductions, whatever name or closure they were reached through."""
    import numpy as np
    from numba.core import types

    found, todo, seen = [], [fn], set()
    while todo:
        disp = todo.pop()
        if id(disp) in seen or not hasattr(disp, "overloads"):
            continue
        seen.add(id(disp))
        for cres in list(disp.overloads.values()):
            typemap = getattr(getattr(cres, "type_annotation", None), "typemap", None) or {}
            for t in typemap.values():
                if isinstance(t, types.Dispatcher):
                    todo.append(t.dispatcher)
                elif isinstance(t, types.BoundFunction) and _method_name(t.typing_key) in _ARRAY_METHODS:
                    meth = _method_name(t.typing_key)
                    if _ARRAY_METHODS[meth] not in allow:
                        found.append(f"`ndarray.{meth}()` (in compiled code)")
                elif isinstance(t, types.Function):
                    key = t.typing_key
                    mod = getattr(key, "__module__", "") or ""
                    name = getattr(key, "__name__", "")
                    if (mod.startswith("numpy") or key is getattr(np, name, None)) and name in _NUMPY_FUNCS \
                            and _NUMPY_FUNCS[name] not in allow:
                        found.append(f"`np.{name}` (in compiled code)")
                    elif mod.startswith("numpy.linalg") and "linalg" not in allow:
                        found.append(f"`np.linalg.{name}` (in compiled code)")
    return found


def precompile(fn, args) -> None:
    """Compile an @njit answer for these arguments, so that what Numba compiled can be read before the call.
    A failure is left to the real call, which reports it."""
    try:
        from numba import typeof

        fn.compile(tuple(typeof(a) for a in args))
    except Exception:  # noqa: BLE001
        pass


def compiled_problems(fn, allow=()) -> list[str]:
    """What a compiled @njit answer does that the grader does not accept, read from what Numba compiled:
    object mode (or lifted object-mode blocks), and NumPy's products, reductions and linear algebra."""
    import numpy as np
    from numba.core import types

    found = []
    try:
        found += compiled_calls(fn, set(allow))
    except Exception:  # noqa: BLE001  (Numba internals moved: the other checks below still hold)
        pass
    todo, seen = [fn], set()
    while todo:
        d = todo.pop()
        if id(d) in seen or not hasattr(d, "overloads"):
            continue
        seen.add(id(d))
        for cres in list(d.overloads.values()):
            if getattr(cres, "objectmode", False) or getattr(cres, "lifted", ()):
                found.append("Numba's object mode (Python objects inside compiled code)")
            ann = getattr(cres, "type_annotation", None)
            typemap = getattr(ann, "typemap", None) or {}
            for expr, sig in list((getattr(ann, "calltypes", None) or {}).items()):
                func = expr._kws.get("func") if getattr(expr, "op", "") == "call" else None
                fty = typemap.get(getattr(func, "name", ""), None)
                key = getattr(fty, "typing_key", None)
                if key in (builtins.sum, builtins.max, builtins.min) and sig is not None \
                        and any(isinstance(a, (types.Array, types.ArrayCompatible)) for a in getattr(sig, "args", ())) \
                        and key.__name__ not in allow:
                    found.append(f"the built-in `{key.__name__}()` over a whole array (in compiled code): that is a "
                                 "reduction your loop should do")
                if isinstance(key, np.ufunc) and sig is not None and "ufunc" not in allow \
                        and any(isinstance(a, types.Array) for a in getattr(sig, "args", ())):
                    found.append(f"`np.{key.__name__}` on a whole array (in compiled code): apply it to single "
                                 "values in your loop")
            try:
                llvm = cres.library.get_llvm_str()
            except Exception:  # noqa: BLE001
                llvm = ""
            for sym, what in (("numba_xxgemm", "BLAS (np.dot/@)"), ("numba_xxdot", "BLAS (np.dot/np.vdot)"),
                              ("numba_xxgemv", "BLAS (np.dot)"), ("numba_ez_", "LAPACK (np.linalg)"),
                              ("PyObject_Call", "a call into the Python interpreter")):
                if sym in llvm and (("linalg" not in allow and "dot" not in allow) or sym == "PyObject_Call"):
                    found.append(f"{what} (in compiled code)")
    return sorted(set(found))
