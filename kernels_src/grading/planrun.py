"""The plan run: the student's notebook loaded cell by cell in the sandbox, where it never sees a hidden input.

It checks the kind of each named object (an ``@njit`` function, or a launcher and the ``@cuda.jit`` kernels it
launches), stubs, signatures and the source for shortcuts (:mod:`.shortcuts`); for a GPU answer it calls the
launcher on two decoy draws of the inputs with launches recorded, not run (:class:`_LaunchRecorder`); and it
describes the functions to grade as plain data (:func:`kernelpack.describe`) for the exec run to rebuild."""
from __future__ import annotations

import ast
import inspect
import os

from .childio import SUBMISSION, _exc_info, _progress
from .replay import _bits
from .shortcuts import _py, _source_tree, scan_shortcuts


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
