"""Pictures and numbers for chapters 4-5 (GEMV, GEMM): the tile-size explorer, the per-rung tables.

Nothing here times anything. Measured numbers come from the committed benchmark JSON under
book/data/bench/ (see :mod:`kernels_src.plots`); the code-generation evidence (PTX, SASS counts) from
book/data/gemm_codegen.json, written by ``kernels_src.tools.gemm.write_codegen_evidence``.
"""
from __future__ import annotations

import json

import numpy as np

from ..paths import BENCH_DATA

DATA = BENCH_DATA.parent  # book/data: bench/ and the codegen evidence
ITEM = 4  # float32
H100_SMS = 132
REGS_PER_SM = 65536
SMEM_PER_SM = 228 * 1024  # bytes of shared memory per SM on the H100/H200 (sm_90)


def tile_stats(BM=128, BN=128, BK=8, TM=8, TN=8, M=4096, N=4096, K=4096, dbuf=True, sms=H100_SMS) -> dict:
    """What a BM x BN x BK block tile with TM x TN register tiles implies, from counting alone.

    - threads: one per TM x TN register tile, (BM/TM) * (BN/TN).
    - shared memory: an A tile (BK x BM) and a B tile (BK x BN), twice if double-buffered.
    - registers: TM*TN accumulators + TM + TN operands + this thread's share of the next tile, plus
      about 30 for indices and addresses (the compiler's real count is in the chapter's table).
    - global intensity: a block does 2*BM*BN*BK FLOPs per (BM + BN)*BK elements it loads, so
      BM*BN / (2*(BM + BN)) FLOP per byte (float32); re-use: each A element loaded is used BN times.
    - shared intensity: per k a thread loads TM + TN values and does TM*TN FMAs.
    """
    nt = (BM // TM) * (BN // TN)
    smem = (BM + BN) * BK * ITEM * (2 if dbuf else 1)
    ld_share = (BM + BN) * BK // max(nt, 1)
    regs = TM * TN + TM + TN + ld_share + 30
    blocks = -(-M // BM) * -(-N // BN)
    by_regs = REGS_PER_SM // max(regs * nt, 1)
    by_smem = SMEM_PER_SM // max(smem, 1)
    by_threads = 2048 // max(nt, 1)
    per_sm = max(0, min(by_regs, by_smem, by_threads, 32))
    return {
        "threads": nt, "smem_bytes": smem, "regs_est": regs,
        "flop_per_byte_global": 2 * BM * BN / (ITEM * (BM + BN)),  # per tile step, ignoring C
        "reuse_A": BN, "reuse_B": BM,
        "smem_loads_per_fma": (TM + TN) / (TM * TN),
        "blocks": blocks, "blocks_per_sm": per_sm,
        "waves": blocks / max(per_sm * sms, 1),
        "limit": min((("registers", by_regs), ("shared memory", by_smem), ("threads", by_threads)),
                     key=lambda t: t[1])[0],
        "global_bytes": (M * K * -(-N // BN) + K * N * -(-M // BM) + M * N) * ITEM,
    }


def draw_tiles(BM=128, BN=128, BK=8, TM=8, TN=8, M=1024, N=1024, K=1024, k_step=3, axes=None):
    """Which tiles one block loads: its BM-row strip of A, BK-column slice highlighted; its BN-column
    strip of B, BK-row slice highlighted; its BM x BN tile of C, with one thread's TM x TN patch."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    if axes is None:
        # 8.2 in: shown on the page at about 0.85 of its size, labels at 8-9 pt stay at 9 px or more
        fig, axes = plt.subplots(1, 3, figsize=(8.2, 3.9), gridspec_kw={"width_ratios": [K, N, N]})
    axA, axB, axC = axes
    bi, bj = min(1, -(-M // BM) - 1), min(2, -(-N // BN) - 1)  # the block we follow
    k0 = min(k_step * BK, max(K - BK, 0))

    def frame(ax, w, h, title):
        ax.add_patch(Rectangle((0, 0), w, h, fill=False, lw=1.2))
        ax.set_xlim(-w * 0.02, w * 1.02)
        ax.set_ylim(h * 1.02, -h * 0.02)
        ax.set_aspect("equal")
        ax.set_title(title, fontsize=10)
        ax.tick_params(labelsize=8)

    frame(axA, K, M, f"A ({M}x{K})")
    axA.add_patch(Rectangle((0, bi * BM), K, BM, color="tab:blue", alpha=0.25, lw=0))
    axA.add_patch(Rectangle((k0, bi * BM), BK, BM, color="tab:blue", alpha=0.9, lw=0))
    frame(axB, N, K, f"B ({K}x{N})")
    axB.add_patch(Rectangle((bj * BN, 0), BN, K, color="tab:orange", alpha=0.25, lw=0))
    axB.add_patch(Rectangle((bj * BN, k0), BN, BK, color="tab:orange", alpha=0.9, lw=0))
    frame(axC, N, M, f"C ({M}x{N}): block ({bi},{bj})\nand one thread")
    for x in range(0, N + 1, BN):
        axC.axvline(x, color="0.85", lw=0.5)
    for y in range(0, M + 1, BM):
        axC.axhline(y, color="0.85", lw=0.5)
    axC.add_patch(Rectangle((bj * BN, bi * BM), BN, BM, color="tab:green", alpha=0.35, lw=0))
    axC.add_patch(Rectangle((bj * BN + 2 * TN, bi * BM + TM), TN, TM, color="tab:red", lw=0))
    st = tile_stats(BM, BN, BK, TM, TN, M, N, K)
    axA.set_xlabel(f"dark: the BK={BK} slice in\nshared memory at step {k_step}", fontsize=9)
    axB.set_xlabel(f"each B element is used\nby {BM} rows of the block", fontsize=9)
    axC.set_xlabel(f"{st['blocks']} blocks of {st['threads']} threads;\nred: one thread's {TM}x{TN} tile",
                   fontsize=9)
    return axes


def stats_markdown(st: dict, M: int, N: int, K: int) -> str:
    ai = 2 * M * N * K / st["global_bytes"]
    rows = [
        ("threads per block", f"{st['threads']}"),
        ("shared memory per block", f"{st['smem_bytes'] / 1024:.1f} KiB (double-buffered)"),
        ("registers per thread (estimate)", f"~{st['regs_est']}" + ("  (over 255: will spill)" if st['regs_est'] > 255 else "")),
        ("blocks per SM (limited by)", f"{st['blocks_per_sm']} ({st['limit']})"),
        ("blocks in the grid / waves", f"{st['blocks']} / {st['waves']:.2f}"),
        ("re-use of each loaded A / B element", f"{st['reuse_A']}x / {st['reuse_B']}x"),
        ("global traffic, arithmetic intensity", f"{st['global_bytes'] / 1e6:,.0f} MB, {ai:.1f} FLOP/byte"),
        ("shared loads per FMA", f"{st['smem_loads_per_fma']:.3f}"),
    ]
    return "\n".join(["| quantity | value |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows])


def explorer(M=1024, N=1024, K=1024):
    """The tile-size explorer: sliders for BM, BN, BK, TM, TN; a table of what they imply and a picture."""
    import matplotlib.pyplot as plt
    from IPython.display import Markdown, display

    from .controls import interact

    pow2 = lambda lo, hi: [2 ** i for i in range(lo, hi + 1)]  # noqa: E731

    def controls(W):
        return dict(BM=W.SelectionSlider(options=pow2(4, 8), value=128, description="BM"),
                    BN=W.SelectionSlider(options=pow2(4, 8), value=128, description="BN"),
                    BK=W.SelectionSlider(options=pow2(2, 6), value=8, description="BK"),
                    TM=W.SelectionSlider(options=pow2(0, 4), value=8, description="TM"),
                    TN=W.SelectionSlider(options=pow2(0, 4), value=8, description="TN"))

    def update(BM=128, BN=128, BK=8, TM=8, TN=8):
        if TM > BM or TN > BN:
            print("TM must be <= BM and TN <= BN")
            return
        st = tile_stats(BM, BN, BK, TM, TN, M, N, K)
        display(Markdown(stats_markdown(st, M, N, K)))
        draw_tiles(BM, BN, BK, TM, TN, M, N, K)
        plt.tight_layout()
        plt.show()

    return interact(update, controls, action="move the sliders")


# ----------------------------------------------------------------------------------- tables
def rung_table(result: dict, size=None) -> str:
    """Markdown: every rung at one size with GFLOP/s, % of the baseline, and its modelled intensity."""
    from .. import plots

    size = tuple(size) if size is not None else plots.largest_size(result)
    lines = ["| rung | variant | what changed | time | GFLOP/s | % of baseline | intensity (FLOP/B) | predicted (the rung's docstring) |",
             "|---|---|---|---|---|---|---|---|"]
    from ..registry import get_variant

    for r in plots.rows(result, size):
        pct = f"{100 * r['vs_baseline']:.1f} %" if "vs_baseline" in r else "–"
        try:  # the registry's current one-line summary (the file keeps the one from the run)
            summary = get_variant(f"{result['op']}/{result['backend']}/{r['variant']}").summary
        except KeyError:
            summary = r["summary"]
        lines.append(f"| {'baseline' if r['baseline'] else r['rung']} | `{r['variant']}` | {summary} | "
                     f"{plots._fmt_time(r['median_s'])} | {r['gflops']:,.0f} | {pct} | "
                     f"{r['flops'] / r['bytes']:.1f} | "
                     f"{(plots.prediction(result['op'], r['variant']) or '–') if not r['baseline'] else '–'} |")
    return "\n".join(lines)


def ladder_plot(result: dict, ax=None, title=None):
    """GFLOP/s of every rung at every size, as grouped bars, with the baseline as a line per size."""
    import matplotlib.pyplot as plt

    from .. import plots

    ax = ax or plt.subplots(figsize=(9, 4))[1]
    sizes = sorted({tuple(r["size"]) for r in plots.rows(result)}, key=lambda s: np.prod(s))
    names = [r["variant"] for r in plots.rows(result, sizes[-1])]
    width = 0.8 / len(sizes)
    for si, s in enumerate(sizes):
        by = {r["variant"]: r for r in plots.rows(result, s)}
        ys = [by[n]["gflops"] if n in by else 0 for n in names]
        ax.bar(np.arange(len(names)) + si * width, ys, width, label="x".join(map(str, s)))
    ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2)
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("GFLOP/s")
    ax.set_yscale("log")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, title="M x N x K", title_fontsize=8)
    ax.set_title(title or f"{result['op']} on {plots.device_label(result)}")
    return ax


def load_codegen() -> dict:
    """PTX/SASS counts per rung (see ``kernels_src.tools.gemm.write_codegen_evidence``)."""
    return json.loads((DATA / "gemm_codegen.json").read_text())


def codegen_table(ev: dict) -> str:
    cols = [("ptx_registers", "registers (ptxas)"), ("ld.shared.f32", "PTX scalar shared loads"),
            ("ld.shared.v4.f32", "PTX 16-byte shared loads"), ("fma.rn", "PTX FMAs"),
            ("add.s64", "PTX 64-bit adds"), ("ld.local", "PTX local loads (spills)")]
    lines = ["| rung | " + " | ".join(c[1] for c in cols) + " |", "|---|" + "---|" * len(cols)]
    for row in ev["ptx"]:
        vals = [row.get(c[0], row.get("counts", {}).get(c[0], "–")) for c in cols]
        lines.append(f"| `{row['variant']}` | " + " | ".join(str(v) for v in vals) + " |")
    return "\n".join(lines)


def sass_table(ev: dict) -> str:
    keys = ["LDS", "LDS.128", "FFMA", "IMAD", "IADD3", "LDL", "STL"]
    lines = ["| rung | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for name, counts in ev.get("sass", {}).items():
        lines.append(f"| `{name}` | " + " | ".join(str(counts.get(k, "–")) for k in keys) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- profiler (ncu)
NCU_STALL = "smsp__average_warps_issue_stalled_"
NCU_STALL_END = "_per_issue_active.ratio"


def load_ncu() -> dict:
    """Nsight Compute totals per rung at 4096^3 on the H100 (``python -m kernels_src profile gemm --set all``).

    book/data/bench/h100/gemm_ncu.json has rungs 6-8 and the first builds of rungs 10-11 (no launch bounds,
    one block per SM); gemm_ncu_bounds.json has rungs 10-11 as registered (launch bounds, two blocks per SM).
    """
    base = json.loads((DATA / "bench" / "h100" / "gemm_ncu.json").read_text())
    final = json.loads((DATA / "bench" / "h100" / "gemm_ncu_bounds.json").read_text())
    rows = {n: base["variants"][n]["total"] for n in ("hinted", "conflictfree", "dbuf")}
    for n in ("vec", "warptile"):
        rows[f"{n}, 1 block/SM"] = base["variants"][n]["total"]
        rows[n] = final["variants"][n]["total"]
    return rows


def ncu_derived(t: dict) -> dict:
    """What the chapter reads off one variant's counters."""
    inst = t["smsp__inst_executed.sum"]
    ld = t["smsp__sass_inst_executed_op_shared_ld.sum"]
    st = t["smsp__sass_inst_executed_op_shared_st.sum"]
    stalls = {k[len(NCU_STALL):-len(NCU_STALL_END)]: v for k, v in t.items()
              if k.startswith(NCU_STALL) and k.endswith(NCU_STALL_END)}
    return {
        "time_ms": t["gpu__time_duration.sum"] / 1e6,
        "registers": t["launch__registers_per_thread"],
        "occupancy": t["sm__warps_active.avg.pct_of_peak_sustained_active"],
        "ffma_share": 100 * t["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"] / 32 / inst,
        "issue": t["smsp__issue_active.avg.pct_of_peak_sustained_active"],
        "fma_pipe": t["sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"],
        "inst_g": inst / 1e9,
        "ld_wf_per_inst": t["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"] / ld,
        "st_wf_per_inst": t["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"] / st,
        "ld_conflicts_m": t["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"] / 1e6,
        "st_conflicts_m": t["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"] / 1e6,
        "stalls": dict(sorted(stalls.items(), key=lambda kv: -kv[1])),
    }


def ncu_issue_table(rows: dict) -> str:
    """Issue and stall summary: why a rung runs at the speed it does."""
    lines = ["| rung | time under ncu | registers | achieved occupancy | instructions issued | FFMA share of them | "
             "issue slots used | FMA pipe busy | top stall reasons (warps stalled per issued instruction) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for n, t in rows.items():
        d = ncu_derived(t)
        top = [(k, v) for k, v in d["stalls"].items() if k != "selected"][:4]
        lines.append(f"| `{n}` | {d['time_ms']:.2f} ms | {d['registers']} | {d['occupancy']:.0f} % | "
                     f"{d['inst_g']:.2f} G | {d['ffma_share']:.0f} % | {d['issue']:.0f} % | {d['fma_pipe']:.0f} % | "
                     + ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in top) + " |")
    return "\n".join(lines)


def ncu_shared_table(rows: dict, names=("hinted", "conflictfree", "dbuf", "vec", "warptile")) -> str:
    """Shared-memory wavefronts and bank conflicts per rung (the counters behind rung 7's claim)."""
    lines = ["| rung | shared loads: wavefronts per instruction | load bank conflicts (millions) | "
             "shared stores: wavefronts per instruction | store bank conflicts (millions) |",
             "|---|---:|---:|---:|---:|"]
    for n in names:
        d = ncu_derived(rows[n])
        lines.append(f"| `{n}` | {d['ld_wf_per_inst']:.2f} | {d['ld_conflicts_m']:,.1f} | {d['st_wf_per_inst']:.2f} | "
                     f"{d['st_conflicts_m']:,.1f} |")
    return "\n".join(lines)
