"""Figures and tables of the runtime chapter, read from committed H100 results (book/data/bench/h100/runtime_*).

    read(name)                         one committed JSON file (None if missing)
    step_bars(ax, profile, runs)       per run: GPU kernel time against the rest of the step (launch and host)
    role_bars(ax, profile, run)        one run's kernel time per role
    launch_rows(lc)                    the launch-cost table (µs per launch by way and argument count)
    decode_rows(runs, cfg)             decode tokens/s, ours against torch, with the goals, over repeated runs
"""
from __future__ import annotations

import json

import numpy as np

from ..paths import ROOT

H100 = ROOT / "book" / "data" / "bench" / "h100"

RUN_LABELS = {"course_eager": "course, eager launches", "course_plan": "course, launch plan",
              "course_graph": "course, CUDA graph", "torch_eager": "torch eager", "torch_graph": "torch, CUDA graph"}


def read(name):
    try:
        return json.loads((H100 / name).read_text())
    except (OSError, ValueError):
        return None


def step_bars(ax, prof, runs=None, title=""):
    """Horizontal bars, one per run: the GPU's kernel time, then the rest of the step's wall time (launches,
    host work, copies: the GPU idles). Both in µs, medians of the profiled step."""
    runs = runs or [r for r in RUN_LABELS if r in prof["runs"]]
    y = np.arange(len(runs))[::-1]
    k = np.array([1e6 * prof["runs"][r]["kernel_s"] for r in runs])
    w = np.array([1e6 * prof["runs"][r]["wall_s"] for r in runs])
    rest = np.maximum(w - k, 0)
    ax.barh(y, k, color="tab:blue", label="GPU kernels")
    ax.barh(y, rest, left=k, color="tab:gray", alpha=0.6, label="launch + host time (GPU idle)")
    for yi, wi, r in zip(y, w, runs):
        ax.text(wi, yi, f" {wi:,.0f} µs, {prof['runs'][r]['launches']} kernels", va="center", fontsize=8)
    ax.set_yticks(y, [RUN_LABELS[r] for r in runs])
    ax.set_xscale("log")
    ax.set_xlabel("µs per step (log scale)")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_xlim(right=ax.get_xlim()[1] * 8)


def role_bars(ax, prof, run="course_eager", title=""):
    by = prof["runs"][run]["by_role"]
    roles = sorted(by, key=lambda r: by[r]["kernel_s"])
    ax.barh(roles, [1e6 * by[r]["kernel_s"] for r in roles], color="tab:blue")
    for i, r in enumerate(roles):
        ax.text(1e6 * by[r]["kernel_s"], i, f" {by[r]['launches']} launches", va="center", fontsize=8)
    ax.set_xlabel("GPU kernel time per step (µs)")
    ax.set_title(title)


def launch_rows(lc) -> list[str]:
    u = lc["us_per_launch"]
    ways = [("plain", "`kern[grid, block](*args)`"), ("bound", "`cfg = kern[grid, block]` once"),
            ("specialized", "`kern.specialize(*args)`"), ("specialized_bound", "specialized and bound"),
            ("packed", "packed parameters, one `cuLaunchKernel`"), ("graph", "in a CUDA graph (per kernel)")]
    rows = ["| way to launch | " + " | ".join(f"{n} array{'s' if n > 1 else ''}" for n in (1, 2, 4, 8)) + " |",
            "|---|---|---|---|---|"]
    for key, label in ways:
        rows.append(f"| {label} | " + " | ".join(f"{u[f'{key}_{n}']:.1f}" for n in (1, 2, 4, 8)) + " |")
    if "torch_add" in u:
        rows.append(f"| torch `x.add_(1)` | {u['torch_add']:.1f} | | | |")
        rows.append(f"| torch `x.add_(1)` in a CUDA graph | {u['torch_graph']:.2f} | | | |")
    return rows


def decode_summary(runs, cfg):
    """{name: [tokens/s per run]} for one config over repeated bench files."""
    out = {}
    for res in runs:
        if cfg not in res["configs"]:  # a run of the other config only
            continue
        c = res["configs"][cfg]
        for k, v in c["course"].items():
            out.setdefault(k, []).append(v["tokens_per_s"])
        for k, v in c["torch"].items():
            if isinstance(v, dict) and "tokens_per_s" in v:
                out.setdefault(f"torch_{k}", []).append(v["tokens_per_s"])
    return out


def spread(xs) -> float:
    """Largest relative difference between repeated measurements."""
    return (max(xs) - min(xs)) / min(xs) if len(xs) > 1 else 0.0


def decode_rows(runs, cfg) -> list[str]:
    s = decode_summary(runs, cfg)
    med = {k: float(np.median(v)) for k, v in s.items()}
    rows = ["| decode, batch 1 | tokens/s (median of runs) | run-to-run spread | vs torch eager | vs torch in a graph |",
            "|---|---|---|---|---|"]
    names = [k for k in s if not k.startswith("torch")] + [k for k in ("torch_eager", "torch_compile", "torch_graph")
                                                           if k in s]
    for k in names:
        sp = f"{100 * spread(s[k]):.0f} %" if len(s[k]) > 1 else "one run"
        rows.append(f"| {k.replace('_', ' ')} | {med[k]:,.0f} | {sp} | "
                    f"{med[k] / med['torch_eager']:.2f}x | {med[k] / med['torch_graph']:.2f}x |")
    return rows
