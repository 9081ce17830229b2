"""Figures for chapters 6-8 (activations and fusion, reductions and norms, softmax).

Figures are drawn from committed benchmark JSON (book/data/bench/) or computed on the spot in float64
(approximation errors, summation errors, the stability table), never by timing anything here. The GPU
benchmark driver that produced the JSON is :mod:`kernels_src.figures.rowwise_bench`; its documented command
line, ``python -m kernels_src.figures.rowwise bench|profile ...``, still starts here.
"""
from __future__ import annotations

import sys

import numpy as np


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


if __name__ == "__main__":  # python -m kernels_src.figures.rowwise bench|profile ...: the driver's command line
    from .rowwise_bench import main

    sys.exit(main())
