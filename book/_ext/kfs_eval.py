"""The site's ``{eval}`` role: ``{eval}`shown.NAME``` shows the value that a code cell of the page set with
``kernels_src.shown.glue("NAME", ...)`` (loaded by kfs_site).

In JupyterLab, ``jupyterlab_myst`` evaluates the expression in the running kernel when the Markdown cell is
rendered. The site is built from the execution cache (no kernel is running while a page is parsed), so here
the role reads the value that ``glue`` also glued with myst-nb into the page's cached outputs: the same text.
These are warnings, which the strict build (`make book`: -W) turns into errors:

* anything but ``shown.<identifier>`` (JupyterLab could evaluate it, the site could not);
* a name that no code cell of the page glued;
* a name glued only by a code cell *below* the prose that shows it: Run All in JupyterLab renders the prose
  before that cell has run, so the reader would see an error where the number should be.
"""
from __future__ import annotations

import re

from myst_nb.core.variables import RetrievalError
from myst_nb.ext.glue.roles import PasteTextRole
from myst_nb.ext.glue.utils import glue_warning, retrieve_glue_data

SHOWN = re.compile(r"^\s*shown\.([A-Za-z_][A-Za-z0-9_]*)\s*$")


def _record_glue_lines(extract):
    """Wrap myst-nb's glue extraction (which drops the glue outputs from the cells) so that it first notes,
    in the notebook's metadata, the source line of the first code cell that glued each name."""
    def extract_glue_data(notebook, source_map, logger):
        lines: dict[str, int] = {}
        for i, cell in enumerate(notebook.cells):
            for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
                name = out.get("metadata", {}).get("scrapbook", {}).get("name")
                if name is not None:
                    lines.setdefault(name, source_map[i])
        notebook.metadata["kfs_glue_lines"] = lines
        return extract(notebook, source_map, logger)
    extract_glue_data.kfs_wrapped = True
    return extract_glue_data


def _glued_at(document, name: str) -> int | None:
    """The source line of the first code cell that glued ``name`` (None if unknown)."""
    client = document["nb_renderer"].renderer.nb_client
    return client.notebook.metadata.get("kfs_glue_lines", {}).get(name)


class ShownEvalRole(PasteTextRole):
    def run(self):
        m = SHOWN.match(self.text)
        if not m:
            return [], [glue_warning(f"the site shows only {{eval}}`shown.<name>` (kernels_src.shown.glue), "
                                     f"not {{eval}}`{self.text}`", self.document, self.line)]
        name = m.group(1)
        try:
            retrieve_glue_data(self.document, name)
        except RetrievalError:
            return [], [glue_warning(f"{{eval}}`shown.{name}`: no code cell of this page set it "
                                     f"(kernels_src.shown.glue({name!r}, ...))", self.document, self.line)]
        at = _glued_at(self.document, name)
        if at is not None and self.line is not None and at > self.line:
            return [], [glue_warning(f"{{eval}}`shown.{name}` is set by the code cell at line {at}, below this "
                                     "prose: after Run All in JupyterLab the prose would show an error; "
                                     "compute it in a cell above", self.document, self.line)]
        self.text = name
        return super().run()


def setup(app):
    app.setup_extension("myst_nb")  # myst-nb registers its own `eval` role: this one replaces it
    from myst_nb.core.execute import base
    if not getattr(base.extract_glue_data, "kfs_wrapped", False):
        base.extract_glue_data = _record_glue_lines(base.extract_glue_data)
    app.add_role("eval", ShownEvalRole(), override=True)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
