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


def draw(ax=None, max_kernels: int = 5):
    """The path, one box per chapter, coloured by part, two rows snaking left to right then right to left."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    chs = chapters()
    per_row = (len(chs) + 1) // 2
    ax = ax or plt.subplots(figsize=(15, 6.2))[1]
    parts = list(dict.fromkeys(c["part"] for c in chs))
    colors = dict(zip(parts, plt.get_cmap("Pastel1").colors))
    w, h, gap_x, gap_y = 2.1, 2.1, 0.45, 0.9
    centres = []
    for i, c in enumerate(chs):
        row, col = divmod(i, per_row)
        if row % 2:
            col = per_row - 1 - col
        x, y = col * (w + gap_x), -row * (h + gap_y)
        centres.append((x + w / 2, y + h / 2, row))
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.04", fc=colors[c["part"]], ec="0.3"))
        ax.text(x + 0.08, y + h - 0.12, f"{c['number']}", fontsize=13, weight="bold", va="top")
        title = c["title"] if len(c["title"]) < 30 else c["title"][:28].rsplit(" ", 1)[0] + " …"
        words, line, lines = title.split(), "", []
        for word in words:  # wrap at ~18 characters
            if len(line) + len(word) > 18 and line:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}".strip()
        lines.append(line)
        ax.text(x + (0.4 if c["number"] < 10 else 0.6), y + h - 0.12, "\n".join(lines[:2]), fontsize=8.5, va="top")
        ks = c["kernels"][:max_kernels] + (["…"] if len(c["kernels"]) > max_kernels else [])
        ax.text(x + 0.1, y + 0.1, "\n".join(ks), fontsize=7, family="monospace", va="bottom", color="0.25")
    for (x0, y0, r0), (x1, y1, r1) in zip(centres, centres[1:]):
        if r0 == r1:
            start, end = (x0 + w / 2 * (1 if x1 > x0 else -1), y0), (x1 - w / 2 * (1 if x1 > x0 else -1), y1)
        else:
            start, end = (x0, y0 - h / 2), (x1, y1 + h / 2)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, color="0.35", lw=1.2))
    for p in parts:
        ax.plot([], [], "s", ms=12, color=colors[p], label=p)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(parts), frameon=False, fontsize=9)
    ax.set_xlim(-0.3, per_row * (w + gap_x))
    ax.set_ylim(-(h + gap_y) - 0.3, h + 0.3)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("The course as one path: each box is a chapter, with the kernels (registered ops) it builds",
                 fontsize=11)
    return ax
