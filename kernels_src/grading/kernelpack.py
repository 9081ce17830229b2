"""Grade the kernel, not the notebook: the student's kernels and ``@njit`` functions, rebuilt from their source
in a process where no other code of the student ever ran.

The student's notebook is loaded once, in a sandboxed process that never sees the hidden inputs (the *plan*
run, :mod:`.planrun`). There, :func:`describe` lists, for each function to grade and each notebook function
it calls, where it is defined, how it is compiled (``@cuda.jit``, device function, ``@njit`` and their
options) and what each global name it reads is bound to, as plain data: a module, an attribute of an allowed
module (``math.sqrt``, ``numba.float32``, ``cuda``), a number, or another such function.

The grading process checks that description against the notebook's own text (:func:`validate`): the
function's body may use its arguments, local variables, numbers, the allowed modules and the notebook's
other kernels, device functions and ``@njit`` functions; never an array, object or module the notebook made
or imported (a value computed while the notebook loaded cannot reach the answer), never a name starting
with ``_``, an import, a ``with`` block (Numba's object mode), ``try``, ``lambda``, ``global`` or a nested
function. The run that sees the hidden inputs (the *exec* run) then rebuilds the functions from their
``def`` text with the grader's own decorators and a namespace holding only those bindings
(:func:`build`): it executes no statement of the notebook, so nothing the notebook did while loading
(patching NumPy, starting a thread, reading a file) exists there.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import math

ALLOWED_MODULES = ("math", "cmath", "numpy", "numba", "numba.cuda", "numba.core.types", "numba.types",
                   "numba.cuda.libdevice", "kernels_src.compiler", "kernels_src.device")
SAFE_BUILTINS = ("range", "len", "min", "max", "abs", "int", "float", "bool", "round", "print", "complex",
                 "enumerate", "zip", "slice", "tuple", "divmod", "pow", "True", "False", "None",
                 "ValueError", "IndexError", "AssertionError", "RuntimeError", "ZeroDivisionError", "TypeError",
                 "ArithmeticError", "OverflowError", "Exception")
BANNED_ATTR_PREFIXES = ("_", "f_", "gi_", "cr_", "ag_", "tb_", "co_")
BANNED_ATTRS = {"format", "format_map", "mro", "copy_to_host", "copy_to_device", "to_device", "tofile", "tolist",
                "tobytes", "ctypes", "base", "data", "view", "getfield", "setfield", "item", "itemset", "dump",
                "dumps", "reshape", "ravel", "flatten", "astype", "copy", "fill", "sum", "prod", "dot", "mean",
                "cumsum", "cumprod", "std", "var", "trace", "max", "min", "argmax", "argmin", "all", "any",
                "sort", "argsort", "nonzero", "transpose", "conj", "conjugate", "flat", "resize", "squeeze",
                "swapaxes", "take", "put", "repeat", "choose", "clip", "compress", "searchsorted", "partition",
                "ptp", "round", "byteswap", "newbyteorder", "split", "bind", "forall", "specialize",
                "overloads", "py_func", "fn", "compile", "inspect_llvm", "inspect_asm", "inspect_types"}
CPU_BANNED_ATTRS = {"format", "format_map", "mro", "ctypes", "dot", "sum", "mean", "prod", "cumsum", "cumprod",
                    "trace", "std", "var", "reduce", "accumulate", "reduceat", "outer", "at"}
# array attributes a kernel may read (the rest of BANNED_ATTRS are methods that move or reduce data)
NP_KERNEL_OK_TYPES = (float, int, bool)
FORBIDDEN_UFUNCS = {"matmul", "vecdot", "matvec", "vecmat"}
BANNED_NODES = (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal, ast.ClassDef, ast.Lambda, ast.Try,
                ast.With, ast.AsyncWith, ast.Yield, ast.YieldFrom, ast.Await, ast.AsyncFunctionDef,
                ast.FunctionDef, ast.JoinedStr, ast.AsyncFor, ast.GeneratorExp, ast.ListComp, ast.SetComp,
                ast.DictComp, ast.Starred) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())
NODE_WORDS = {ast.Import: "an import", ast.ImportFrom: "an import", ast.Global: "`global`", ast.Nonlocal: "`nonlocal`",
              ast.ClassDef: "a class", ast.Lambda: "a lambda", ast.Try: "`try`", ast.With: "a `with` block "
              "(Numba's object mode, numba.objmode, is not allowed)", ast.Yield: "`yield`", ast.FunctionDef:
              "a nested function", ast.JoinedStr: "an f-string", ast.GeneratorExp: "a generator expression",
              ast.ListComp: "a list comprehension", ast.Starred: "`*args`"}
KINDS = ("cuda_kernel", "cuda_device", "njit")
NJIT_OPTIONS = ("parallel", "fastmath", "boundscheck", "error_model", "nogil", "inline")


# ----------------------------------------------------------------------------------------- plan side (D)
def _plain(v, depth=0):
    """v as JSON data if it is a number, bool, None, short string or a (nested) tuple/list of them."""
    if isinstance(v, bool) or v is None:
        return True, v
    if isinstance(v, int):
        return (abs(v) < 1 << 62), v
    if isinstance(v, float):
        return True, (v if math.isfinite(v) else repr(v))
    if isinstance(v, str):
        return len(v) <= 200, v
    if isinstance(v, (tuple, list)) and depth < 3 and len(v) <= 64:
        out = []
        for x in v:
            ok, y = _plain(x, depth + 1)
            if not ok:
                return False, None
            out.append(y)
        return True, {"tuple": out} if isinstance(v, tuple) else {"list": out}
    return False, None


def _function_kind(v):
    """(kind, options, python function) of a kernel, device function or @njit function; else None."""
    try:
        from numba.core.dispatcher import Dispatcher
    except Exception:  # noqa: BLE001
        Dispatcher = ()
    cls = type(v).__name__
    if cls in ("FakeCUDAKernel", "CUDADispatcher"):
        fn = getattr(v, "fn", None) or getattr(v, "py_func", None)
        device = bool(getattr(v, "_device", False) or (getattr(v, "targetoptions", {}) or {}).get("device"))
        fm = getattr(v, "_fastmath", None)
        if fm is None:
            fm = (getattr(v, "targetoptions", {}) or {}).get("fastmath", False)
        fm = sorted(fm) if isinstance(fm, (set, frozenset, list, tuple)) else bool(fm)
        opts = {"fastmath": fm}
        inline = (getattr(v, "targetoptions", {}) or {}).get("inline")  # the simulator keeps no options
        if device and inline and inline != "never":
            opts["inline"] = inline
        return ("cuda_device" if device else "cuda_kernel"), opts, fn
    if Dispatcher and isinstance(v, Dispatcher):
        opts = {}
        for k in NJIT_OPTIONS:
            val = (v.targetoptions or {}).get(k)
            if val is None:
                continue
            if isinstance(val, (set, frozenset, list, tuple)):
                val = sorted(str(x) for x in val)
            elif not isinstance(val, (bool, int, str)):
                val = bool(val)
            opts[k] = val
        return "njit", opts, v.py_func
    return None


def _find_attr(v, modules) -> tuple | None:
    for mod in modules:
        for name in dir(mod):
            if name.startswith("_"):
                continue
            try:
                if getattr(mod, name) is v:
                    return mod.__name__, name
            except Exception:  # noqa: BLE001
                continue
    return None


def _allowed_modules():
    import importlib
    import sys

    mods = []
    for name in ALLOWED_MODULES:
        m = sys.modules.get(name)
        if m is None:
            try:
                m = importlib.import_module(name)
            except Exception:  # noqa: BLE001
                continue
        mods.append(m)
    return mods


def binding(v, modules, submission="submission") -> list:
    """How the exec run gets the value ``v`` that a graded function reads as a global."""
    import numpy as np

    if inspect.ismodule(v):
        return ["module", v.__name__]
    fk = _function_kind(v)
    if fk is not None and getattr(fk[2], "__module__", None) == submission:
        return ["function", fk[2].__name__, fk[2].__code__.co_firstlineno]
    if inspect.isfunction(v) and v.__module__ == submission:
        return ["python", v.__name__, v.__code__.co_firstlineno]
    if isinstance(v, np.generic) and v.dtype.kind in "biuf":
        return ["npscalar", v.dtype.name, v.item()]
    ok, data = _plain(v)
    if ok:
        return ["const", data]
    found = _find_attr(v, modules)
    if found:
        return ["attr", found[0], found[1]]
    try:
        from numba.core.types import Type

        if isinstance(v, Type):
            return ["numba_type", str(v)]
    except Exception:  # noqa: BLE001
        pass
    return ["unsupported", type(v).__name__]


def _global_names(code) -> set:
    names = set(code.co_names)
    for c in code.co_consts:
        if inspect.iscode(c):
            names |= _global_names(c)
    return names


def describe(roots: dict, submission="submission") -> dict:
    """{function name: {"line", "kind", "options", "globals": {name: binding}}} for ``roots`` (name -> object)
    and every notebook function they call, as plain data (run in the plan process)."""
    modules = _allowed_modules()
    out: dict = {}
    todo = list(roots.values())
    while todo:
        obj = todo.pop()
        fk = _function_kind(obj)
        if fk is None:
            continue
        kind, opts, fn = fk
        if fn is None or getattr(fn, "__module__", None) != submission or fn.__name__ in out:
            continue
        glb = fn.__globals__
        bind = {}
        for name in sorted(_global_names(fn.__code__)):
            if name in glb:
                v = glb[name]
                bind[name] = binding(v, modules, submission)
                if bind[name][0] == "function":
                    todo.append(v)
        out[fn.__name__] = {"line": fn.__code__.co_firstlineno, "kind": kind, "options": opts, "globals": bind}
    return out


# ------------------------------------------------------------------------------------- grader side (parent)
def find_def(tree: ast.Module, name: str, line: int):
    """The top-level FunctionDef ``name`` whose first line (first decorator) is ``line``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if first == line or node.lineno == line:
                return node
    return None


def _resolve(mod_name: str, attr: str | None = None):
    import importlib

    if mod_name not in ALLOWED_MODULES:
        raise LookupError(mod_name)
    m = importlib.import_module(mod_name)
    return m if attr is None else getattr(m, attr)


def _object_problem(obj, dotted: str, gpu: bool, allow=()) -> str:
    """'' if a kernel (gpu) or @njit function may use ``obj`` (reached as ``dotted``), else why not."""
    import numpy as np

    if inspect.ismodule(obj):
        if obj.__name__ not in ALLOWED_MODULES:
            return f"`{dotted}` is the module {obj.__name__}, which a kernel cannot use"
        return ""
    mod = getattr(obj, "__module__", "") or ""
    name = getattr(obj, "__name__", "") or dotted.rsplit(".", 1)[-1]
    if isinstance(obj, np.ufunc):
        if name in FORBIDDEN_UFUNCS and name not in allow:
            return f"`{dotted}` is NumPy's {name}: NumPy would do the work, not your code"
        return ""
    if isinstance(obj, type) and issubclass(obj, np.generic):
        return ""
    if isinstance(obj, NP_KERNEL_OK_TYPES):
        return ""
    from .shortcuts import FORBIDDEN_NUMPY, _NUMPY_FUNCS

    root = mod.split(".")[0]
    if root == "numpy" or dotted.split(".")[0] in ("np", "numpy"):
        if name in FORBIDDEN_NUMPY or name in _NUMPY_FUNCS or "linalg" in mod:
            if name not in allow and _NUMPY_FUNCS.get(name, name) not in allow:
                return f"`{dotted}` is NumPy's {name}: NumPy would do the work, not your code"
        if gpu and callable(obj):
            return (f"`{dotted}` is a NumPy function: inside a GPU kernel only NumPy's element-wise math "
                    "(np.sqrt, np.exp, ...) and its scalar types compile")
    return ""


def _where(line_of, node) -> str:
    return line_of(getattr(node, "lineno", 0)) if line_of else f"line {getattr(node, 'lineno', '?')}"


def check_function(node: ast.FunctionDef, info: dict, gpu: bool, allow=(), line_of=None) -> list[str]:
    """The kernel-language rules for one function (see the module docstring)."""
    problems = []
    name = node.name
    args = node.args
    params = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    if args.vararg or args.kwarg or args.defaults or args.kw_defaults:
        problems.append(f"`{name}` has default values or *args/**kwargs ({_where(line_of, node)}): a graded "
                        "function takes plain positional arguments")
    local = set(params)
    for n in (x for stmt in node.body for x in ast.walk(stmt)):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            local.add(n.id)
        elif isinstance(n, ast.arg):
            local.add(n.arg)
    bindings = info.get("globals", {})
    body = [n for stmt in node.body for n in ast.walk(stmt)]
    for n in body:
        if isinstance(n, BANNED_NODES) and (gpu or not isinstance(n, (ast.ListComp, ast.GeneratorExp))):
            what = next((w for t, w in NODE_WORDS.items() if isinstance(n, t)), type(n).__name__)
            problems.append(f"`{name}` uses {what} ({_where(line_of, n)}): a kernel or compiled function "
                            "may not")
            continue
        if isinstance(n, ast.Attribute):
            a = n.attr
            banned = BANNED_ATTRS if gpu else CPU_BANNED_ATTRS - set(allow)
            if a.startswith(BANNED_ATTR_PREFIXES) or a in banned:
                if not (a in ("max", "min", "round", "all", "any") and _is_module_chain(n.value, bindings)):
                    problems.append(f"`{name}` uses `.{a}` ({_where(line_of, n)}): not available inside a "
                                    "kernel or compiled function (only the arguments' shape, size, ndim and "
                                    "dtype, and indexing)")
                    continue
            chain = _chain(n)
            if chain and chain[0] not in local and bindings.get(chain[0], [None])[0] == "module":
                p = _chain_problem(bindings[chain[0]][1], chain, gpu, allow)
                if p:
                    problems.append(f"`{name}`: {p} ({_where(line_of, n)})")
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in local:
            b = bindings.get(n.id)
            if b is None:
                if n.id in SAFE_BUILTINS or (n.id in ("sum", "any", "all", "sorted") and not gpu and False):
                    continue
                if hasattr(builtins, n.id):
                    problems.append(f"`{name}` uses the built-in `{n.id}` ({_where(line_of, n)}): not available "
                                    "inside a kernel or compiled function")
                else:
                    problems.append(f"`{name}` uses `{n.id}`, which is not defined when the grader loads your "
                                    f"code ({_where(line_of, n)})")
                continue
            kind = b[0]
            if kind == "unsupported":
                problems.append(f"`{name}` reads the global `{n.id}`, a {b[1]} made by your notebook "
                                f"({_where(line_of, n)}): a kernel or compiled function may read only its "
                                "arguments, numbers, NumPy/math functions and your other kernels and device "
                                "functions; pass data as an argument")
            elif kind == "python":
                problems.append(f"`{name}` calls `{n.id}`, a plain Python function ({_where(line_of, n)}): "
                                + ("a kernel can call only @cuda.jit(device=True) functions" if gpu else
                                   "an @njit function can call only other @njit functions"))
            elif kind == "module":
                try:
                    p = _object_problem(_resolve(b[1]), n.id, gpu, allow)
                except LookupError:
                    p = f"`{n.id}` is the module {b[1]}, which a kernel cannot use"
                except Exception:  # noqa: BLE001
                    p = f"`{n.id}` is the module {b[1]}, which the grader cannot load"
                if p:
                    problems.append(f"`{name}`: {p} ({_where(line_of, n)})")
            elif kind == "attr":
                try:
                    p = _object_problem(_resolve(b[1], b[2]), n.id, gpu, allow)
                except Exception:  # noqa: BLE001
                    p = f"`{n.id}` ({b[1]}.{b[2]}) is not available to a kernel"
                if p:
                    problems.append(f"`{name}`: {p} ({_where(line_of, n)})")
    return sorted(set(problems), key=problems.index)


def _is_module_chain(expr, bindings) -> bool:
    c = _chain(expr) if isinstance(expr, ast.Attribute) else ([expr.id] if isinstance(expr, ast.Name) else None)
    return bool(c) and bindings.get(c[0], [None])[0] in ("module",)


def _chain(n) -> list | None:
    parts = []
    while isinstance(n, ast.Attribute):
        parts.append(n.attr)
        n = n.value
    if not isinstance(n, ast.Name):
        return None
    parts.append(n.id)
    return parts[::-1]


def _chain_problem(mod_name: str, chain: list, gpu: bool, allow) -> str:
    try:
        obj = _resolve(mod_name)
    except Exception:  # noqa: BLE001
        return f"`{chain[0]}` is the module {mod_name}, which a kernel cannot use"
    dotted = chain[0]
    for part in chain[1:]:
        dotted += "." + part
        try:
            obj = getattr(obj, part)
        except AttributeError:
            return ""  # resolved only while a kernel runs (cuda.threadIdx in the simulator)
        if inspect.ismodule(obj) and obj.__name__ not in ALLOWED_MODULES:
            return f"`{dotted}` is the module {obj.__name__}, which a kernel cannot use"
    return _object_problem(obj, dotted, gpu, allow)


def validate(source: str, described: dict, roots: dict, allow=(), line_of=None) -> tuple[list, dict]:
    """Check the plan run's description against the notebook's text. ``roots``: {name: "gpu" | "cpu"}.

    Returns (problems, pack): the pack is what :func:`build` needs (only validated data)."""
    tree = ast.parse(source)
    problems, pack = [], {}
    gpu_funcs = set()
    todo = [(n, k) for n, k in roots.items()]
    seen = set()
    while todo:
        fname, target = todo.pop()
        if fname in seen:
            continue
        seen.add(fname)
        info = described.get(fname)
        if not isinstance(info, dict):
            problems.append(f"`{fname}` could not be found in your code as a function the grader can rebuild")
            continue
        kind = info.get("kind")
        if kind not in KINDS:
            problems.append(f"`{fname}` is not a kernel or compiled function")
            continue
        node = find_def(tree, fname, int(info.get("line", -1)))
        if node is None:
            problems.append(f"`{fname}` must be defined with `def` at the top level of a cell (the grader "
                            "rebuilds it from its text)")
            continue
        gpu = kind.startswith("cuda")
        if gpu:
            gpu_funcs.add(fname)
        problems += check_function(node, info, gpu, allow, line_of)
        glb = {}
        for g, b in (info.get("globals") or {}).items():
            if not isinstance(b, list) or not b:
                continue
            if b[0] == "function" and len(b) == 3:
                todo.append((b[1], target))
            glb[g] = b
        opts = info.get("options") or {}
        opts = {k: v for k, v in opts.items() if k in ("fastmath",) + NJIT_OPTIONS
                and isinstance(v, (bool, int, str, list))}
        pack[fname] = {"line": min([node.lineno] + [d.lineno for d in node.decorator_list]), "def_line": node.lineno,
                       "kind": kind, "options": opts, "globals": glb}
    for fname, p in pack.items():  # a kernel calls device functions, @njit calls @njit
        for g, b in p["globals"].items():
            if b[0] == "function" and b[1] in pack:
                callee = pack[b[1]]["kind"]
                if p["kind"].startswith("cuda") and callee == "cuda_kernel":
                    problems.append(f"`{fname}` calls the kernel `{b[1]}`: a kernel can call only device functions")
                if p["kind"] == "njit" and callee != "njit":
                    problems.append(f"`{fname}` (@njit) calls `{b[1]}`, which is not an @njit function")
    return problems, pack


# ----------------------------------------------------------------------------------------- exec side (R)
def _value(b):
    import numpy as np

    kind = b[0]
    if kind == "module":
        return _resolve(b[1])
    if kind == "attr":
        return _resolve(b[1], b[2])
    if kind == "npscalar":
        return np.dtype(b[1]).type(b[2])
    if kind == "const":
        return _unplain(b[1])
    if kind == "numba_type":
        import numba

        return getattr(numba, b[1]) if hasattr(numba, b[1]) else getattr(numba.types, b[1])
    raise LookupError(kind)


def _unplain(d):
    if isinstance(d, dict):
        if "tuple" in d:
            return tuple(_unplain(x) for x in d["tuple"])
        if "list" in d:
            return [_unplain(x) for x in d["list"]]
    if isinstance(d, str) and d in ("inf", "-inf", "nan"):
        return float(d)
    return d


def _decorator_inline(node):
    """The ``inline=`` constant of a def's decorator call (``@cuda.jit(device=True, inline=True)``), else None."""
    for d in node.decorator_list:
        for kw in getattr(d, "keywords", ()):
            if kw.arg == "inline" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, (bool, str)):
                return kw.value.value
    return None


def build(source_path: str, pack: dict) -> dict:
    """Rebuild the pack's functions from the notebook's text; returns the namespace (name -> object)."""
    from .. import device

    with open(source_path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), source_path)
    ns: dict = {"__name__": "submission", "__builtins__": {k: getattr(builtins, k) for k in SAFE_BUILTINS
                                                            if hasattr(builtins, k)}}
    later = []
    for fname, p in pack.items():
        for g, b in p["globals"].items():
            if b[0] in ("module", "attr", "npscalar", "const", "numba_type"):
                ns[g] = _value(b)
            elif b[0] == "function":
                later.append((g, b[1]))
    made = {}
    for fname, p in pack.items():
        node = find_def(tree, fname, p["line"])
        src_inline = _decorator_inline(node)
        node.decorator_list = []
        code = compile(ast.Module([node], []), source_path, "exec")
        exec(code, ns)  # noqa: S102  (a `def` only: defines the function, runs none of its body)
        fn = ns[fname]
        opts = dict(p["options"])
        fm = opts.pop("fastmath", None)
        if isinstance(fm, list):
            fm = set(fm)
        if p["kind"] == "njit":
            import numba

            kw = {k: (set(v) if isinstance(v, list) else v) for k, v in opts.items() if k in NJIT_OPTIONS}
            if fm:
                kw["fastmath"] = fm
            made[fname] = numba.njit(**kw)(fn)
        else:
            kw = {"device": p["kind"] == "cuda_device"}
            if fm:
                kw["fastmath"] = fm
            # A non-inlined device function asks for the current device when it is compiled to PTX: with no
            # GPU, that fails. The simulator keeps no options, so inline= is read from the decorator's text too;
            # and a PTX build inlines every device function (inlining changes no typing, which is what it checks).
            inline = opts.get("inline") or src_inline
            if kw["device"] and device.MODE == "ptx" and inline in (None, False, "never"):
                inline = True
            if kw["device"] and inline and inline != "never":
                kw["inline"] = inline
            made[fname] = device.cuda.jit(**kw)(fn)
    for fname, obj in made.items():
        ns[fname] = obj
    for g, target in later:
        if target in made:
            ns[g] = made[target]
    return made
