"""Figures and tables for the random-numbers chapter: uniforms, a dropout mask, sampling's cuts, ladder tables."""
from __future__ import annotations

import numpy as np

from .. import plots
from ..ops import philox as P
from ..ops import sampling as S


def plot_uniforms(n=1 << 16, seed=2024, offset=0, bins=32, ax=None):
    """Histogram of n uniforms of one stream, with the expected count and a +-3 sigma band."""
    import matplotlib.pyplot as plt

    ax = ax or plt.gca()
    u = P.uniforms(seed, offset, n)
    h, edges = np.histogram(u, bins=bins, range=(0.0, 1.0))
    ax.bar(edges[:-1], h, width=1.0 / bins, align="edge", color="#4c78a8", edgecolor="white")
    e = n / bins
    sd = np.sqrt(e * (1 - 1 / bins))
    ax.axhline(e, color="k", lw=1)
    ax.axhspan(e - 3 * sd, e + 3 * sd, color="k", alpha=0.1, label="expected ± 3σ")
    ax.set_xlabel("u = (bits >> 8) · 2⁻²⁴")
    ax.set_ylabel("count")
    ax.set_title(f"{n:,} uniforms, seed {seed}, offset {offset}")
    ax.legend(loc="lower right")
    return h


def plot_masks(p=0.3, seed=7, shape=(24, 64), offsets=(0, 1), axes=None):
    """The keep mask of a (rows, cols) activation for two offsets of the same seed: white = kept."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, len(offsets), figsize=(5 * len(offsets), 2.4))
    n = shape[0] * shape[1]
    for ax, off in zip(np.atleast_1d(axes), offsets):
        m = P.keep_mask(p, seed, off, n).reshape(shape)
        ax.imshow(m, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(f"p = {p}, seed {seed}, offset {off}: {m.mean():.0%} kept")
        ax.set_xticks([])
        ax.set_yticks([])
    return axes


def plot_cuts(logits, temperature=1.0, top_k=0, top_p=1.0, ax=None):
    """One row's probabilities in descending order, with the tokens top-k and top-p keep highlighted."""
    import matplotlib.pyplot as plt

    ax = ax or plt.gca()
    l = np.asarray(logits, dtype=np.float64)
    order = np.lexsort((np.arange(l.size), -l))
    w = np.exp((l - l.max()) / temperature)
    prob = w[order] / w.sum()
    n_k = top_k if 0 < top_k < l.size else l.size
    cw = np.cumsum(prob[:n_k])
    n_p = int(np.searchsorted(cw, top_p * cw[-1], side="left")) + 1 if top_p < 1 else n_k
    colors = ["#e45756" if j < n_p else ("#f2cf5b" if j < n_k else "#bbbbbb") for j in range(l.size)]
    ax.bar(np.arange(l.size), prob, color=colors, width=0.9)
    ax.set_xlabel("rank (largest logit first; equal logits by index)")
    ax.set_ylabel("probability")
    ax.set_title(f"T = {temperature}: top-k = {top_k} keeps {n_k} (yellow + red), top-p = {top_p} keeps {n_p} (red)")
    return n_k, n_p


def ladder_table(op: str, result: dict | None = None, size=None) -> str:
    """The registered rungs of ``op`` (one backend's, when a result is given) with each rung's prediction, and the
    measured time and % of copy where ``result`` has them; "not yet measured" otherwise."""
    from ..registry import get_op

    o = get_op(op)
    measured = {}
    if result is not None:
        for r in plots.rows(result, size):
            measured[r["variant"]] = r
    lines = ["| backend | rung | variant | what changes | predicted | measured |", "|---|---|---|---|---|---|"]
    for v in o.variants:
        if result is not None and v.backend != result["backend"]:
            continue
        r = measured.get(v.name)
        got = (f"{plots._fmt_time(r['median_s'])}, {100 * r['frac_copy_bw']:.0f} % of copy"
               if r is not None and r.get("frac_copy_bw") else "not yet measured on the H100" if v.backend == "gpu"
               else "not in the book's data yet")
        what = " ".join(v.doc.split()).split(". ")[0].rstrip(".") + "."
        lines.append(f"| {v.backend} | {'base' if v.baseline else v.rung} | `{v.name}` | {what} | "
                     f"{plots.prediction(op, v.name) or '–'} | {got} |")
    return "\n".join(lines)


def load_or_none(name: str):
    """A committed benchmark result, or None when the book has none yet."""
    try:
        return plots.load_bench(name)
    except (FileNotFoundError, ValueError):
        return None


def sampling_demo(V=12, seed=3):
    """A small logits row with ties, for the chapter's picture and its check of the rules."""
    rng = np.random.default_rng(seed)
    return (np.round(0.8 * rng.standard_normal(V) * 2) / 2).astype(np.float32)


__all__ = ["plot_uniforms", "plot_masks", "plot_cuts", "ladder_table", "load_or_none", "sampling_demo", "S"]
