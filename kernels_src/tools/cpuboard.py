"""The CPU scoreboard: every op's best CPU rung against torch on the CPU and the NumPy formula, in one run.

    kernels cpuboard [--ops a,b] [--out DIR] [--again] [--largest]
    kernels cpuboard --asm [--ops a,b] [--out DIR]     (no timing: the best rungs' machine code, see asm_run)

For each op with course CPU rungs, ``bench`` runs every CPU variant at the op's CPU bench sizes and writes
DIR/<op>_cpu.json (DIR defaults to book/data/bench/cpu/<this machine>, named by its CPU model and core count).
Then, at the largest size, the scoreboard takes the fastest course rung and sets it beside the baselines
measured in the same run: the NumPy formula (``numpy``) and torch on the CPU (``torch``, where installed), and,
for memory-bound ops, the fraction of the machine's parallel copy bandwidth (also measured in that run).

``--again`` times the best rung and the baselines a second time (a second pass over every op, after the
first), so the scoreboard says how far apart two runs are. Everything goes to DIR/cpuboard.json, from which
the book draws its CPU scoreboard (kernels_src/figures/cpu.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

# Registered CPU "variants" that model or demonstrate rather than compute an op's output at speed.
NOT_KERNELS = {"decode_time_prediction", "attention_causal_speedup", "fp16_update_vanishes"}


def board_ops(wanted=None) -> list:
    from ..registry import ops

    out = []
    for op in ops():
        if op.name in NOT_KERNELS or (wanted and op.name not in wanted):
            continue
        if any(v.backend == "cpu" and not v.baseline for v in op.variants):
            out.append(op)
    if wanted:
        missing = set(wanted) - {o.name for o in out}
        if missing:
            raise KeyError(f"no CPU rungs to score for {sorted(missing)}")
    return out


def _largest(result: dict) -> tuple:
    import numpy as np

    sizes = {tuple(r["size"]) for r in result["rows"] if "median_s" in r}
    return max(sizes, key=lambda s: float(np.prod(s)))


def summarize(result: dict) -> dict:
    """One scoreboard row from one op's bench result: the best course rung at the largest size, the
    baselines beside it, and the ratios (> 1: the course is faster)."""
    size = _largest(result)
    at = [r for r in result["rows"] if "median_s" in r and tuple(r["size"]) == size]
    course = [r for r in at if not r["baseline"]]
    base = {r["variant"]: r for r in at if r["baseline"]}
    skipped = {r["variant"]: r["skipped"] for r in result["rows"] if "skipped" in r}
    best = min(course, key=lambda r: r["median_s"])
    row = {"op": result["op"], "kind": result["kind"], "size": list(size), "size_label": best["size_label"],
           "best": best["variant"], "best_rung": best["rung"], "best_s": best["median_s"],
           "best_q1_s": best["q1_s"], "best_q3_s": best["q3_s"], "gbps": best["gbps"], "gflops": best["gflops"],
           "frac_copy": best.get("frac_copy_bw"), "frac_compute": best.get("frac_compute_peak")}
    for name in ("numpy", "torch"):
        b = base.get(name)
        row[f"{name}_s"] = b["median_s"] if b else None
        row[f"vs_{name}"] = b["median_s"] / best["median_s"] if b else None
        if not b:
            row[f"{name}_why"] = skipped.get(name, "no such baseline registered")
    return row


def run(ops_wanted=None, out=None, again: bool = False, progress: bool = True, largest: bool = False) -> dict:
    import numpy as np

    from ..bench import (bench, cpu_slug, default_bench_sizes, environment, format_table, save_json, _median, time_cpu,
                         _prepare)
    from ..paths import BENCH_DATA
    from ..registry import get_op

    from ..compiler import import_torch_first

    import_torch_first()  # before Numba's threads start: see compiler/cpubits.py
    out = Path(out) if out else BENCH_DATA / "cpu" / cpu_slug()
    chosen = board_ops(ops_wanted)
    rows, results = [], {}
    it = chosen
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(chosen, desc="cpuboard", unit="op")
    for op in it:
        # --largest: only the size the board scores (about half the time; the op's JSON then has that size only)
        sizes = [max(default_bench_sizes(op, "cpu"), key=lambda s: float(np.prod(s)))] if largest else None
        res = bench(op.name, "cpu", sizes=sizes, progress=False)
        save_json(res, out / f"{op.name}_cpu.json")
        if not progress:
            print(format_table(res))
        results[op.name] = res
        rows.append(summarize(res))
    if again:  # a second pass, after every op's first: the same variants at the same size
        it = rows
        if progress:
            from tqdm.auto import tqdm

            it = tqdm(rows, desc="again", unit="op")
        for row in it:
            op = get_op(row["op"])
            names = [row["best"]] + [n for n in ("numpy", "torch") if row[f"{n}_s"] is not None]
            args = _prepare(op, tuple(row["size"]), "float32", "cpu", 1)[0]
            for name in names:
                v = next(x for x in op.variants if x.backend == "cpu" and x.name == name)
                t = _median(time_cpu(v.fn, args, min_repeat=5))
                key = "best" if name == row["best"] else name
                row[f"{key}_s_run2"] = t
            first = row["best_s"]
            row["run_spread"] = abs(row["best_s_run2"] - first) / min(first, row["best_s_run2"])
            for n in ("numpy", "torch"):
                if row.get(f"{n}_s_run2"):
                    row[f"vs_{n}_run2"] = row[f"{n}_s_run2"] / row["best_s_run2"]
    board = {"meta": environment(), "peaks": next(iter(results.values()))["peaks"] if results else {},
             "again": again, "largest_only": largest, "rows": rows}
    if ops_wanted:  # a partial run updates the rows it measured and keeps the others
        old_path = out / "cpuboard.json"
        if old_path.exists():
            from ..bench import load_json

            old = load_json(old_path)
            kept = [r for r in old["rows"] if r["op"] not in {x["op"] for x in rows}]
            if kept:  # the board's header stays the full run's; each row keeps the fractions of its own run
                board["rows"] = sorted(kept + rows, key=lambda r: r["op"])
                board["meta"], board["peaks"] = old["meta"], old["peaks"]
                board["reruns"] = old.get("reruns", []) + [{"ops": [r["op"] for r in rows],
                                                            "date": environment()["date"],
                                                            "copy_gbps": results[rows[0]["op"]]["peaks"].get("copy_gbps")}]
    save_json(board, out / "cpuboard.json")
    return board


def asm_run(out=None, ops_wanted=None, progress: bool = True, fma: bool = True) -> dict:
    """``kernels cpuboard --asm``: no timing. For the best rung of every op on DIR/cpuboard.json, the instruction
    counts of its compiled code (kernels_src/tools/asm.py, with the hot loop's counts per element) and the op's
    byte model at the board's size (bytes read and written), written to DIR/cpuboard_asm.json. Also the FMA
    peak of one core and of all threads at once (tools/fmapeak.py, a second or two of register-only FMAs;
    skipped without AVX-512): the yardstick the GEMM rows and the vector-port model are read against. The
    book's "where the CPU path still loses" table (chapter 1) reads this file."""
    from ..bench import cpu_slug, environment, load_json, save_json
    from ..paths import BENCH_DATA
    from . import asm

    out = Path(out) if out else BENCH_DATA / "cpu" / cpu_slug()
    path = out / "cpuboard.json"
    if not path.exists():
        raise FileNotFoundError(f"cpuboard --asm reads the scoreboard {path}, which does not exist: run "
                                f"`kernels cpuboard` first, or name the folder that holds it with --out")
    board = load_json(path)
    rows = board["rows"]
    if ops_wanted:
        have = {r["op"] for r in rows}
        missing = sorted(set(ops_wanted) - have)
        if missing:
            raise KeyError(f"not on the scoreboard {path}: {missing}")
        rows = [r for r in rows if r["op"] in ops_wanted]
    found, copy = asm.board_asm(rows, progress=progress)
    for r, f in zip(rows, found):
        f["kind"] = r["kind"]
        f["size"] = r["size"]
    from .fmapeak import fma_peak, fma_peak_all

    peak = {}
    for key, fn in (("fma_peak_core", fma_peak), ("fma_peak_all", fma_peak_all)):
        if not fma:  # (tests: the counts alone)
            peak[key] = {"skipped": "not measured in this run"}
            continue
        try:
            peak[key] = fn(n=5_000_000, repeat=5) or {"skipped": "needs AVX-512, or AVX2 with FMA (tools/fmapeak.py)"}
        except Exception as e:  # noqa: BLE001  the counts stand without it
            peak[key] = {"skipped": f"{type(e).__name__}: {e}"}
    m = board["meta"]
    result = {"meta": environment(), "board": {k: m.get(k) for k in ("date", "cpu_model", "cpu_count", "simd")},
              **peak, "copy_yardstick": copy, "rows": found}
    dest = out / "cpuboard_asm.json"
    if ops_wanted and dest.exists():  # a partial run replaces its ops' rows and keeps the others
        old = load_json(dest)
        kept = [r for r in old["rows"] if r["op"] not in {x["op"] for x in found}]
        result["rows"] = sorted(kept + found, key=lambda r: r["op"])
    save_json(result, dest)
    return result


def format_asm(result: dict) -> str:
    lines = [f"cpuboard --asm on {result['meta'].get('cpu_model', '?')} (the board: "
             f"{result['board'].get('cpu_model', '?')}); FMA peak a core: "
             + (f"{result['fma_peak_core']['gflops']:.0f} GFLOP/s" if "gflops" in result["fma_peak_core"]
                else result["fma_peak_core"].get("skipped", "?")),
             f"{'op':<22} {'best rung':<16} {'hot loop: insns/elem':>21}  what it holds"]
    for r in result["rows"]:
        if "error" in r or "skipped" in r:
            lines.append(f"{r['op']:<22} {r['variant']:<16} {'-':>21}  "
                         + r.get("error", "skipped: " + r.get("skipped", "")))
            continue
        h = r["total"].get("hot_loop")
        ipe = f"{h['per_element']:.2f}" if h else "-"
        what = (f"{h['bits']}-bit, {h['fma']} FMA, {h['broadcasts']} broadcasts, {h['scalar_fp']} scalar"
                if h else "no loop")
        lines.append(f"{r['op']:<22} {r['variant']:<16} {ipe:>21}  {what}")
    return "\n".join(lines)


def format_board(board: dict) -> str:
    m = board["meta"]
    lines = [f"CPU scoreboard: {m.get('cpu_model', '?')}, {m.get('cpu_count', '?')} cores, "
             f"{m.get('cpu_threads', '?')} threads; copy {board['peaks'].get('copy_gbps', 0):.1f} GB/s",
             f"{'op':<22} {'size':<22} {'best rung':<16} {'median':>10} {'vs numpy':>9} {'vs torch':>9} "
             f"{'% copy':>7} {'2nd run':>8}"]
    from ..bench import fmt_time

    def ratio(x):
        return f"{x:.2f}x" if x else "-"

    def pct(x, digits=0):
        return f"{100 * x:.{digits}f}%" if x is not None else "-"

    for r in board["rows"]:
        lines.append(f"{r['op']:<22} {r['size_label']:<22} {r['best']:<16} {fmt_time(r['best_s']):>10} "
                     f"{ratio(r['vs_numpy']):>9} {ratio(r['vs_torch']):>9} {pct(r.get('frac_copy')):>7} "
                     f"{pct(r.get('run_spread'), 1):>8}")
    return "\n".join(lines)


def add_parser(sub) -> None:
    s = sub.add_parser("cpuboard", help="every op's best CPU rung against torch (CPU) and NumPy, in one run")
    s.add_argument("--ops", help="comma-separated op names (default: every op with CPU rungs)")
    s.add_argument("--out", help="folder for the JSON, new or not, in a folder that exists (default: "
                   "book/data/bench/cpu/<this machine>)")
    s.add_argument("--again", action="store_true", help="time the best rung and the baselines a second time")
    s.add_argument("--largest", action="store_true", help="time only the size the board scores (each op's largest "
                   "CPU bench size), not the whole sweep: about half the time")
    s.add_argument("--asm", action="store_true", help="no timing: count the machine code of each op's best rung "
                   "on DIR/cpuboard.json and write DIR/cpuboard_asm.json (with the ops' byte models)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar; print each op's table")
    s.set_defaults(func=cmd_cpuboard)


def cmd_cpuboard(args) -> int:
    from ..usage import UsageError, names, op_named, output_dir

    wanted = names(args.ops)
    scored = [o.name for o in board_ops()]
    for name in wanted or []:
        op_named(name)
        if name not in scored:
            raise UsageError(f"{name} has no CPU rungs to score; ops that have: {', '.join(scored)}")
    out = output_dir(args.out)
    if args.asm:
        if args.again:
            raise UsageError("--asm times nothing; --again is for a timed run")
        try:
            result = asm_run(out, wanted, progress=not args.quiet)
        except (FileNotFoundError, KeyError) as e:
            raise UsageError(str(e).strip("'\"")) from None
        print(format_asm(result))
        bad = [r["op"] for r in result["rows"] if "error" in r]
        if bad:
            print(f"cpuboard --asm: {len(bad)} op(s) failed to compile or count: {', '.join(bad)}", file=sys.stderr)
            return 1
        return 0
    board = run(wanted, out, args.again, progress=not args.quiet, largest=args.largest)
    print(format_board(board))
    return 0
