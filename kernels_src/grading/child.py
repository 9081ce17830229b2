"""The sandboxed grading process: ``python -I <runtime>/boot.py job.json`` (see :mod:`.sandbox`), started in a fresh
directory holding ``submission.py`` (the student's code) and ``job.json``.

It confines itself first (:mod:`.confine`), before anything of the student's is read, applies its limits, and
runs the job's mode: ``plan`` (:mod:`.planrun`), ``exec`` and ``ptx`` (:mod:`.worker`), ``perf``
(:mod:`.perfworker`). It writes ``result.json`` and ``outputs.npz`` and exits with ``os._exit`` (so no student
thread or ``atexit`` hook runs after it). It never sees a reference output: the comparison happens in the parent.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

from .childio import SUBMISSION, Where, _exc_info, _finish, _progress
from .planrun import _load_cells, plan_job
from .worker import exec_job, ptx_job


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
