"""Figures and tables for dispatch by shape (the runtime chapter): the policy, the autotune table, the
dispatcher's explanation of one step, and training against torch. Everything reads committed JSON or the
dispatcher itself; nothing here times anything."""
from __future__ import annotations

import json

from .. import paths
from ..runtime import dispatch as D

H100_TABLE = D.TABLES / "nvidia-h100-80gb-hbm3.json"


def read_table(path=H100_TABLE) -> dict:
    return D.load_table(path)


def read_h100(name: str) -> dict:
    return json.loads((paths.BENCH_DATA / "h100" / name).read_text())


def _short(key: str) -> str:
    """'gemm/gpu/splitk' -> 'gemm/splitk' (the backend is the table's device)."""
    if not key:
        return "–"
    op, _be, name = key.split("/")
    return f"{op}/{name}"


def policy_table(roles=D.MATMUL_ROLES) -> str:
    """Markdown: each product role's rules in order, the condition, and the variant per device."""
    rows = ["| role | rule | when | GPU | simulator | CPU |", "|---|---|---|---|---|---|"]
    for role in roles:
        rows.append(f"| `{role}` | table | an exact (M, N, K) entry of the device's table | its winner | – | – |")
        for r in D.POLICIES[role]:
            when = r.limit or "otherwise"
            rows.append(f"| | {r.name} | {when} | "
                        + " | ".join(f"`{_short(r.variants.get(d, ''))}`" if r.variants.get(d) else "–"
                                     for d in ("gpu", "sim", "cpu")) + " |")
    return "\n".join(rows)


def entries_table(table: dict, shapes, cublas=True) -> str:
    """Markdown: for (role, (M, N, K)) pairs, each candidate's time and the winner."""
    idx = {(e["role"], tuple(e["shape"])): e for e in table["entries"]}
    cands = []
    for key in shapes:
        for k in idx[key]["us"]:
            if k not in cands:
                cands.append(k)
    head = ["role", "M x N x K"] + [f"`{_short(k)}` (µs)" for k in cands] + (["cuBLAS (µs)"] if cublas else []) + ["picked"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in shapes:
        e = idx[key]
        cells = [f"`{e['role']}`", "x".join(map(str, e["shape"]))]
        for k in cands:
            v = e["us"].get(k)
            cells.append("–" if v is None else (f"**{v:.0f}**" if k == e["best"] else f"{v:.0f}"))
        if cublas:
            cells.append(f"{e['cublas_us']:.0f}" if "cublas_us" in e else "–")
        cells.append(f"`{_short(e['best'])}`")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def model_entries(table: dict, step_rows) -> list:
    """The (role, shape) keys of a step's products (rows from dispatch.explain) that the table measured."""
    have = {(e["role"], tuple(e["shape"])) for e in table["entries"]}
    out = []
    for r in step_rows:
        if r["role"] in D.MATMUL_ROLES:
            s = dict(x.split("=") for x in r["shape"].split())
            key = (r["role"], (int(s["M"]), int(s["N"]), int(s["K"])))
            if key in have and key not in out:
                out.append(key)
    return out


def plot_splitk(ax, table: dict):
    """Split-K's speed-up over the warptile GEMM for X^T G products, against K, one line per output size."""
    from ..tools.autotune import SPLITK_K, SPLITK_MN

    idx = {(e["role"], tuple(e["shape"])): e for e in table["entries"]}
    for m, n in SPLITK_MN:
        xs, ys = [], []
        for k in SPLITK_K:
            e = idx.get(("gemm_tn", (m, n, k)))
            if e and "gemm/gpu/splitk" in e["us"] and "gemm/gpu/warptile" in e["us"]:
                xs.append(k)
                ys.append(e["us"]["gemm/gpu/warptile"] / e["us"]["gemm/gpu/splitk"])
        if xs:
            tiles = D._tiles({"M": m, "N": n})
            ax.plot(xs, ys, marker="o", label=f"{m}x{n} ({tiles} tiles)")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("K (rows summed over: B*T tokens for dW)")
    ax.set_ylabel("split-K speed-up over warptile")
    # beside the axes, never over the curves (the page shows it at 8 pt, about 11 px)
    ax.legend(fontsize=8, title="output M x N", title_fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1),
              frameon=False)


def plot_gemv(ax, table: dict):
    """Time per product against M for the GEMV (once per row) and the warptile GEMM, at decode's shapes."""
    from ..tools.autotune import GEMV_M, GEMV_NK

    idx = {(e["role"], tuple(e["shape"])): e for e in table["entries"]}
    for n, k in GEMV_NK:
        for key, style in (("gemv/gpu/splitk_grid", "-"), ("gemm/gpu/warptile", "--")):
            xs = [m for m in GEMV_M if key in idx.get(("gemm", (m, n, k)), {}).get("us", {})]
            ys = [idx[("gemm", (m, n, k))]["us"][key] for m in xs]
            if xs:
                ax.plot(xs, ys, style, marker="o", label=f"{_short(key)} N={n} K={k}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (rows: tokens in the step)")
    ax.set_ylabel("µs per product (launch included)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)


def explain_table(rows, roles=None) -> str:
    """Markdown of dispatch.explain rows (optionally only some roles)."""
    out = ["| role | shape | calls | variant | rule |", "|---|---|---|---|---|"]
    for r in rows:
        if roles and r["role"] not in roles:
            continue
        out.append(f"| `{r['role']}` | {r['shape']} | {r['calls']} | `{r['variant']}` | {r['rule']} |")
    return "\n".join(out)


def train_table(res: dict) -> str:
    """Markdown: training tokens/s of the course model and torch, per config (runtime_train.json)."""
    rows = ["| config | tokens per step | course (tok/s) | torch eager | torch.compile | course / eager | course / compile |",
            "|---|---|---|---|---|---|---|"]
    for name, c in res["configs"].items():
        if "course" not in c:
            continue
        cfg = c["config"]
        te, tc = c.get("torch_eager", {}), c.get("torch_compile", {})
        f = lambda d: f"{d['tokens_per_s']:,.0f}" if "tokens_per_s" in d else "–"  # noqa: E731
        r = lambda k: f"{c[k]:.2f}x" if k in c else "–"  # noqa: E731
        rows.append(f"| {cfg['layers']} layers, width {cfg['width']}, T {c['T']} | {c['tokens']:,} | "
                    f"{f(c['course'])} | {f(te)} | {f(tc)} | {r('vs_torch_eager')} | {r('vs_torch_compile')} |")
    return "\n".join(rows)


TRAIN_ENTRIES = (("course", "course, eager"), ("course_graph", "course, one CUDA graph"), ("torch_eager", "torch eager"),
                 ("torch_compile", "torch.compile"), ("torch_graph", "torch in a CUDA graph"))


def train_runs(runs: list, name: str) -> dict:
    """{entry: [tokens/s of each run]} for one config of several runtime_train JSONs (the same command run
    again); an entry a run did not measure is left out of that run's list."""
    out: dict = {}
    for r in runs:
        c = r["configs"].get(name, {})
        for k, _label in TRAIN_ENTRIES:
            if "tokens_per_s" in c.get(k, {}):
                out.setdefault(k, []).append(c[k]["tokens_per_s"])
    return out


def train_runs_table(runs: list, name: str) -> str:
    """Markdown: per entry, the median over runs of tokens/s, each run's value, the spread between runs
    ((max - min) / median) and the ratio of the course's graph step to it."""
    import numpy as np

    tp = train_runs(runs, name)
    g = float(np.median(tp["course_graph"])) if "course_graph" in tp else None
    rows = ["| step | tokens/s (median) | each run | spread between runs | course graph / this |",
            "|---|---|---|---|---|"]
    for k, label in TRAIN_ENTRIES:
        if k not in tp:
            continue
        v = tp[k]
        med = float(np.median(v))
        spread = f"{100 * (max(v) - min(v)) / med:.1f} %" if len(v) > 1 else "one run"
        ratio = f"{g / med:.2f}x" if g else "–"
        rows.append(f"| {label} | {med:,.0f} | {', '.join(f'{x:,.0f}' for x in v)} | {spread} | {ratio} |")
    return "\n".join(rows)
