"""Execute the book's pages side by side before Sphinx reads them (loaded by kfs_site).

myst-nb's ``cache`` mode executes each page that has no cached outputs while Sphinx reads it, one page after
another. A chapter's kernel runs one Python thread most of the time (Numba compiling, the CUDA simulator), so
on a machine with two or more cores the others wait. On ``env-before-read-docs`` this extension reads every page
Sphinx is about to read exactly as myst-nb will (its own reader and configuration), asks the execution cache
for each, and executes the missing ones in ``KERNELS_BOOK_JOBS`` child processes at a time (default: the number
of cores, at most 8), longest pages first. A page that times code says so in its front matter
(``kfs_build: {runs_alone: <why>}``) and is left to myst-nb, which runs it afterwards with no other page beside
it: chapter 13 trains for a fixed number of seconds, and with a second page executing it managed 29 steps
instead of 300. Each success goes into the cache as myst-nb would store it; myst-nb
then finds it there ("Using cached notebook"). A page that fails here is left out of the cache, so myst-nb
executes it again and reports the error as it always does: the build's verdict is myst-nb's.

``KERNELS_BOOK_JOBS=1`` turns this off (the pages then run one at a time inside Sphinx, as before).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

from sphinx.util import logging

LOG = logging.getLogger(__name__)


def jobs() -> int:
    raw = os.environ.get("KERNELS_BOOK_JOBS", "").strip()
    if raw:
        try:
            return max(1, int(raw))
        except ValueError:
            LOG.warning(f"KERNELS_BOOK_JOBS={raw!r} is not a whole number; the pages run one at a time")
            return 1
    return max(1, min(os.cpu_count() or 1, 8))


def _pending(app, env, docnames):
    """The execution cache, and (path, notebook, length of its text) of each page to be read that myst-nb would
    execute and the cache does not hold."""
    from jupyter_cache import get_cache
    from myst_nb.core.read import create_nb_reader

    nb_config = env.mystnb_config
    cache = get_cache(nb_config.execution_cache_path)
    out = []
    for docname in sorted(docnames):
        path = Path(env.doc2path(docname))
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        reader = create_nb_reader(str(path), env.myst_config, nb_config, text)
        if reader is None:
            continue  # a plain Markdown page
        posix = PurePosixPath(path.as_posix())
        if any(posix.match(p) for p in nb_config.execution_excludepatterns or ()):
            continue
        notebook = reader.read(text)
        if nb_config.metadata_key in notebook.metadata or nb_config.kernel_rgx_aliases:
            continue  # per-page settings: leave the page to myst-nb
        if not any(c.cell_type == "code" and c.source.strip() for c in notebook.cells):
            continue
        alone = (notebook.metadata.get("kfs_build") or {}).get("runs_alone")
        if alone:  # myst-nb runs it later, while Sphinx reads the pages, with no other page executing
            LOG.info(f"kfs_prerun: {os.path.relpath(path, app.srcdir)} runs alone ({alone})")
            continue
        try:
            cache.match_cache_notebook(notebook)
            continue  # cached already
        except KeyError:
            pass
        out.append((path, notebook, len(text)))
    return cache, out


def _run_one(path: Path, notebook, timeout, allow_errors, workdir: Path):
    """Execute one page in a child process; (executed notebook or None, seconds, one-line error)."""
    import nbformat

    src, dst = workdir / f"{path.stem}.in.ipynb", workdir / f"{path.stem}.out.ipynb"
    nbformat.write(notebook, src)
    code = ("import json, sys, nbformat\n"
            "from jupyter_cache.executors.utils import single_nb_execution\n"
            "nb = nbformat.read(sys.argv[1], as_version=4)\n"
            "r = single_nb_execution(nb, cwd=sys.argv[3], timeout=json.loads(sys.argv[4]), "
            "allow_errors=json.loads(sys.argv[5]), meta_override=True)\n"
            "if r.err is not None:\n"
            "    sys.stderr.write(r.exc_string or repr(r.err)); sys.exit(3)\n"
            "nbformat.write(nb, sys.argv[2])\n"
            "print(json.dumps(r.time))\n")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code, str(src), str(dst), str(path.parent), json.dumps(timeout),
                        json.dumps(bool(allow_errors))], capture_output=True, text=True)
    seconds = time.monotonic() - t0
    if p.returncode != 0 or not dst.exists():
        last = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        return None, seconds, last[:300]
    return nbformat.read(dst, as_version=4), float(p.stdout.strip() or seconds), ""


def prerun(app, env, docnames):
    nb_config = getattr(env, "mystnb_config", None)
    n = jobs()
    if nb_config is None or nb_config.execution_mode != "cache" or n <= 1:
        return
    from jupyter_cache.base import CacheBundleIn

    cache, pending = _pending(app, env, docnames)
    if len(pending) < 2:
        return  # nothing to share out: myst-nb runs the page itself
    pending.sort(key=lambda item: -item[2])  # the longest pages first, so the last to finish is a short one
    LOG.info(f"kfs_prerun: executing {len(pending)} pages, {min(n, len(pending))} at a time (KERNELS_BOOK_JOBS)")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kfs_prerun_") as tmp, ThreadPoolExecutor(min(n, len(pending))) as pool:
        futures = [(path, pool.submit(_run_one, path, notebook, nb_config.execution_timeout,
                                      nb_config.execution_allow_errors, Path(tmp)))
                   for path, notebook, _ in pending]
        for path, fut in futures:
            executed, seconds, err = fut.result()
            rel = os.path.relpath(path, app.srcdir)
            if executed is None:
                LOG.info(f"kfs_prerun: {rel} failed here ({err}); myst-nb runs it again and reports the error")
                continue
            cache.cache_notebook_bundle(CacheBundleIn(executed, str(path), data={"execution_seconds": seconds}),
                                        check_validity=False, overwrite=True)
            LOG.info(f"kfs_prerun: {rel} executed in {seconds:.1f} s")
    LOG.info(f"kfs_prerun: {len(pending)} pages in {time.monotonic() - t0:.0f} s of wall time")


def setup(app):
    app.connect("env-before-read-docs", prerun)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
