"""The judge: run one check of a student's function and turn what happened into a verdict with feedback.

A check is described by a :class:`CheckSpec` (which function, which op, which sizes, CPU or GPU). The
judge draws fresh random inputs (the seed changes every run and is printed), computes the float64
reference, and hands the student's code and the inputs, but never the reference, to a sandboxed child
(:mod:`.sandbox`, :mod:`.child`). Back in this process it compares the outputs with
:func:`kernels_src.parity.compare`, checks that the outputs were all written (the poison is a NaN with a
payload, see :func:`kernels_src.parity.is_poison`), that the inputs came back unchanged, that the GPU
answer launched the student's own kernel with no shared-memory race or divergent barrier, and that
the kernel compiles to PTX for sm_90 with the argument types it ran with. The feedback says what
failed, on which shape, the first mismatches, and a hint for the classic causes.
"""
from __future__ import annotations

import os
import secrets
import threading
import time

import numpy as np

from .. import parity
from . import exercise_ops, sandbox
from .bundle import Bundle
from .spec import CheckSpec, GraderError, Verdict  # noqa: F401


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


def _ptx_results(bundle: Bundle, items: list[dict], timeout: float, pack: dict | None = None) -> list[dict]:
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
            res = sandbox.run({"mode": "ptx", "ptx": todo, "line_map": bundle.line_map, "pack": pack or {}}, bundle.source,
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
        hints.append(nan_hint(spec, got, ref, produced_nan, inputs, elementwise))
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


def nan_hint(spec, got, ref, produced, inputs, elementwise) -> str:
    """Where a NaN or Inf that the reference does not have came from, as far as the inputs tell."""
    flat = np.flatnonzero(produced.reshape(-1))
    first = int(flat[0])
    idx = tuple(int(i) for i in np.unravel_index(first, ref.shape))
    g = float(np.asarray(got).reshape(-1)[first])
    what = "NaN" if np.isnan(g) else ("+Inf" if g > 0 else "-Inf")
    names = list(spec.args[-len(inputs):]) if spec.args and len(spec.args) >= len(inputs) else \
        [f"input{k + 1}" for k in range(len(inputs))]
    at = []
    special = []
    if elementwise:
        for nm, a in zip(names, inputs):
            if isinstance(a, np.ndarray) and a.shape == ref.shape:
                v = float(np.asarray(a, np.float64)[idx])
                at.append(f"{nm}{list(idx)} = {v:.7g}")
                if not np.isfinite(v) or v == 0:
                    special.append(v)
    head = (f"your code made {what} at {int(flat.size)} element(s) where the reference is finite (the first at index "
            f"{idx}, expected {float(np.asarray(ref).reshape(-1)[first]):.7g})")
    if at:
        head += "; the inputs there: " + ", ".join(at)
    if what != "NaN":
        why = ("an intermediate overflowed float32 (|x| > 3.4e38): reorder the computation (subtract the maximum "
               "before exp, divide before multiplying) so the intermediates stay in range")
    elif any(np.isinf(v) for v in special):
        why = ("an infinite input met inf - inf, 0 * inf or inf / inf in your formula, where the reference's "
               "formula keeps it finite: handle that value the way the reference does")
    elif any(v == 0 for v in special):
        why = "0 / 0 or 0 * inf: a division by a value that is zero here (the reference avoids it)"
    elif any(np.isnan(v) for v in special):
        why = "a NaN input reached an element whose reference is finite: that NaN belongs to other elements only"
    elif not elementwise:
        why = ("a NaN in one term makes a whole sum NaN: memory read before it was written (cuda.shared.array, "
               "cuda.local.array and np.empty are not zeroed), a thread past the end contributing garbage instead of "
               "0, or 0/0 on an empty row")
    else:
        why = ("the inputs here are ordinary numbers, so the NaN was made by your code: memory read before it was "
               "written (np.empty, cuda.shared.array), or 0/0 / sqrt of a negative number")
    return (head + ". Likely cause: " + why + ". (Elements never written are reported separately: they still "
            "hold the grader's poison value.)")


LEGEND = {
    "never written": "\"never written\": before your code runs, the grader fills every output with a NaN that carries "
                     "a marker (the poison); an element that still holds it afterwards was not written by your code",
    "never written?": "\"never written?\": the element is NaN and the grader cannot tell the poison from a NaN your code "
                      "computed (integer or half-precision outputs)",
    "shortcut": "",
    "edge values": "\"edge values\": a case whose inputs hold zeros, -0.0, +-inf, NaN and huge or tiny numbers",
    "seed": "\"seed\": the inputs are random; passing seed= to the check reproduces them",
    "rtol": "\"allowed: |err| <= atol + rtol*|expected|\": the tolerance of this check",
    "race": "\"race\" (RAW/WAR/WAW): two threads of one block touched the same shared element between two barriers, "
            "one of them writing (read-after-write, write-after-read, write-after-write)",
    "did not finish": "\"did not finish\": the time limit of one check (the whole question stops there)",
    "died": "\"died\" (SIGSEGV, SIGKILL, SIGABRT, ...): the process running your code ended by a signal; the name says "
            "which",
    "not your fault": "\"not your fault\": the grader itself failed (status error); tell your instructor",
    "tid": "\"tid=[x, y, z] ctaid=[x, y, z]\": the simulator's name for the thread that raised: tid is its "
           "cuda.threadIdx, ctaid its cuda.blockIdx",
    "decoy": "\"decoy inputs\": two other random draws of the inputs (same shapes) on which the grader calls your "
             "launcher to record what it launches; your kernels then run on the real inputs, launched by the grader",
    "ptx": "\"PTX (sm_90)\": the grader compiles your kernel for the H100 GPU (compute capability 9.0) with the "
           "argument types it ran with; the simulator alone accepts code a GPU cannot compile",
    "host": "\"written on the host\": the launcher (Python on the CPU), not a thread of your kernel, stored that "
            "element: a copy_to_device, `out[...] = ...` or NumPy on the data",
}


def legend_lines(text: str) -> list[str]:
    """One line per code or marker that appears in ``text``: what it means (issue 28: every code explained)."""
    keys = {"never written": "<- never written (still", "never written?": "never written?",
            "edge values": "edge values: FAILED", "rtol": "allowed: |err|", "race": "race (",
            "did not finish": "did not finish within", "died": "process running your code died",
            "not your fault": "not your fault", "tid": "ctaid=", "decoy": "decoy input", "ptx": "sm_90",
            "host": "written on the host"}
    return [LEGEND[k] for k, needle in keys.items() if needle in text and LEGEND.get(k)]


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
    if t in ("ModuleNotFoundError", "ImportError") and "kernels_src" in msg:
        return ["the process that runs your code has only kernels_src.device and kernels_src.compiler (cuda, "
                "ceil_div, the scalar types): the course's references, kernels and helpers are not there to call"]
    if t == "PermissionError":
        return ["your code ran in a sandbox that may read only Python's libraries and write only its own "
                "directory: the course's files, measurements and other submissions are out of reach"]
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
        self.weak: list = []  # protections the sandbox lacked (confine.weaknesses), shared by a batch's reporters

    def __call__(self, passed: bool, lines: list, status: str = "fail") -> Verdict:
        n = self.n_cases
        head = f"{self.spec.title}: {'ok' if passed else 'FAILED'} ({n} case{'s' if n != 1 else ''}, seed {self.seed})"
        body = [head] + ["  " + ln for ln in lines]
        if not passed:
            legend = legend_lines("\n".join(body))
            if legend:
                body += ["  what the report's words mean:"] + ["    " + ln for ln in legend]
            body += ["  note: " + n for n in self.bundle.notes]
            body += ["  note: " + n for n in self.load_notes]
            body += ["  note: your code " + f for f in self.flags]
        return Verdict(self.spec.key, self.spec.title, passed, "\n".join(body), self.seed,
                       time.perf_counter() - self.t0, "ok" if passed else status, self.flags,
                       sandbox=sorted(set(self.weak)))


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
    unwritten = parity.is_poison(got, avoid=ref) if got.shape == ref.shape else np.zeros(ref.shape, bool)
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


def _ptx_step(spec, bundle, ptx_items, t0, pack=None) -> tuple[str, list]:
    """Compile the launched kernels to sm_90 PTX: ("ok" | "fail" | "error", lines)."""
    from ..ptx import unavailable

    if unavailable():  # numba's built-in numba.cuda (macOS, no numba-cuda): it simulates, it cannot compile
        return "ok", [f"not compiled to PTX on this machine: {unavailable()}; the autograder (Linux, numba-cuda) "
                      "makes this check"]
    remaining = max(10.0, (spec.timeout or sandbox.DEFAULT_TIMEOUT) - (time.perf_counter() - t0))
    results = _ptx_results(bundle, list(ptx_items.values()), remaining, pack)
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


# ------------------------------------------------------------------------------ decoys and the launch plan
def _decoy_cases(spec: CheckSpec, op, cases, seed: int) -> list:
    """Two other draws of every case's inputs (same shapes, other values; the scalars are the real ones): the
    plan run calls the launcher on these, never on the inputs that are graded."""
    out = []
    for s in (1, 2):
        rng = np.random.default_rng([seed, 7919 * s])
        dtype = np.dtype(spec.dtype)
        drawn = []
        for label, size, inputs, refs in cases:
            if label.endswith(", edge values"):
                other = parity.as_tuple(exercise_ops.find_edge_inputs(op)(size, dtype, rng))
            else:
                other = parity.as_tuple(op.make_inputs(size, dtype, rng))
            mixed = []
            for real, dec in zip(inputs, other):
                if not isinstance(real, np.ndarray) or real.ndim == 0:
                    mixed.append(real)  # scalars are the real ones (host math on them is allowed)
                elif isinstance(dec, np.ndarray) and dec.shape == real.shape and dec.dtype == real.dtype:
                    mixed.append(dec)
                elif real.dtype.kind == "f":  # a draw of another shape: fresh values of the real shape
                    mixed.append(rng.standard_normal(real.shape).astype(real.dtype))
                else:  # integers (indices, codes): the same values, shuffled
                    mixed.append(rng.permutation(real.reshape(-1)).reshape(real.shape))
            drawn.append(mixed)
        out.append(drawn)
    return out


def _decoy_arrays(job: dict, arrays: dict, decoys: list) -> dict:
    files = {}
    for s, drawn in enumerate(decoys):
        for ci, jc in enumerate(job["cases"]):
            for k, key in enumerate(jc["inputs"]):
                files[f"d{s}_{key}"] = np.asarray(drawn[ci][k])
            for key in jc["outputs"]:
                files[f"d{s}_{key}"] = arrays[key]
    return files


def _same_array(store: dict, k0: str, k1: str) -> bool:
    a, b = store.get(k0), store.get(k1)
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8) if a.dtype.itemsize == 1 else
                                                                         a, b, equal_nan=a.dtype.kind == "f")


def _writes_differ(w0: list, w1: list, store) -> list:
    """The (role, k) of host writes that are not the same in both decoy runs."""
    d0 = {(w["role"], w["k"]): w["key"] for w in w0 or []}
    d1 = {(w["role"], w["k"]): w["key"] for w in w1 or []}
    bad = []
    for rk in sorted(set(d0) | set(d1)):
        if rk not in d0 or rk not in d1 or not (_same_array(store, d0[rk] + "_idx", d1[rk] + "_idx")
                                                 and _same_array(store, d0[rk] + "_val", d1[rk] + "_val")):
            bad.append(rk)
    return bad


def _arg_name(spec, role, k, n_outputs) -> str:
    i = k if role == "out" else n_outputs + k
    return f"`{spec.args[i]}`" if len(spec.args) > i else (f"output #{k + 1}" if role == "out" else f"input #{k + 1}")


def _plan_problems(spec: CheckSpec, pair: list, store: dict, n_outputs: int, written: dict) -> list:
    """What the launcher did on the decoy inputs that the grader does not accept."""
    p0, p1 = pair
    fname = f"`{spec.function}`"
    if p0.get("error"):
        err = p0["error"]
        return _error_problems(err, spec)
    problems = []
    mine = [la for la in p0["launches"] if la["module"] == "submission"]
    foreign = sorted({f"{la['module']}.{la['kernel']}" for la in p0["launches"] if la["module"] != "submission"})
    if foreign:
        problems.append("launches the course's own kernel(s) " + ", ".join(foreign) + ": this scores 0; "
                        "launch the kernel you wrote")
    for k in spec.kernels:
        if not any(la["kernel"] == k for la in mine):
            problems.append(f"{fname} never launched `{k}`: the launcher must launch your kernel "
                            f"(`{k}[blocks, threads](...)`)")
    for la in mine:
        if int(np.prod(la["block"] or [1])) > 1024:
            problems.append(f"`{la['kernel']}` was launched with {int(np.prod(la['block']))} threads per block; "
                            "a GPU allows at most 1024")
        for i, a in enumerate(la["args"]):
            if a["kind"] == "unsupported":
                problems.append(f"`{la['kernel']}` gets argument {i + 1} of type {a['type']}: a kernel takes arrays "
                                "and numbers")
    l0, l1 = p0["launches"], p1["launches"]
    same_shape = len(l0) == len(l1) and all(
        (a["kernel"], a["grid"], a["block"], a.get("dynshared"), [x["kind"] for x in a["args"]])
        == (b["kernel"], b["grid"], b["block"], b.get("dynshared"), [x["kind"] for x in b["args"]]) for a, b in zip(l0, l1))
    if not same_shape:
        problems.append(f"{fname} launched different kernels or grids for two inputs of the same shape: the launch "
                        "may depend on the sizes only, never on the values in the arrays")
        return problems
    for li, (a, b) in enumerate(zip(l0, l1)):
        for i, (x, y) in enumerate(zip(a["args"], b["args"])):
            if x["kind"] == "scalar" and x["value"] != y["value"] and not (x["value"] != x["value"]):
                problems.append(f"{fname} passes `{a['kernel']}` a number computed on the host from the input "
                                f"values (argument {i + 1}): only your kernels may compute from the inputs")
            elif x["kind"] == "made" and not _same_array(store, x["key"], y["key"]):
                problems.append(f"{fname} passes `{a['kernel']}` an array filled on the host with values computed "
                                f"from the inputs (argument {i + 1}): only your kernels may compute from the "
                                "inputs. The grader runs your kernels itself, on inputs the launcher never sees.")
        for role, k in _writes_differ(a.get("host_writes"), b.get("host_writes"), store):
            problems.append(_host_data_message(spec, role, k, n_outputs, store, a.get("host_writes")))
    for role, k in _writes_differ(p0.get("end_writes"), p1.get("end_writes"), store):
        problems.append(_host_data_message(spec, role, k, n_outputs, store, p0.get("end_writes")))
    for w in (p0.get("end_writes") or []) + [w for la in l0 for w in la.get("host_writes") or []]:
        if w["role"] == "in":
            problems.append(f"input {_arg_name(spec, 'in', w['k'], n_outputs)} was modified on the host by "
                            f"{fname}: inputs are read-only")
        else:
            written.setdefault(w["k"], 0)
    return sorted(set(problems), key=problems.index)


def _host_data_message(spec, role, k, n_outputs, store, writes) -> str:
    name = _arg_name(spec, role, k, n_outputs)
    n = 0
    for w in writes or []:
        if (w["role"], w["k"]) == (role, k):
            n = int(store.get(w["key"] + "_idx", np.zeros(0)).size)
    ks = " or ".join(f"`{x}`" for x in spec.kernels) or "your kernel"
    if role == "in":
        return f"input {name} was modified on the host by `{spec.function}`: inputs are read-only"
    return (f"{name}: the output was written on the host ({n} element(s), with values computed from the inputs). "
            f"Every element of the output must be stored by a thread of {ks}; the launcher only allocates, "
            "computes the grid and launches (no copy_to_device, `out[...] = ...` or NumPy on the data).")


def _launched_kernels(payload) -> set:
    return {la["kernel"] for pair in payload.get("plans") or [] for la in pair[0]["launches"]
            if la["module"] == "submission"}


def run_check(spec: CheckSpec, bundle: Bundle, seed: int | None = None) -> Verdict:
    """Grade one check. Never raises for anything the student did; GraderError for an author's mistake."""
    return run_checks([spec], bundle, seed)[0]


def batch_key(spec: CheckSpec) -> tuple:
    """Checks with the same key grade the same code the same way and run in one plan run and one exec run."""
    return (spec.kind, spec.function, spec.kernels, spec.dtype, spec.allow, spec.forbid, spec.args, spec.racecheck,
            spec.timeout)


def run_checks(specs: list, bundle: Bundle, seed: int | None = None) -> list:
    """Grade checks of one batch (same :func:`batch_key`): one verdict each, in order.

    The steps: draw each check's cases from the seed; the *plan* run loads the notebook and checks its kind,
    stubs, signature and source, and for a GPU answer calls the launcher on two decoy draws of the inputs,
    recording what it launches; this process checks the functions to grade (:mod:`.kernelpack`); the *exec*
    run rebuilds them from their text and runs them on the real inputs (a GPU answer: the recorded launches,
    replayed by the grader); judge each case (errors, launches, races, outputs, inputs); for GPU answers,
    compile the kernels to PTX."""
    from . import kernelpack

    t0 = time.perf_counter()
    seed = _draw_seed(seed)
    spec = specs[0]
    assert all(batch_key(s) == batch_key(spec) for s in specs), "run_checks: checks of different batches"
    ops, all_cases, owner = [], [], []
    for si, s in enumerate(specs):
        op = exercise_ops.find_op(s.op)
        cs = build_cases(s, op, seed)
        ops.append(op)
        all_cases += cs
        owner += [si] * len(cs)
    flags = suspicious_flags(bundle)
    reporters = [_Reporter(s, bundle, owner.count(si), seed, flags, t0) for si, s in enumerate(specs)]
    weak: list = []
    for r in reporters:
        r.weak = weak

    def boxed(*a, **k):
        """sandbox.run, noting what the sandbox lacked on this machine (the report says so)."""
        from .confine import weaknesses

        res = sandbox.run(*a, **k)
        if res.confined is not None or not sandbox.CONFINE:
            weak.extend(weaknesses(res.confined))
        return res

    def everyone(passed, lines, status="fail", timed_out=False):
        out = []
        for r in reporters:
            v = r(passed, lines, status)
            v.timed_out = timed_out
            out.append(v)
        return out

    job, arrays = _make_job(spec, bundle, all_cases)

    # 1. the plan run: the notebook's code, decoy inputs only
    files = {}
    if spec.kind == "gpu":
        decoys = [[], []]
        for si, s in enumerate(specs):
            mine = [c for c, o in zip(all_cases, owner) if o == si]
            d = _decoy_cases(s, ops[si], mine, seed + 104729 * si)
            decoys[0] += d[0]
            decoys[1] += d[1]
        files = {"decoys.npz": _decoy_arrays(job, arrays, decoys)}
    res = boxed(dict(job, mode="plan"), bundle.source, files=files, device_mode="sim", timeout=spec.timeout)
    lines = _sandbox_failure(res)
    if lines is not None:
        return everyone(False, lines, timed_out=res.status == "timeout")
    payload = res.payload
    if payload.get("load_errors") and payload.get("status") != "missing":
        from .planrun import load_error_lines

        for r in reporters:
            r.load_notes += load_error_lines(payload["load_errors"])
    if res.status == "error" and payload.get("traceback"):
        return everyone(False, ["the grader failed while running your code (not your fault; tell your instructor):",
                                payload.get("message", "")], status="error")
    if payload.get("status", "ok") != "ok":
        lines = payload.get("message", "").splitlines()
        err = payload.get("load_error")
        if err:
            lines += ["  hint: " + h for h in hints_for_error(err, spec)]
        return everyone(False, lines)
    n_outputs = job["n_outputs"]
    store = res.outputs
    plans = payload.get("plans") or []
    plan_failed = [[] for _ in specs]
    if spec.kind == "gpu":
        if len(plans) != len(all_cases):
            return everyone(False, ["the grader received no launch plan from your launcher"])
        written: dict = {}
        for case, pair, si in zip(all_cases, plans, owner):
            problems = _plan_problems(specs[si], pair, store, n_outputs, written)
            if problems:
                plan_failed[si].append((case[0], problems))
        if all(plan_failed):
            return [r(False, _failure_lines(f, [])) for r, f in zip(reporters, plan_failed)]

    # 2. the functions to grade, checked against the notebook's text
    roots = {spec.function: "cpu"} if spec.kind == "cpu" else \
        {k: "gpu" for k in sorted(set(spec.kernels) | _launched_kernels(payload))}
    problems, pack = kernelpack.validate(bundle.source, payload.get("described") or {}, roots,
                                         allow=tuple(spec.allow), line_of=lambda ln: _bundle_where(bundle, ln))
    if problems:
        return everyone(False, problems + ["a graded function is rebuilt from its own text and run by the grader "
                                           "on the hidden inputs: it may use its arguments, numbers, math/NumPy "
                                           "functions and your other kernels, device and @njit functions"])

    # 3. the exec run: the functions rebuilt from their text, the real inputs sent once they are built
    keep = [ci for ci, si in enumerate(owner) if not plan_failed[si]]
    exec_job = {"mode": "exec", "backend": spec.kind, "function": spec.function,
                "cases": [job["cases"][ci] for ci in keep], "pack": pack,
                "plans": [plans[ci][0] for ci in keep] if plans else [], "racecheck": spec.racecheck,
                "allow": list(spec.allow), "line_map": bundle.line_map}
    plan_files = {}
    if spec.kind == "gpu":
        prefixes = tuple(f"c{ci}s0_" for ci in keep)
        plan_files = {"plan.npz": {k: v for k, v in store.items() if k.startswith(prefixes)}}
    wanted = {key for ci in keep for key in job["cases"][ci]["inputs"] + job["cases"][ci]["outputs"]}
    res = boxed(exec_job, bundle.source, files=plan_files, stream={k: v for k, v in arrays.items() if k in wanted},
                      device_mode="sim", timeout=spec.timeout)
    lines = _sandbox_failure(res)
    verdicts: list = [None] * len(specs)
    for si, f in enumerate(plan_failed):
        if f:
            verdicts[si] = reporters[si](False, _failure_lines(f, []))
    if lines is not None:
        return [v or r(False, lines) for v, r in zip(verdicts, reporters)] if res.status != "timeout" else \
            [v or _timed_out(r, lines) for v, r in zip(verdicts, reporters)]
    payload = res.payload
    if res.status == "error" and payload.get("traceback"):
        return [v or r(False, ["the grader failed while running your code (not your fault; tell your instructor):",
                               payload.get("message", "")], status="error") for v, r in zip(verdicts, reporters)]

    recs = dict(zip(keep, payload.get("cases", [])))
    ptx_items: dict = {}
    results: list = [[[], [], {}] for _ in specs]  # passed labels, failures, ptx items
    for ci, (case, si) in enumerate(zip(all_cases, owner)):
        if ci not in recs:
            continue
        s, op = specs[si], ops[si]
        names = op.output_names if len(op.output_names) == n_outputs else [f"out{i}" for i in range(n_outputs)]
        problems = _case_problems(s, op, case, recs[ci], job["cases"][ci], res.outputs, names, results[si][2])
        if problems:
            results[si][1].append((case[0], problems))
        else:
            results[si][0].append(case[0])
    for si, s in enumerate(specs):
        if verdicts[si] is not None:
            continue
        passed_labels, failures, items = results[si]
        if failures:
            verdicts[si] = reporters[si](False, _failure_lines(failures, passed_labels))
            continue
        lines = ["matches the float64 reference on " + "; ".join(passed_labels)]
        if s.kind == "gpu":
            lines.append("your kernels were run by the grader on inputs your launcher never saw")
            if s.racecheck:
                lines.append("no shared-memory race, every barrier reached by every thread")
            if items:  # always: the simulator runs kernels as Python; the compiler judges what they are
                status, more = _ptx_step(s, bundle, items, t0, pack)
                if status == "error":
                    verdicts[si] = reporters[si](False, more, status="error")
                    continue
                if status == "fail":
                    verdicts[si] = reporters[si](False, lines + more)
                    continue
                lines += more
        else:
            lines.append("compiled by Numba in nopython mode, with no object mode and no NumPy product or reduction")
        verdicts[si] = reporters[si](True, lines)
    return verdicts


def _timed_out(reporter, lines):
    v = reporter(False, lines)
    v.timed_out = True
    return v


def _bundle_where(bundle: Bundle, line: int) -> str:
    where = bundle.where(line)
    text = bundle.line_text(line)
    return f"{where}: `{text}`" if where and text else (where or f"line {line}")
