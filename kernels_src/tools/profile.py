"""Profile registered variants with Nsight Compute (``ncu``) and keep a small JSON summary.

    python -m kernels_src profile softmax --size 16384x4096 --variants regs,online --set memory --json out.json

Each variant runs in a child process: two warm-up calls (compilation, autotuning), then exactly one call
between ``cuProfilerStart`` and ``cuProfilerStop``. ``ncu --profile-from-start off`` therefore sees only the
kernels of that one call, whatever their names and however many there are. ncu flushes the caches before
each kernel it measures (its default ``--cache-control all``), so DRAM bytes are those of a cold L2, as in
the benchmarks. Clocks are left alone (``--clock-control none``).

The summary keeps, per variant, every kernel's metrics and a ``total`` over the kernels: ``.sum`` counters
and durations are added; percentages and ratios are averaged, weighted by each kernel's duration; launch
settings (registers, grid, block) are those of the longest kernel. The chapters read these JSON files; the
raw reports stay on the GPU machine.
"""
from __future__ import annotations

import csv
import io
import glob
import os
import shutil
import subprocess
import sys

STALL_REASONS = ("long_scoreboard", "short_scoreboard", "mio_throttle", "math_pipe_throttle", "barrier", "wait",
                 "not_selected", "selected", "lg_throttle", "dispatch_stall", "no_instruction", "branch_resolving",
                 "membar", "drain", "tex_throttle", "imc_miss", "sleeping")
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"

COMMON = ("gpu__time_duration.sum", "launch__registers_per_thread", "launch__grid_size", "launch__block_size",
          "sm__warps_active.avg.pct_of_peak_sustained_active", "sm__maximum_warps_per_active_cycle_pct")
METRIC_SETS = {
    "memory": ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum", "l1tex__t_bytes.sum",
               "lts__t_sector_hit_rate.pct", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
               "launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem",
               # sectors per request: 4 for a coalesced warp-wide 4-byte load, up to 32 when every lane
               # touches its own 32-byte sector
               "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
               "smsp__sass_inst_executed_op_global_ld.sum"),
    "stalls": ("smsp__issue_active.avg.pct_of_peak_sustained_active", "smsp__inst_executed.sum",
               "sm__throughput.avg.pct_of_peak_sustained_elapsed",
               "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
               "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum")
              + tuple(STALL_PREFIX + r + STALL_SUFFIX for r in STALL_REASONS),
    "shared": ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
               "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
               "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
               "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
               "smsp__sass_inst_executed_op_shared_ld.sum", "smsp__sass_inst_executed_op_shared_st.sum"),
    # the instruction mix (warp-level counts, and thread-level counts of each kind) and the launch's waves
    "instructions": ("smsp__inst_executed.sum", "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
                     "smsp__sass_thread_inst_executed_op_fp32_pred_on.sum",
                     "smsp__sass_thread_inst_executed_op_integer_pred_on.sum",
                     "smsp__inst_executed_pipe_fma.sum", "smsp__inst_executed_pipe_alu.sum",
                     "smsp__inst_executed_pipe_lsu.sum", "smsp__inst_executed_pipe_xu.sum",
                     "launch__waves_per_multiprocessor", "launch__occupancy_limit_registers",
                     "launch__occupancy_limit_shared_mem"),
}
METRIC_SETS["all"] = tuple(dict.fromkeys(m for s in METRIC_SETS.values() for m in s))
DURATION = "gpu__time_duration.sum"
# Short names for tables: the chapters show these, the JSON keeps ncu's own names.
SHORT = {"gpu__time_duration.sum": "time (ns)", "dram__bytes_read.sum": "DRAM read (B)",
         "dram__bytes_write.sum": "DRAM write (B)", "lts__t_bytes.sum": "L2 bytes", "l1tex__t_bytes.sum": "L1 bytes",
         "lts__t_sector_hit_rate.pct": "L2 hit %", "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM % of peak",
         "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved occupancy %",
         "sm__maximum_warps_per_active_cycle_pct": "theoretical occupancy %",
         "launch__registers_per_thread": "registers/thread",
         "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue active %",
         "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": "FMA pipe %",
         "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "smem load bank conflicts",
         "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": "smem store bank conflicts"}
SHORT.update({"smsp__inst_executed.sum": "warp instructions", "launch__waves_per_multiprocessor": "waves",
              "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": "FFMA (thread)",
              "smsp__sass_thread_inst_executed_op_integer_pred_on.sum": "integer (thread)",
              "launch__occupancy_limit_registers": "block limit (registers)",
              "launch__occupancy_limit_shared_mem": "block limit (shared memory)"})
SHORT.update({STALL_PREFIX + r + STALL_SUFFIX: f"stall {r}" for r in STALL_REASONS})


class ProfileError(RuntimeError):
    pass


def find_ncu() -> str | None:
    """ncu on PATH, or in the usual CUDA / Nsight Compute install folders."""
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda-*/bin/ncu"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


def ncu_command(ncu: str, metrics, child_args, *, python: str | None = None,
                module: str = "kernels_src.tools.profile --child") -> list[str]:
    """ncu running ``python -m <module> <child_args>`` (a child that brackets what it wants measured with
    cuProfilerStart/Stop)."""
    return [ncu, "--csv", "--page", "raw", "--print-units", "base", "--print-kernel-base", "function",
            "--profile-from-start", "off", "--clock-control", "none", "--cache-control", "all",
            "--metrics", ",".join(metrics), python or sys.executable, "-m", *module.split(), *child_args]


def _number(text: str):
    t = text.strip().replace(",", "")
    if t in ("", "n/a", "N/A"):
        return None
    try:
        v = float(t)
    except ValueError:
        return text.strip()
    return int(v) if v.is_integer() and "." not in t else v


def parse_csv(text: str, metrics) -> list[dict]:
    """The kernels of ncu's ``--csv --page raw`` output: [{'name': ..., metric: value}] (units row skipped)."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header, out = rows[0], []
    if "Kernel Name" not in header:
        raise ProfileError(f"unexpected ncu CSV header: {header[:6]}")
    name_col = header.index("Kernel Name")
    for r in rows[1:]:
        if len(r) != len(header) or r[0] in ("", "ID") or not r[0].strip().isdigit():
            continue  # the units row has an empty ID
        k = {"name": r[name_col]}
        for m in metrics:
            if m in header:
                k[m] = _number(r[header.index(m)])
        out.append(k)
    return out


def aggregate(kernels: list[dict], metrics) -> dict:
    """One row for a call that launched ``kernels`` (see the module docstring for the rules)."""
    if not kernels:
        return {}
    total = {"kernels": len(kernels)}
    dur = [k.get(DURATION) or 0 for k in kernels]
    longest = kernels[max(range(len(kernels)), key=lambda i: dur[i])]
    for m in metrics:
        vals = [(k.get(m), d) for k, d in zip(kernels, dur) if isinstance(k.get(m), (int, float))]
        if not vals:
            continue
        if m.startswith("launch__"):
            total[m] = longest.get(m)
        elif m.endswith(".sum"):
            total[m] = sum(v for v, _ in vals)
        else:  # pct / ratio: weighted by duration
            w = sum(d for _, d in vals)
            total[m] = sum(v * d for v, d in vals) / w if w else sum(v for v, _ in vals) / len(vals)
    return total


def _bad_metrics(output: str, metrics) -> list[str]:
    """Metrics that ncu says it does not know (their names appear on an ==ERROR== / ==WARNING== line)."""
    bad = []
    for line in output.splitlines():
        if "==ERROR==" in line or "==WARNING==" in line:
            bad += [m for m in metrics if m in line and m not in bad]
    return bad


def profile_variant(op_name: str, variant: str, size, *, metrics, dtype="float32", ncu=None, runner=None,
                    timeout=300) -> tuple[list[dict], list[str]]:
    """(kernels, dropped metrics) for one call of ``variant``. Metrics ncu rejects are dropped and retried."""
    ncu = ncu or find_ncu()
    if not ncu:
        raise ProfileError("ncu (Nsight Compute) was not found on PATH or in /usr/local/cuda/bin; it comes with "
                           "the CUDA toolkit or the Nsight Compute installer")
    runner = runner or (lambda cmd: subprocess.run(cmd, capture_output=True, text=True, timeout=timeout))
    metrics, dropped = list(metrics), []
    child = [op_name, variant, "x".join(map(str, size)), dtype]
    for _ in range(4):
        proc = runner(ncu_command(ncu, metrics, child))
        output = (proc.stdout or "") + "\n" + (proc.stderr or "")
        kernels = parse_csv(proc.stdout or "", metrics) if proc.returncode == 0 else []
        if proc.returncode == 0 and kernels:
            return kernels, dropped
        bad = _bad_metrics(output, metrics)
        if not bad:
            tail = "\n".join(output.strip().splitlines()[-15:])
            raise ProfileError(f"ncu on {op_name}/{variant} at {size} "
                               f"{'profiled no kernel' if proc.returncode == 0 else 'failed'}:\n{tail}")
        dropped += bad
        metrics = [m for m in metrics if m not in bad]
    raise ProfileError(f"ncu kept rejecting metrics for {op_name}/{variant}: {dropped}")


def profile(op_name: str, variants=None, size=None, *, metric_set="memory", extra_metrics=(), dtype="float32",
            ncu=None, runner=None, progress=True, log=print) -> dict:
    """Profile each GPU variant of ``op_name`` at ``size``; return the JSON-able summary. ``extra_metrics``
    are ncu metric names added to the set (see ``ncu --query-metrics``)."""
    from .. import bench, device
    from ..registry import get_op

    op = get_op(op_name)
    gpu = [v for v in op.variants if v.backend == "gpu"]
    names = list(variants) if variants else [v.name for v in gpu]
    unknown = sorted(set(names) - {v.name for v in gpu})
    if unknown:
        raise KeyError(f"{op_name}/gpu has no variant(s) {unknown}; known: {[v.name for v in gpu]}")
    if size is None:
        size = tuple(bench.default_bench_sizes(op, "gpu")[-1])
    metrics = tuple(dict.fromkeys(COMMON + METRIC_SETS[metric_set] + tuple(extra_metrics)))
    res = {"op": op_name, "size": list(size), "size_label": op.size_label(tuple(size)), "dtype": dtype,
           "set": metric_set, "metrics": list(metrics), "dropped": [], "meta": bench.environment(),
           "variants": {}}
    it = names
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(names, desc=f"ncu {op_name}", unit="variant")
    for name in it:
        v = next(v for v in gpu if v.name == name)
        ok, why = v.available() if not device.SIMULATED else (True, "")
        if not ok:
            res["variants"][name] = {"skipped": why}
            continue
        kernels, dropped = profile_variant(op_name, name, size, metrics=metrics, dtype=dtype, ncu=ncu, runner=runner)
        res["dropped"] = sorted(set(res["dropped"]) | set(dropped))
        res["variants"][name] = {"kernels": kernels, "total": aggregate(kernels, metrics)}
        if log:
            t = res["variants"][name]["total"]
            log(f"{name}: {t.get('kernels')} kernel(s), {t.get(DURATION, 0) / 1e3:.1f} us")
    return res


def table(result: dict, columns=None, variants=None, scale=None) -> str:
    """A markdown table of the totals: one row per variant, ``columns`` (ncu names) as the columns.
    ``scale`` maps a metric to (divisor, header), e.g. {"dram__bytes_read.sum": (2**20, "DRAM read (MiB)")}."""
    scale = scale or {}
    rows = [(n, r["total"]) for n, r in result["variants"].items() if "total" in r and (not variants or n in variants)]
    columns = columns or [m for m in result["metrics"] if any(m in t for _, t in rows)]
    heads = [scale[m][1] if m in scale else SHORT.get(m, m) for m in columns]
    out = ["| variant | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(columns)]
    for name, t in rows:
        cells = []
        for m in columns:
            v = t.get(m)
            if v is None:
                cells.append("–")
                continue
            v = v / scale[m][0] if m in scale else v
            cells.append(f"{v:,.0f}" if abs(v) >= 100 or float(v).is_integer() else f"{v:.2f}")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def stall_breakdown(result: dict, variant: str, top: int = 5) -> list[tuple[str, float]]:
    """The ``top`` stall reasons of a variant (warps stalled per issued instruction), largest first.
    "selected" (the warp that issued) is not a stall and is left out."""
    t = result["variants"][variant]["total"]
    pairs = [(r, t[STALL_PREFIX + r + STALL_SUFFIX]) for r in STALL_REASONS
             if r != "selected" and STALL_PREFIX + r + STALL_SUFFIX in t]
    return sorted(pairs, key=lambda p: -p[1])[:top]


def _child(op_name: str, variant: str, size_text: str, dtype: str) -> int:
    """Run in ncu: warm up, then one profiled call."""
    from .. import bench, device
    from ..registry import get_op

    op = get_op(op_name)
    v = next(v for v in op.variants if v.backend == "gpu" and v.name == variant)
    size = tuple(int(s) for s in size_text.split("x"))
    args = bench._prepare(op, size, dtype, "gpu", 1)[0]
    for _ in range(2):
        v.fn(*args)
    device.synchronize()
    start, stop = (getattr(device.cuda, f, lambda: None) for f in ("profile_start", "profile_stop"))  # sim: none
    start()
    v.fn(*args)
    device.synchronize()
    stop()
    return 0


def add_parser(sub) -> None:
    s = sub.add_parser("profile", help="Nsight Compute counters (DRAM bytes, stalls, bank conflicts) per variant")
    s.add_argument("op")
    s.add_argument("--size", help="one size, e.g. 16384x4096 (default: the op's largest benchmark size)")
    s.add_argument("--variants", help="comma-separated GPU variant names (default: all)")
    s.add_argument("--set", dest="metric_set", choices=sorted(METRIC_SETS), default="memory")
    s.add_argument("--metrics", help="extra ncu metric names, comma-separated (ncu --query-metrics lists them)")
    s.add_argument("--dtype", default="float32")
    s.add_argument("--json", help="write the summary to this file")
    s.add_argument("-q", "--quiet", action="store_true")
    s.set_defaults(func=cmd_profile)


def cmd_profile(args) -> int:
    from .. import device
    from ..bench import save_json
    from ..usage import UsageError, check_dtype, check_sizes, op_named, output_file, parse_sizes, variant_names

    op = op_named(args.op)
    if args.variants:
        variant_names(op, "gpu", args.variants)
    variant_names(op, "gpu", [])  # an op with no GPU variant has nothing to profile
    sizes = check_sizes(op, parse_sizes(args.size), "bench")
    if sizes and len(sizes) != 1:
        raise UsageError(f"--size takes one size, not {len(sizes)}")
    check_dtype(args.dtype, {d for v in op.variants if v.backend == "gpu" for d in v.dtypes},
                f"the GPU variants of {op.name}")
    out = output_file(args.json)
    if device.SIMULATED or not device.GPU_VARIANTS_RUN:
        print(f"kernels profile: error: profiling needs a real NVIDIA GPU and ncu "
              f"({device.REASON or 'the CUDA simulator is on'})", file=sys.stderr)
        return 2
    try:
        res = profile(args.op, args.variants.split(",") if args.variants else None, sizes[0] if sizes else None,
                      metric_set=args.metric_set, extra_metrics=tuple(filter(None, (args.metrics or "").split(","))),
                      dtype=args.dtype, progress=not args.quiet)
    except ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(res, columns=[m for m in res["metrics"] if m in SHORT][:8]))
    if res["dropped"]:
        print(f"ncu did not know these metrics (left out): {', '.join(res['dropped'])}")
    if out:
        print(f"wrote {save_json(res, out)}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        sys.exit(_child(*sys.argv[2:]))
    print("usage: python -m kernels_src profile OP ... (this module's --child mode is for ncu)", file=sys.stderr)
    sys.exit(2)
