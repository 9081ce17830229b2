"""The CPU scoreboard in the book: every op's best CPU rung against torch on the CPU and the NumPy formula.

Drawn from book/data/bench/cpu/<machine>/cpuboard.json, written by ``kernels cpuboard --again`` (one run, every
op, then a second pass over the best rungs and baselines). Nothing here times anything.
"""
from __future__ import annotations

import math

import numpy as np

from ..bench import fmt_time, load_json
from ..paths import CPU_BENCH_DATA


def load_board(path=None) -> dict | None:
    """The committed scoreboard of the book's CPU machine, or None where it has not been measured."""
    p = path or CPU_BENCH_DATA / "cpuboard.json"
    return load_json(p) if p.exists() else None


def machine(board: dict) -> str:
    m = board["meta"]
    return (f"{m.get('cpu_model', '?')}, {m.get('cpu_count', '?')} cores ({m.get('cpu_threads', '?')} Numba threads; "
            f"SIMD {', '.join(m.get('simd', [])) or '?'})")


def _chapter(op: str):
    from ..registry import get_op

    try:
        return get_op(op).chapter
    except KeyError:
        return None


def goals(board: dict) -> dict:
    """Counts behind the issue's goals: ops at least as fast as torch / NumPy, memory-bound ops at >= 70 % of
    the copy bandwidth, and the largest spread between the two runs."""
    rows = board["rows"]
    vs_t = [r for r in rows if r.get("vs_torch")]
    vs_n = [r for r in rows if r.get("vs_numpy")]
    mem = [r for r in rows if r["kind"] == "memory" and r.get("frac_copy") is not None]
    spreads = [r["run_spread"] for r in rows if "run_spread" in r]
    return {"ops": len(rows), "with_torch": len(vs_t), "beat_torch": sum(r["vs_torch"] >= 1.0 for r in vs_t),
            "with_numpy": len(vs_n), "beat_numpy": sum(r["vs_numpy"] >= 1.0 for r in vs_n),
            "memory_ops": len(mem), "copy70": sum(r["frac_copy"] >= 0.70 for r in mem),
            "max_spread": max(spreads) if spreads else None,
            "median_spread": float(np.median(spreads)) if spreads else None,
            "behind_torch": [r["op"] for r in vs_t if r["vs_torch"] < 1.0],
            "behind_numpy": [r["op"] for r in vs_n if r["vs_numpy"] < 1.0]}


def board_table(board: dict, ops=None) -> str:
    """A Markdown table: one row per op (sorted by chapter), the best rung, its time, the ratios (> 1: the
    course is faster) and, for memory-bound ops, the fraction of the copy bandwidth."""
    rows = [r for r in board["rows"] if not ops or r["op"] in ops]
    rows.sort(key=lambda r: (_chapter(r["op"]) or 99, r["op"]))
    out = ["| ch | op | size | best course rung | median | vs NumPy | vs torch | % of copy | 2nd run |",
           "|---|---|---|---|---|---|---|---|---|"]

    def ratio(x):
        return "–" if not x else (f"**{x:.2f}×**" if x >= 1.0 else f"{x:.2f}×")

    for r in rows:
        frac = f"{100 * r['frac_copy']:.0f} %" if r.get("frac_copy") is not None and r["kind"] == "memory" else "–"
        spread = f"±{100 * r['run_spread']:.0f} %" if "run_spread" in r else "–"
        out.append(f"| {_chapter(r['op']) or ''} | {r['op']} | {r['size_label']} | {r['best']} | "
                   f"{fmt_time(r['best_s'], 'µs')} | {ratio(r.get('vs_numpy'))} | {ratio(r.get('vs_torch'))} | "
                   f"{frac} | {spread} |")
    return "\n".join(out)


def ops_table(ops) -> str:
    """The scoreboard rows of ``ops`` (a chapter's CPU table), from the committed cpuboard.json; a one-line
    note where the board or an op's row has not been measured yet."""
    board = load_board()
    if board is None:
        return "*The CPU scoreboard has not been measured yet: `python -m kernels_src cpuboard --again`.*"
    have = {r["op"] for r in board["rows"]}
    missing = [o for o in ops if o not in have]
    note = f"\n\n*Not on the committed board yet: {', '.join(missing)}.*" if missing else ""
    return board_table(board, ops=[o for o in ops if o in have]) + note


def board_plot(board: dict, ax=None, ops=None):
    """Speed of each op's best CPU rung relative to torch and to NumPy (log scale; right of 1 = faster)."""
    import matplotlib.pyplot as plt

    rows = [r for r in board["rows"] if (r.get("vs_torch") or r.get("vs_numpy")) and (not ops or r["op"] in ops)]
    rows.sort(key=lambda r: (_chapter(r["op"]) or 99, r["op"]), reverse=True)
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 0.26 * len(rows) + 1.2))
    y = np.arange(len(rows))
    h = 0.38
    for off, key, label, color in ((h / 2, "vs_torch", "against torch (CPU)", "tab:red"),
                                   (-h / 2, "vs_numpy", "against the NumPy formula", "tab:blue")):
        vals = [r.get(key) or math.nan for r in rows]
        ax.barh(y + off, [v - 1 if v == v else 0 for v in vals], left=1, height=h, color=color, label=label)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xscale("log")
    ax.set_yticks(y, [r["op"] for r in rows], fontsize=8)
    ax.set_xlabel("speed of the course's best CPU rung (× the yardstick; right of 1 = faster)")
    ax.set_title(f"Every op on the CPU: {board['meta'].get('cpu_model', '?')}, {board['meta'].get('cpu_count')} cores",
                 fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", which="both", alpha=0.3)
    return ax
