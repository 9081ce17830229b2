"""Figures and tables for the book, generated from committed benchmark JSON (book/data/bench/).

Nothing here times anything: a figure is only ever drawn from results measured by
``python -m kernels_src bench ... --json FILE``. GPU results come from the H100; CPU results from the
machine named in the file's metadata, which every caption repeats.
"""
from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np

from .bench import fmt_time, load_json

ROOT = Path(__file__).resolve().parent.parent
from .paths import BENCH_DATA as DATA  # noqa: E402
from .paths import CPU_BENCH_DATA  # noqa: E402


def load_bench(name: str) -> dict:
    """``load_bench("axpy_gpu")`` reads book/data/bench/axpy_gpu.json; a CPU result (``"gemm_cpu"``) comes
    from the book's CPU machine, book/data/bench/cpu/<machine>/gemm_cpu.json, when it has one."""
    fname = name if name.endswith(".json") else name + ".json"
    path = DATA / fname
    if "/" not in name and fname.endswith("_cpu.json") and (CPU_BENCH_DATA / fname).exists():
        path = CPU_BENCH_DATA / fname
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: measure it with `python -m kernels_src bench ... --json {path}`")
    res = load_json(path)
    if res.get("simulated"):
        raise ValueError(f"{path} holds simulated GPU timings, which must never appear in a figure")
    return res


def rows(result: dict, size=None, baselines: bool = True) -> list[dict]:
    out = [r for r in result["rows"] if "median_s" in r and (baselines or not r["baseline"])]
    if size is not None:
        out = [r for r in out if tuple(r["size"]) == tuple(size)]
    return out


def largest_size(result: dict) -> tuple:
    return max((tuple(r["size"]) for r in rows(result)), key=lambda s: np.prod(s))


def device_label(result: dict) -> str:
    """The machine a result was measured on: the GPU's name, or for CPU results the CPU model and core count."""
    m = result["meta"]
    if result.get("backend") == "cpu" and m.get("cpu_model"):
        return f"{m['cpu_model']}, {m.get('cpu_count', '?')} cores"
    return m["device"].get("name", "?")


def caption(result: dict) -> str:
    m = result["meta"]
    return (f"{result['op']} on {device_label(result)}, {result['dtype']}, measured {m['date'][:10]} "
            f"(numba {m['versions'].get('numba', '?')}); medians of {rows(result)[0]['repeats']}+ runs.")


def prediction(op: str, variant: str, limit: int = 160) -> str:
    """The registered rung's prediction (its docstring's "predicted ..." sentence), shortened for a table."""
    from .registry import get_op

    try:
        v = next((x for x in get_op(op).variants if x.name == variant), None)
    except KeyError:
        return ""
    text = v.prediction if v is not None else ""
    return text if len(text) <= limit else text[: limit - 1].rsplit(" ", 1)[0] + " …"


def bench_table(result: dict, size=None, columns=None, skip=()) -> str:
    """A Markdown table of one benchmark file (all sizes, or one). The "predicted" column is each rung's
    prediction from the registry, printed beside what was measured.

    By default a memory-bound op shows GB/s and a compute-bound op GFLOP/s, not both: the article column
    is about 750 px wide, and the table must fit it with its last column, the prediction, wrapping."""
    memory = result.get("kind") == "memory"
    if columns is None:
        columns = ("variant", "rung", "median", "GB/s" if memory else "GFLOP/s", "frac", "vs_base", "predicted")
    header = {"variant": "variant", "rung": "rung", "size": "size", "median": "median",
              "GFLOP/s": "GFLOP/s", "GB/s": "GB/s", "frac": "% of copy BW" if memory else "% of compute yardstick",
              "vs_base": "vs baseline", "predicted": "predicted (the rung's docstring)"}
    cols = list(columns)
    if size is None and len({tuple(r["size"]) for r in rows(result)}) > 1:
        cols.insert(0, "size")
    lines = ["| " + " | ".join(header[c] for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows(result, size):
        if r["variant"] in skip:
            continue
        frac = r.get("frac_copy_bw") if memory else r.get("frac_compute_peak")
        cell = {"variant": f"`{r['variant']}`", "rung": "baseline" if r["baseline"] else str(r["rung"]),
                "size": r["size_label"].replace("x", "x\u200b"), "median": _fmt_time(r["median_s"]), "GFLOP/s": f"{r['gflops']:,.1f}",
                "GB/s": f"{r['gbps']:,.1f}", "frac": f"{100 * frac:.1f} %" if frac is not None else "–",
                "vs_base": f"{r['vs_baseline']:.2f}×" if "vs_baseline" in r else "–",
                "predicted": (prediction(result["op"], r["variant"]) or "–") if not r["baseline"] else "–"}
        # A number and its unit never split across lines (the prose cells may wrap; a size such as
        # 4x16x2048x64 may break after an x, at the zero-width space).
        lines.append("| " + " | ".join(cell[c] if c == "predicted" else cell[c].replace(" ", "\u00a0")
                                       for c in cols) + " |")
    return "\n".join(lines)


def show_table(result: dict, **kw) -> None:
    from IPython.display import Markdown, display

    display(Markdown(bench_table(result, **kw)))


def yardstick_note(result: dict) -> str:
    """One Markdown sentence naming the copy yardstick of a run: the fastest copy measured in it, each
    candidate's GB/s, and the datasheet figure beside it (labelled as such)."""
    peaks = result.get("peaks") or {}
    if not peaks.get("copy_gbps"):
        return ""
    each = peaks.get("copy_each") or {}
    parts = [f"{c['what']} {c['gbps']:,.0f} GB/s" for c in each.values() if "gbps" in c]
    text = f"Copy yardstick: {peaks['copy_gbps']:,.0f} GB/s"
    text += (", the fastest of " + "; ".join(parts) + ", all measured in this run") if parts else \
        f" ({peaks.get('copy_what', 'device copy')})"
    sheet = peaks.get("datasheet")
    if sheet:
        text += f". Datasheet, not measured: {sheet['hbm_gbps']:,} GB/s HBM ({sheet['name']})"
    return text + "."


def yardstick_table(result: dict) -> str:
    """A Markdown table of the copies timed for a run's yardstick, the chosen one in bold, and the datasheet
    figure under them, labelled as not measured."""
    peaks = result.get("peaks") or {}
    lines = [f"**Copy yardstick of this run** ({device_label(result)}, 1 GiB float32, bytes read + written)", "",
             "| copy | GB/s | % of the fastest |", "|---|---|---|"]
    for c in (peaks.get("copy_each") or {}).values():
        if "gbps" not in c:
            lines.append(f"| {c['what']} | skipped: {c['skipped']} | – |")
            continue
        best = abs(c["gbps"] - peaks["copy_gbps"]) < 1e-9
        cell = f"**{c['gbps']:,.0f}**" if best else f"{c['gbps']:,.0f}"
        lines.append(f"| {c['what']} | {cell} | {100 * c['gbps'] / peaks['copy_gbps']:.1f} % |")
    sheet = peaks.get("datasheet")
    if sheet:
        lines.append(f"| datasheet peak, not measured ({sheet['name']}) | {sheet['hbm_gbps']:,} | "
                     f"({100 * sheet['hbm_gbps'] / peaks['copy_gbps']:.0f} %) |")
    return "\n".join(lines)


def _fmt_time(s: float) -> str:
    return fmt_time(s, micro="µs")


def scaling(result: dict, ax=None, metric: str = "gbps", title: str | None = None):
    """Throughput against problem size for every variant, with the measured copy bandwidth as a line.
    The rising left part is overhead-bound; the flat right part is bandwidth-bound."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(7, 4))[1]
    by_var: dict[str, list] = {}
    for r in rows(result):
        by_var.setdefault(r["variant"], []).append(r)
    for name, rs in by_var.items():
        rs.sort(key=lambda r: np.prod(r["size"]))
        x = [np.prod(r["size"]) for r in rs]
        ax.plot(x, [r[metric] for r in rs], "o-" if not rs[0]["baseline"] else "s--", label=name)
    peaks = result.get("peaks") or {}
    if metric == "gbps" and peaks.get("copy_gbps"):
        ax.axhline(peaks["copy_gbps"], color="k", lw=1, ls=":")
        ax.annotate(f"copy {peaks['copy_gbps']:.0f} GB/s", (ax.get_xlim()[0], peaks["copy_gbps"]),
                    xytext=(4, 4), textcoords="offset points", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("elements" if len(rows(result)[0]["size"]) == 1 else "problem size (product of dims)")
    ax.set_ylabel({"gbps": "GB/s (useful bytes / time)", "gflops": "GFLOP/s"}[metric])
    ax.set_title(title or f"{result['op']} on {device_label(result)}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def roofline(results, ax=None, title: str | None = None, size=None, annotate: bool = True,
             show_datasheet: bool = True):
    """A roofline: performance (GFLOP/s) against arithmetic intensity (FLOP/byte), log-log.

    The ceilings are the copy bandwidth and the compute yardstick measured in the first result's run. The
    datasheet's figures are drawn beside them (dashed, labelled), and where the run measured them, the
    tensor-core roofs (TF32, BF16): ceilings of other hardware than the FP32 CUDA cores the course uses.
    Each variant is drawn at one size (``size``, default the largest in each file).
    """
    import matplotlib.pyplot as plt

    results = results if isinstance(results, (list, tuple)) else [results]
    ax = ax or plt.subplots(figsize=(7, 4.5))[1]
    peaks = results[0].get("peaks") or {}
    bw, comp = peaks.get("copy_gbps"), peaks.get("compute_gflops")
    pts = []
    for res in results:
        s = size if size is not None else largest_size(res)
        for r in rows(res, s):
            pts.append((r["flops"] / r["bytes"], r["gflops"], f"{res['op']}/{r['variant']}", r["baseline"]))
    ai = np.array([p[0] for p in pts] + [1e-2, 1e2])
    x = np.logspace(np.log10(ai.min() / 2), np.log10(ai.max() * 2), 200)
    if bw:
        roof = bw * x if not comp else np.minimum(bw * x, comp)
        ax.plot(x, roof, "k-", lw=1.5, label=f"roof: {bw:,.0f} GB/s copy" + (f", {comp:,.0f} GFLOP/s" if comp else ""))
        if comp:
            ax.axvline(comp / bw, color="k", ls=":", lw=0.8)
            ax.annotate(f"ridge {comp / bw:.1f} FLOP/B", (comp / bw, comp), xytext=(4, -14),
                        textcoords="offset points", fontsize=8)
    sheet = peaks.get("datasheet")
    if sheet and show_datasheet:
        dbw, dcomp = sheet["hbm_gbps"], sheet["fp32_tflops"] * 1e3
        ax.plot(x, np.minimum(dbw * x, dcomp), color="0.6", ls="--", lw=1,
                label=f"datasheet (not measured): {dbw:,} GB/s, {sheet['fp32_tflops']} TFLOP/s")
    tc = peaks.get("tensor_core_roofs") or {}
    for key, name, style in (("tf32_gflops", "TF32", "-."), ("bf16_gflops", "BF16", ":")):
        if tc.get(key) and bw:
            ax.plot(x, np.minimum(bw * x, tc[key]), color="tab:purple", ls=style, lw=1,
                    label=f"{name} tensor cores, measured: {tc[key] / 1e3:,.0f} TFLOP/s (not for FP32 cores)")
    for a, g, label, base in pts:
        ax.loglog(a, g, "s" if base else "o", ms=7, mfc="none" if base else None, label=label)
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(title or f"Roofline on {device_label(results[0])}")
    ax.grid(True, which="both", alpha=0.3)
    # Below the axes, never over the points (a legend inside hid a rung's point), at 8 pt: two columns when
    # the labels are short enough for the page's width.
    labels = ax.get_legend_handles_labels()[1]
    ncol = 2 if max(map(len, labels), default=0) <= 60 else 1
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=ncol, frameon=False)
    return ax


def show(fn, *, title: str | None = None) -> None:
    """Display the source of a kernel or launcher (unwrapping registry/numba wrappers) in a notebook."""
    from IPython.display import Markdown, display

    f = getattr(fn, "__wrapped_launcher__", fn)
    for attr in ("py_func", "fn"):
        f = getattr(f, attr, f)
    src = inspect.getsource(f)
    display(Markdown((f"**{title}**\n\n" if title else "") + f"```python\n{src.rstrip()}\n```"))
