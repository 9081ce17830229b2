"""Figures for the data-parallel capstone (chapter 21), drawn from ``dp_capstone.json`` (written by
``python -m kernels_src train-dp ... --json``; the two-GPU run is committed as
``book/data/bench/<gpu>x2/dp_capstone.json``).

- ``plot_timeline(res)``: one step of backward and the buckets' all-reduces, one lane per rank: the backward
  segments (one per block, last block first) on the upper half of a lane, the all-reduces on the lower half,
  AdamW after them. What overlaps is what the eye sees overlap.
- ``plot_loss(res)``: the n-rank loss per step over the one-process loss on the concatenated batch, and their
  difference.
- ``plot_ab(res)``: the A/B run (``train-dp --ab-overlap K``, ``dp_capstone_ab.json``): the median step with and
  without the overlap, beside each rank's host time per step (forward, backward launches, the rest); a step as
  long as its host time is launch-bound, and no overlap of communication can shorten it.
"""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COLOURS = {"backward": "#4C72B0", "allreduce": "#DD8452", "optimizer": "#55A868"}


def find(pattern: str = "book/data/bench/*x2/dp_capstone.json") -> Path | None:
    """The committed two-GPU file (the first, by name), or None."""
    found = sorted(ROOT.glob(pattern))
    return found[0] if found else None


def load(path=None) -> dict | None:
    p = Path(path) if path else find()
    return json.loads(p.read_text()) if p and p.exists() else None


def plot_timeline(res: dict, ax=None):
    """Backward segments and per-bucket all-reduces of one training step, per rank (ms)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    tl = res["timeline"]
    ranks = sorted({e["rank"] for e in tl})
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 1.1 + 0.9 * len(ranks)))
    for lane, r in enumerate(ranks):
        y = len(ranks) - 1 - lane
        for e in (e for e in tl if e["rank"] == r):
            kind, w = e["kind"], e["t1_ms"] - e["t0_ms"]
            lo = y + (0.05 if kind == "allreduce" else 0.5)
            ax.broken_barh([(e["t0_ms"], max(w, 1e-3))], (lo, 0.4), facecolors=COLOURS[kind], edgecolors="white",
                           linewidth=0.5)
            if kind == "allreduce" and e["bucket"] is not None:
                ax.text(e["t0_ms"] + w / 2, lo + 0.2, str(e["bucket"]), ha="center", va="center", fontsize=7)
            if kind == "backward" and e.get("layer") is not None:
                ax.text(e["t0_ms"] + w / 2, lo + 0.2, f"b{e['layer']}", ha="center", va="center", fontsize=7,
                        color="white")
    ax.set_yticks([len(ranks) - 1 - i + 0.5 for i in range(len(ranks))], [f"rank {r}" for r in ranks])
    ax.set_xlabel("ms from the start of backward")
    meta = res.get("meta", {})
    ax.set_title(f"{meta.get('device', '')}: backward (top of each lane, b = block) and the buckets' all-reduces "
                 f"(bottom, numbered), then AdamW", fontsize=9)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()], fontsize=8, loc="upper left",
              ncol=3, bbox_to_anchor=(0, -0.25))
    ax.figure.tight_layout()
    return ax.figure


def plot_loss(res: dict, axs=None):
    """The n-rank loss and the one-process loss (concatenated batch) per step, and their difference."""
    import matplotlib.pyplot as plt
    import numpy as np

    loss = res["loss"]
    n = max(int(k) for k in loss)
    if axs is None:
        _, axs = plt.subplots(1, 2, figsize=(9, 3))
    a = np.array(loss[str(n)])
    axs[0].plot(np.arange(1, len(a) + 1), a, label=f"{n} ranks")
    if "1" in loss and n != 1:
        b = np.array(loss["1"])
        axs[0].plot(np.arange(1, len(b) + 1), b, "--", label="one process, concatenated batch")
        axs[1].plot(np.arange(1, len(a) + 1), a - b, ".")
        axs[1].axhline(0, color="grey", linewidth=0.5)
        axs[1].set_title(f"{n} ranks minus one process", fontsize=9)
        axs[1].set_xlabel("step")
    axs[0].set_xlabel("step")
    axs[0].set_title("training loss", fontsize=9)
    axs[0].legend(fontsize=8)
    axs[0].figure.tight_layout()
    return axs[0].figure


def plot_ab(res: dict, ax=None):
    """Median step (ms) with and without the overlap, and each rank's median host time per step, stacked."""
    import matplotlib.pyplot as plt

    ab = res["ab_overlap"]
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3))
    parts = ("forward", "backward_launch", "rest")
    colours = {"forward": "#8172B3", "backward_launch": "#4C72B0", "rest": "#937860"}
    x, labels = 0, []
    for mode, v in ab.items():
        ax.bar(x, v["step_ms_median"], color="#C44E52", width=0.8)
        ax.text(x, v["step_ms_median"], f"{v['step_ms_median']:.1f}", ha="center", va="bottom", fontsize=7)
        labels.append((x, f"{mode.replace('_', ' ')}\nstep"))
        for rank, h in sorted(v["host_ms_median"].items()):
            x += 1
            bottom = 0.0
            for k in parts:
                ax.bar(x, h[k], bottom=bottom, color=colours[k], width=0.8,
                       label=k.replace("_", " ") if (mode, rank) == (next(iter(ab)), "0") else None)
                bottom += h[k]
            labels.append((x, f"rank {rank}\nhost"))
        x += 2
    ax.set_xticks([p for p, _ in labels], [t for _, t in labels], fontsize=7)
    ax.set_ylabel("ms (median)")
    ax.set_title("the step with and without the overlap, and the host's time per step", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.figure.tight_layout()
    return ax.figure
