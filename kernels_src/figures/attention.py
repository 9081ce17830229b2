"""Figures, widgets and GPU measurement drivers for chapter 9 (attention).

- ``score_memory(S, ...)``: bytes of the S x T score matrix against what a flash kernel keeps;
- ``flash_trace(q, k, v, BC)``: the flash loop of one query row, tile by tile (running max, sum, output);
- ``attention_widget()``: a heat map of P with causal/padding toggles and a step-through of the flash loop;
- ``sweep(...)`` and ``peak_memory(...)``: drivers run on the H100 (tile-shape sweep of the flash kernel;
  device memory of rung 1 against rung 3 at a long sequence), writing JSON under book/data/bench/h100/.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..paths import BENCH_DATA
from ..ops import attention as A


# ----------------------------------------------------------------------------- memory (analytic)
def score_memory(S, B=1, H=16, D=64, itemsize=4, BR=64, BC=32):
    """Bytes per forward call: the score matrix (B*H*S*S) versus Q, K, V, O, L, versus what one flash
    block keeps on chip (its Q tile, one K and V tile, and the running statistics)."""
    S = np.asarray(S, dtype=np.float64)
    scores = B * H * S * S * itemsize
    qkvo = 4 * B * H * S * D * itemsize + B * H * S * itemsize
    block = (BR * D + 2 * BC * D + BR * BC + 2 * BR) * itemsize
    return {"scores": scores, "qkvo": qkvo, "flash_block": np.full_like(S, block)}


# ------------------------------------------------------------------------------ the flash loop
def flash_trace(q, k, v, BC, lim=None):
    """The flash recurrence for ONE query row q (D,) over keys k, v (T,D) in tiles of BC keys.

    Returns a list with one dict per tile: the tile's scores, the running max m, the running sum l, the
    rescale factor alpha applied to the old state, and the unnormalized output o (D,) after the tile,
    plus o / l (the output if the loop stopped here). ``lim``: keys >= lim are masked."""
    D = q.shape[0]
    T = k.shape[0]
    lim = T if lim is None else lim
    s_all = (k @ q) / math.sqrt(D)
    s_all = np.where(np.arange(T) < lim, s_all, -np.inf)
    m, l, o = -np.inf, 0.0, np.zeros(D)
    steps = []
    for j0 in range(0, T, BC):
        s = s_all[j0:j0 + BC]
        m_new = max(m, float(np.max(s)))
        if m_new == -np.inf:
            alpha, p = 1.0, np.zeros_like(s)
        else:
            alpha = math.exp(m - m_new) if m > -np.inf else 0.0
            p = np.exp(s - m_new)
        l = l * alpha + float(p.sum())
        o = o * alpha + p @ v[j0:j0 + BC]
        m = m_new
        steps.append({"j0": j0, "scores": s.copy(), "m": m, "l": l, "alpha": alpha, "o": o.copy(),
                      "out": o / l if l > 0 else np.zeros(D)})
    return steps


def draw_attention(q, k, v, BC, causal, kv_len, row, tile):
    """One frame of the widget: P with the loaded tile outlined, the running statistics up to ``tile``,
    and the output o / l after that tile next to the final output."""
    import matplotlib.pyplot as plt

    S, T, D = q.shape[2], k.shape[2], q.shape[3]
    kv = np.array([kv_len], dtype=np.int32)
    o_ref, lse = A.reference(q, k, v, kv, int(causal))
    s = A.scores_reference(q, k, v, kv, int(causal))[0, 0]
    L = lse[0, 0]
    p = np.where(np.isfinite(L)[:, None], np.exp(s - np.where(np.isfinite(L), L, 0.0)[:, None]), 0.0)
    i = row
    lim = min(kv_len, i + T - S + 1) if causal else kv_len
    steps = flash_trace(q[0, 0, i], k[0, 0], v[0, 0], BC, lim)
    n = min(tile, len(steps) - 1) + 1
    st = steps[n - 1]
    # 9.5 in: the page shows it at about 0.8 of its size; legends below the panels, never over a point
    fig, ax = plt.subplots(1, 3, figsize=(9.5, 4.4), gridspec_kw={"width_ratios": [1.1, 1, 1]})
    ax[0].imshow(p, cmap="viridis", vmin=0, vmax=max(float(p.max()), 1e-9), aspect="auto")
    ax[0].add_patch(plt.Rectangle((st["j0"] - 0.5, i - 0.5), BC, 1, fill=False, ec="red", lw=2))
    for j0 in range(BC, T, BC):
        ax[0].axvline(j0 - 0.5, color="w", lw=0.5)
    ax[0].set(xlabel="key j", ylabel="query i")
    ax[0].set_title("P = softmax(scores);\nred: the tile just loaded", fontsize=10)
    ms = [x["m"] for x in steps[:n]]
    ls = [x["l"] for x in steps[:n]]
    ax[1].plot(range(n), ms, "o-", label="running max m")
    ax[1].plot(range(n), ls, "s-", label="running sum l (relative to m)")
    ax[1].set(xlim=(-0.5, len(steps) - 0.5), xlabel="tile")
    ax[1].set_title("row statistics\nafter each tile", fontsize=10)
    below = dict(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    ax[1].legend(**below)
    ax[2].bar(np.arange(D) - 0.2, st["out"], width=0.4, label="o / l after this tile")
    ax[2].bar(np.arange(D) + 0.2, o_ref[0, 0, i], width=0.4, label="final O (reference)")
    ax[2].set(xlabel="d")
    ax[2].set_title(f"row {i}:\noutput after tile {n - 1}", fontsize=10)
    ax[2].legend(**below)
    fig.tight_layout()
    return fig


def attention_widget(S=24, T=24, D=8, BC=6, seed=0):
    """Heat map of P (B = H = 1) with causal and padding toggles, and a step-through of the flash loop
    for one chosen query row: which key tile is loaded, and m, l, o after it."""
    import matplotlib.pyplot as plt

    from .controls import interact

    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 1, S, D)) * 1.5
    k = rng.standard_normal((1, 1, T, D)) * 1.5
    v = rng.standard_normal((1, 1, T, D))

    def show(causal=True, kv_len=T, row=S - 1, tile=0):
        draw_attention(q, k, v, BC, causal, kv_len, row, tile)
        plt.show()

    return interact(show, lambda W: dict(
        causal=W.Checkbox(value=True, description="causal"),
        kv_len=W.IntSlider(value=T, min=0, max=T, description="kv_len"),
        row=W.IntSlider(value=S - 1, min=0, max=S - 1, description="query row"),
        tile=W.IntSlider(value=0, min=0, max=math.ceil(T / BC) - 1, description="tile")),
        action="toggle the mask and move the sliders", labels={"row": "query row"})


# ------------------------------------------------------------------------- the ladder table
def prediction(doc):
    """The sentence of a rung's docstring that starts with "Predict" (the registry holds the predictions)."""
    text = " ".join(doc.split())
    for sent in text.replace("; ", ". ").split(". "):
        if sent.strip().startswith("Predict"):
            return sent.strip().rstrip(".") + "."
    return "–"


def ladder_rows(result, D=64):
    """Per variant: time non-causal and causal, TFLOP/s, fraction of cuBLAS, and speed against SDPA."""
    from ..registry import get_variant

    t = {}
    for r in result["rows"]:
        if "median_s" in r and r["size"][5] == D:
            t.setdefault(r["variant"], {})[r["size"][6]] = r
    base = {m: t["sdpa_math"][m]["median_s"] for m in (0, 1)} if "sdpa_math" in t else None
    dflt = {m: t["sdpa_default"][m]["median_s"] for m in (0, 1)} if "sdpa_default" in t else None
    out = []
    for name, rs in t.items():
        v = get_variant(f"{result['op']}/gpu/{name}")
        row = {"variant": name, "rung": v.rung, "baseline": v.baseline, "summary": v.summary,
               "prediction": prediction(v.doc) if not v.baseline else "–"}
        for m in (0, 1):
            if m in rs:
                row[f"t{m}"] = rs[m]["median_s"]
                row[f"tflops{m}"] = rs[m]["gflops"] / 1e3
                row[f"frac{m}"] = rs[m].get("frac_compute_peak")
                if base:
                    row[f"vs_math{m}"] = base[m] / rs[m]["median_s"]
                if dflt:
                    row[f"vs_default{m}"] = dflt[m] / rs[m]["median_s"]
        if 0 in rs and 1 in rs:
            row["causal_speedup"] = rs[0]["median_s"] / rs[1]["median_s"]
        out.append(row)
    return out


def ladder_table(result, D=64):
    from ..bench import fmt_time

    lines = ["| rung | variant | what changed | predicted | non-causal | causal | TFLOP/s (n-c / c) | "
             "% of cuBLAS FP32 (n-c) | vs SDPA math (n-c / c) | causal speed-up |", "|" + "---|" * 10]
    for r in ladder_rows(result, D):
        lines.append("| " + " | ".join([
            "baseline" if r["baseline"] else str(r["rung"]), f"`{r['variant']}`", r["summary"], r["prediction"],
            fmt_time(r["t0"], "µs"), fmt_time(r["t1"], "µs"), f"{r['tflops0']:.1f} / {r['tflops1']:.1f}",
            f"{100 * r['frac0']:.1f} %", f"{r['vs_math0']:.2f}× / {r['vs_math1']:.2f}×",
            f"{r['causal_speedup']:.2f}×"]) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------- H100 drivers (real GPU)
SWEEP = {64: [dict(BR=64, BC=32, TM=8, TN=4), dict(BR=64, BC=48, TM=8, TN=6), dict(BR=64, BC=32, TM=4, TN=4),
              dict(BR=32, BC=64, TM=4, TN=8), dict(BR=64, BC=32, TM=8, TN=2), dict(BR=64, BC=16, TM=8, TN=2),
              dict(BR=32, BC=32, TM=4, TN=4), dict(BR=64, BC=24, TM=8, TN=3)],
         128: [dict(BR=32, BC=16, TM=4, TN=2), dict(BR=32, BC=24, TM=4, TN=3), dict(BR=32, BC=16, TM=2, TN=2),
               dict(BR=16, BC=32, TM=2, TN=4), dict(BR=32, BC=8, TM=4, TN=1)]}


def sweep(out=None, B=4, H=16, S=2048, heads=(64, 128), repeat=10):
    """Time the causal-skipping flash kernel for each tile shape in SWEEP (causal and not) on the GPU."""
    from .. import bench, device

    cuda = device.cuda
    rows = []
    for D in heads:
        for mask in (0, 1):
            size = (B, H, H, S, S, D, mask)
            q, k, v, kv, causal = A.make_inputs(size, np.float32, np.random.default_rng(0))
            args = [cuda.to_device(a) for a in (q, k, v, kv)]
            o = cuda.device_array(q.shape, np.float32)
            lse = cuda.device_array(q.shape[:3], np.float32)
            for cfg in SWEEP[D]:
                try:
                    launch = A.flash(D, skip=True, **cfg)
                    t = bench._median(bench.time_gpu(launch, [(o, lse, *args, causal)], repeat=repeat))
                    rows.append({**cfg, "D": D, "mask": mask, "median_s": t, "threads": launch.config["threads"],
                                 "smem_bytes": launch.config["smem_bytes"], "tflops": A._flops(size) / t / 1e12})
                except Exception as e:  # noqa: BLE001  (a shape that does not fit is a result too)
                    rows.append({**cfg, "D": D, "mask": mask, "error": f"{type(e).__name__}: {e}"[:300]})
                print(rows[-1], flush=True)
    res = {"what": "flash forward (rung 4 kernel) tile sweep", "size": [B, H, H, S, S], "rows": rows,
           "meta": bench.environment()}
    if out:
        bench.save_json(res, out)
    return res


# Rungs 6-7's candidates (kernels_src.ops.attention.make_flash2_kernel keywords) for D = 64: the tile, the
# register tile per thread, blocks asked of the launch bounds (registers <= 65536 / (threads * minblocks)) and
# the unroll of the inner loops.
SWEEP2 = [dict(BR=64, BC=64, TM=8, TN=4, shuffle=True), dict(BR=64, BC=64, TM=8, TN=4, shuffle=True, unroll=1),
          dict(BR=64, BC=64, TM=8, TN=4, shuffle=True, unroll=4), dict(BR=64, BC=64, TM=8, TN=4, shuffle=True, minblocks=3),
          dict(BR=64, BC=32, TM=4, TN=4, shuffle=True), dict(BR=64, BC=32, TM=4, TN=4, shuffle=False),
          dict(BR=64, BC=32, TM=8, TN=4, shuffle=True, minblocks=3), dict(BR=128, BC=32, TM=8, TN=4, shuffle=True, minblocks=2),
          dict(BR=128, BC=32, TM=8, TN=4, shuffle=True, minblocks=3), dict(BR=64, BC=64, TM=8, TN=8, shuffle=True, minblocks=3),
          dict(BR=32, BC=64, TM=4, TN=4, shuffle=True), dict(BR=64, BC=64, TM=4, TN=4, shuffle=True, minblocks=2)]


def sweep2(out=None, B=4, H=16, S=2048, D=64, configs=None, repeat=10):
    """Time rungs 6-7's kernel for each shape in SWEEP2 (causal and not) on the GPU, with its registers per
    thread and its largest difference from rung 4's output on the same inputs (a wrong shape shows up here)."""
    from .. import bench, device

    cuda = device.cuda
    rows = []
    for mask in (0, 1):
        size = (B, H, H, S, S, D, mask)
        q, k, v, kv, causal = A.make_inputs(size, np.float32, np.random.default_rng(0))
        args = [cuda.to_device(a) for a in (q, k, v, kv)]
        o = cuda.device_array(q.shape, np.float32)
        lse = cuda.device_array(q.shape[:3], np.float32)
        A.flash(D, skip=True, **A.FLASH_CFG)(o, lse, *args, causal)
        o_ref = o.copy_to_host()
        for cfg in configs or SWEEP2:
            try:
                launch = A.make_flash2_kernel(D, **cfg)
                t = bench._median(bench.time_gpu(launch, [(o, lse, *args, causal)], repeat=repeat))
                regs = None
                try:
                    regs = int(next(iter(launch.kernel.get_regs_per_thread().values())))
                except Exception:  # noqa: BLE001
                    pass
                err = float(np.max(np.abs(o.copy_to_host() - o_ref)))
                rows.append({**cfg, "D": D, "mask": mask, "median_s": t, "threads": launch.config["threads"],
                             "minblocks": launch.config["minblocks"], "smem_bytes": launch.config["smem_bytes"],
                             "registers": regs, "max_abs_diff_vs_rung4": err, "tflops": A._flops(size) / t / 1e12})
            except Exception as e:  # noqa: BLE001  (a shape that does not fit is a result too)
                rows.append({**cfg, "D": D, "mask": mask, "error": f"{type(e).__name__}: {e}"[:300]})
            print(rows[-1], flush=True)
    res = {"what": "flash forward rungs 6-7 (make_flash2_kernel) shape sweep", "size": [B, H, H, S, S, D],
           "rows": rows, "meta": bench.environment()}
    if out:
        bench.save_json(res, out)
    return res


# Backward rung 2's candidates for D = 64 (keywords of make_dkdv2_kernel / make_dq2_kernel): at D = 64 the side
# whose outputs a block owns is fixed at 32 (BC of dK/dV, BR of dQ); the other side, the threads along keys in
# the score product, the unroll of the accumulations and the blocks asked of the launch bounds vary.
SWEEP_BWD2 = {"dkdv": [dict(BR=32, BC=32, NTX=16), dict(BR=32, BC=32, NTX=8), dict(BR=32, BC=32, NTX=16, unroll=2),
                       dict(BR=32, BC=32, NTX=16, minblocks=3), dict(BR=16, BC=32, NTX=16),
                       dict(BR=16, BC=32, NTX=8, minblocks=5)],
              "dq": [dict(BR=32, BC=32, NTX=8), dict(BR=32, BC=32, NTX=16), dict(BR=32, BC=32, NTX=8, unroll=2),
                     dict(BR=32, BC=32, NTX=8, minblocks=3), dict(BR=32, BC=16, NTX=8),
                     dict(BR=32, BC=16, NTX=8, minblocks=5)]}


def sweep_bwd2(out=None, B=4, H=16, S=2048, D=64, configs=None, repeat=10):
    """Time backward rung 2's dK/dV kernel and dQ kernel separately for each shape in SWEEP_BWD2 (causal and
    not) on the GPU, with registers per thread and the largest difference from rung 1's dK, dV or dQ on the
    same inputs; and the whole rung 2 (pre-pass + both kernels, default tiles) and rung 1 for scale."""
    from .. import bench, device

    cuda = device.cuda
    rows = []
    configs = configs or SWEEP_BWD2
    for mask in (0, 1):
        size = (B, H, H, S, S, D, mask)
        q, k, v, kv, causal = A.make_inputs(size, np.float32, np.random.default_rng(0))
        q, k, v, kvd = (cuda.to_device(a) for a in (q, k, v, kv))
        o = cuda.device_array(q.shape, np.float32)
        lse = cuda.device_array(q.shape[:3], np.float32)
        A.flash(D, skip=True, **A.FLASH_CFG)(o, lse, q, k, v, kvd, causal)
        do = cuda.to_device(np.random.default_rng(1).standard_normal(q.shape).astype(np.float32))
        dq, dk, dv = (cuda.device_array(a.shape, np.float32) for a in (q, k, v))
        full = (dq, dk, dv, do, q, k, v, o, lse, kvd, causal)
        for name, fn in (("flash2", A.attention_bwd_flash2), ("flash2_vec", A.attention_bwd_flash2_vec)):
            t = bench._median(bench.time_gpu(fn, [full], repeat=repeat))
            rows.append({"kernel": "all", "variant": name, "D": D, "mask": mask, "median_s": t,
                         "tflops_useful": 2 * A._flops(size) / t / 1e12})
            print(rows[-1], flush=True)
        A.attention_bwd_flash2(*full)  # rung 1's outputs, the yardstick
        ref = {"dq": dq.copy_to_host(), "dk": dk.copy_to_host(), "dv": dv.copy_to_host()}
        dr = A._scratch("dr", q.shape[:3])  # Dr of these inputs, left by the call above
        for kind, make in (("dkdv", A.make_dkdv2_kernel), ("dq", A.make_dq2_kernel)):
            for cfg in configs[kind]:
                try:
                    launch = make(D, **cfg)
                    args = (dk, dv, do, q, k, v, lse, dr, kvd, causal) if kind == "dkdv" else \
                        (dq, do, q, k, v, lse, dr, kvd, causal)
                    t = bench._median(bench.time_gpu(launch, [args], repeat=repeat))
                    regs = None
                    try:
                        regs = int(next(iter(launch.kernel.get_regs_per_thread().values())))
                    except Exception:  # noqa: BLE001
                        pass
                    got = {"dq": dq} if kind == "dq" else {"dk": dk, "dv": dv}
                    err = max(float(np.max(np.abs(a.copy_to_host() - ref[n]))) for n, a in got.items())
                    rows.append({"kernel": kind, **cfg, "D": D, "mask": mask, "median_s": t,
                                 "threads": launch.config["threads"], "minblocks": launch.config["minblocks"],
                                 "smem_bytes": launch.config["smem_bytes"], "registers": regs,
                                 "max_abs_diff_vs_rung1": err})
                except Exception as e:  # noqa: BLE001  (a shape that does not fit is a result too)
                    rows.append({"kernel": kind, **cfg, "D": D, "mask": mask,
                                 "error": f"{type(e).__name__}: {e}"[:300]})
                print(rows[-1], flush=True)
    res = {"what": "attention backward rung 2 (make_dkdv2_kernel, make_dq2_kernel) shape sweep",
           "size": [B, H, H, S, S, D], "rows": rows, "meta": bench.environment()}
    if out:
        bench.save_json(res, out)
    return res

def peak_memory(out=None, B=1, H=16, S=16384, D=64):
    """Device memory in use after one call of rung 1 (three kernels) and of rung 3 (flash), measured with
    cudaMemGetInfo around the call (inputs and outputs excluded), plus the time of each call."""
    from .. import bench, device

    cuda = device.cuda
    ctx = cuda.current_context()
    size = (B, H, H, S, S, D, 0)
    q, k, v, kv, causal = A.make_inputs(size, np.float32, np.random.default_rng(0))
    args = [cuda.to_device(a) for a in (q, k, v, kv)]
    o = cuda.device_array(q.shape, np.float32)
    lse = cuda.device_array(q.shape[:3], np.float32)
    res = {"size": list(size), "io_bytes": int(sum(a.nbytes for a in args) + o.nbytes + lse.nbytes), "rows": [],
           "meta": bench.environment()}
    for name, fn in (("three_kernels", A.attention_three_kernels), ("flash", A.attention_flash)):
        A.free_workspace()
        ctx.deallocations.clear()
        cuda.synchronize()
        free0 = ctx.get_memory_info()[0]
        t0 = bench._median(bench.time_gpu(fn, [(o, lse, *args, causal)], warmup=1, repeat=3))
        cuda.synchronize()
        free1 = ctx.get_memory_info()[0]
        res["rows"].append({"variant": name, "extra_bytes": int(free0 - free1), "median_s": t0})
        print(res["rows"][-1], flush=True)
    A.free_workspace()
    if out:
        bench.save_json(res, out)
    return res


def load(name):
    """A committed H100 JSON of this chapter (book/data/bench/h100/<name>.json)."""
    p = BENCH_DATA / "h100" / f"{name}.json"
    return json.loads(p.read_text())


def ncu_summary(txt, out=None):
    """Parse the text report of ``ncu --section ...`` into {kernel: {section: {metric: [unit, value]}}}
    and write it as JSON (the chapter reads the JSON; the text stays on the GPU machine)."""
    import re

    res, kern, sec = {"kernels": {}}, None, None
    metric = re.compile(r"^\s{4,}(\S.*?)\s{2,}(\S+)\s+([-\d][\d,\.]*)\s*$")
    for line in Path(txt).read_text(errors="replace").splitlines():
        if re.match(r"^\s{2}\S.*\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", line):
            kern = line.strip()
            res["kernels"][kern] = {}
        elif line.strip().startswith("Section:") and kern:
            sec = line.strip()[len("Section:"):].strip()
            res["kernels"][kern][sec] = {}
        else:
            m = metric.match(line)
            if m and kern and sec:
                res["kernels"][kern][sec][m.group(1)] = [m.group(2), float(m.group(3).replace(",", ""))]
    if out:
        from .. import bench

        bench.save_json(res, out)
    return res


# ------------------------------------------------------------------ Nsight Compute tables (chapters 9 and 10)
_NCU_COLS = (("launch__registers_per_thread", "registers / thread", "{:.0f}"),
             ("launch__occupancy_limit_registers", "blocks / SM by registers", "{:.0f}"),
             ("launch__occupancy_limit_shared_mem", "blocks / SM by shared memory", "{:.0f}"),
             ("sm__maximum_warps_per_active_cycle_pct", "theoretical occupancy %", "{:.1f}"),
             ("sm__warps_active.avg.pct_of_peak_sustained_active", "achieved occupancy %", "{:.1f}"),
             ("launch__waves_per_multiprocessor", "waves", "{:.2f}"),
             ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue slots busy %", "{:.1f}"),
             ("sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active", "FMA pipe busy %", "{:.1f}"),
             ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM % of peak", "{:.1f}"))


def ncu_rows(result) -> dict:
    """Per profiled variant: its ``total`` (kernels/tools/profile.py) plus derived counts: integer instructions
    per FFMA (thread-level), FFMA share of all thread instructions, GPU time in µs, top stall reasons."""
    from ..tools.profile import stall_breakdown

    out = {}
    for name, r in result["variants"].items():
        if "total" not in r:
            continue
        t = dict(r["total"])
        ffma = t.get("smsp__sass_thread_inst_executed_op_ffma_pred_on.sum")
        integer = t.get("smsp__sass_thread_inst_executed_op_integer_pred_on.sum")
        if ffma and integer is not None:
            t["int_per_ffma"] = integer / ffma
        t["time_us"] = t.get("gpu__time_duration.sum", 0) / 1e3
        t["kernel_us"] = [(k["name"].split("[")[0].split("(")[0], k.get("gpu__time_duration.sum", 0) / 1e3)
                          for k in r["kernels"]]
        try:
            t["stalls"] = stall_breakdown(result, name, top=3)
        except KeyError:
            t["stalls"] = []
        out[name] = t
    return out


def ncu_table(result, variants=None) -> str:
    """Markdown: one row per variant with the launch limits, occupancy, instruction mix and top stalls."""
    rows = ncu_rows(result)
    names = [n for n in (variants or rows) if n in rows]
    cols = [c for c in _NCU_COLS if any(c[0] in rows[n] for n in names)]
    head = ["variant", "GPU time (µs)"] + [c[1] for c in cols] + ["integer instr. per FFMA", "top stalls (warps per issue)"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in names:
        t = rows[n]
        cells = [f"`{n}`", f"{t['time_us']:,.1f}"]
        cells += [c[2].format(t[c[0]]) if isinstance(t.get(c[0]), (int, float)) else "–" for c in cols]
        cells.append(f"{t['int_per_ffma']:.2f}" if "int_per_ffma" in t else "–")
        cells.append(", ".join(f"{s} {v:.2f}" for s, v in t["stalls"]) or "–")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def sweep2_table(result) -> str:
    """Markdown of the rungs 6-7 shape sweep: per shape, threads, registers, times and TFLOP/s."""
    by = {}
    for r in result["rows"]:
        if "median_s" not in r:
            continue
        key = (r["BR"], r["BC"], r["TM"], r["TN"], r["shuffle"], r.get("minblocks"), r.get("unroll", 2))
        by.setdefault(key, {"threads": r["threads"], "registers": r.get("registers")})[r["mask"]] = r
    out = ["| BR x BC | per thread | shuffles | blocks asked / SM | unroll | threads | registers | non-causal | causal | "
           "TFLOP/s (n-c) |", "|" + "---|" * 10]
    for (br, bc, tm, tn, sh, mb, un), v in sorted(by.items(), key=lambda kv: kv[1].get(0, {}).get("median_s", 1)):
        t0, t1 = v.get(0, {}).get("median_s"), v.get(1, {}).get("median_s")
        out.append(f"| {br} x {bc} | {tm} x {tn} | {'yes' if sh else 'no'} | {mb} | {un} | {v['threads']} | "
                   f"{v['registers']} | {t0 * 1e3:.2f} ms | {t1 * 1e3:.2f} ms | {v[0]['tflops']:.1f} |")
    return "\n".join(out)
