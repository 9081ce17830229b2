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
        cmd = prof.ncu_command(ncu, metrics, [plan_text], module="kernels_src.figures.rowwise profile-child")
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


# ======================================================================================= figures
def _ax(ax, figsize=(7, 4)):
    import matplotlib.pyplot as plt

    return ax if ax is not None else plt.subplots(figsize=figsize)[1]


def plot_gelu_approx(axes=None):
    """Left: exact GELU and its tanh approximation. Right: approximation error (float64, so the curve is
    the approximation's error alone, not rounding)."""
    import matplotlib.pyplot as plt

    from ..ops.activations import gelu_tanh_error, relu_ref, silu_ref

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(9, 3.8))  # shown at about 0.85 of its size on the page
    x, exact, err = gelu_tanh_error()
    approx = exact + err
    ax = axes[0]
    ax.plot(x, relu_ref(x), color="0.6", lw=1, label="ReLU")
    ax.plot(x, silu_ref(x), ls="--", label="SiLU")
    ax.plot(x, exact, lw=2, label="GELU (erf, exact)")
    ax.plot(x, approx, ls=":", lw=2, label="GELU (tanh approximation)")
    ax.set_xlim(-4, 4)
    ax.set_ylim(-0.6, 4)
    ax.set_xlabel("x")
    ax.set_title("activations")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.plot(x, err)
    ax.axhline(0, color="k", lw=0.5)
    i = int(np.argmax(np.abs(err)))
    ax.annotate(f"max |error| {abs(err[i]):.1e} at x = {x[i]:.2f}", (x[i], err[i]), xytext=(10, -10),
                textcoords="offset points", fontsize=8)
    ax.set_xlabel("x")
    ax.set_ylabel("tanh approx - exact")
    ax.set_title("error of the tanh approximation (float64)")
    ax.grid(alpha=0.3)
    return axes


def cancellation_errors(xs=None) -> dict:
    """float32 relative error of two ways to write GELU and the tanh-GELU derivative's Phi-like factor,
    against float64: the textbook form (1 + erf, 1 + tanh) and the form the kernels use (erfc, sigmoid)."""
    import math

    xs = np.linspace(-9, 3, 241) if xs is None else xs  # below -9 the true values leave float32's range
    f32 = np.float32
    out = {"x": xs, "erf form": [], "erfc form": [], "1 + tanh form": [], "sigmoid form": []}
    from ..ops.activations import gelu_ref

    for x in xs:
        xf = f32(x)
        ex = float(gelu_ref(np.array([float(xf)]))[0])
        u64 = math.sqrt(2 / math.pi) * (float(xf) + 0.044715 * float(xf) ** 3)
        et = float(xf) / (1.0 + math.exp(-2.0 * u64))  # (1 + tanh u)/2 = sigmoid(2u): no cancellation
        a = f32(0.5) * xf * (f32(1) + f32(math.erf(xf * f32(1 / math.sqrt(2)))))
        b = f32(0.5) * xf * f32(math.erfc(-xf * f32(1 / math.sqrt(2))))
        u = f32(math.sqrt(2 / math.pi)) * (xf + f32(0.044715) * xf * xf * xf)
        c = f32(0.5) * xf * (f32(1) + f32(math.tanh(u)))
        with np.errstate(over="ignore"):
            d = xf / (f32(1) + f32(math.exp(min(-2 * float(u), 700.0))))
        rel = lambda got, want: abs(float(got) - want) / abs(want) if want != 0 else 0.0  # noqa: E731
        out["erf form"].append(rel(a, ex))
        out["erfc form"].append(rel(b, ex))
        out["1 + tanh form"].append(rel(c, et))
        out["sigmoid form"].append(rel(d, et))
    return {k: np.asarray(v) for k, v in out.items()}


def plot_cancellation(ax=None):
    ax = _ax(ax)
    r = cancellation_errors()
    for k, style in (("erf form", "-"), ("erfc form", "-"), ("1 + tanh form", "--"), ("sigmoid form", "--")):
        ax.semilogy(r["x"], np.maximum(r[k], 1e-9), style, label=k)
    ax.axhline(np.finfo(np.float32).eps, color="k", lw=0.6, ls=":")
    ax.annotate("float32 eps", (r["x"][0], np.finfo(np.float32).eps), xytext=(2, 3), textcoords="offset points",
                fontsize=8)
    ax.set_xlabel("x")
    ax.set_ylabel("relative error in float32 (floored at 1e-9)")
    ax.set_title("GELU in float32: where 1 + erf and 1 + tanh lose their digits")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return ax


def plot_summation_errors(res=None, ax=None):
    """Relative error of float32 summation orders against math.fsum, against n (log-log)."""
    from ..ops.reductions import summation_errors

    res = res or summation_errors([2 ** k for k in range(6, 25, 2)])
    ax = _ax(ax)
    n = np.asarray(res["n"], dtype=float)
    for k, st in (("naive", "o-"), ("pairwise", "s-"), ("numpy", "x--"), ("kahan", "^-"), ("f64acc", "v:")):
        ax.loglog(n, np.maximum(res[k], 1e-10), st, label=k)
    eps = np.finfo(np.float32).eps
    ax.loglog(n, eps * np.sqrt(n) * 0.1, "k:", lw=0.8, label="0.1 sqrt(n) eps")
    ax.axhline(eps / 2, color="0.5", lw=0.8, ls="--")
    ax.annotate("eps/2: one rounding", (n[0], eps / 2), xytext=(2, 3), textcoords="offset points", fontsize=8)
    ax.set_xlabel("n (uniform [0, 1) float32 values)")
    ax.set_ylabel("relative error (floored at 1e-10)")
    ax.set_title("Summing in float32: the order of the additions matters")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return ax


def variance_cancellation(offsets=(0, 1e1, 1e2, 1e3, 1e4), n=4096, seed=0) -> list[dict]:
    """Relative error of the float32 variance of rows offset + N(0,1), two ways: E[x^2] - E[x]^2 (one
    pass, cancels) and the mean of (x - mean)^2 (two passes, what the kernels do)."""
    rng = np.random.default_rng(seed)
    rows = []
    for off in offsets:
        x = (off + rng.standard_normal(n)).astype(np.float32)
        exact = np.var(x.astype(np.float64))
        m = np.float32(np.sum(x, dtype=np.float32) / np.float32(n))
        one = np.float32(np.sum(x * x, dtype=np.float32) / np.float32(n)) - m * m
        two = np.float32(np.sum((x - m) * (x - m), dtype=np.float32) / np.float32(n))
        rows.append({"offset": off, "exact": exact, "one_pass": float(one), "two_pass": float(two),
                     "err_one_pass": abs(float(one) - exact) / exact, "err_two_pass": abs(float(two) - exact) / exact})
    return rows


def softmax_stability(n=8, seed=0) -> list[dict]:
    """Run the CPU softmax rungs on three kinds of row and report NaN counts and max error vs reference."""
    from ..ops import softmax as sm

    rng = np.random.default_rng(seed)
    cases = {
        "normal logits (scale 2)": (2 * rng.standard_normal((4, n))).astype(np.float32),
        "logits of +-1e4": (1e4 * np.sign(rng.standard_normal((4, n)))).astype(np.float32),
        "fully masked rows (all -inf)": np.full((4, n), -np.inf, dtype=np.float32),
    }
    rungs = {"naive": sm.softmax_naive, "safe": sm.softmax_safe, "online": sm.softmax_online}
    out = []
    for label, x in cases.items():
        ref = sm.reference(x.astype(np.float64))
        for name, fn in rungs.items():
            y = np.full_like(x, np.nan)
            with np.errstate(all="ignore"):
                fn(y, x)
            fin = np.isfinite(y)
            err = float(np.max(np.abs(y[fin] - ref[fin]))) if fin.any() else float("nan")
            out.append({"input": label, "rung": name, "nan": int(np.isnan(y).sum()), "of": y.size,
                        "max_err_finite": err, "matches_reference": bool(np.allclose(y, ref, rtol=1e-5, atol=1e-7,
                                                                                     equal_nan=False))})
    return out


def online_trace(x):
    """Running max m_j and running sum s_j = sum_{k<=j} exp(x_k - m_j) of the online softmax over a row."""
    m, s, ms, ss = -np.inf, 0.0, [], []
    for v in np.asarray(x, dtype=np.float64):
        if v > m:
            s = s * np.exp(m - v) + 1.0
            m = v
        else:
            s += np.exp(v - m)
        ms.append(m)
        ss.append(s)
    return np.asarray(ms), np.asarray(ss)


def plot_online_trace(x=None, ax=None):
    import matplotlib.pyplot as plt

    if x is None:  # several near-equal maxima early (s grows), then a jump (s collapses by exp(m_old - m_new))
        x = np.random.default_rng(3).normal(0, 1, 40)
        x[4:10] = [2.4, 2.6, 2.5, 2.7, 2.55, 2.65]
        x[24], x[31] = 6.0, 6.3
    x = np.asarray(x)
    ms, ss = online_trace(x)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.8))
    j = np.arange(x.size)
    ax.bar(j, x, color="0.8", label="logit x_j")
    ax.step(j, ms, where="mid", color="C3", label="running max m_j")
    jumps = np.flatnonzero(np.diff(ms, prepend=-np.inf) > 0)
    ax.plot(jumps, ms[jumps], "o", color="C3", ms=4)
    ax.set_xlabel("position j in the row")
    ax.set_ylabel("logit")
    ax2 = ax.twinx()
    ax2.plot(j, ss, color="C0", label="running sum s_j (relative to m_j)")
    ax2.set_ylabel("s_j", color="C0")
    for k in jumps:
        ax.axvline(k, color="C3", lw=0.4, alpha=0.5)
    ax.set_title("online softmax: each new maximum rescales the sum by exp(m_old - m_new)")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
    return ax


# --------------------------------------------------------------------------- benchmark-file helpers
def row(result: dict, variant: str, size=None) -> dict | None:
    """One timed row of a benchmark file (largest size unless given)."""
    from ..plots import largest_size, rows

    size = tuple(size) if size is not None else largest_size(result)
    for r in rows(result, size):
        if r["variant"] == variant:
            return r
    return None


def ladder_bars(result: dict, size=None, ax=None, title=None):
    """GB/s of every variant at one size, with the run's copy bandwidth and 85 % of it as lines."""
    from ..plots import device_label, largest_size, rows

    ax = _ax(ax, (8, 3.8))
    size = tuple(size) if size is not None else largest_size(result)
    rs = rows(result, size)
    names = [r["variant"] for r in rs]
    vals = [r["gbps"] for r in rs]
    colors = ["0.6" if r["baseline"] else "C0" for r in rs]
    ax.barh(range(len(rs)), vals, color=colors)
    ax.set_yticks(range(len(rs)), names)
    ax.invert_yaxis()
    copy = (result.get("peaks") or {}).get("copy_gbps")
    if copy:
        ax.axvline(copy, color="k", lw=1)
        ax.axvline(0.85 * copy, color="k", lw=1, ls=":")
        ax.annotate(f"copy {copy:,.0f}", (copy, len(rs) - 0.5), xytext=(-4, 0), textcoords="offset points",
                    ha="right", fontsize=8)
        ax.annotate("85 %", (0.85 * copy, len(rs) - 0.5), xytext=(-4, 0), textcoords="offset points",
                    ha="right", fontsize=8)
    for i, v in enumerate(vals):
        ax.annotate(f"{v:,.0f}", (v, i), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_xlabel("GB/s (bytes that must move / median time)")
    ax.set_title(title or f"{result['op']} {result['rows'][0]['size_label'] if False else 'x'.join(map(str, size))} "
                 f"on {device_label(result)} (grey: baselines)")
    ax.grid(axis="x", alpha=0.3)
    return ax


def fusion_summary(result: dict, size=None) -> dict:
    """Predicted and measured ratio of unfused to fused bias+GELU."""
    from ..ops.activations import bias_gelu_bytes_fused, bias_gelu_bytes_unfused

    un, fu = row(result, "unfused", size), row(result, "fused", size)
    s = tuple(un["size"])
    pred = bias_gelu_bytes_unfused(s, 4) / bias_gelu_bytes_fused(s, 4)
    return {"size": s, "bytes_unfused": bias_gelu_bytes_unfused(s, 4), "bytes_fused": bias_gelu_bytes_fused(s, 4),
            "predicted_ratio": pred, "measured_ratio": un["median_s"] / fu["median_s"],
            "t_unfused": un["median_s"], "t_fused": fu["median_s"], "gbps_unfused": un["gbps"],
            "gbps_fused": fu["gbps"]}


def summary_table(results: list[dict], variants=None) -> str:
    """Markdown: one line per op at its largest size: the best course kernel's GB/s and % of copy."""
    from ..plots import _fmt_time, largest_size, rows

    lines = ["| op | size | best course kernel | median | GB/s | % of copy BW |", "|---|---|---|---|---|---|"]
    for res in results:
        s = largest_size(res)
        rs = [r for r in rows(res, s, baselines=False) if variants is None or r["variant"] in variants]
        if not rs:
            continue
        b = max(rs, key=lambda r: r["gbps"])
        lines.append(f"| {res['op']} | {b['size_label']} | `{b['variant']}` | {_fmt_time(b['median_s'])} | "
                     f"{b['gbps']:,.0f} | {100 * b.get('frac_copy_bw', float('nan')):.1f} % |")
    return "\n".join(lines)


def available(ops, backend="gpu") -> list[dict]:
    """The committed benchmark files that exist for ``ops`` (chapters show what has been measured)."""
    from ..plots import DATA, load_bench

    sub = "h100/" if backend == "gpu" else ""  # GPU figures come from the H100 files
    return [load_bench(f"{sub}{o}_{backend}") for o in ops if (DATA / f"{sub}{o}_{backend}.json").exists()]


def combined_table(results: list[dict], size=None) -> str:
    """Markdown: every variant of every op at its largest size (or ``size``): time, GB/s, % of copy."""
    from ..plots import _fmt_time, largest_size, prediction, rows

    lines = ["| op | size | variant | rung | median | GB/s | % of copy BW | vs baseline | predicted (the rung's docstring) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        s = tuple(size) if size is not None else largest_size(res)
        for r in rows(res, s):
            frac = r.get("frac_copy_bw")
            lines.append(f"| {res['op']} | {r['size_label']} | `{r['variant']}` | "
                         f"{'baseline' if r['baseline'] else r['rung']} | {_fmt_time(r['median_s'])} | "
                         f"{r['gbps']:,.0f} | {100 * frac:.1f} % | "
                         f"{(format(r['vs_baseline'], '.2f') + '×') if 'vs_baseline' in r else '–'} | "
                         f"{(prediction(res['op'], r['variant']) or '–') if not r['baseline'] else '–'} |")
    return "\n".join(lines)


def fusion_bars(result: dict, ax=None):
    """Predicted (from bytes, at the unfused pair's measured bandwidth) and measured time of both rungs."""
    f = fusion_summary(result)
    ax = _ax(ax, (6, 3.5))
    bw = f["gbps_unfused"] * 1e9  # bytes/s the unfused pair actually achieved
    pred = [f["bytes_unfused"] / bw * 1e6, f["bytes_fused"] / bw * 1e6]
    meas = [f["t_unfused"] * 1e6, f["t_fused"] * 1e6]
    x = np.arange(2)
    ax.bar(x - 0.2, pred, 0.4, color="0.75", label="predicted from bytes moved")
    ax.bar(x + 0.2, meas, 0.4, color="C0", label="measured")
    for i in range(2):
        ax.annotate(f"{meas[i]:.0f} µs", (x[i] + 0.2, meas[i]), xytext=(0, 3), textcoords="offset points",
                    ha="center", fontsize=8)
    ax.set_xticks(x, ["unfused (2 kernels)", "fused (1 kernel)"])
    ax.set_ylabel("µs")
    ax.set_title(f"bias + GELU, {f['size'][0]} x {f['size'][1]} float32")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return ax


def norm_edge_checks(seed: int = 1) -> str:
    """Markdown table: every available norm variant on every edge case of norms.EDGE_CASES (pass/fail
    and the worst error as a fraction of the allowed tolerance)."""
    from .. import parity
    from ..ops import norms
    from ..registry import get_op

    lines = ["| op | variant | " + " | ".join(norms.EDGE_CASES) + " |", "|---|---|" + "---|" * len(norms.EDGE_CASES)]
    for name in ("layernorm", "rmsnorm", "layernorm_bwd", "rmsnorm_bwd"):
        op = get_op(name)
        for v in op.variants:
            if not v.available()[0]:
                continue
            cells = []
            for case in norms.EDGE_CASES:
                rng = np.random.default_rng(seed)
                size = (5, 1) if case == "length-1 rows" else (6, 33)
                inp = norms.edge_inputs(name, case, size, np.dtype("float32"), rng)
                refs = parity.reference_outputs(op, inp)
                outs = parity.run_variant(v, inp, parity.empty_outputs(refs, "float32"))
                x = inp[0] if name in ("layernorm", "rmsnorm") else inp[1]
                gamma = inp[1] if name == "layernorm" else inp[-1]
                rt, at = norms.edge_tol(case, x, gamma, None if name in ("layernorm", "rmsnorm") else inp[0])
                reps = [parity.compare("o", g, r, rt, at) for g, r in zip(outs, refs)]
                worst = 0.0
                for g, r in zip(outs, refs):
                    with np.errstate(invalid="ignore"):
                        worst = max(worst, float(np.nanmax(np.abs(g - r) / (at + rt * np.abs(r)))))
                cells.append(("ok" if all(r.ok for r in reps) else "**FAIL**") + f" ({worst:.2f})")
            lines.append(f"| {name} | `{v.backend}/{v.name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n(in parentheses: the worst error as a fraction of the allowed error)"


# ------------------------------------------------------------------------- Nsight Compute summaries
NCU_STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"


def ncu_rows(result: dict, variants=None) -> list[dict]:
    """Per variant of a ``<op>_ncu.json``: kernel time, DRAM bytes (and their ratio to the bytes the op
    must move), L2 traffic, instructions per element (warp instructions x 32 / elements), issue-slot and
    DRAM utilisation, occupancy and the largest stall reason."""
    from ..tools.profile import STALL_REASONS

    out = []
    for name, r in result["variants"].items():
        if "total" not in r or (variants and name not in variants):
            continue
        t = r["total"]
        dram = t.get("dram__bytes_read.sum", 0) + t.get("dram__bytes_write.sum", 0)
        stalls = {s: t[NCU_STALL.format(s)] for s in STALL_REASONS if NCU_STALL.format(s) in t}
        top = max(stalls, key=stalls.get) if stalls else ""
        out.append({"variant": name, "kernels": t.get("kernels", 1), "time_us": t["gpu__time_duration.sum"] / 1e3,
                    "dram_read_mib": t.get("dram__bytes_read.sum", 0) / 2 ** 20,
                    "dram_write_mib": t.get("dram__bytes_write.sum", 0) / 2 ** 20,
                    "dram_over_min": dram / result["bytes_min"], "l2_mib": t.get("lts__t_bytes.sum", 0) / 2 ** 20,
                    "inst_per_elem": t.get("smsp__inst_executed.sum", 0) * 32 / result["elements"],
                    "issue_pct": t.get("smsp__issue_active.avg.pct_of_peak_sustained_active"),
                    "dram_pct": t.get("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
                    "occupancy_pct": t.get("sm__warps_active.avg.pct_of_peak_sustained_active"),
                    "regs": t.get("launch__registers_per_thread"),
                    "long_scoreboard": stalls.get("long_scoreboard"), "top_stall": top,
                    "top_stall_value": stalls.get(top)})
    return out


def ncu_table(result: dict, variants=None) -> str:
    """Markdown table of :func:`ncu_rows` (every number read from the JSON)."""
    lines = ["| variant | kernels | kernel time (µs) | DRAM read (MiB) | DRAM write (MiB) | DRAM bytes / minimum | "
             "L2 traffic (MiB) | instructions per element | issue slots busy | DRAM busy | occupancy | "
             "long-scoreboard stalls per issue |", "|---|" + "---:|" * 11]
    for r in ncu_rows(result, variants):
        lines.append(f"| `{r['variant']}` | {r['kernels']} | {r['time_us']:.1f} | {r['dram_read_mib']:,.0f} | "
                     f"{r['dram_write_mib']:,.0f} | {r['dram_over_min']:.2f} | {r['l2_mib']:,.0f} | "
                     f"{r['inst_per_elem']:.1f} | {r['issue_pct']:.0f} % | {r['dram_pct']:.0f} % | "
                     f"{r['occupancy_pct']:.0f} % | {r['long_scoreboard']:.1f} |")
    return "\n".join(lines)


def ncu_row(result: dict, variant: str) -> dict:
    return next(r for r in ncu_rows(result) if r["variant"] == variant)


# ------------------------------------------------------------------------ chapter 6's split roofline
_RUNG_STYLE = {"thread": ("o", "C0"), "ilp4": ("s", "C1"), "vec4": ("^", "C2"), "unfused": ("o", "C0"),
               "fused": ("s", "C1"), "fused_v4": ("^", "C2")}


def activation_roofline(results: list[dict], axes=None, title=None):
    """The chapter 6 kernels on a roofline zoomed to where they live (0.05-2 FLOP/B), split into three
    panels (forward, backward, bias + GELU). Colour and marker name the rung, the same in every panel;
    each op's name is written beside its points (every rung of an op has the same intensity)."""
    import matplotlib.pyplot as plt

    from ..plots import largest_size, rows

    panels = {"forward": [], "backward": [], "bias + GELU (fusion)": []}
    for res in results:
        key = "bias + GELU (fusion)" if res["op"] == "bias_gelu" else ("backward" if res["op"].endswith("_bwd")
                                                                      else "forward")
        panels[key].append(res)
    if axes is None:
        # one panel above the other at the page's width (side by side at 15 in, labels reached the page at 5 px)
        _, axes = plt.subplots(3, 1, figsize=(7.4, 13), sharey=True)
    bw = (results[0].get("peaks") or {}).get("copy_gbps")
    x = np.logspace(np.log10(0.05), np.log10(2.5), 50)
    for ax, (name, group) in zip(axes, panels.items()):
        ax.loglog(x, bw * x, "k-", lw=1.2, label=f"copy bandwidth x intensity ({bw:,.0f} GB/s)")
        ax.loglog(x, 0.85 * bw * x, "k:", lw=0.8, label="85 % of copy")
        seen = set()
        labels = []
        for res in group:
            s = largest_size(res)
            pts = [r for r in rows(res, s) if not r["baseline"]]
            for r in pts:
                m, c = _RUNG_STYLE.get(r["variant"], ("x", "0.4"))
                ai = r["flops"] / r["bytes"]
                ax.loglog(ai, r["gflops"], m, color=c, ms=7, mfc="none" if r["variant"] == "thread" else c,
                          label=r["variant"] if r["variant"] not in seen else None)
                seen.add(r["variant"])
                if res["op"] == "bias_gelu":
                    labels.append((ai, r["gflops"], r["variant"]))
            if res["op"] != "bias_gelu":
                top = max(pts, key=lambda r: r["gflops"])
                labels.append((top["flops"] / top["bytes"], top["gflops"], res["op"]))
        labels.sort()
        for i, (ai, g, text) in enumerate(labels):  # alternate left-above / right-below: neighbours do not collide
            ax.annotate(text, (ai, g), xytext=(-7, 6) if i % 2 == 0 else (7, -12), textcoords="offset points",
                        ha="right" if i % 2 == 0 else "left", fontsize=8)
        ax.set_xlim(0.05, 2.5)
        ax.set_title(name)
        ax.set_xlabel("FLOP / byte")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
        ax.set_ylabel("GFLOP/s")
    if title:
        axes[0].figure.suptitle(title)
    axes[0].figure.tight_layout()
    return axes
