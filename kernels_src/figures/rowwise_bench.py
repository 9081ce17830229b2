"""Figures for chapters 6-8 (activations and fusion, reductions and norms, softmax), and the benchmark
driver that produced their GPU data.

Figures are drawn from committed benchmark JSON (book/data/bench/) or computed on the spot in float64
(approximation errors, summation errors, the stability table), never by timing anything here.

Benchmark driver (run on the GPU machine; writes one JSON per op):

    python -m kernels_src.figures.rowwise bench --out DIR [--ops softmax,layernorm] [--explore] [--explore-vec4]
    python -m kernels_src.figures.rowwise profile --out DIR [--plan "softmax@16384x4096:naive,vec4;..."]

It runs :func:`kernels_src.bench.bench` for every chapter 6-8 op in ONE process, so all of them share
the copy-bandwidth yardstick measured at the start, and it adds a ``torch_eager`` baseline row for
softmax, LayerNorm and RMSNorm (and ``torch_compile``, torch.compile of the same call), and a
``torch_eager`` row for the softmax backward, the exact GELU and its backward, bias + GELU, and the LayerNorm
and RMSNorm backward (``torch.autograd.grad`` through ``F.layer_norm``/``F.rms_norm``): torch called
as a user calls it (its own output allocation), timed with the same CUDA-event harness.

``profile`` runs ONE process under Nsight Compute for a whole plan of (op, size, variants), with a marker
kernel launched between variants so that each kernel is attributed to its variant; it writes one
``<op>_ncu.json`` per op in the format of ``kernels_src.tools.profile`` (so ``profile.table`` reads it). The registered ``torch`` variants of LayerNorm and RMSNorm write into our
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
EAGER = {"softmax": "softmax", "layernorm": "norms", "rmsnorm": "norms", "softmax_bwd": "softmax",
         "gelu": "activations", "gelu_bwd": "activations", "bias_gelu": "activations",
         "layernorm_bwd": "norms", "rmsnorm_bwd": "norms"}
COMPILED = ("softmax", "layernorm", "rmsnorm")  # ops that also get a torch.compile row
TARGET_SIZE = (16384, 4096)


# ------------------------------------------------------------------------------- benchmark driver
def _eager_gelu(x):
    import torch

    return torch.nn.functional.gelu(x)


def _eager_gelu_bwd(dy, x):
    import torch

    return torch.ops.aten.gelu_backward(dy, x)  # what autograd runs for F.gelu's backward


def _eager_bias_gelu(x, b):
    import torch

    return torch.nn.functional.gelu(x + b, approximate="tanh")  # two kernels, as eager runs it


def _eager_fn(op_name):
    from ..ops import norms, softmax

    return {"softmax": softmax.eager_torch, "layernorm": norms.eager_layernorm,
            "rmsnorm": norms.eager_rmsnorm, "softmax_bwd": softmax.eager_torch_bwd, "gelu": _eager_gelu,
            "gelu_bwd": _eager_gelu_bwd, "bias_gelu": _eager_bias_gelu,
            "layernorm_bwd": norms.eager_bwd("layernorm"), "rmsnorm_bwd": norms.eager_bwd("rmsnorm")}[op_name]


def eager_rows(op, sizes, dtype="float32", repeat=20, compiled: bool = True) -> list[dict]:
    """Time torch eager (allocating its output) on tensors made by the op's make_inputs, and with
    ``compiled`` also ``torch.compile`` of the same function (Triton kernels generated for the shape):
    the strongest baseline a user would reach for."""
    import torch

    from ..bench import _median, time_gpu

    fn = _eager_fn(op.name)
    out = []
    for size in sizes:
        rng = np.random.default_rng(1234)
        inputs = op.make_inputs(size, np.dtype(dtype), rng)
        targs = [torch.from_numpy(a).cuda() for a in inputs]
        kinds = [("torch_eager", fn, f"torch {torch.__version__} eager, as a user calls it (allocates its output)")]
        if compiled:
            kinds.append(("torch_compile", torch.compile(fn, dynamic=False),
                          f"torch {torch.__version__} torch.compile of the same function (Triton), allocating"))
        for name, f, summary in kinds:
            times = time_gpu(lambda: f(*targs), [()], warmup=3, repeat=repeat)
            t = _median(times)
            itemsize = np.dtype(dtype).itemsize
            flops, nbytes = op.flops(size), op.bytes(size, itemsize)
            out.append({"variant": name, "rung": 0, "baseline": True, "summary": summary,
                        "size": list(size), "size_label": op.size_label(size), "median_s": t,
                        "min_s": float(np.min(times)), "q1_s": float(np.percentile(times, 25)),
                        "q3_s": float(np.percentile(times, 75)), "repeats": len(times),
                        "gflops": flops / t / 1e9, "gbps": nbytes / t / 1e9, "flops": flops, "bytes": nbytes})
        del targs
        torch.cuda.empty_cache()
    return out


def bench_ops(ops, out_dir, backend="gpu", repeat=20, peaks=None, log=print) -> dict:
    """Benchmark ``ops`` in this process with one shared set of peaks; write <op>_<backend>.json."""
    from .. import device
    from ..bench import _add_fractions, bench, format_table, measure_peaks, save_json
    from ..registry import get_op

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
                res["rows"] += eager_rows(op, sizes, repeat=repeat, compiled=name in COMPILED)
            except ImportError as e:
                log(f"no torch eager rows for {name}: {e}")
        _add_fractions(res)
        res["meta"]["command"] = "python -m kernels_src.figures.rowwise bench " + " ".join(sys.argv[2:])
        from ..ops import activations, norms, softmax

        res["meta"]["config"] = {"softmax.PER_THREAD": softmax.PER_THREAD, "norms.PER_THREAD": dict(norms.PER_THREAD),
                                 "norms.ROWS": dict(norms.ROWS), "activations.ITEMS": 4,
                                 "softmax.VEC_PER_THREAD": softmax.VEC_PER_THREAD,
                                 "softmax.BWD_PER_THREAD": softmax.BWD_PER_THREAD, "activations.VEC4": activations.VEC4}
        if out_dir:
            save_json(res, Path(out_dir) / f"{name}_{backend}.json")
        log(format_table(res) + f"\n  ({time.time() - t0:.1f} s)")
        results[name] = res
    return results


def explore(out_dir, log=print, size=TARGET_SIZE, repeat=20, autotune=False) -> list[dict]:
    """Block sizes (and rows per block for the norms) of the register rungs at one size: at N = 4096,
    T threads hold 4096/T values each. Each configuration is first checked against the reference (a
    full row and a ragged one); inputs are prepared once per op; every configuration is timed by the same
    CUDA-event harness. With ``autotune`` each op then uses its fastest correct configuration."""
    from .. import parity
    from ..bench import _median, _prepare, time_gpu
    from ..ops import norms, softmax
    from ..registry import get_op, get_variant

    rows = []
    plan = {"softmax": [(t, 1) for t in (128, 256, 512, 1024)],
            "layernorm": [(t, r) for r in (1, 2) for t in (128, 256, 512, 1024)],
            "rmsnorm": [(t, r) for r in (1, 2) for t in (128, 256, 512, 1024)]}
    fam = {"layernorm": "ln", "rmsnorm": "rms"}
    chosen = {}
    for name, configs in plan.items():
        op = get_op(name)
        v = get_variant(f"{name}/gpu/regs_shfl")
        sets = _prepare(op, size, "float32", "gpu", 2)
        nbytes = op.bytes(size, 4)
        best = None
        for threads, nrows in configs:
            per = size[1] // threads
            if name == "softmax":
                softmax.PER_THREAD = per
            else:
                norms.PER_THREAD[fam[name]] = per
                norms.ROWS[fam[name]] = nrows
            row = {"op": name, "variant": v.name, "threads": threads, "per_thread": per, "rows": nrows}
            try:
                bad = [str(r) for r in (parity.check_variant(v, op, s) for s in ((3, size[1]), (5, size[1] + 3)))
                       if not r.ok]
                t = _median(time_gpu(v.fn, sets, repeat=repeat))
                row.update(median_s=t, gbps=nbytes / t / 1e9, correct=not bad)
                if bad:
                    row["check"] = bad[0][:300]
                elif best is None or t < best[0]:
                    best = (t, per, nrows)
            except Exception as e:  # noqa: BLE001
                row["error"] = repr(e)[:300]
            log(json.dumps(row))
            rows.append(row)
        if best is not None:
            chosen[name] = {"per_thread": best[1], "rows": best[2]}
        # back to the defaults unless autotuning
        if name == "softmax":
            softmax.PER_THREAD = chosen[name]["per_thread"] if (autotune and name in chosen) else 16
        else:
            f = fam[name]
            norms.PER_THREAD[f] = chosen[name]["per_thread"] if (autotune and name in chosen) else 16
            norms.ROWS[f] = chosen[name]["rows"] if (autotune and name in chosen) else 1
        del sets
    log(f"fastest correct configurations: {chosen}; autotune={autotune}: softmax.PER_THREAD = "
        f"{softmax.PER_THREAD}, norms.PER_THREAD = {norms.PER_THREAD}, norms.ROWS = {norms.ROWS}")
    if out_dir:
        Path(out_dir, "explore_gpu.json").write_text(json.dumps({"rows": rows, "fastest": chosen,
                                                                 "autotune": autotune}, indent=1))
    return rows


def explore_vec4(out_dir, log=print, repeat=20, autotune=False) -> list[dict]:
    """The vec4 rungs' one knob, float4 groups per thread: softmax and its backward at 16384 x 4096
    (T = 1024 / V threads), the exact GELU and its backward at n = 2^26 (V = 1, 2, 4). Each setting is
    checked against the reference first (ragged sizes included), then timed; with ``autotune`` the
    fastest correct setting is kept for the benchmark that follows."""
    from .. import parity
    from ..bench import _median, _prepare, time_gpu
    from ..ops import activations, softmax
    from ..registry import get_op, get_variant

    plan = [("softmax", "vec4", (16384, 4096), (8, 4, 2, 1), [(3, 4096), (5, 4100), (2, 1000)]),
            ("softmax_bwd", "vec4", (16384, 4096), (8, 4, 2, 1), [(3, 4096), (5, 4100), (2, 1000)]),
            ("gelu", "vec4", (1 << 26,), (1, 2, 4), [(4099,), (65537,), (1000,)]),
            ("gelu_bwd", "vec4", (1 << 26,), (1, 2, 4), [(4099,), (65537,), (1000,)])]
    defaults = {"softmax": softmax.VEC_PER_THREAD, "gelu": activations.VEC4}
    rows, chosen = [], {}

    def setv(name, v):
        if name.startswith("softmax"):
            softmax.VEC_PER_THREAD = v
        else:
            activations.VEC4 = v

    for name, var, size, options, checks in plan:
        op, v = get_op(name), get_variant(f"{name}/gpu/{var}")
        sets = _prepare(op, size, "float32", "gpu", 2)
        nbytes = op.bytes(size, 4)
        best = None
        for vecs in options:
            setv(name, vecs)
            row = {"op": name, "variant": var, "vecs": vecs, "size": list(size)}
            try:
                bad = [str(r) for r in (parity.check_variant(v, op, s) for s in checks) if not r.ok]
                t = _median(time_gpu(v.fn, sets, repeat=repeat))
                row.update(median_s=t, gbps=nbytes / t / 1e9, correct=not bad)
                if bad:
                    row["check"] = bad[0][:300]
                elif best is None or t < best[0]:
                    best = (t, vecs)
            except Exception as e:  # noqa: BLE001
                row["error"] = repr(e)[:300]
            log(json.dumps(row))
            rows.append(row)
        if best is not None:
            chosen[name] = best[1]
        del sets
    # softmax and its backward share VEC_PER_THREAD, the GELUs share VEC4: keep the forward's choice
    for name, fam in (("softmax", "softmax"), ("gelu", "gelu")):
        setv(name, chosen[name] if (autotune and name in chosen) else defaults[fam])
    log(f"vec4 fastest: {chosen}; autotune={autotune}: softmax.VEC_PER_THREAD = {softmax.VEC_PER_THREAD}, "
        f"activations.VEC4 = {activations.VEC4}")
    if out_dir:
        Path(out_dir, "explore_vec4_gpu.json").write_text(json.dumps({"rows": rows, "fastest": chosen,
                                                                      "autotune": autotune}, indent=1))
    return rows


# --------------------------------------------------------------------------- Nsight Compute, one process
PROFILE_PLAN = ("softmax@16384x4096:naive,safe,online,regs,regs_shfl,vec4;"
                "softmax_bwd@16384x4096:row,regs,vec4;"
                "bias_gelu@16384x4096:unfused,fused,fused_v4;"
                "gelu_tanh@16777216:ilp4,vec4;"
                "gelu@67108864:thread,ilp4,vec4;"
                "gelu_bwd@67108864:ilp4,vec4")
MARKER = "rowwise_marker"


def parse_plan(text: str) -> list[tuple[str, tuple, list[str]]]:
    """"op@AxB:v1,v2;op2@N:v3" -> [(op, size, [variants])]."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        head, vs = part.split(":")
        op, size = head.split("@")
        out.append((op, tuple(int(d) for d in size.split("x")), [v for v in vs.split(",") if v]))
    return out


def _profile_child(plan_text: str) -> int:
    """Run under ncu: warm every variant up, then, between cuProfilerStart and Stop, launch the marker
    kernel and then one call of each variant in plan order."""
    from .. import device
    from ..device import cuda
    from ..registry import get_op, get_variant

    @cuda.jit
    def rowwise_marker(a):
        a[0] += 1.0

    mark = cuda.to_device(np.zeros(1, dtype=np.float32))
    jobs = []
    for op_name, size, variants in parse_plan(plan_text):
        op = get_op(op_name)
        rng = np.random.default_rng(0)
        inputs = [cuda.to_device(np.ascontiguousarray(a)) for a in op.make_inputs(size, np.dtype("float32"), rng)]
        outs = [cuda.device_array_like(inputs[0]) for _ in op.output_names]
        for v in variants:
            fn = get_variant(f"{op_name}/gpu/{v}").fn
            for _ in range(2):
                fn(*outs, *inputs)
            jobs.append((fn, outs, inputs))
    rowwise_marker[1, 1](mark)
    device.synchronize()
    cuda.profile_start()
    for fn, outs, inputs in jobs:
        rowwise_marker[1, 1](mark)
        fn(*outs, *inputs)
    rowwise_marker[1, 1](mark)
    device.synchronize()
    cuda.profile_stop()
    return 0


def profile_plan(plan_text: str, out_dir, metric_set: str = "all", log=print, timeout=400) -> dict:
    """Profile a plan in one ncu process; write <op>_ncu.json per op; return {op: summary}."""
    import subprocess

    from .. import bench
    from ..registry import get_op
    from ..tools import profile as prof

    ncu = prof.find_ncu()
    if not ncu:
        raise prof.ProfileError("ncu not found")
    sets = ["memory", "stalls"] if metric_set == "all" else [metric_set]
    metrics = list(dict.fromkeys(prof.COMMON + tuple(m for k in sets for m in prof.METRIC_SETS[k])))
    plan, dropped = parse_plan(plan_text), []
    for _ in range(4):
        cmd = prof.ncu_command(ncu, metrics, [plan_text], module="kernels_src.figures.rowwise_bench profile-child")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        output = (proc.stdout or "") + "\n" + (proc.stderr or "")
        kernels = prof.parse_csv(proc.stdout or "", metrics) if proc.returncode == 0 else []
        if kernels:
            break
        bad = prof._bad_metrics(output, metrics)
        if not bad:
            raise prof.ProfileError("ncu failed:\n" + "\n".join(output.strip().splitlines()[-20:]))
        dropped += bad
        metrics = [m for m in metrics if m not in bad]
    # split the kernel list at the markers: [marker, variant kernels..., marker, ..., marker]
    groups, cur = [], None
    for k in kernels:
        if MARKER in k["name"]:
            if cur is not None:
                groups.append(cur)
            cur = []
        elif cur is not None:
            cur.append(k)
    jobs = [(op, size, v) for op, size, vs in plan for v in vs]
    if len(groups) != len(jobs):
        raise prof.ProfileError(f"{len(groups)} kernel groups for {len(jobs)} variants")
    results = {}
    for (op_name, size, v), ks in zip(jobs, groups):
        op = get_op(op_name)
        res = results.setdefault(op_name, {"op": op_name, "size": list(size), "size_label": op.size_label(size),
                                           "dtype": "float32", "set": metric_set, "metrics": metrics,
                                           "dropped": dropped, "meta": bench.environment(), "variants": {},
                                           "bytes_min": op.bytes(size, 4), "elements": int(np.prod(size))})
        res["meta"]["command"] = "python -m kernels_src.figures.rowwise profile " + " ".join(sys.argv[2:])
        res["variants"][v] = {"kernels": ks, "total": prof.aggregate(ks, metrics)}
        log(f"{op_name}/{v}: {len(ks)} kernel(s), {res['variants'][v]['total'].get(prof.DURATION, 0) / 1e3:.1f} us")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        for name, res in results.items():
            Path(out_dir, f"{name}_ncu.json").write_text(json.dumps(res, indent=1))
    return results


def check_margins(ops, log=print) -> list[dict]:
    """Parity of every GPU variant over its check sizes, with the worst error as a fraction of the
    allowed tolerance (so tolerances can be set from measured headroom)."""
    from .. import parity
    from ..registry import get_op

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
    from ..ops import norms, softmax

    sig_sm, sig_ln, sig_rms = softmax.SIG, norms.SIG_LN, norms.SIG_RMS
    items = []
    for t, e in ((128, 32), (256, 16), (512, 8)):
        items.append((f"softmax regs_shfl t={t} e={e}", softmax.kernel("regs", t, e, True), sig_sm))
        for r in (1, 2):
            items.append((f"layernorm regs_shfl t={t} e={e} rows={r}", norms.kernel("ln_regs", t, e, True, r), sig_ln))
            items.append((f"rmsnorm regs_shfl t={t} e={e} rows={r}", norms.kernel("rms_regs", t, e, True, r), sig_rms))
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
    p = argparse.ArgumentParser(prog="python -m kernels_src.figures.rowwise")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="benchmark the chapter 6-8 ops in one process")
    b.add_argument("--out", required=True)
    b.add_argument("--ops", default=",".join(ALL_OPS))
    b.add_argument("--backend", default="gpu", choices=["cpu", "gpu"])
    b.add_argument("--repeat", type=int, default=20)
    b.add_argument("--explore", action="store_true", help="also try block sizes of the register rungs")
    b.add_argument("--autotune", action="store_true", help="with --explore: bench with the fastest block sizes")
    b.add_argument("--tar", help="also pack every file written into this .tar.gz (the device tool returns 8 files)")
    b.add_argument("--margins", action="store_true", help="also check every GPU variant, with error margins")
    b.add_argument("--resources", action="store_true", help="also report registers per thread")
    b.add_argument("--explore-vec4", action="store_true", help="also try float4 groups per thread of the vec4 rungs")
    b.add_argument("--profile", help="also run this Nsight Compute plan (see the profile command); 'default' for "
                                     "PROFILE_PLAN")
    pr = sub.add_parser("profile", help="Nsight Compute counters for a plan of variants, in one process")
    pr.add_argument("--out", required=True)
    pr.add_argument("--plan", default=PROFILE_PLAN)
    pr.add_argument("--set", dest="metric_set", default="all", choices=["all", "memory", "stalls"])
    pc = sub.add_parser("profile-child")
    pc.add_argument("plan")
    args = p.parse_args(argv)
    if args.cmd == "profile-child":
        return _profile_child(args.plan)
    if args.cmd == "profile":
        Path(args.out).mkdir(parents=True, exist_ok=True)
        profile_plan(args.plan, args.out, args.metric_set)
        return 0
    from .. import device
    from ..bench import measure_peaks

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
            explore(out, log, autotune=args.autotune)
            log(f"[explore done at {time.time() - t0:.0f} s]")
        if args.explore_vec4:
            explore_vec4(out, log, autotune=args.autotune)
            log(f"[explore vec4 done at {time.time() - t0:.0f} s]")
        bench_ops(ops, out, args.backend, args.repeat, peaks, log)
        log(f"[bench done at {time.time() - t0:.0f} s]")
        if args.profile:
            try:
                profile_plan(PROFILE_PLAN if args.profile == "default" else args.profile, out, "all", log)
            except Exception as e:  # noqa: BLE001  (the benchmark files are written already)
                log(f"profile failed: {e!r}")
            log(f"[profile done at {time.time() - t0:.0f} s]")
    finally:
        (out / f"log_{args.backend}.txt").write_text("\n".join(log_lines) + "\n")
        if args.tar:
            import tarfile

            with tarfile.open(args.tar, "w:gz") as tf:
                for f in sorted(out.iterdir()):
                    if f.is_file() and not f.name.endswith(".tar.gz"):
                        tf.add(f, arcname=f.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
