"""The judge: run one check of a student's function and turn what happened into a verdict with feedback.

A check is described by a :class:`CheckSpec` (which function, which op, which sizes, CPU or GPU). The
judge draws fresh random inputs (the seed changes every run and is printed), computes the float64
reference, and hands the student's code and the inputs, but never the reference, to a sandboxed child
(:mod:`.sandbox`, :mod:`.worker`). Back in this process it compares the outputs with
:func:`kernels_src.parity.compare`, checks that the outputs were all written (the poison is a NaN with a
payload, see :func:`kernels_src.parity.is_poison`), that the inputs came back unchanged, that the GPU
answer launched the student's own kernel with no shared-memory race or divergent barrier, and that
the kernel compiles to PTX for sm_90 with the argument types it ran with. The feedback says what
failed, on which shape, the first mismatches, and a hint for the classic causes.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .. import parity
from . import exercise_ops, sandbox
from .bundle import Bundle


@dataclass(frozen=True)
class CheckSpec:
    kind: str  # "cpu" (an @njit function) or "gpu" (a launcher and its @cuda.jit kernels)
    function: str  # the name the student's notebook must define
    op: str  # a registered op or an exercise op: gives the reference, inputs, sizes and tolerance
    kernels: tuple = ()  # GPU: names of the @cuda.jit kernels the launcher must launch
    sizes: tuple | None = None  # default: the op's "check" sizes (CPU) or "check_sim" sizes (GPU)
    edge: bool = False  # also run the op's edge-value inputs (zeros, inf, NaN, ...)
    hidden: bool = False
    dtype: str = "float32"
    racecheck: bool = True
    ptx: bool = True
    forbid: tuple = ()  # extra forbidden names, e.g. ("np.add",)
    allow: tuple = ()  # default-forbidden NumPy names this exercise allows, e.g. ("sum",)
    args: tuple = ()  # argument names for messages, e.g. ("out", "a", "x", "y")
    timeout: float | None = None

    @property
    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True, default=list)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def title(self) -> str:
        hidden = ", hidden test" if self.hidden else ""
        if self.kind == "gpu":
            ks = ", ".join(f"`{k}`" for k in self.kernels)
            return f"`{self.function}` (GPU launcher of {ks}{hidden})" if ks else f"`{self.function}` (GPU{hidden})"
        return f"`{self.function}` (CPU, Numba{hidden})"


@dataclass
class Verdict:
    key: str
    title: str
    passed: bool
    feedback: str
    seed: int = 0
    seconds: float = 0.0
    status: str = "ok"  # ok | fail | error (the grader itself failed: never the student's fault)
    flags: list = field(default_factory=list)  # instructor notes: suspicious constructs in the code
    timed_out: bool = False  # the student's code did not finish within the check's time limit

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Verdict":
        return cls(**d)


class GraderError(RuntimeError):
    """The exercise itself is broken (e.g. every reference output is zero): an author's bug."""


# ------------------------------------------------------------------------------------------ cases
def _sizes(spec: CheckSpec, op) -> list[tuple]:
    if spec.sizes:
        return [tuple(s) if isinstance(s, (tuple, list)) else (int(s),) for s in spec.sizes]
    if spec.kind == "gpu":
        return [tuple(s) for s in (op.sizes.get("check_sim") or op.sizes["check"])]
    return [tuple(s) for s in op.sizes["check"]]


def build_cases(spec: CheckSpec, op, seed: int):
    """[(label, inputs tuple, reference outputs)] for one check, all drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(spec.dtype)
    cases = []
    sizes = _sizes(spec, op)
    for size in sizes:
        inputs = parity.as_tuple(op.make_inputs(size, dtype, rng))
        cases.append((op.describe_size(size), size, inputs))
    if spec.edge:
        edge = exercise_ops.find_edge_inputs(op)
        if edge is None:
            raise GraderError(f"edge=True but no edge-value inputs are defined for op {op.name!r}: define "
                              "make_edge_inputs(size, dtype, rng) next to its make_inputs")
        size = max(sizes, key=lambda s: int(np.prod(s)))
        cases.append((op.describe_size(size) + ", edge values", size, parity.as_tuple(edge(size, dtype, rng))))
    out = []
    any_nonzero = False
    for label, size, inputs in cases:
        refs = parity.reference_outputs(op, inputs)
        any_nonzero |= any(np.any(r != 0) for r in refs)
        out.append((label, size, inputs, refs))
    if not any_nonzero:
        raise GraderError(f"every reference output of {op.name} is zero for these inputs: such a check "
                          "cannot tell a correct kernel from one that writes zeros")
    return out


# -------------------------------------------------------------------------------------------- PTX
_ptx_cache: dict = {}
_ptx_lock = threading.Lock()


def _ptx_results(bundle: Bundle, items: list[dict], timeout: float) -> list[dict]:
    todo = []
    results = {}
    with _ptx_lock:
        for it in items:
            k = (bundle.sha, it["kernel"], it["signature"])
            if k in _ptx_cache:
                results[k] = _ptx_cache[k]
            else:
                todo.append(it)
    if todo:
        for attempt in range(2):  # an environment hiccup (driver probing, a busy machine) gets one retry
            res = sandbox.run({"mode": "ptx", "ptx": todo, "line_map": bundle.line_map}, bundle.source,
                              device_mode="ptx", timeout=timeout)
            infra = (res.status in ("no_result", "memory") or "CudaSupportError" in res.message
                     or "driver" in res.message.lower())
            if res.ok or not infra:
                break
        got = res.payload.get("ptx") if res.ok else None
        for it in todo:
            k = (bundle.sha, it["kernel"], it["signature"])
            if got is None:
                tb = (res.payload.get("load_error") or {}).get("traceback", "") or res.payload.get("traceback", "")
                entry = dict(it, ok=False, grader=True,
                             message=(res.message or "the PTX compiler process did not report a result")
                             + (f"\n{tb}" if tb else ""))
                if res.status == "load_error" and not infra:
                    entry["message"] = "loading your code with the real CUDA compiler failed: " + res.message
                    entry["grader"] = False
            else:
                entry = next((g for g in got if g["kernel"] == it["kernel"] and g["signature"] == it["signature"]),
                             dict(it, ok=False, message="no result"))
            results[k] = entry
            if got is not None:
                with _ptx_lock:
                    _ptx_cache[k] = entry
    return [results[(bundle.sha, it["kernel"], it["signature"])] for it in items]


# ------------------------------------------------------------------------------------------ hints
def _suffix_run(mask: np.ndarray) -> int:
    """If the True entries of a 1-D mask are exactly its last k entries, return k, else 0."""
    idx = np.flatnonzero(mask)
    if idx.size == 0:
        return 0
    return int(idx.size) if idx[0] == mask.size - idx.size else 0


def hints_for_mismatch(spec, got, ref, bad, unwritten, launches, inputs=()) -> list[str]:
    hints = []
    # elementwise: the output has the shape of an input array, so output index i is thread/iteration i
    elementwise = any(isinstance(a, np.ndarray) and a.shape == ref.shape for a in inputs)
    flat_bad, flat_unw = bad.reshape(-1), unwritten.reshape(-1)
    n = ref.size
    if unwritten.all() and n == 1:
        hints.append("the only element was never written: with n = 1 the grid is one block with one useful "
                     "thread (index 0); check the launch (at least one block) and the guard (`if i < n:`)"
                     if spec.kind == "gpu" else "the only element was never written: check the loop bounds")
        return hints
    if unwritten.all():
        if spec.kind == "gpu":
            hints.append("no element of the output was written: does the kernel store into the `out` argument, and "
                         "does the launcher launch it over the whole array?")
        else:
            hints.append("no element of the output was written: does your function store into the `out` argument "
                         "(`out[i] = ...`), rather than build and return a new array?")
        return hints
    k = _suffix_run(flat_unw)
    threads = None
    if launches:
        la = launches[-1]
        threads = int(np.prod(la["grid"])) * int(np.prod(la["block"]))
    if k:
        if spec.kind == "gpu" and threads is not None and threads < n:
            la = launches[-1]
            hints.append(f"the last {k} element(s) were never written: your launch started {int(np.prod(la['grid']))} "
                         f"block(s) of {int(np.prod(la['block']))} threads = {threads} threads for {n} elements. Use "
                         "blocks = ceil_div(n, threads) (rounding up), so the last, partial block exists.")
        elif spec.kind == "gpu":
            hints.append(f"the last {k} element(s) were never written although enough threads were launched: is the "
                         "bounds guard too strict (`i < n - 1`, `i <= n - 2`)? It should be `if i < n:`.")
        else:
            hints.append(f"the last {k} element(s) were never written: does your loop cover every index "
                         "(range(n), not range(n - 1))?")
    elif flat_unw.any():
        first = int(np.flatnonzero(flat_unw)[0])
        hints.append(f"{int(flat_unw.sum())} element(s) were never written (the first at flat index {first}): check "
                     "how each thread or loop iteration computes its index (blockIdx.x * blockDim.x + threadIdx.x, "
                     "the stride of a loop)")
    if launches and spec.kind == "gpu" and elementwise:
        bsize = int(np.prod(launches[-1]["block"]))
        if ref.ndim == 1 and bsize and n % bsize and n > bsize and flat_bad.any():
            tail_start = (n // bsize) * bsize
            if np.flatnonzero(flat_bad)[0] >= tail_start and not k:
                hints.append(f"only elements in the last, partial block (index {tail_start} and up) are wrong: a "
                             "bounds-guard problem in the block that runs past the end of the array")
    if not elementwise and ref.ndim == 1 and n > 1 and flat_bad[-1] and not flat_bad[:-1].any() and not k:
        hints.append("only the last output element is wrong: it comes from the last, partial block of the input; "
                     "check how the threads or iterations past the end are handled (they must contribute nothing, "
                     "and the guard must be `i < n`)")
    produced_nan = (~unwritten) & ~np.isfinite(got) & np.isfinite(ref)
    if produced_nan.any():
        hints.append(f"your code produced NaN or Inf at {int(produced_nan.sum())} element(s) where the result is "
                     "finite: reading memory that was never initialised (np.empty and cuda.shared.array are not "
                     "zeroed), or a division by zero?")
    written_bad = flat_bad & ~flat_unw
    if written_bad.any() and ref.ndim == 1 and n > 2:
        g = got.reshape(-1).astype(np.float64)
        r = ref.reshape(-1).astype(np.float64)
        idx = np.flatnonzero(written_bad)
        for shift in (1, -1):
            j = idx + shift
            ok = (j >= 0) & (j < n)
            if ok.sum() >= max(1, idx.size // 2):
                close = np.isclose(g[idx[ok]], r[j[ok]], rtol=1e-4, atol=1e-5)
                if close.mean() > 0.8:
                    hints.append(f"element i holds the answer for element i{shift:+d}: an off-by-one in an index")
                    break
        gw, rw = g[idx], r[idx]
        fin = np.isfinite(gw) & np.isfinite(rw) & (np.abs(rw) > 1e-6)
        if np.all(gw == 0):
            hints.append("the wrong elements are all exactly 0")
        elif fin.sum() >= 3:
            ratio = gw[fin] / rw[fin]
            if np.allclose(ratio, ratio[0], rtol=1e-3) and not np.isclose(ratio[0], 1.0, rtol=1e-3):
                hints.append(f"every wrong element is off by the same factor, about {ratio[0]:.4g}: a missing or "
                             "extra scale factor?")
    return hints


def hints_for_error(err: dict, spec: CheckSpec) -> list[str]:
    t, msg = err.get("type", ""), err.get("message", "")
    if t == "IndexError" and "out of bounds" in msg:
        if spec.kind == "gpu":
            return ["a thread indexed past the end of an array. The last block usually has threads beyond the end: "
                    "guard the loads and stores with `if i < n:` (and check the guard is not off by one)."]
        return ["an index ran past the end of an array: check your loop bounds (range(n), not range(n + 1))."]
    if t == "MemoryError":
        return ["your code tried to allocate more memory than the grader allows "
                f"({sandbox.DEFAULT_MEMORY >> 20} MB of address space): are you allocating per element, or "
                "an array sized by something other than n?"]
    if t == "ZeroDivisionError":
        return ["a division by zero: with n = 1, or an empty last block, some count is 0."]
    if t in ("TypeError", "AttributeError") and "shfl" in msg:
        return ["warp shuffles do not exist in the CUDA simulator: use shared memory for this exercise."]
    if t == "NameError":
        return ["a name used by your code is not defined when the grader loads it: is it defined in a cell that "
                "only runs interactively (inside an `if`, a loop, or after a call the grader skips)?"]
    return []


def host_write_message(name: str, w: dict, spec: CheckSpec) -> str:
    """Feedback for output elements whose final value was written by host code, not by a kernel thread."""
    n, nk, nh = w["size"], w["kernel"], w["host"]
    ks = " or ".join(f"`{k}`" for k in spec.kernels) or "your kernel"
    if nh >= n or nk == 0:
        head = f"{name}: the output was written on the host; the kernel wrote {nk} of {n} elements"
    else:
        head = (f"{name}: {nh} of {n} elements were last written on the host (the first at flat index "
                f"{w['first_host']}); the kernel wrote {nk} of {n} elements")
    return (head + f". Every element of the output must be stored by a thread of {ks} during your launch; the "
            "launcher only allocates, computes the grid and launches (no copy_to_device, `out[...] = ...` or NumPy "
            "work on the host). This scores 0.")


# ------------------------------------------------------------------------------------------- judge
SUSPICIOUS = {
    "sys.modules": "touches sys.modules", "gc.": "uses the garbage collector", "ctypes": "uses ctypes",
    "os._exit": "calls os._exit", "builtins": "touches builtins", "__import__": "calls __import__",
    "importlib": "uses importlib", "kernels_src.grading": "refers to the grader", "otter": "refers to otter",
    "inspect.": "uses inspect", "atexit": "registers atexit hooks", "signal.": "handles signals",
    "setattr(": "calls setattr", "subprocess": "starts processes",
}


def suspicious_flags(bundle: Bundle) -> list[str]:
    """Instructor notes: constructs that have no place in a kernel exercise (the grade does not use them)."""
    import ast

    flags = []
    src = bundle.source
    for needle, what in SUSPICIOUS.items():
        if needle in src:
            flags.append(what)
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return flags
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported |= {a.asname or a.name for a in node.names}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute):
                    base = t.value
                    while isinstance(base, ast.Attribute):
                        base = base.value
                    if isinstance(base, ast.Name) and base.id in imported:
                        flags.append(f"replaces `{ast.unparse(t)}` (line {node.lineno} of the graded code); the "
                                     "grader does not use it, so this changes nothing")
    return sorted(set(flags))


def _draw_seed(seed: int | None) -> int:
    if seed is not None:
        return seed
    env_seed = os.environ.get("KERNELS_GRADING_SEED")
    return int(env_seed) if env_seed else secrets.randbits(31)


class _Reporter:
    """Builds the one Verdict of a check: the head line, the body, and the notes a failure carries."""

    def __init__(self, spec: CheckSpec, bundle: Bundle, n_cases: int, seed: int, flags: list, t0: float):
        self.spec, self.bundle, self.n_cases, self.seed, self.flags, self.t0 = spec, bundle, n_cases, seed, flags, t0
        self.load_notes: list = []  # cells that stopped with an error while the worker loaded the code

    def __call__(self, passed: bool, lines: list, status: str = "fail") -> Verdict:
        n = self.n_cases
        head = f"{self.spec.title}: {'ok' if passed else 'FAILED'} ({n} case{'s' if n != 1 else ''}, seed {self.seed})"
        body = [head] + ["  " + ln for ln in lines]
        if not passed:
            body += ["  note: " + n for n in self.bundle.notes]
            body += ["  note: " + n for n in self.load_notes]
            body += ["  note: your code " + f for f in self.flags]
        return Verdict(self.spec.key, self.spec.title, passed, "\n".join(body), self.seed,
                       time.perf_counter() - self.t0, "ok" if passed else status, self.flags)


def _make_job(spec: CheckSpec, bundle: Bundle, cases) -> tuple[dict, dict]:
    """The worker's job description and the arrays it reads (inputs, and poisoned outputs to write)."""
    arrays, job_cases = {}, []
    for ci, (label, size, inputs, refs) in enumerate(cases):
        in_keys, scalar, out_keys = [], [], []
        for k, a in enumerate(inputs):
            key = f"c{ci}_in{k}"
            arrays[key] = np.asarray(a)
            in_keys.append(key)
            scalar.append(not isinstance(a, np.ndarray))
        for k, o in enumerate(parity.empty_outputs(refs, spec.dtype)):
            key = f"c{ci}_out{k}"
            arrays[key] = o
            out_keys.append(key)
        job_cases.append({"label": label, "inputs": in_keys, "scalar": scalar, "outputs": out_keys})
    job = {"mode": "run", "backend": spec.kind, "function": spec.function, "kernels": list(spec.kernels),
           "n_outputs": len(cases[0][3]), "n_inputs": len(cases[0][2]), "args": list(spec.args),
           "cases": job_cases, "racecheck": spec.racecheck, "forbid": list(spec.forbid), "allow": list(spec.allow),
           "line_map": bundle.line_map}
    return job, arrays


def _sandbox_failure(res) -> list | None:
    """Lines for a run that ended without a result (time or memory limit, a crash), else None."""
    if res.status not in ("timeout", "signal", "exited", "memory", "output_limit", "no_result"):
        return None
    lines = [res.message]
    if res.output_tail.strip() and res.status != "output_limit":
        tail = res.output_tail.strip().splitlines()[-6:]
        lines += ["the last lines your code printed:"] + ["  " + t[:200] for t in tail]
    return lines


def _error_problems(err: dict, spec: CheckSpec) -> list:
    where = f" at {err['where']}" if err.get("where") else ""
    first = f"{err['message']}{where}" if err["type"] == "OutputLimit" else f"raised {err['type']}: {err['message']}{where}"
    return [first] + ["hint: " + h for h in hints_for_error(err, spec)]


def _launch_problems(spec: CheckSpec, launches: list, ptx_items: dict) -> list:
    """The student's own kernels were launched, sensibly; records each launch's signature for PTX."""
    problems = []
    mine = [la for la in launches if la["module"] == "submission"]
    foreign = sorted({f"{la['module']}.{la['kernel']}" for la in launches if la["module"] != "submission"})
    if foreign:
        problems.append("launches the course's own kernel(s) " + ", ".join(foreign) + ": this scores 0; "
                        "launch the kernel you wrote")
    for k in spec.kernels:
        if not any(la["kernel"].split(".")[-1] == k for la in mine):
            problems.append(f"`{spec.function}` never launched `{k}`: the launcher must launch your kernel "
                            f"(`{k}[blocks, threads](...)`)")
    for la in mine:
        if int(np.prod(la["block"])) > 1024:
            problems.append(f"`{la['kernel']}` was launched with {int(np.prod(la['block']))} threads per block; "
                            "a GPU allows at most 1024")
        for k in spec.kernels:
            if la["kernel"].split(".")[-1] == k and "?" not in la["argtypes"]:
                sig = "void(" + ", ".join(la["argtypes"]) + ")"
                ptx_items[(k, sig)] = {"kernel": k, "signature": sig}
    return problems


def _race_problems(rec: dict) -> list:
    problems = []
    if rec.get("races"):
        n = rec.get("n_races", len(rec["races"]))
        problems.append(f"shared-memory race ({n} conflicting access(es)) found by the race detector:")
        problems += ["  " + line for r in rec["races"][:3] for line in r.splitlines()]
    if rec.get("barriers"):
        problems += ["barrier problem: " + b for b in rec["barriers"][:2]]
    return problems


def _output_problems(spec, name, k, got, ref, rec, rtol, atol, launches, inputs) -> list:
    """One output against its reference: written by the kernel, every element written, within tolerance."""
    if got is None:
        return [f"{name}: the grader received no output"]
    writes = rec.get("writes") or []
    if spec.kind == "gpu" and k < len(writes) and writes[k]["host"]:
        return [host_write_message(name, writes[k], spec)]
    rep = parity.compare(name, got, ref, rtol, atol)
    if rep.problem:
        return [rep.problem]
    unwritten = parity.is_poison(got) if got.shape == ref.shape else np.zeros(ref.shape, bool)
    extra = unwritten & ~(rep.bad_mask if rep.bad_mask is not None else np.zeros(ref.shape, bool))
    if rep.ok and not extra.any():
        return []
    bad = (rep.bad_mask if rep.bad_mask is not None else np.zeros(ref.shape, bool)) | unwritten
    n_unw = int(unwritten.sum())
    n_nan = int((~unwritten & ~np.isfinite(np.asarray(got, dtype=np.float64)) & np.isfinite(ref)).sum())
    what = [f"{n_unw} never written"] if n_unw else []
    what += [f"{n_nan} NaN/Inf where the result is finite"] if n_nan else []
    lines = [f"{name} shape {tuple(ref.shape)}: {int(bad.sum())} of {ref.size} elements wrong"
             + (f" ({', '.join(what)})" if what else "")]
    if not rep.ok:
        lines += rep.lines()[1:]
    else:
        lines.append("  (they were never written, and matched only because the result there is NaN)")
    return lines + ["hint: " + h for h in hints_for_mismatch(spec, np.asarray(got), np.asarray(ref), bad,
                                                              unwritten, launches, inputs)]


def _input_problems(spec, inputs, job_case, outputs, n_outputs) -> list:
    """Inputs are read-only: any element the answer changed is reported."""
    problems = []
    for k, a in enumerate(inputs):
        if not isinstance(a, np.ndarray):
            continue
        after = outputs.get("after_" + job_case["inputs"][k])
        if after is None or np.array_equal(after, a, equal_nan=True):
            continue
        nchg = int(np.sum(~((after == a) | (np.isnan(after) & np.isnan(a))))) if after.shape == a.shape else a.size
        arg = spec.args[n_outputs + k] if len(spec.args) > n_outputs + k else "an input array"
        problems.append(f"input #{k + 1} ({arg}) was modified ({nchg} element(s) changed): inputs must be "
                        "read-only; write only into the output")
    return problems


def _case_problems(spec, op, case, rec, job_case, outputs, names, ptx_items) -> list:
    """Everything wrong with one case of the run (an empty list: the case passed)."""
    label, size, inputs, refs = case
    rtol, atol = parity.resolve_tol(op.tol, spec.dtype, size)
    err = rec.get("error")
    launches = rec.get("launches", [])
    problems = _error_problems(err, spec) if err else []
    if rec.get("shortcut_calls"):
        problems.append("calls " + ", ".join(rec["shortcut_calls"]) + " instead of computing the answer: "
                        "this scores 0. Write the computation yourself.")
    if spec.kind == "gpu" and not err:
        problems += _launch_problems(spec, launches, ptx_items)
    problems += _race_problems(rec)
    if not err:
        for k, (name, ref) in enumerate(zip(names, refs)):
            got = outputs.get(job_case["outputs"][k])
            problems += _output_problems(spec, name, k, got, ref, rec, rtol, atol, launches, inputs)
        problems += _input_problems(spec, inputs, job_case, outputs, len(refs))
    return problems


def _failure_lines(failures: list, passed_labels: list) -> list:
    """The first and last failing cases in full, the others by name, then what passed."""
    lines = []
    shown = failures if len(failures) <= 2 else [failures[0], failures[-1]]
    for label, problems in shown:
        lines.append(f"{label}: FAILED")
        lines += ["  " + p for p in problems]
    if len(failures) > 2:
        lines.append("also failed: " + "; ".join(f[0] for f in failures[1:-1]))
    if passed_labels:
        lines.append("passed: " + "; ".join(passed_labels))
    return lines


PTX_HINT = ("  hint: the simulator runs kernels as Python, so it accepts code a GPU cannot: a float used as an "
            "index (use // for integer division), a list or a Python object in the kernel, a string, a NumPy call "
            "that allocates, or returning a value from a kernel.")


def _ptx_step(spec, bundle, ptx_items, t0) -> tuple[str, list]:
    """Compile the launched kernels to sm_90 PTX: ("ok" | "fail" | "error", lines)."""
    remaining = max(10.0, (spec.timeout or sandbox.DEFAULT_TIMEOUT) - (time.perf_counter() - t0))
    results = _ptx_results(bundle, list(ptx_items.values()), remaining)
    bad = [r for r in results if not r.get("ok")]
    for r in bad:
        if r.get("grader"):
            return "error", ["the PTX compiler could not be run (not your fault; tell your instructor): "
                             f"{r.get('message', '')}"]
    if bad:
        msg = []
        for r in bad:
            where = f" (at {r['where']})" if r.get("where") else ""
            msg += [f"`{r['kernel']}` runs in the simulator but does not compile for a real GPU "
                    f"(sm_90) with signature {r['signature']}{where}:", "  " + r.get("message", "")[:700], PTX_HINT]
        return "fail", msg
    return "ok", ["compiles to PTX for sm_90 (" + ", ".join(f"{r['kernel']}{r['signature'][4:]}" for r in results) + ")"]


def run_check(spec: CheckSpec, bundle: Bundle, seed: int | None = None) -> Verdict:
    """Grade one check. Never raises for anything the student did; GraderError for an author's mistake.

    The steps: draw the cases from the seed; run the answer on them in the sandbox; judge each case
    (errors, shortcuts, launches, races, outputs, inputs); for GPU answers, compile the kernels to PTX."""
    t0 = time.perf_counter()
    seed = _draw_seed(seed)
    op = exercise_ops.find_op(spec.op)
    cases = build_cases(spec, op, seed)
    verdict = _Reporter(spec, bundle, len(cases), seed, suspicious_flags(bundle), t0)

    job, arrays = _make_job(spec, bundle, cases)
    res = sandbox.run(job, bundle.source, inputs=arrays, device_mode="sim", timeout=spec.timeout)
    lines = _sandbox_failure(res)
    if lines is not None:
        v = verdict(False, lines)
        v.timed_out = res.status == "timeout"
        return v
    payload = res.payload
    if payload.get("load_errors") and payload.get("status") != "missing":
        from .worker import load_error_lines

        verdict.load_notes += load_error_lines(payload["load_errors"])
    if res.status == "error" and payload.get("traceback"):
        return verdict(False, ["the grader failed while running your code (not your fault; tell your instructor):",
                               payload.get("message", "")], status="error")
    if payload.get("status", "ok") != "ok":
        lines = payload.get("message", "").splitlines()
        err = payload.get("load_error")
        if err:
            lines += ["  hint: " + h for h in hints_for_error(err, spec)]
        return verdict(False, lines)

    n_outputs = job["n_outputs"]
    names = op.output_names if len(op.output_names) == n_outputs else [f"out{i}" for i in range(n_outputs)]
    passed_labels, failures, ptx_items = [], [], {}
    for case, rec, job_case in zip(cases, payload.get("cases", []), job["cases"]):
        problems = _case_problems(spec, op, case, rec, job_case, res.outputs, names, ptx_items)
        if problems:
            failures.append((case[0], problems))
        else:
            passed_labels.append(case[0])
    if failures:
        return verdict(False, _failure_lines(failures, passed_labels))

    lines = ["matches the float64 reference on " + "; ".join(passed_labels)]
    if spec.kind == "gpu":
        if spec.racecheck:
            lines.append("no shared-memory race, every barrier reached by every thread")
        if spec.ptx and ptx_items:
            status, more = _ptx_step(spec, bundle, ptx_items, t0)
            if status == "error":
                return verdict(False, more, status="error")
            if status == "fail":
                return verdict(False, lines + more)
            lines += more
    return verdict(True, lines)
