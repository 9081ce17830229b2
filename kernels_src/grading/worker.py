"""The exec run and the PTX run of a check: the graded functions rebuilt from their ``def`` text, where no other
statement of the student's notebook ever ran, and run or compiled by the grader.

  exec  rebuild the checked functions (:func:`kernelpack.build`), say "ready" on the pipe ``ready_fd``, read the
        graded inputs from stdin, and run: the recorded launches replayed on the grader's arrays under the race
        detector and the write record (GPU, :mod:`.replay`), or the compiled function after
        :func:`~.shortcuts.compiled_problems` (CPU).
  ptx   rebuild the kernels with the real numba.cuda (``KERNELS_DEVICE=ptx``) and compile each to PTX for
        sm_90 with the signatures observed in the exec run: the simulator does not check typing.

The process starts in :mod:`.child` (which confines it and picks the mode); the plan run is :mod:`.planrun`.
The names the speed worker (:mod:`.perfworker`) takes from here are re-exported below.
"""
from __future__ import annotations

import os
import sys
import time

from .childio import SUBMISSION, _exc_info, _progress, _student_line
from .replay import _replay, host_writes, launch_recorded, scalar_arg, write_flat
from .shortcuts import compiled_problems, precompile

__all__ = ["exec_job", "ptx_job", "_exc_info", "_progress", "_replay", "compiled_problems", "precompile",
           "host_writes", "launch_recorded", "scalar_arg", "write_flat"]


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
