"""Computed values in a chapter's prose, shown in JupyterLab and on the course site alike.

A code cell computes a value and names it; the prose shows it with MyST's inline ``{eval}`` role::

    ```{code-cell} ipython3
    from kernels_src.shown import glue, shown
    glue("gpu_copy", f"{gbps:,.0f}")
    ```
    The GPU copies at {eval}`shown.gpu_copy` GB/s.

``glue`` does two things with the text of the value:

* it keeps it as ``shown.<name>``, a plain ``str``: JupyterLab's MyST renderer (``jupyterlab_myst``) evaluates
  ``shown.gpu_copy`` in the kernel when the Markdown cell is rendered (after Run All) and shows the text;
* it glues it with myst-nb (``myst_nb.glue``, not displayed), which the site build keeps in its execution
  cache: the site's ``{eval}`` role (book/_ext/kfs_eval.py) looks ``shown.<name>`` up there, so the site is
  built from the cached run of the page as before, and a name that no code cell set fails the strict build.

A name that the prose shows must be a Python identifier (it follows ``shown.``); a name is set once per page
(myst-nb refuses a duplicate key), in a code cell above the prose that shows it (the site build checks both).
"""
from __future__ import annotations

import types

__all__ = ["glue", "shown"]


class _Shown(types.SimpleNamespace):
    """The values a page shows, by name (``shown.gpu_copy``)."""

    def __repr__(self) -> str:
        return f"shown({', '.join(sorted(vars(self)))})"


shown = _Shown()


def glue(name: str, value, display: bool = False) -> None:
    """Show ``value``'s text in the prose as ``{eval}`shown.<name>```. ``display=True`` also shows it
    under the cell (as ``myst_nb.glue`` does)."""
    if not isinstance(name, str):
        raise TypeError(f"glue: the name must be a str, not {type(name).__name__}")
    text = value if isinstance(value, str) else str(value)
    setattr(shown, name, text)
    try:
        from myst_nb import glue as nb_glue
    except ImportError:  # JupyterLab without the site tools: the prose still shows the value
        if display:
            print(text)
        return
    nb_glue(name, text, display=display)
