"""How big a figure's text is where the reader sees it: on the site, at the page's width.

The book shows a Matplotlib figure as the PNG the notebook's inline backend writes (``figure.dpi`` pixels per
inch, trimmed to the drawn content, ``bbox_inches="tight"``), scaled down to the article's width when it is
wider. A 15-inch figure is 1500 pixels wide and shown at 688: its 7 pt labels reach the reader at under
5 pixels. :func:`smallest_text` gives the text of a figure by the size it is shown at, smallest first, so a
test can hold every figure function to a floor (``MIN_PX``) and a chapter author can check a new figure::

    from kernels_src.figures.readability import smallest_text
    smallest_text(fig)[:3]   # [(px, "the label"), ...]
"""
from __future__ import annotations

# The widest a code cell's image is shown on the site (measured in the built site with the course's theme in a
# 1280-pixel-wide window: the article is 752 px, an output image at most 688; wider windows do not widen it)
# and the smallest text a reader can still read there.
CONTENT_PX = 688
MIN_PX = 9.0


def display_scale(fig, content_px: float = CONTENT_PX) -> float:
    """The factor the page scales the figure's PNG by (1 when it fits the column)."""
    fig.canvas.draw()
    box = fig.get_tightbbox(fig.canvas.get_renderer())
    natural_px = box.width * fig.dpi
    return min(1.0, content_px / natural_px) if natural_px > 0 else 1.0


def smallest_text(fig, content_px: float = CONTENT_PX) -> list[tuple[float, str]]:
    """Every visible piece of text in ``fig`` as ``(pixels tall as shown on the page, text)``, smallest first."""
    from matplotlib.text import Text

    scale = display_scale(fig, content_px)
    renderer = fig.canvas.get_renderer()
    fbox = fig.bbox
    out = []
    for t in fig.findobj(Text):
        s = t.get_text().strip()
        if not s or not t.get_visible():
            continue
        try:
            ext = t.get_window_extent(renderer)
        except RuntimeError:
            continue
        if ext.width == 0 or not ext.overlaps(fbox):
            continue  # not drawn (a tick label outside the view, an empty legend title)
        out.append((t.get_fontsize() * fig.dpi / 72 * scale, s))
    return sorted(out)


def too_small(fig, min_px: float = MIN_PX, content_px: float = CONTENT_PX) -> list[tuple[float, str]]:
    """The text of ``fig`` shown smaller than ``min_px`` pixels on the page."""
    return [(round(px, 1), s) for px, s in smallest_text(fig, content_px) if px < min_px]


def legend_over_data(fig) -> list[str]:
    """Legends drawn inside an axes that cover one of its data points (a marker or a line's vertex)."""
    import numpy as np
    from matplotlib.lines import Line2D

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = []
    for ax in fig.axes:
        leg = ax.get_legend()
        if leg is None or not leg.get_visible():
            continue
        box = leg.get_window_extent(renderer)
        if not box.overlaps(ax.bbox):
            continue  # outside the axes: covers nothing
        for line in ax.get_lines():
            if not isinstance(line, Line2D) or not line.get_visible() or line.get_label().startswith("_"):
                continue
            if line.get_marker() in (None, "", "None", " ") and len(line.get_xydata()) > 2:
                continue  # a curve (a roof, a fit): its vertices are not data points
            xy = ax.transData.transform(np.asarray(line.get_xydata(), dtype=float))
            xy = xy[np.isfinite(xy).all(axis=1)]
            inside_ax = ax.bbox.contains_points(xy) if hasattr(ax.bbox, "contains_points") else \
                np.array([ax.bbox.contains(*p) for p in xy])
            hidden = [p for p, ok in zip(xy, inside_ax) if ok and box.contains(*p)]
            if hidden:
                found.append(f"{ax.get_title() or 'axes'}: the legend covers {len(hidden)} point(s) of "
                             f"{line.get_label()!r}")
    return found
