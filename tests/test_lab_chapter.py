"""Computed values in a chapter's prose (issue 29): ``{eval}`shown.NAME``` set by ``kernels_src.shown.glue``.

* Every chapter writes its values that way, and only that way (no ``{glue:text}``, which JupyterLab cannot
  show; no myst-nb ``glue`` called directly; ``{eval}`` only of ``shown.<identifier>``).
* The site's role (book/_ext/kfs_eval.py) keeps the strict build's guarantees: a small book with an unknown
  name, an expression, or a value set below its prose fails; the same book without them passes and shows the
  value.
* In the real browser (marker ``browser``): chapter 1 opened in JupyterLab (`make lab`, with jupyterlab-myst),
  Run All Cells, and every Markdown cell shows numbers where the roles were: no role text, no error, and two
  values match the committed benchmark files they come from (read here with ``json``, formatted as the prose
  says). Screenshots go to ``_build/screenshots/lab_chapter/``.
"""
from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("ch*.md"))
SHOTS = ROOT / "_build" / "screenshots" / "lab_chapter"
ROLE = re.compile(r"\{([a-z:-]+)\}`([^`]*)`")


# ------------------------------------------------------------------------------------------ the chapters
@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapters_show_values_with_eval_of_shown(path):
    text = path.read_text(encoding="utf-8")
    assert "{glue" not in text, f"{path.name}: a {{glue}} role (JupyterLab shows it raw): use {{eval}}`shown.NAME`"
    assert "myst_nb" not in text, f"{path.name}: glue through kernels_src.shown, not myst_nb"
    evals = [arg for name, arg in ROLE.findall(text) if name == "eval"]
    bad = [a for a in evals if not re.fullmatch(r"shown\.[A-Za-z_][A-Za-z0-9_]*", a)]
    assert not bad, f"{path.name}: {{eval}} of something other than shown.<name>: {bad}"
    spans = re.findall(r"`\{eval\}`[^`]*``", text)
    assert not spans, f"{path.name}: a role inside a code span shows as raw markup: {spans}"
    comments = [l for l in text.splitlines() if re.match(r"\s*%", l) and "{eval}" in l]
    assert not comments, f"{path.name}: a line starting with % is a MyST comment (its values vanish): {comments}"
    if evals:
        assert re.search(r"^from kernels_src\.shown import .*\bshown\b", text, re.M), \
            f"{path.name}: shows values but never imports `shown` (JupyterLab would show a NameError)"


def test_glue_keeps_the_text_for_the_kernel_and_glues_it_for_the_site(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    from kernels_src import shown as mod

    mod.glue("t_one", f"{1234.5:,.1f}")
    mod.glue("t_two", 7)
    assert mod.shown.t_one == "1,234.5" and mod.shown.t_two == "7"
    assert type(mod.shown.t_two) is str  # shown as text, without quotes, by jupyterlab-myst
    with pytest.raises(TypeError):
        mod.glue(3, "x")
    # inside IPython, myst-nb's glue output carries the name for the site build (hidden: not displayed)
    shell = InteractiveShell.instance()
    try:
        seen = []
        shell.display_pub.publish = lambda data, metadata=None, **kw: seen.append((data, metadata))
        mod.glue("t_three", "3.0")
        assert seen and seen[0][1]["scrapbook"]["name"] == "t_three"
        assert set(seen[0][0]) == {"application/papermill.record/text/plain"}
    finally:
        InteractiveShell.clear_instance()


# ------------------------------------------------------------------------------- the strict site build
PAGE = """---
jupytext:
  text_representation: {{extension: .md, format_name: myst}}
kernelspec: {{display_name: Python 3, language: python, name: python3}}
---

# A page

```{{code-cell}} ipython3
from kernels_src.shown import glue, shown
glue("speed", f"{{1234.5:,.1f}}")
```

{prose}

```{{code-cell}} ipython3
glue("later", "9")
```
"""
CONFIG = """title: t
execute: {{execute_notebooks: cache, cache: {cache}, allow_errors: false}}
sphinx:
  local_extensions: {{kfs_site: {ext}}}
"""


def build_book(tmp: Path, pages: dict[str, str], **env) -> tuple[int, str]:
    """Write ``pages`` (name -> MyST text; the first is the root) into ``tmp`` as a small book with the site's
    extensions and its own execution cache, and build it as strictly as ``make book``: (exit status, log)."""
    tmp.mkdir()
    for name, text in pages.items():
        (tmp / f"{name}.md").write_text(text)
    names = list(pages)
    chapters = "".join(f"  - file: {n}\n" for n in names[1:])
    (tmp / "_toc.yml").write_text(f"format: jb-book\nroot: {names[0]}\n"
                                  + (f"chapters:\n{chapters}" if chapters else ""))
    (tmp / "_config.yml").write_text(CONFIG.format(cache=(tmp / "cache").as_posix(),
                                                   ext=(ROOT / "book" / "_ext").as_posix()))
    env = dict(__import__("os").environ, PYTHONPATH=str(ROOT), JUPYTER_PREFER_ENV_PATH="1", **env)
    r = subprocess.run([sys.executable, "-c", "import sys; from jupyter_book.cli.main import main; sys.exit(main())",
                        "build", str(tmp), "-W", "-n", "--keep-going"], capture_output=True, text=True, env=env,
                       timeout=600)
    return r.returncode, r.stdout + r.stderr


def _build(tmp: Path, prose: str) -> tuple[int, str, str]:
    rc, log = build_book(tmp, {"page": PAGE.format(prose=prose)})
    html = tmp / "_build" / "html" / "page.html"
    return rc, log, html.read_text() if html.exists() else ""


@pytest.mark.slow
def test_site_build_shows_values_and_refuses_what_jupyterlab_could_not_show(tmp_path):
    rc, log, html = _build(tmp_path / "good", "The speed is {eval}`shown.speed` GB/s.")
    assert rc == 0, log[-3000:]
    assert re.search(r"The speed is <span[^>]*>1,234\.5</span> GB/s", html), html[-2000:]
    bad = ("Unknown {eval}`shown.nope`, expression {eval}`1 + 1`, too early {eval}`shown.later`.")
    rc, log, _ = _build(tmp_path / "bad", bad)
    assert rc != 0
    for needle in ("`shown.nope`: no code cell of this page set it", "not {eval}`1 + 1`",
                   "`shown.later` is set by the code cell at line"):
        assert needle in log, f"{needle!r} not in the build log:\n{log[-3000:]}"


# ---------------------------------------------------------------------------------------- in JupyterLab
CHAPTER = "ch01_what_is_a_kernel"
_MARKDOWN = """() => Array.from(document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-MarkdownCell'))
  .map(c => (c.querySelector('.jp-RenderedMarkdown') || c).innerText)"""


def _expected_values() -> list[str]:
    """Two of chapter 1's values, from the committed files they are computed from (not from the chapter)."""
    axpy = json.loads((ROOT / "book" / "data" / "bench" / "h100" / "axpy_gpu.json").read_text())
    pit = json.loads((ROOT / "book" / "data" / "bench" / "pitfalls_gpu.json").read_text())
    return [f"{axpy['peaks']['copy_gbps']:,.0f} GB/s",
            f"{pit['wall_sync_s'] * 1e6:.0f} µs against {pit['events_s'] * 1e6:.0f} µs"]


@pytest.mark.browser
@pytest.mark.slow
def test_chapter_shows_its_numbers_in_jupyterlab(browser, tmp_path, monkeypatch):
    import test_lab_student as lab

    # every cell rendered (no windowing): the test reads all Markdown cells, not just those in view
    monkeypatch.setitem(lab.USER_SETTINGS, "@jupyterlab/notebook-extension/tracker.jupyterlab-settings",
                        {"windowingMode": "none"})
    src = (ROOT / "notebooks" / f"{CHAPTER}.md").read_text(encoding="utf-8")
    n_roles = len(re.findall(r"\{eval\}`", src))
    assert n_roles >= 10, f"{CHAPTER} shows only {n_roles} values: pick a chapter that shows more"
    root = tmp_path / "home"
    (root / "notebooks").mkdir(parents=True)
    shutil.copy(ROOT / "notebooks" / f"{CHAPTER}.md", root / "notebooks")
    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir(parents=True)
    with lab.make_lab(root, tmp_path) as url:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        try:
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url, wait_until="domcontentloaded", timeout=60_000)
            listing = page.locator("#filebrowser .jp-DirListing-content")
            listing.locator(".jp-DirListing-itemText", has_text=re.compile(r"^notebooks$")).dblclick(timeout=60_000)
            listing.locator(".jp-DirListing-itemText", has_text=re.compile(rf"^{CHAPTER}\.md$")).dblclick(timeout=30_000)
            page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-KernelName",
                         has_text="Python").wait_for(timeout=lab.KERNEL_S * 1000)
            page.wait_for_function(lab._IDLE, timeout=lab.KERNEL_S * 1000)
            before = "\n".join(page.evaluate(_MARKDOWN))
            page.screenshot(path=str(SHOTS / "01_opened.png"))
            t0 = time.monotonic()
            cells = lab._run_all(page)
            print(f"Run All Cells: {time.monotonic() - t0:.0f} s")
            failed = [c for c in cells if "Traceback" in c["output"]]
            assert not failed, f"cells raised:\n{lab._describe(failed)}"
            page.wait_for_timeout(1500)  # the last Markdown cells' expressions come back from the kernel
            texts = page.evaluate(_MARKDOWN)
            after = "\n".join(texts)
            # where the roles were before the run (shown as code: `shown.gpu_copy`), numbers are now
            assert "shown." in before, "before Run All the roles should be unevaluated (is jupyterlab-myst there?)"
            for needle in ("{eval}", "shown.", "NameError", "AttributeError", "SyntaxError"):
                bad = [t for t in texts if needle in t]
                assert not bad, f"after Run All, {needle!r} still shows in:\n" + "\n---\n".join(b[:400] for b in bad)
            for want in _expected_values():
                assert want in after, f"{want!r} (from the committed data) is not in the rendered chapter"
            for i, anchor in enumerate(("Overhead-bound", "Measured on")):
                page.locator(".jp-MarkdownCell", has_text=anchor).first.scroll_into_view_if_needed()
                page.wait_for_timeout(300)
                page.screenshot(path=str(SHOTS / f"0{i + 2}_values_{anchor.split()[0].lower()}.png"))
            assert not errors, f"JupyterLab page errors: {errors}"
        except Exception:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(SHOTS / "99_failed.png"))
            raise
        finally:
            context.close()
