"""numba-cuda and its successor numba-cuda-mlir, side by side on one GPU (the compiler door's evidence).

    python -m kernels_src.tools.compilers measure --out FILE     everything below, with the compiler this process
                                                                 uses (KERNELS_COMPILER=numba-cuda|mlir)
    python -m kernels_src.tools.compilers compare A.json B.json --out FILE   the two files as one, with ratios

``measure`` records, for the compiler in use:
- ``checks``: ``kernels check --backend gpu`` over every registered GPU variant, pass/fail/skip per op and the
  first line of each failing variant's error;
- ``launch_us``: the host cost of one launch from Python, by number of array arguments (1024-element kernels,
  median of 200 launches, the GPU drained before each burst);
- ``rungs``: the time of each chapter's best GPU rung (the fastest non-baseline variant at the largest size of
  the committed H100 benchmark, ``book/data/bench/h100/<op>_gpu.json``), through ``bench.bench`` (CUDA events,
  L2 flushed, median of 20).

Run both compilers in one session on the same GPU, then ``compare``: ratios of the successor's time to
numba-cuda's are medians taken on the same machine.

``ptxmix`` compiles a few best rungs to PTX under both compilers (no GPU) and counts their instruction mix. The
GEMV rung's Nsight Compute counters (``book/data/bench/h100/compilers_gemv_ncu.json``) were taken with
``ncu --csv --metrics ... -k regex:splitk_grid --launch-skip 3 --launch-count 1 --clock-control none python -m
kernels_src.tools.compilers child rung '{"op": "gemv", "variant": "splitk_grid", "size": [16384, 16384]}'``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from .. import compiler, device
from ..paths import BENCH_DATA

H100_BENCH = BENCH_DATA / "h100"
# One op per chapter whose best rung is timed (chapter: op).
CHAPTER_OPS = {1: "copy", 4: "gemv", 5: "gemm", 6: "gelu", 7: "layernorm", 8: "softmax", 9: "attention",
               10: "decode_attention", 11: "qgemv_q8_0", 12: "adamw"}


def best_rungs() -> list[dict]:
    """(chapter, op, variant, size) of each chapter's fastest committed non-baseline GPU rung."""
    out = []
    for ch, op in CHAPTER_OPS.items():
        path = H100_BENCH / f"{op}_gpu.json"
        if not path.exists():
            continue
        rows = [r for r in json.loads(path.read_text())["rows"] if "median_s" in r and not r.get("baseline")]
        if not rows:
            continue
        biggest = max(rows, key=lambda r: np.prod(r["size"]))["size"]
        best = min((r for r in rows if r["size"] == biggest), key=lambda r: r["median_s"])
        out.append({"chapter": ch, "op": op, "variant": best["variant"], "size": biggest,
                    "committed_median_s": best["median_s"]})
    return out


def _checks(save=None) -> dict:
    """Per op: GPU checks passed/failed/skipped and each failing variant's first error. ``save(per_op)`` is
    called after every op, so a run cut short keeps what it measured."""
    from ..parity import check
    from .. import ops as _all_ops  # noqa: F401  (registers every op)
    from ..registry import ops

    per_op: dict = {}
    for op in ops():
        if not any(v.backend == "gpu" for v in op.variants):
            continue
        try:
            reports = check(op.name, "gpu", progress=False)
        except Exception as e:  # noqa: BLE001  (an op whose module cannot even be checked: all of it failed)
            per_op[op.name] = {"passed": 0, "failed": 1, "skipped": 0,
                               "failures": {op.name: f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}}
            reports = []
        _count(per_op, reports)
        if save is not None:
            save(per_op)
    return per_op


def _count(per_op: dict, reports) -> None:
    for r in reports:
        op = r.label.split("/")[0]
        e = per_op.setdefault(op, {"passed": 0, "failed": 0, "skipped": 0, "failures": {}})
        if r.skipped:
            e["skipped"] += 1
        elif r.ok:
            e["passed"] += 1
        else:
            e["failed"] += 1
            key = r.label
            if key not in e["failures"]:
                e["failures"][key] = " ".join(str(r).split())[:300]


def _child_json(args: list[str], timeout: float) -> tuple[dict | None, str]:
    """Run ``python -m kernels_src.tools.compilers ARGS`` (same compiler, same environment); return its JSON
    (the last stdout line) or None and the reason: a kernel that corrupts the GPU context (an illegal address
    is sticky for the whole process) then costs only its own op, not every op after it."""
    import subprocess

    try:
        p = subprocess.run([sys.executable, "-m", "kernels_src.tools.compilers", *args], capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    lines = p.stdout.strip().splitlines()
    if p.returncode == 0 and lines:
        try:
            return json.loads(lines[-1]), ""
        except ValueError:
            pass
    tail = [ln for ln in p.stderr.strip().splitlines() if ln.strip()][-1:] or [f"exit {p.returncode}"]
    return None, f"process failed (exit {p.returncode}): {tail[0][:250]}"


def _isolated_checks(jobs: int, save=None, timeout: float = 240) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    from .. import ops as _all_ops  # noqa: F401
    from ..registry import ops

    names = [op.name for op in ops() if any(v.backend == "gpu" for v in op.variants)]
    per_op: dict = {}

    def one(name):
        res, why = _child_json(["child", "checks", name], timeout)
        return name, (res or {}).get(name) if res is not None else {
            "passed": 0, "failed": 1, "skipped": 0, "failures": {name: why}}

    with ThreadPoolExecutor(jobs) as ex:
        for name, entry in ex.map(one, names):
            per_op[name] = entry or {"passed": 0, "failed": 0, "skipped": 0, "failures": {}}
            if save is not None:
                save(per_op)
    return per_op


def _one_rung(rung: dict) -> dict:
    from ..bench import bench

    row = dict(rung)
    try:
        res = bench(rung["op"], "gpu", variants=[rung["variant"]], sizes=[tuple(rung["size"])], progress=False,
                    include_peaks=False)
        r = res["rows"][0]
        row.update(median_s=r.get("median_s"), skipped=r.get("skipped"))
    except Exception as e:  # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    return row


def _launch_cost(n_arrays: int, launches: int = 200) -> float:
    cuda = compiler.cuda
    args = ", ".join(f"a{k}" for k in range(n_arrays))
    body = f"def k({args}):\n    i = cuda.grid(1)\n    if i < a0.size:\n        a0[i] += 1.0\n"
    ns: dict = {"cuda": cuda}
    exec(body, ns)  # a kernel with n_arrays array parameters (only the first is touched)
    kern = cuda.jit(ns["k"])
    arrays = [cuda.to_device(np.zeros(1024, np.float32)) for _ in range(n_arrays)]
    kern[4, 256](*arrays)
    cuda.synchronize()
    per = []
    for _ in range(5):
        cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(launches // 5):
            kern[4, 256](*arrays)
        per.append((time.perf_counter() - t0) / (launches // 5) * 1e6)
        cuda.synchronize()
    return statistics.median(per)


PARTS = ("launch", "rungs", "checks")


def measure(parts=PARTS, save=None, isolate: int = 0) -> dict:
    """``isolate=N``: each op's checks and each rung in its own process, N at a time."""
    from ..bench import environment

    out = {"compiler": compiler.NAME, "version": compiler.version(), "environment": environment(),
           "launch_us": {}, "rungs": [], "checks": {}, "parts": list(parts)}
    for n in ((1, 2, 4, 8) if "launch" in parts else ()):
        try:
            out["launch_us"][str(n)] = _launch_cost(n)
        except Exception as e:  # noqa: BLE001  (a compiler that cannot launch it is the finding)
            out["launch_us"][str(n)] = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    for rung in (best_rungs() if "rungs" in parts else ()):
        if isolate:
            res, why = _child_json(["child", "rung", json.dumps(rung)], 200)
            row = res if res is not None else dict(rung, error=why)
        else:
            row = _one_rung(rung)
        out["rungs"].append(row)
        print(f"  {row['op']}/{row['variant']} {row['size']}: {row.get('median_s') or row.get('error')}", flush=True)
    t0 = time.perf_counter()
    try:
        if "checks" in parts:
            def partial(per_op):
                out["checks"] = per_op
                out["checks_s"] = time.perf_counter() - t0
                if save is not None:
                    save(out)

            out["checks"] = _isolated_checks(isolate, partial) if isolate else _checks(partial)
    except Exception:  # noqa: BLE001
        out["checks_error"] = traceback.format_exc()[-2000:]
    out["checks_s"] = time.perf_counter() - t0
    return out


MIX_VARIANTS = ("softmax/gpu/vec4", "layernorm/gpu/vec4", "gemv/gpu/splitk_grid", "attention/gpu/flash_causal",
                "gelu/gpu/vec4", "copy/gpu/stride_v4")


def ptx_mix(keys=MIX_VARIANTS) -> dict:
    """The instruction mix of each kernel's PTX for sm_90 under this process's compiler (no GPU needed):
    instructions, integer divisions/remainders, 16-byte loads, 4-byte loads, fused multiply-adds."""
    import re

    from .. import ops as _all_ops  # noqa: F401
    from .. import ptx
    from ..registry import get_variant

    out = {}
    for key in keys:
        for kern, sig in get_variant(key).ptx:
            lines = [ln.strip() for ln in ptx.compile_one(kern, sig).splitlines()]
            ins = [ln for ln in lines if ln and not ln.startswith(("//", ".", "{", "}", "$", ")", "("))]
            out[f"{key}:{ptx.py_func(kern).__name__}"] = {
                "instructions": len(ins),
                "int_div_rem": sum(1 for ln in ins if re.match(r"(div|rem)\.(s|u)(32|64)", ln)),
                "v4_loads": sum(1 for ln in ins if re.match(r"ld\.(global|shared)\S*\.v4", ln)),
                "scalar_loads": sum(1 for ln in ins if re.match(r"ld\.(global|shared)\S*\.(f32|u32|s32|b32)\b", ln)),
                "fma": sum(1 for ln in ins if ln.startswith("fma.")),
                "approx": sum(1 for ln in ins if ".approx" in ln)}
    return out


def compare(a: dict, b: dict) -> dict:
    """One file from two ``measure`` results (``a`` numba-cuda, ``b`` numba-cuda-mlir)."""
    def totals(m):
        c = m.get("checks", {})
        return {k: sum(e[k] for e in c.values()) for k in ("passed", "failed", "skipped")}

    ops = sorted(set(a.get("checks", {})) | set(b.get("checks", {})))
    rungs = []
    for ra in a["rungs"]:
        rb = next((r for r in b["rungs"] if r["op"] == ra["op"] and r["variant"] == ra["variant"]), {})
        ta, tb = ra.get("median_s"), rb.get("median_s")
        rungs.append({"chapter": ra["chapter"], "op": ra["op"], "variant": ra["variant"], "size": ra["size"],
                      "numba_cuda_s": ta, "mlir_s": tb, "mlir_error": rb.get("error"),
                      "ratio_mlir_over_numba_cuda": (tb / ta) if ta and tb else None})
    ratios = [r["ratio_mlir_over_numba_cuda"] for r in rungs if r["ratio_mlir_over_numba_cuda"]]
    return {
        "what": "numba-cuda vs numba-cuda-mlir on one GPU: kernels check --backend gpu, launch cost, best rungs",
        "numba_cuda": {"version": a["version"], "totals": totals(a), "launch_us": a["launch_us"],
                       "environment": a["environment"]},
        "mlir": {"version": b["version"], "totals": totals(b), "launch_us": b["launch_us"],
                 "environment": b["environment"]},
        "checks_per_op": {op: {"numba_cuda": a.get("checks", {}).get(op), "mlir": b.get("checks", {}).get(op)}
                          for op in ops},
        "rungs": rungs,
        "median_ratio_mlir_over_numba_cuda": statistics.median(ratios) if ratios else None,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernels_src.tools.compilers", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="checks, launch cost and best rungs with this process's compiler")
    m.add_argument("--out", required=True)
    m.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    m.add_argument("--isolate", type=int, default=0, metavar="N",
                   help="run each op's checks and each rung in its own process, N at a time")
    x = sub.add_parser("ptxmix", help="PTX instruction mix of a few best rungs under both compilers (no GPU)")
    x.add_argument("--out", required=True)
    ch = sub.add_parser("child", help=argparse.SUPPRESS)
    ch.add_argument("what", choices=["checks", "rung", "ptxmix"])
    ch.add_argument("arg")
    c = sub.add_parser("compare", help="merge a numba-cuda and a numba-cuda-mlir measurement")
    c.add_argument("numba_cuda_json")
    c.add_argument("mlir_json")
    c.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.cmd == "child":  # one op's checks or one rung, printed as one JSON line
        if args.what == "checks":
            per_op: dict = {}
            from ..parity import check

            _count(per_op, check(args.arg, "gpu", progress=False))
            print(json.dumps(per_op))
        elif args.what == "ptxmix":
            print(json.dumps({"compiler": compiler.NAME, "version": compiler.version(), "kernels": ptx_mix()}))
        else:
            print(json.dumps(_one_rung(json.loads(args.arg)), default=str))
        return 0
    if args.cmd == "ptxmix":
        import os

        res = {}
        for name in ("numba-cuda", "mlir"):
            os.environ.update(KERNELS_COMPILER=name, KERNELS_DEVICE="ptx", NUMBA_ENABLE_CUDASIM="0")
            got, why = _child_json(["child", "ptxmix", "-"], 900)
            if got is None:
                print(f"error: {name}: {why}", file=sys.stderr)
                return 1
            res[name] = got
        Path(args.out).write_text(json.dumps(res, indent=1))
        print(f"wrote {args.out}")
        return 0
    if args.cmd == "measure":
        if device.MODE != "gpu":
            print(f"error: measuring compilers needs a real GPU ({device.REASON})", file=sys.stderr)
            return 2
        out = Path(args.out)
        if not out.parent.is_dir():
            print(f"error: no directory {out.parent}", file=sys.stderr)
            return 2
        print(f"measuring {compiler.NAME} {compiler.version()} on {device.describe()['name']}", flush=True)
        parts = tuple(x.strip() for x in args.parts.split(",") if x.strip())
        unknown = set(parts) - set(PARTS)
        if unknown or not parts:
            print(f"error: --parts takes a subset of {','.join(PARTS)}, not {args.parts!r}", file=sys.stderr)
            return 2
        def save(result):
            out.write_text(json.dumps(result, indent=1, default=str))

        save(measure(parts, save, isolate=args.isolate))
        print(f"wrote {out}")
        return 0
    paths = [Path(args.numba_cuda_json), Path(args.mlir_json)]
    for q in paths:
        if not q.is_file():
            print(f"error: no file {q}", file=sys.stderr)
            return 2
    a, b = (json.loads(q.read_text()) for q in paths)
    Path(args.out).write_text(json.dumps(compare(a, b), indent=1, default=str))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
