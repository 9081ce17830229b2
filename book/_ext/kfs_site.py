"""Sphinx extension for the course site (loaded through `_config.yml`, `sphinx.local_extensions`).

Jupyter Book 1 always loads sphinx-thebe. Its inline configuration script ends up twice on every page
("Identifier 'THEBE_JS_URL' has already been declared" in the console), and the thebe loader would fetch
thebe from unpkg when clicked. Thebe is off for this site (it must work offline), so both scripts are
removed from every page.
"""
from __future__ import annotations

import os


def _is_thebe(js) -> bool:
    name = str(getattr(js, "filename", js) or "")
    body = (getattr(js, "attributes", None) or {}).get("body", "") or ""
    return "sphinx-thebe" in name or "THEBE_JS_URL" in body


def _strip_thebe(app, pagename, templatename, context, doctree):
    if "script_files" in context:
        context["script_files"] = [js for js in context["script_files"] if not _is_thebe(js)]


def setup(app):
    # The pages' kernels inherit this process's environment: kernels_src.figures.controls then draws each
    # interactive figure as a still picture with a caption instead of saving widgets that would do nothing.
    os.environ["KFS_BOOK_BUILD"] = "1"
    # Simulated blocks run as greenlets in the pages' kernels (kernels_src/device.py): the same outputs from the
    # course's race-free kernels, several times faster (compare `KERNELS_SIM_THREADS=os make book`, which keeps
    # the simulator's OS threads).
    os.environ.setdefault("KERNELS_SIM_THREADS", "greenlets")
    app.connect("html-page-context", _strip_thebe, priority=900)
    app.setup_extension("kfs_prerun")  # the pages executed side by side before Sphinx reads them
    app.setup_extension("kfs_eval")  # the `{eval}` role of the pages' computed values (book/_ext/kfs_eval.py)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
