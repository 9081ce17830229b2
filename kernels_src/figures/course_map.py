"""The course map on the intro page: the chapters as one path from ``y = wx + b`` to a transformer, each
with the kernels it builds.

Everything is read, nothing is typed in: the chapters and their order from ``_toc.yml``, each title from
its notebook's first heading, and each chapter's kernels from the registry (ops with ``chapter=N`` that
have at least one GPU rung of the course's own). A chapter added to the toc appears on the map by itself.
"""
from __future__ import annotations

import re

from ..paths import ROOT


def chapters() -> list[dict]:
    """[{"part", "number", "title", "kernels"}] in the order of the table of contents."""
    import yaml

    from ..registry import ops

    by_chapter: dict = {}
    for op in ops():
        if op.chapter is not None and any(v.backend == "gpu" and not v.baseline for v in op.variants):
            by_chapter.setdefault(op.chapter, []).append(op.name)
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    out = []
    for part in toc.get("parts", []):
        for entry in part.get("chapters", []):
            f = entry.get("file", "")
            m = re.match(r"notebooks/ch(\d+)_", f)
            if not m:
                continue
            text = (ROOT / (f + ".md")).read_text()
            head = re.search(r"^# (.+)$", text, re.M)
            title = re.sub(r"^\d+\.\s*", "", head.group(1)) if head else f
            n = int(m.group(1))
            out.append({"part": part.get("caption", ""), "number": n, "title": title,
                        "kernels": by_chapter.get(n, [])})
    return out


def draw(ax=None, max_kernels: int = 4, per_row: int = 4):
    """The path, one box per chapter, coloured by part, in rows of ``per_row`` that snake left to right,
    then right to left. Drawn at about the page's width (7.7 in at 100 dpi; the site shows a cell's image at
    most 688 px wide, so at about 0.9 of its size): every label is at least 8 pt, 10 px on the page."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    chs = chapters()
    rows = max(1, -(-len(chs) // per_row))
    parts = list(dict.fromkeys(c["part"] for c in chs))
    # one unit = one inch: boxes 1.6 x 1.25, gaps for the arrows
    w, h, gap_x, gap_y = 1.6, 1.3, 0.3, 0.36
    legend_h = 0.19 * -(-len(parts) // 2) + 0.1
    width = per_row * w + (per_row - 1) * gap_x
    if ax is None:
        fig = plt.figure(figsize=(width + 0.2, rows * (h + gap_y) + legend_h + 0.4))
        ax = fig.add_axes((0, 0, 1, 1))
    colors = dict(zip(parts, plt.get_cmap("Pastel1").colors + plt.get_cmap("Pastel2").colors))
    centres = []
    for i, c in enumerate(chs):
        row, col = divmod(i, per_row)
        if row % 2:
            col = per_row - 1 - col
        x, y = col * (w + gap_x), -row * (h + gap_y)
        centres.append((x + w / 2, y + h / 2, row))
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=colors[c["part"]], ec="0.3"))
        ax.text(x + 0.07, y + h - 0.07, f"{c['number']}", fontsize=11, weight="bold", va="top")
        lines, line = [], ""
        for word in c["title"].split():  # wrap at ~17 characters of 8.5 pt in the box
            if len(line) + len(word) + 1 > 17 and line:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}".strip()
        lines.append(line)
        if len(lines) > 3:
            lines = lines[:3]
            lines[2] = lines[2][:17] + "…"
        ax.text(x + (0.3 if c["number"] < 10 else 0.4), y + h - 0.08, "\n".join(lines), fontsize=8.5,
                va="top", linespacing=1.1)
        ks = c["kernels"][:max_kernels] + ([f"+{len(c['kernels']) - max_kernels} more"]
                                           if len(c["kernels"]) > max_kernels else [])
        ks = [k if len(k) <= 19 else k[:18] + "…" for k in ks]
        ax.text(x + 0.07, y + 0.06, "\n".join(ks), fontsize=8, family="monospace", va="bottom", color="0.2",
                linespacing=1.05)
    for (x0, y0, r0), (x1, y1, r1) in zip(centres, centres[1:]):
        if r0 == r1:
            sign = 1 if x1 > x0 else -1
            start, end = (x0 + sign * w / 2, y0), (x1 - sign * w / 2, y1)
        else:
            start, end = (x0, y0 - h / 2), (x1, y1 + h / 2)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, color="0.35", lw=1.2,
                                     shrinkA=1, shrinkB=1))
    for p in parts:
        ax.plot([], [], "s", ms=10, color=colors[p], label=p)
    bottom = -(rows - 1) * (h + gap_y) - gap_y
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=ax.transData, ncol=2,
              frameon=False, fontsize=8.5, handletextpad=0.3, columnspacing=1.0, borderaxespad=0)
    ax.set_xlim(-0.1, width + 0.1)
    ax.set_ylim(bottom - legend_h, h + 0.4)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.text(width / 2, h + 0.3, "The course as one path: each box is a chapter, with the kernels it builds",
            ha="center", va="top", fontsize=10)
    # the legend hangs below the last row: put its anchor there
    ax.get_legend().set_bbox_to_anchor((width / 2, bottom), transform=ax.transData)
    return ax
