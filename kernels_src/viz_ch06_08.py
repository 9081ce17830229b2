"""Figures for chapters 6-8 (activations and fusion, reductions and norms, softmax), and the benchmark
driver that produced their GPU data.

Figures are drawn from committed benchmark JSON (book/data/bench/) or computed on the spot in float64
(approximation errors, summation errors, the stability table), never by timing anything here.

Benchmark driver (run on the GPU machine; writes one JSON per op):

    python -m kernels_src.viz_ch06_08 bench --out DIR [--ops softmax,layernorm] [--explore]

It runs :func:`kernels_src.bench.bench` for every chapter 6-8 op in ONE process, so all of them share
the copy-bandwidth yardstick measured at the start, and it adds a ``torch_eager`` baseline row for
softmax, LayerNorm and RMSNorm: torch called as a user calls it (its own output allocation), timed with
the same CUDA-event harness. The registered ``torch`` variants of LayerNorm and RMSNorm write into our
buffers through an extra copy (torch has no out= for them), so they are left out of the timing.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

CH6 = ["relu", "relu_bwd", "gelu", "gelu_bwd", "gelu_tanh", "gelu_tanh_bwd", "silu", "silu_bwd", "swiglu",
       "swiglu_bwd", "bias_gelu"]
CH7 = ["reduce_sum", "reduce_max", "layernorm", "layernorm_bwd", "rmsnorm", "rmsnorm_bwd"]
CH8 = ["softmax", "softmax_bwd"]
ALL_OPS = CH6 + CH7 + CH8
EAGER = {"softmax": "softmax", "layernorm": "norms", "rmsnorm": "norms"}
TARGET_SIZE = (16384, 4096)


# ------------------------------------------------------------------------------- benchmark driver
def _eager_fn(op_name):
    from .ops import norms, softmax

    return {"softmax": softmax.eager_torch, "layernorm": norms.eager_layernorm,
            "rmsnorm": norms.eager_rmsnorm}[op_name]


def eager_rows(op, sizes, dtype="float32", repeat=20) -> list[dict]:
    """Time torch eager (allocating its output) on tensors made by the op's make_inputs."""
    import torch

    from .bench import _median, time_gpu

    fn = _eager_fn(op.name)
    out = []
    for size in sizes:
        rng = np.random.default_rng(1234)
        inputs = op.make_inputs(size, np.dtype(dtype), rng)
        targs = [torch.from_numpy(a).cuda() for a in inputs]
        times = time_gpu(lambda: fn(*targs), [()], repeat=repeat)
        t = _median(times)
        itemsize = np.dtype(dtype).itemsize
        flops, nbytes = op.flops(size), op.bytes(size, itemsize)
        out.append({"variant": "torch_eager", "rung": 0, "baseline": True,
                    "summary": f"torch {torch.__version__} eager, as a user calls it (allocates its output)",
                    "size": list(size), "size_label": op.size_label(size), "median_s": t,
                    "min_s": float(np.min(times)), "q1_s": float(np.percentile(times, 25)),
                    "q3_s": float(np.percentile(times, 75)), "repeats": len(times),
                    "gflops": flops / t / 1e9, "gbps": nbytes / t / 1e9, "flops": flops, "bytes": nbytes})
        del targs
        torch.cuda.empty_cache()
    return out


def bench_ops(ops, out_dir, backend="gpu", repeat=20, peaks=None, log=print) -> dict:
    """Benchmark ``ops`` in this process with one shared set of peaks; write <op>_<backend>.json."""
    from . import device
    from .bench import _add_fractions, bench, format_table, measure_peaks, save_json
    from .registry import get_op

    peaks = peaks if peaks is not None else measure_peaks(backend)
    results = {}
    for name in ops:
        op = get_op(name)
        names = [v.name for v in op.variants if v.backend == backend
                 and not (name in ("layernorm", "rmsnorm") and v.name == "torch")]
        t0 = time.time()
        res = bench(name, backend, variants=names, repeat=repeat, progress=False, include_peaks=False)
        res["peaks"] = dict(peaks)
        if backend == "gpu" and name in EAGER and device.MODE == "gpu":
            sizes = sorted({tuple(r["size"]) for r in res["rows"]})
            try:
                res["rows"] += eager_rows(op, sizes, repeat=repeat)
            except ImportError as e:
                log(f"no torch eager rows for {name}: {e}")
        _add_fractions(res)
        res["meta"]["command"] = "python -m kernels_src.viz_ch06_08 bench " + " ".join(sys.argv[2:])
        if out_dir:
            save_json(res, Path(out_dir) / f"{name}_{backend}.json")
        log(format_table(res) + f"\n  ({time.time() - t0:.1f} s)")
        results[name] = res
    return results


def explore(out_dir, log=print, size=TARGET_SIZE, repeat=20) -> list[dict]:
    """Block sizes (and, for the norms, blocks that loop over rows) for the register rungs, at one size.
    Inputs are prepared once per op; every configuration is timed by the same CUDA-event harness."""
    from .bench import _median, _prepare, time_gpu
    from .ops import norms, softmax
    from .registry import get_op, get_variant

    rows = []
    plan = {"softmax": (softmax, [(t, 0) for t in (256, 512, 1024)]),
            "layernorm": (norms, [(t, 0) for t in (256, 512, 1024)] + [(512, 2), (512, 4)]),
            "rmsnorm": (norms, [(t, 0) for t in (256, 512, 1024)] + [(512, 2), (512, 4)])}
    for name, (mod, configs) in plan.items():
        op = get_op(name)
        sets = _prepare(op, size, "float32", "gpu", 2)
        nbytes = op.bytes(size, 4)
        for threads, persist in configs:
            mod.THREADS = threads
            if hasattr(mod, "PERSIST"):
                mod.PERSIST = persist
            for variant in ("regs_shfl", "regs"):
                if variant == "regs" and (threads != 512 or persist):
                    continue
                row = {"op": name, "variant": variant, "threads": threads, "persist": persist}
                try:
                    t = _median(time_gpu(get_variant(f"{name}/gpu/{variant}").fn, sets, repeat=repeat))
                    row.update(median_s=t, gbps=nbytes / t / 1e9)
                except Exception as e:  # noqa: BLE001
                    row["error"] = repr(e)[:300]
                log(json.dumps(row))
                rows.append(row)
        mod.THREADS = None
        if hasattr(mod, "PERSIST"):
            mod.PERSIST = 0
        del sets
    if out_dir:
        Path(out_dir, "explore_gpu.json").write_text(json.dumps(rows, indent=1))
    return rows


def check_margins(ops, log=print) -> list[dict]:
    """Parity of every GPU variant over its check sizes, with the worst error as a fraction of the
    allowed tolerance (so tolerances can be set from measured headroom)."""
    from . import parity
    from .registry import get_op

    out = []
    for name in ops:
        op = get_op(name)
        for v in op.variants:
            if v.backend != "gpu":
                continue
            worst, ok_all, why = 0.0, True, ""
            for size in parity.default_check_sizes(op, "gpu"):
                rep = parity.check_variant(v, op, size)
                if rep.skipped:
                    why = rep.skipped
                    break
                if not rep.ok:
                    ok_all = False
                    log(str(rep))
                rng = np.random.default_rng(0)
                inputs = parity.as_tuple(op.make_inputs(size, np.dtype("float32"), rng))
                refs = parity.reference_outputs(op, inputs)
                try:
                    res = parity.run_variant(v, inputs, parity.empty_outputs(refs, "float32"))
                except Exception as e:  # noqa: BLE001
                    log(f"{v.key} {size}: {e!r}")
                    ok_all = False
                    continue
                rt, at = parity.resolve_tol(v.tol if v.tol is not None else op.tol, "float32", size)
                for g, r in zip(res, refs):
                    fin = np.isfinite(r)
                    if fin.any():
                        worst = max(worst, float(np.max(np.abs(g[fin] - r[fin]) / (at + rt * np.abs(r[fin])))))
            row = {"variant": v.key, "ok": ok_all and not why, "skipped": why, "worst_err_over_tol": worst}
            log(json.dumps(row))
            out.append(row)
    return out


def kernel_resources(log=print) -> list[dict]:
    """Registers and local memory per thread of the register-rung kernels at N = 4096 (real GPU)."""
    from .ops import norms, softmax

    sig_sm, sig_ln, sig_rms = softmax.SIG, norms.SIG_LN, norms.SIG_RMS
    items = []
    for t, e in ((256, 16), (512, 8), (1024, 4)):
        for sh in (True, False):
            items.append((f"softmax regs t={t} e={e} shfl={sh}", softmax.kernel("regs", t, e, sh), sig_sm))
            items.append((f"layernorm regs t={t} e={e} shfl={sh}", norms.kernel("ln_regs", t, e, sh, False), sig_ln))
            items.append((f"rmsnorm regs t={t} e={e} shfl={sh}", norms.kernel("rms_regs", t, e, sh, False), sig_rms))
    out = []
    for label, k, sig in items:
        try:
            k.compile(sig)
            row = {"kernel": label, "regs": str(k.get_regs_per_thread()),
                   "local_bytes": str(k.get_local_mem_per_thread())}
        except Exception as e:  # noqa: BLE001
            row = {"kernel": label, "error": repr(e)[:200]}
        log(json.dumps(row))
        out.append(row)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernels_src.viz_ch06_08")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="benchmark the chapter 6-8 ops in one process")
    b.add_argument("--out", required=True)
    b.add_argument("--ops", default=",".join(ALL_OPS))
    b.add_argument("--backend", default="gpu", choices=["cpu", "gpu"])
    b.add_argument("--repeat", type=int, default=20)
    b.add_argument("--explore", action="store_true", help="also try block sizes of the register rungs")
    b.add_argument("--margins", action="store_true", help="also check every GPU variant, with error margins")
    b.add_argument("--resources", action="store_true", help="also report registers per thread")
    args = p.parse_args(argv)
    from . import device
    from .bench import measure_peaks

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    log_lines = []

    def log(s):
        print(s, flush=True)
        log_lines.append(s)

    log(f"device: {device.describe()}")
    ops = [o for o in args.ops.split(",") if o]
    try:
        if args.margins:
            m = check_margins(ops, log)
            (out / "margins_gpu.json").write_text(json.dumps(m, indent=1))
            log(f"[margins done at {time.time() - t0:.0f} s]")
        if args.resources:
            (out / "resources_gpu.json").write_text(json.dumps(kernel_resources(log), indent=1))
            log(f"[resources done at {time.time() - t0:.0f} s]")
        peaks = measure_peaks(args.backend)
        log(f"peaks: {peaks}")
        if args.explore:
            explore(out, log)
            log(f"[explore done at {time.time() - t0:.0f} s]")
        bench_ops(ops, out, args.backend, args.repeat, peaks, log)
        log(f"[bench done at {time.time() - t0:.0f} s]")
    finally:
        (out / f"log_{args.backend}.txt").write_text("\n".join(log_lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
