"""The sandboxed side of a check: load the student's code, describe what to run, run it, report.

Started by :mod:`kernels_src.grading.sandbox` as ``python -I <runtime>/boot.py job.json`` in a fresh directory
holding ``submission.py`` (the student's code) and ``job.json``; it confines itself first (:mod:`.confine`).
It writes ``result.json`` and ``outputs.npz`` and exits with ``os._exit`` (so no student thread or
``atexit`` hook runs after it). It never sees a reference output: the comparison happens in the parent.

Modes:
  plan  load the code cell by cell; check the kind of each named object (a Numba ``@njit`` function for CPU
        answers; a launcher plus ``@cuda.jit`` kernels defined in the submission for GPU answers), stubs,
        signatures, and the source for shortcuts; for a GPU answer call the launcher on two decoy draws
        of the inputs (``decoys.npz``) with launches recorded, not run (:class:`_LaunchRecorder`); describe
        the functions to grade as plain data (:func:`kernelpack.describe`).
  exec  rebuild the checked functions from their ``def`` text (:func:`kernelpack.build`; no other statement
        of the notebook runs), say "ready" on the pipe ``ready_fd``, read the graded inputs from stdin, and
        run: the recorded launches replayed on the grader's arrays under the race detector and the write
        record (GPU), or the compiled function after :func:`compiled_problems` (CPU).
  ptx   rebuild the kernels with the real numba.cuda (``KERNELS_DEVICE=ptx``) and compile each to PTX for
        sm_90 with the signatures observed in the exec run: the simulator does not check typing.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import json
import os
import sys
import textwrap
import time
import traceback

SUBMISSION = "submission.py"
_write_text = None  # captured before student code runs


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


# ----------------------------------------------------------------------------------- shortcuts
FORBIDDEN_NUMPY = ("matmul", "dot", "einsum", "inner", "outer", "vdot", "tensordot", "kron", "sum", "nansum",
                   "prod", "cumsum", "cumprod", "mean", "average", "convolve", "correlate", "trace", "max", "min",
                   "amax", "amin", "nanmax", "nanmin", "argmax", "argmin", "ptp")
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


def _is_stub(fn) -> bool:
    tree, _ = _source_tree(fn)
    if tree is None or not tree.body or not isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    body = tree.body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # docstring
    return all(isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                           and s.value.value is Ellipsis) for s in body)


# What compiled code may not call: canonical name -> the names a question's ``allow=`` may give.
_SUM_LIKE = {"sum": "sum", "nansum": "sum", "prod": "prod", "nanprod": "prod", "cumsum": "cumsum",
             "nancumsum": "cumsum", "cumprod": "cumprod", "nancumprod": "cumprod", "mean": "mean",
             "nanmean": "mean", "average": "average", "std": "std", "var": "var", "nanstd": "std", "nanvar": "var",
             "trace": "trace", "max": "max", "amax": "max", "nanmax": "max", "min": "min", "amin": "min",
             "nanmin": "min", "argmax": "argmax", "argmin": "argmin", "ptp": "ptp"}
_PRODUCT_LIKE = ("dot", "vdot", "inner", "outer", "matmul", "matvec", "vecmat", "vecdot", "einsum", "einsum_path",
                 "tensordot", "kron", "convolve", "correlate", "cov", "corrcoef", "polyval", "polyfit", "multi_dot",
                 "tensorinv", "tensorsolve")
_NUMPY_FUNCS = dict(_SUM_LIKE, **{n: n for n in _PRODUCT_LIKE})
_ARRAY_METHODS = {"dot": "dot", "sum": "sum", "mean": "mean", "prod": "prod", "cumsum": "cumsum",
                  "cumprod": "cumprod", "trace": "trace", "std": "std", "var": "var", "max": "max", "min": "min",
                  "argmax": "argmax", "argmin": "argmin", "ptp": "ptp", "__matmul__": "matmul",
                  "__rmatmul__": "matmul", "__imatmul__": "matmul"}
_UFUNC_METHODS = {("add", "reduce"): "sum", ("add", "accumulate"): "cumsum", ("add", "reduceat"): "sum",
                  ("multiply", "reduce"): "prod", ("multiply", "accumulate"): "cumprod",
                  ("multiply", "reduceat"): "prod", ("multiply", "outer"): "outer", ("matmul", "reduce"): "matmul"}


# The call monitor of the first round (a profile hook on the launcher's thread) is gone: the launcher now runs on
# decoy inputs only, and the graded functions are rebuilt where nothing else of the notebook runs (see
# kernelpack). What remains is reading what Numba compiled.
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
                elif isinstance(t, types.BoundFunction) and isinstance(t.typing_key, tuple) \
                        and len(t.typing_key) == 2 and t.typing_key[1] in _ARRAY_METHODS:
                    canonical = _ARRAY_METHODS[t.typing_key[1]]
                    if canonical not in allow:
                        found.append(f"`ndarray.{t.typing_key[1]}()` (in compiled code)")
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


# ------------------------------------------------------------------------------------ checks
def _kind_problem(obj, name: str, want: str) -> str:
    """'' if ``obj`` is the right kind of object for ``want`` (cpu | launcher | kernel)."""
    from numba.core.dispatcher import Dispatcher

    from .. import device

    kernel_types = ()
    if device.SIMULATED:
        from numba.cuda.simulator.kernel import FakeCUDAKernel

        kernel_types = (FakeCUDAKernel,)
    else:
        from numba.cuda.dispatcher import CUDADispatcher

        kernel_types = (CUDADispatcher,)
    is_kernel = isinstance(obj, kernel_types)
    if want == "cpu":
        if is_kernel:
            return (f"`{name}` is a @cuda.jit GPU kernel, but this question asks for a CPU function compiled "
                    "with @njit")
        if not isinstance(obj, Dispatcher):
            if inspect.isfunction(obj):
                return (f"`{name}` is a plain Python function: this question asks for a Numba-compiled one. "
                        "Put @njit on the line above `def` (from numba import njit)")
            return f"`{name}` is a {type(obj).__name__}, not a function compiled with @njit"
    elif want == "launcher":
        if is_kernel:
            return (f"`{name}` is the @cuda.jit kernel itself; `{name}` must be the launcher: a plain Python "
                    "function that computes the grid and launches your kernel")
        if isinstance(obj, Dispatcher):
            return f"`{name}` is compiled with @njit; the launcher must be a plain Python function"
        if not inspect.isfunction(obj):
            return f"`{name}` is a {type(obj).__name__}, not a function"
    elif want == "kernel":
        if not is_kernel:
            if isinstance(obj, Dispatcher):
                return f"`{name}` is compiled with @njit (a CPU function); it must be a @cuda.jit kernel"
            return f"`{name}` must be a GPU kernel: a function decorated with @cuda.jit"
        if getattr(obj, "_device", False) or getattr(getattr(obj, "targetoptions", {}), "get", lambda k: 0)("device"):
            return f"`{name}` is a device function (@cuda.jit(device=True)); it must be a kernel"
    fn = _py(obj)
    if fn is not None and fn.__module__ != "submission":
        return (f"`{name}` is `{fn.__module__}.{fn.__qualname__}`, imported rather than written in your notebook: "
                "define it yourself")
    return ""


def _signature_problem(fn, name, expected: list, n_expected: int) -> str:
    f = _py(fn) or fn
    try:
        sig = inspect.signature(f)
    except (TypeError, ValueError):
        return ""
    params = list(sig.parameters.values())
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return ""
    required = [p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(required) <= n_expected <= len(positional):
        return ""
    want = f"{name}({', '.join(expected)})" if expected else f"{n_expected} arguments"
    return (f"`{name}{sig}` has the wrong signature: it takes {len(positional)} argument(s), but the grader calls "
            f"it as {want}")


def _checks_before_running(job, mod, where, result):
    """The kind, stub, signature and source checks; returns (fn, kernels) or None (result says why)."""
    backend = job["backend"]
    name = job["function"]
    problems = []
    load_errors = result.get("load_errors") or []
    needed = [name] + list(job.get("kernels", []))
    missing = [n for n in needed if not hasattr(mod, n)]
    if missing and any(set(missing) & set(e.get("not_defined", [])) for e in load_errors):
        result["status"] = "missing"
        result["message"] = "\n".join([f"your notebook does not define {', '.join(f'`{n}`' for n in missing)}: a cell "
                                        "stopped with an error before defining it"]
                                       + load_error_lines(load_errors, missing))
        return None
    if not hasattr(mod, name):
        result["status"] = "missing"
        result["message"] = (f"your notebook does not define `{name}`: it must be defined at the top level of a "
                             "code cell (was it renamed, or is it inside another function?)")
        if load_errors:
            result["message"] += "\n" + "\n".join(load_error_lines(load_errors))
        return None
    fn = getattr(mod, name)
    want = "cpu" if backend == "cpu" else "launcher"
    p = _kind_problem(fn, name, want)
    if p:
        problems.append(p)
    kernels = {}
    for k in job.get("kernels", []):
        if not hasattr(mod, k):
            problems.append(f"your notebook does not define the kernel `{k}` (a @cuda.jit function at the top "
                            "level of a code cell)")
            continue
        kobj = getattr(mod, k)
        p = _kind_problem(kobj, k, "kernel")
        if p:
            problems.append(p)
        kernels[k] = kobj
    stubs = [n for n, o in [(name, fn)] + list(kernels.items()) if _py(o) is not None and _is_stub(_py(o))]
    if stubs:
        result["status"] = "stub"
        result["message"] = ("still the stub (`...`): " + ", ".join(f"`{s}`" for s in stubs)
                             + ". Replace the `...` with your code, then run the cell again.")
        return None
    if problems:
        result["status"] = "wrong_kind"
        result["message"] = "\n".join(problems)
        return None
    n_args = job["n_outputs"] + job["n_inputs"]
    p = _signature_problem(fn, name, job.get("args") or [], n_args)
    if p:
        result["status"] = "signature"
        result["message"] = p
        return None
    shortcuts, visited = scan_shortcuts([fn] + list(kernels.values()), job.get("allow", ()), job.get("forbid", ()),
                                        where)
    result["scanned"] = visited
    if shortcuts:
        result["status"] = "shortcut"
        result["message"] = "\n".join(shortcuts)
        return None
    return fn, kernels


# ------------------------------------------------------------------------------- the plan run (decoys)
def _bits(a):
    import numpy as np

    a = np.ascontiguousarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.itemsize in (1, 2, 4, 8) else a.view(np.uint8)


class _LaunchRecorder:
    """Records what a launcher does with the (decoy) arrays it is given: each kernel launch (kernel, grid,
    block, dynamic shared memory, and what each argument is) and every host write to an array between
    launches. Kernels are not run: their results would only be the decoys'."""

    def __init__(self, grader_arrays, store: dict, prefix: str):
        self.grader = grader_arrays  # [(role, k, device array)]
        self.store, self.prefix = store, prefix
        self.launches: list = []
        self.made: list = []  # launcher-made arrays seen as kernel arguments: [(host view, last bits)]
        self.last = [_bits(d._ary).copy() for _, _, d in grader_arrays]

    def _host_writes(self, tag: str) -> list:
        import numpy as np

        writes = []
        for j, (role, k, d) in enumerate(self.grader):
            now = _bits(d._ary)
            changed = np.flatnonzero((now != self.last[j]).reshape(-1))
            if changed.size:
                key = f"{self.prefix}_{tag}_{role}{k}"
                self.store[key + "_idx"] = changed.astype(np.int64)
                self.store[key + "_val"] = np.ascontiguousarray(d._ary).reshape(-1)[changed].copy()
                writes.append({"role": role, "k": k, "key": key})
                self.last[j] = now.copy()
        return writes

    def _arg(self, a, li, ai) -> dict:
        import numpy as np

        host = getattr(a, "_ary", a)
        if isinstance(host, np.ndarray) and host.ndim > 0:
            lo = host.__array_interface__["data"][0]
            for role, k, d in self.grader:
                base = d._ary
                b0 = base.__array_interface__["data"][0]
                if b0 <= lo < b0 + max(1, base.nbytes) and base.dtype.itemsize:
                    if host.shape == base.shape and host.strides == base.strides and lo == b0 and host.dtype == base.dtype:
                        return {"kind": role, "k": k}
                    return {"kind": "view", "role": role, "k": k, "offset": int(lo - b0), "shape": list(host.shape),
                            "strides": list(host.strides), "dtype": host.dtype.str}
            for mi, (m, _) in enumerate(self.made):
                if m is host:
                    break
            else:
                mi = len(self.made)
                self.made.append((host, None))
            key = f"{self.prefix}_L{li}_a{ai}"
            self.store[key] = np.array(host, copy=True)
            return {"kind": "made", "id": mi, "key": key, "shape": list(host.shape), "dtype": host.dtype.str}
        if isinstance(a, np.generic) and a.dtype.kind in "biuf":
            return {"kind": "scalar", "dtype": a.dtype.name, "value": a.item()}
        if isinstance(a, (bool, int, float)):
            return {"kind": "scalar", "dtype": type(a).__name__, "value": a}
        return {"kind": "unsupported", "type": type(a).__name__}

    def launch(self, kernel, args) -> None:
        fn = getattr(kernel, "fn", None)
        li = len(self.launches)
        rec = {"kernel": getattr(fn, "__name__", "?"), "module": getattr(fn, "__module__", "?"),
               "grid": list(kernel.grid_dim or ()), "block": list(kernel.block_dim or ()),
               "dynshared": int(getattr(kernel, "dynshared_size", 0) or 0),
               "host_writes": self._host_writes(f"L{li}")}
        rec["args"] = [self._arg(a, li, ai) for ai, a in enumerate(args)]
        self.launches.append(rec)

    def finish(self) -> list:
        return self._host_writes("end")


def _dry_run(fn, job, arrays, ci, s, store):
    """Call the launcher on decoy set ``s`` of case ``ci`` with launches recorded, not run."""
    import numpy as np

    from .. import device
    from numba.cuda.simulator import kernel as skernel

    case = job["cases"][ci]
    cuda = device.cuda
    inputs = [arrays[f"d{s}_{k}"][()] if case["scalar"][i] else arrays[f"d{s}_{k}"] for i, k in enumerate(case["inputs"])]
    outs = [arrays[f"d{s}_{k}"].copy() for k in case["outputs"]]
    d_in = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in inputs]
    d_out = [cuda.to_device(o) for o in outs]
    grader = [("out", k, d) for k, d in enumerate(d_out)] + [("in", k, d) for k, d in enumerate(d_in)
                                                              if not isinstance(d, (int, float, np.generic))]
    rec = _LaunchRecorder(grader, store, f"c{ci}s{s}")
    saved = skernel.FakeCUDAKernel.__call__

    def call(self, *args):
        if self._device or skernel._kernel_context:
            return saved(self, *args)
        rec.launch(self, args)
        return None

    plan = {"launches": rec.launches}
    skernel.FakeCUDAKernel.__call__ = call
    try:
        fn(*d_out, *d_in)
    except BaseException as e:  # noqa: BLE001
        plan["error"] = None  # filled by the caller (it has `where`)
        plan["exception"] = e
    finally:
        skernel.FakeCUDAKernel.__call__ = saved
    plan["end_writes"] = rec.finish()
    return plan


def plan_job(job, mod, where, result) -> dict:
    """The plan run: the checks before running, the description of the functions to rebuild, and for a GPU
    answer, what the launcher launches on two sets of decoy inputs (see :class:`_LaunchRecorder`)."""
    import numpy as np

    from . import kernelpack

    found = _checks_before_running(job, mod, where, result)
    if found is None:
        return {}
    fn, kernels = found
    store: dict = {}
    roots = dict(kernels) if job["backend"] == "gpu" else {job["function"]: fn}
    if job["backend"] == "gpu":
        with np.load("decoys.npz", allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        plans = []
        for ci in range(len(job["cases"])):
            _progress(f"running `{job['function']}` on decoy inputs ({job['cases'][ci]['label']})")
            pair = []
            for s in (0, 1):
                p = _dry_run(fn, job, arrays, ci, s, store)
                e = p.pop("exception", None)
                if e is not None:
                    p["error"] = _exc_info(e, where)
                    if isinstance(e, (SystemExit, KeyboardInterrupt)):
                        p["error"]["message"] = f"{type(e).__name__} raised by your code (sys.exit()/quit()?)"
                pair.append(p)
            plans.append(pair)
            for la in pair[0]["launches"]:
                if la["module"] == "submission" and hasattr(mod, la["kernel"]):
                    roots.setdefault(la["kernel"], getattr(mod, la["kernel"]))
        result["plans"] = plans
    result["described"] = kernelpack.describe(roots)
    return store


# ------------------------------------------------------------------------------- the exec run (hidden inputs)
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


def host_writes(writes, real, plan_arrays):
    """``(array, idx, val)`` for each host write recorded between launches that lands in one of the grader's
    arrays (``real``): the plan run's flat indices and the values written there."""
    for w in writes or []:
        d = real.get((w["role"], w["k"]))
        idx = plan_arrays.get(w["key"] + "_idx")
        val = plan_arrays.get(w["key"] + "_val")
        if d is not None and idx is not None and val is not None:
            yield d, idx, val


def write_flat(flat, idx, val) -> None:
    """Apply one recorded host write to a flat host view, ignoring indices outside it."""
    ok = (idx >= 0) & (idx < flat.size)
    flat[idx[ok]] = val[ok].astype(flat.dtype, copy=False)


def scalar_arg(a):
    """A recorded scalar kernel argument, rebuilt with its type (Python int/float/bool or a NumPy scalar)."""
    import numpy as np

    t = a["dtype"]
    return {"int": int, "float": float, "bool": bool}[t](a["value"]) if t in ("int", "float", "bool") \
        else np.dtype(t).type(a["value"])


def launch_recorded(kernel, la, args) -> None:
    """Launch ``kernel`` with the recorded launch ``la``'s grid, block and dynamic shared memory."""
    grid, block = tuple(la["grid"]), tuple(la["block"])
    if la.get("dynshared"):
        kernel[grid, block, 0, la["dynshared"]](*args)
    else:
        kernel[grid, block](*args)


def _apply_host_writes(writes, real, plan_arrays) -> None:
    for d, idx, val in host_writes(writes, real, plan_arrays):  # simulator arrays: write their host buffer
        write_flat(d._ary.reshape(-1), idx, val)


def _replay(made, plan, real, plan_arrays, cache) -> list:
    """Launch the plan's kernels, in order, on the grader's arrays."""
    import numpy as np

    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    for la in plan["launches"]:
        _apply_host_writes(la.get("host_writes"), real, plan_arrays)
        kernel = made.get(la["kernel"])
        if kernel is None or la["module"] != "submission":
            continue
        args = []
        for a in la["args"]:
            kind = a["kind"]
            if kind in ("out", "in"):
                args.append(real[(kind, a["k"])])
            elif kind == "view":
                base = real[(a["role"], a["k"])]._ary
                v = np.ndarray(tuple(a["shape"]), np.dtype(a["dtype"]), buffer=base, offset=a["offset"],
                               strides=tuple(a["strides"]))
                args.append(FakeCUDAArray(v))
            elif kind == "made":
                arr = cache.get(a["id"])
                src = plan_arrays[a["key"]]
                if arr is None:
                    arr = cache[a["id"]] = FakeCUDAArray(np.array(src, copy=True))
                elif not np.array_equal(_bits(src), _bits(cache.setdefault(("snap", a["id"]), src))):
                    arr._ary[...] = src  # the host changed it between launches
                cache[("snap", a["id"])] = src
                args.append(arr)
            elif kind == "scalar":
                args.append(scalar_arg(a))
            else:
                raise TypeError(f"a kernel argument of type {a.get('type')} cannot be passed to a kernel")
        launch_recorded(kernel, la, args)
    _apply_host_writes(plan.get("end_writes"), real, plan_arrays)
    return []


def exec_job(job, where, result) -> dict:
    """The exec run: rebuild the functions from the notebook's text (no other statement of it runs), say
    ready, read the hidden inputs from stdin, run, report."""
    import io

    import numpy as np

    from .. import device
    from . import kernelpack
    from .racecheck import instrumented

    _progress("rebuilding your functions from their source")
    made = kernelpack.build(os.path.abspath(SUBMISSION), job["pack"])
    plan_arrays = {}
    if os.path.exists("plan.npz"):
        with np.load("plan.npz", allow_pickle=False) as z:
            plan_arrays = {k: z[k] for k in z.files}
    ready = job.get("ready_fd")
    if ready is not None:
        os.write(int(ready), b"ready\n")
        os.close(int(ready))
    _progress("waiting for the inputs")
    data = sys.stdin.buffer.read()
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    del data
    backend = job["backend"]
    name = job["function"]
    outputs: dict = {}
    cases = []
    result["cases"] = cases
    if backend == "cpu":
        fn = made[name]
    for ci, case in enumerate(job["cases"]):
        _progress(f"running `{name}` on {case['label']}")
        inputs = [arrays[k][()] if case["scalar"][i] else arrays[k] for i, k in enumerate(case["inputs"])]
        outs = [arrays[k].copy() for k in case["outputs"]]
        rec = {"label": case["label"], "seconds": 0.0, "launches": [], "races": [], "barriers": []}
        cases.append(rec)
        t0 = time.perf_counter()
        session = None
        try:
            if backend == "gpu":
                cuda = device.cuda
                d_in = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in inputs]
                d_out = [cuda.to_device(o) for o in outs]
                real = {("out", k): d for k, d in enumerate(d_out)}
                real.update({("in", k): d for k, d in enumerate(d_in) if hasattr(d, "_ary")})
                with instrumented(track_races=job.get("racecheck", True)) as session, device.simulator_speedup():
                    session.watch(d_out)
                    _replay(made, job["plans"][ci], real, plan_arrays, {})
                    writes = session.writes()
                rec["writes"] = [{"kernel": w.n_kernel, "host": w.n_host, "size": w.size,
                                  "first_host": int(np.flatnonzero(w.host.reshape(-1))[0]) if w.n_host else -1}
                                 for w in writes]
                got = [np.array(d._ary, copy=True) for d in d_out]
                after = [np.array(d._ary, copy=True) if isinstance(a, np.ndarray) else None
                         for d, a in zip(d_in, inputs)]
            else:
                precompile(fn, outs + inputs)
                bad = compiled_problems(fn, job.get("allow", ()))
                if bad:
                    rec["shortcut_calls"] = bad
                    got, after = None, None
                else:
                    fn(*outs, *inputs)
                    got, after = outs, inputs
        except BaseException as e:  # noqa: BLE001  (student code may raise anything, SystemExit included)
            rec["error"] = _exc_info(e, where)
            if isinstance(e, (SystemExit, KeyboardInterrupt)):
                rec["error"]["message"] = f"{type(e).__name__} raised by your code (sys.exit()/quit()?)"
            got, after = None, None
        rec["seconds"] = time.perf_counter() - t0
        if session is not None:
            for la in session.report().launches:
                rec["launches"].append({"kernel": la.kernel, "module": la.module, "grid": la.grid, "block": la.block,
                                        "argtypes": la.argtypes, "error": la.error})
                rec["races"] += [r.describe(lambda a: where(a.line, a.file)) for r in la.races]
                rec["barriers"] += [b.describe(lambda f, ln: where(ln, f)) for b in la.barrier_problems]
                rec["n_races"] = rec.get("n_races", 0) + la.n_races
        if got is not None:
            for k, g in zip(case["outputs"], got):
                outputs[k] = np.asarray(g)
            for i, (k, a) in enumerate(zip(case["inputs"], after)):
                if isinstance(a, np.ndarray):
                    outputs["after_" + k] = np.asarray(a)
    return outputs


def ptx_job(job, where, result) -> None:
    """Compile the rebuilt kernels for sm_90 (the notebook's own statements are not run here either)."""
    from .. import ptx
    from . import kernelpack

    made = kernelpack.build(os.path.abspath(SUBMISSION), job["pack"])
    out = []
    for item in job["ptx"]:
        kname, sig = item["kernel"], item["signature"]
        entry = {"kernel": kname, "signature": sig}
        kobj = made.get(kname)
        if kobj is None:
            entry.update(ok=False, message=f"`{kname}` is not defined")
        else:
            _progress(f"compiling `{kname}` to PTX")
            try:
                text = ptx.compile_one(kobj, sig)
                entry.update(ok=True, lines=text.count("\n"))
            except Exception as e:  # noqa: BLE001  (a typing error is the finding)
                import re

                msg = " ".join(str(e).split())
                msg = re.sub(r"[^\s\"']*/submission\.py", "submission.py", msg)
                line = _student_line(e.__traceback__)
                entry.update(ok=False, type=type(e).__name__, message=msg[:1500])
                m = re.search(r'File "[^"]*submission\.py", line (\d+)', str(e))
                if m:
                    line = int(m.group(1))
                entry["where"] = where(line) if line else ""
        out.append(entry)
    result["ptx"] = out


def _load_cells(mod, where, result, mode: str) -> None:
    """Run the student's code cell by cell, as Jupyter would: a statement that raises stops the rest of its
    own cell only, and what was defined before it stays defined. Each such error is kept in
    ``result["load_errors"]``, so that a question whose function is missing can say which cell failed, and a
    question that needs nothing from that cell is graded as usual.

    For the PTX compile (the real CUDA target and no GPU), a top-level statement that touches the device (a
    demo's ``cuda.to_device``) fails while the definitions are all the compiler needs: there only the failing
    statement is skipped."""
    path = os.path.abspath(SUBMISSION)
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    mod.__file__ = path
    errors = result.setdefault("load_errors", [])
    cells: list = []  # [(cell number or None, [statements])]
    for stmt in tree.body:
        lm = where.line_map[stmt.lineno - 1] if 1 <= stmt.lineno <= len(where.line_map) else None
        cell = lm[0] if lm else None
        if not cells or cells[-1][0] != cell:
            cells.append((cell, []))
        cells[-1][1].append(stmt)
    for cell, stmts in cells:
        for k, stmt in enumerate(stmts):
            code = compile(ast.Module([stmt], []), path, "exec")
            try:
                exec(code, mod.__dict__)
            except BaseException as e:  # noqa: BLE001  (SystemExit and KeyboardInterrupt too: a cell's end)
                if mode == "ptx":
                    result["notes"].append(f"skipped line {stmt.lineno} for the PTX compile: {type(e).__name__}")
                    continue
                info = _exc_info(e, where)
                if isinstance(e, (SystemExit, KeyboardInterrupt)):
                    info["message"] = f"{type(e).__name__} (sys.exit()/quit()?)"
                info["cell"] = cell
                skipped = [n for s2 in stmts[k:] for n in _names_defined(s2)]
                info["not_defined"] = skipped
                errors.append(info)
                break


def _names_defined(stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names]
    out = []
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.append(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.append(node.name)
    return out


def load_error_lines(errors, names=None) -> list[str]:
    """Student-facing lines for the cells that stopped while loading; only those that left one of ``names``
    undefined if names are given (and there are such)."""
    chosen = [e for e in errors if names and set(names) & set(e.get("not_defined", []))] or list(errors)
    out = []
    for e in chosen[:3]:
        at = f" at {e['where']}" if e.get("where") else ""
        out.append(f"loading your code raised {e['type']}: {e['message']}{at}; the rest of that cell did not run"
                   + (f" (it would have defined {', '.join(f'`{n}`' for n in e['not_defined'][:6])})"
                      if e.get("not_defined") else ""))
        if e.get("type") in ("ModuleNotFoundError", "ImportError") and "kernels_src" in e.get("message", ""):
            out[-1] += (" (the grader's process has only kernels_src.device and kernels_src.compiler: the course's "
                        "references, helpers and measurements are not there, so a cell that imports them does not run)")
    return out




def main(argv=None) -> None:
    argv = argv if argv is not None else sys.argv[1:]
    with open(argv[0], encoding="utf-8") as f:
        job = json.load(f)
    result: dict = {"status": "ok", "notes": []}
    conf = job.get("confine")
    if conf is not None:  # first: before anything of the student's is read
        from .confine import confine

        result["confined"] = confine(os.getcwd(), read=conf.get("read", ()), uid=conf.get("uid"),
                                     net=conf.get("net", True), devices=conf.get("devices", ()),
                                     skip=conf.get("skip", ()))
    from .sandbox import apply_limits

    apply_limits(job.get("limits", {}))
    outputs: dict = {}
    try:
        _progress("starting Python and Numba")
        import kernels_src  # noqa: F401  (chooses the simulator or the PTX target before numba.cuda loads)
        import numpy  # noqa: F401

        where = Where(job.get("line_map"))
        if job["mode"] == "exec":
            outputs = exec_job(job, where, result)
            _finish(result, outputs)
        if job["mode"] == "ptx":
            ptx_job(job, where, result)
            _finish(result, outputs)
        if job["mode"] == "perf":  # a speed question: runs on the grader's word (see .perfworker)
            from .perfworker import perf_job

            perf_job(job, where, result)
            _finish(result, outputs)
        _progress("loading your code (its imports, definitions and constants)")
        import importlib.util

        sys.path.insert(0, os.getcwd())
        try:
            spec = importlib.util.spec_from_file_location("submission", os.path.abspath(SUBMISSION))
            mod = importlib.util.module_from_spec(spec)
            sys.modules["submission"] = mod
            _load_cells(mod, where, result, job["mode"])
        except BaseException as e:  # noqa: BLE001  (the file does not parse: not a notebook the bundle made)
            info = _exc_info(e, where)
            info["traceback"] = traceback.format_exc()[-2500:]
            result.update(status="load_error", load_error=info,
                          message=(f"loading your code raised {info['type']}: {info['message']}"
                                   + (f"\n    at {info['where']}" if info["where"] else "")))
            _finish(result)
        if job["mode"] == "plan":
            outputs = plan_job(job, mod, where, result)
        else:
            raise ValueError(f"unknown mode {job['mode']!r}")
    except BaseException as e:  # noqa: BLE001
        result.update(status="error", message=f"{type(e).__name__}: {e}",
                      traceback=traceback.format_exc()[-3000:])
    _finish(result, outputs)


if __name__ == "__main__":
    main()
