"""Sliders that work where they are drawn: a live widget in JupyterLab, a still picture on the course site.

A Jupyter widget saved into a static page is drawn as a slider that moves and changes nothing (no kernel runs
behind the page). So every interactive figure of the book goes through :func:`interact`:

- in a notebook (JupyterLab, VS Code, a test), it builds the ipywidgets controls and returns the live
  ``ipywidgets.interactive``, displayed, as ``ipywidgets.interact`` would;
- while the book is being built (the site's Sphinx extension, ``book/_ext/kfs_site.py``, sets
  ``KFS_BOOK_BUILD=1`` in the build's environment, which the kernels it starts inherit), it creates no widget
  at all (a created widget would be saved into the page), calls the function once with its default arguments,
  so the page shows the figure or the printout of the starting values, and under it a caption naming those
  values and saying where to move the controls.

The controls are built lazily, by ``controls(ipywidgets) -> {name: widget}``, and the starting values are the
function's own defaults, so the two cannot drift apart: in the live path :func:`interact` checks that each
widget starts at the function's default.
"""
from __future__ import annotations

import inspect
import os

BOOK_ENV = "KFS_BOOK_BUILD"


def static_mode() -> bool:
    """True while the course site is being built (controls are drawn as a still picture)."""
    return os.environ.get(BOOK_ENV, "") not in ("", "0")


def _defaults(fn) -> dict:
    params = inspect.signature(fn).parameters
    missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty]
    if missing:
        raise TypeError(f"{fn.__name__}: every argument of an interactive figure needs a default "
                        f"(the still picture on the site draws it), missing for {missing}")
    return {n: p.default for n, p in params.items()}


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def caption(fn, action: str = "move the sliders", labels: dict | None = None) -> str:
    """The Markdown line shown under the still picture."""
    labels = labels or {}
    values = ", ".join(f"{labels.get(n, n)} = {_fmt(v)}" for n, v in _defaults(fn).items())
    return (f"*A still picture at the starting values ({values}): on this page nothing runs, so no controls "
            f"are drawn. Run this chapter in JupyterLab to {action}.*")


def interact(fn, controls, *, action: str = "move the sliders", labels: dict | None = None):
    """``fn(**values)`` draws (a figure with ``plt.show()``, or prints); ``controls(ipywidgets)`` returns the
    dict of widgets, one per argument of ``fn``. Returns the live ``ipywidgets.interactive`` (already
    displayed), or None on the site, where the still picture and its caption are displayed instead.
    ``labels`` names arguments in the caption (default: the argument's name)."""
    from IPython.display import Markdown, display

    defaults = _defaults(fn)
    if static_mode():
        fn(**defaults)
        display(Markdown(caption(fn, action, labels)))
        return None
    import ipywidgets

    made = controls(ipywidgets)
    if set(made) != set(defaults):
        raise TypeError(f"{fn.__name__}: controls for {sorted(made)}, arguments {sorted(defaults)}")
    for name, w in made.items():
        if w.value != defaults[name]:
            raise ValueError(f"{fn.__name__}: the {name} control starts at {w.value!r}, the function's "
                             f"default (what the site shows) is {defaults[name]!r}")
    live = ipywidgets.interactive(fn, **made)
    display(live)
    return live
