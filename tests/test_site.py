"""The built site, read as a reader would: every page in headless Chromium, offline.

`make test` builds the book first (`make book`), then this test serves `_build/html` on 127.0.0.1 and
drives a headless Chromium with pip's playwright (the ``browser`` fixture, tests/_browser.py): Playwright's
own Chromium if it is installed; otherwise ``python -m playwright install chromium`` is tried (it needs
internet); otherwise a system Chromium or Chrome. With none, these tests are skipped with one line that says
how to get one, unless ``REQUIRE_BROWSER=1`` (set by `.ci/run`), which makes a missing browser a failure.
For every page it asserts:

- no console errors and no uncaught page errors;
- no failed request and no HTTP error status;
- no request leaves 127.0.0.1 (such requests are blocked and reported: the site must work offline);
- every image has loaded (naturalWidth > 0);
- MathJax typeset every math element, without a MathJax error;
- no unrendered MyST, Markdown, HTML or LaTeX in the page's prose (backticks, `**bold**`, `*italics*`,
  `[text](link)`, `{role}`, fences, `#` headings, `|---|` rows, tags or entities shown as text, `$$`):
  `tests/_site_text.py` says exactly what counts as prose and what each rule allows; it runs on the DOM after
  the page's scripts, and (without a browser, `test_page_prose_has_no_raw_markup`) on the built files;
- no inert control: no saved Jupyter widget, widget DOM or form control in the page's content (a static
  page has no kernel behind it; interactive figures are drawn as a still picture with a caption there,
  `kernels_src/figures/controls.py`);
- every internal link resolves (target file exists, and the #fragment exists in it);
- a chapter (notebooks/) with code cells shows outputs, i.e. it was executed, and no cell shows an
  error unless it is tagged `raises-exception` (a deliberate demo of an error).

With KERNELS_SITE_SCREENSHOTS=1, a full-page screenshot of each page goes to `_build/screenshots/` (look at
them: a passing test can still look wrong). They are off by default: drawing a chapter of 40 000 pixels takes
longer than all the checks of its page, and no check reads them. Set KFS_SITE_DIR to test another built site.
"""
from __future__ import annotations

import functools
import html
import http.server
import os
import re
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests._site_text import inert_controls, raw_markup

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("KFS_SITE_DIR", ROOT / "_build" / "html")).resolve()
SHOTS = SITE.parent / "screenshots"
SCREENSHOTS = os.environ.get("KERNELS_SITE_SCREENSHOTS", "0") == "1"
# The index.html at the root only redirects to the intro page (its link is checked like any other).
NOT_CONTENT = {"index.html"}
SKIP_DIRS = {"_static", "_sources", "_images", "reports", "jupyter_execute", "_downloads"}

def _pages() -> list[str]:
    if not (SITE / "index.html").is_file():
        return []
    pages = []
    for p in sorted(SITE.rglob("*.html")):
        rel = p.relative_to(SITE)
        if rel.parts[0] in SKIP_DIRS or rel.as_posix() in NOT_CONTENT or any(x.startswith(".") for x in rel.parts):
            continue
        pages.append(rel.as_posix())
    return pages


PAGES = _pages()


# --------------------------------------------------------------------------------------------- fixtures
class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest's output clean
        pass


@pytest.fixture(scope="session")
def site_url():
    if not (SITE / "index.html").is_file():
        pytest.fail(f"{SITE} has no built site: run `make book` first (`make test` does it for you)")
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------------------------------ link checks
@functools.lru_cache(maxsize=None)
def _ids(path: Path) -> frozenset[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    return frozenset(html.unescape(m) for m in re.findall(r'\b(?:id|name)="([^"]+)"', text))


def _broken_link(href: str, base: str) -> str | None:
    """Why an internal link does not resolve, or None when it does."""
    parts = urlsplit(href)
    if f"{parts.scheme}://{parts.netloc}" != base:
        return None  # external (not checked here; requests to it are blocked anyway) or mailto:
    path = unquote(parts.path)
    target = SITE / path.lstrip("/")
    if path.endswith("/") or target.is_dir():
        target = target / "index.html"
    if not target.is_file():
        return f"{href}: no such file {target.relative_to(SITE) if target.is_relative_to(SITE) else target}"
    frag = unquote(parts.fragment)
    if frag and target.suffix == ".html" and frag not in _ids(target):
        return f"{href}: no element with id {frag!r} in {target.relative_to(SITE)}"
    return None


# ------------------------------------------------------------------------------------------------ test
_WAIT_RENDERED = """() => {
  return !document.querySelector('.math') ||
      (window.MathJax && MathJax.startup && MathJax.startup.document &&
       Array.from(document.querySelectorAll('.math')).every(e => e.querySelector('mjx-container')));
}"""

_INSPECT = r"""async () => {
  const imgs = Array.from(document.images);
  imgs.forEach(i => { i.loading = 'eager'; });
  await Promise.all(imgs.map(i => i.complete ? null : new Promise(r => { i.onload = i.onerror = r; })));
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  return {
    badImages: imgs.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.getAttribute('src')),
    mathCount: document.querySelectorAll('.math').length,
    mathUntypeset: Array.from(document.querySelectorAll('.math'))
        .filter(e => !e.querySelector('mjx-container')).map(e => e.textContent.slice(0, 80)),
    mathErrors: Array.from(document.querySelectorAll('mjx-merror'))
        .map(e => (e.getAttribute('data-mjx-error') || e.textContent).slice(0, 120)),
    html: document.documentElement.outerHTML,
    untaggedTracebacks: Array.from(document.querySelectorAll('.cell:not(.tag_raises-exception) .output.traceback'))
        .map(e => (e.querySelector('pre') || e).textContent.trim().split(String.fromCharCode(10)).pop().slice(0, 160)),
    codeCells: document.querySelectorAll('.cell .cell_input').length,
    cellOutputs: document.querySelectorAll('.cell .cell_output').length,
    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
  };
}"""


# A page has settled when no request of its own is in flight for this long (Playwright's "networkidle" rule).
_QUIET_MS = 500
_SETTLE_S = 120


def _open(browser, url: str, problems: list[str]):
    """Load url in a fresh context and wait until it has rendered and settled.

    Returns (context, page, still_pending): the requests that had not finished when the wait gave up.
    Requests are counted here rather than with Playwright's "networkidle", so that a page which never settles
    says which request held it open.
    """
    context = browser.new_context(viewport={"width": 1280, "height": 900}, service_workers="block")

    def route(r):
        host = urlsplit(r.request.url).hostname
        if r.request.url.startswith(("data:", "blob:")) or host == "127.0.0.1":
            r.continue_()
        else:
            problems.append(f"request leaves 127.0.0.1: {r.request.url}")
            r.abort()

    context.route("**/*", route)
    p = context.new_page()
    # Generous limits: a loaded 2-core CI machine has taken over 30 s (Playwright's default) to render the longest
    # chapters; a page that never settles still fails, after 2 minutes.
    p.set_default_timeout(_SETTLE_S * 1000)
    pending: dict = {}
    p.on("request", lambda r: pending.__setitem__(id(r), r.url))
    p.on("requestfinished", lambda r: pending.pop(id(r), None))
    p.on("requestfailed", lambda r: pending.pop(id(r), None))
    p.on("console", lambda m: m.type == "error" and problems.append(f"console error: {m.text} @ {m.location}"))
    p.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    p.on("requestfailed", lambda r: urlsplit(r.url).hostname == "127.0.0.1"
         and problems.append(f"request failed: {r.url} ({r.failure})"))
    p.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"))

    p.goto(url, wait_until="load")
    try:
        p.wait_for_function(_WAIT_RENDERED, timeout=60_000)
    except Exception:  # reported in detail by the caller's checks
        pass
    deadline = time.monotonic() + _SETTLE_S
    quiet_since = None
    while time.monotonic() < deadline:
        if pending:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= _QUIET_MS / 1000:
            return context, p, []
        p.wait_for_timeout(100)  # lets Playwright deliver the request events meanwhile
    return context, p, sorted(set(pending.values()))


@pytest.mark.browser
@pytest.mark.parametrize("page", PAGES or ["<no built site>"])
def test_page(page, site_url, browser):
    assert PAGES, f"no pages found under {SITE}: run `make book` first"
    problems: list[str] = []
    context, p, stuck = _open(browser, f"{site_url}/{page}", problems)
    if stuck:
        # One CI run saw a chapter that loads in 8 s under full load never settle in 2 minutes; the page was not
        # the cause on reruns. Open it once more in a fresh context: a request that hangs twice is the page's.
        context.close()
        problems = []
        context, p, stuck = _open(browser, f"{site_url}/{page}", problems)
    try:
        problems += [f"request still in flight after {_SETTLE_S} s (opened twice): {u}" for u in stuck]
        info = p.evaluate(_INSPECT)

        problems += [f"image did not load: {s}" for s in info["badImages"]]
        problems += [f"math not typeset by MathJax: {t!r}" for t in info["mathUntypeset"]]
        problems += [f"MathJax error: {t!r}" for t in info["mathErrors"]]
        problems += [f"inert control (drawn, does nothing on a static page): {t}" for t in inert_controls(info["html"])]
        problems += [f"unrendered markup in the page text: {t}" for t in raw_markup(info["html"])]
        problems += [f"a cell shows an error and is not tagged raises-exception: {t}" for t in info["untaggedTracebacks"]]
        if page.startswith("notebooks/") and info["codeCells"] and not info["cellOutputs"]:
            problems.append(f"chapter has {info['codeCells']} code cells and no output: was it executed?")
        for href in sorted(set(info["links"])):
            why = _broken_link(href, site_url)
            if why:
                problems.append(f"broken internal link: {why}")

        if SCREENSHOTS:
            # Grow the viewport to the whole page first: the theme's sticky sidebars are as tall as the
            # viewport, so a plain full-page capture cuts them off after the first screen.
            height = p.evaluate("document.documentElement.scrollHeight")
            p.set_viewport_size({"width": 1280, "height": max(900, min(height, 30_000))})
            p.wait_for_timeout(100)
            SHOTS.mkdir(parents=True, exist_ok=True)
            p.screenshot(path=str(SHOTS / (page.replace("/", "__").removesuffix(".html") + ".png")), full_page=True)
    finally:
        context.close()
    assert not problems, f"{page}:\n  " + "\n  ".join(problems)


# ------------------------------------------------------------------------- the built files, without a browser
@pytest.mark.parametrize("page", PAGES or ["<no built site>"])
def test_page_prose_has_no_raw_markup(page):
    """The raw-markup and inert-control checks of `test_page`, on the built HTML file as written by the book
    build (no browser needed, so it runs where Chromium is missing)."""
    assert PAGES, f"no pages found under {SITE}: run `make book` first"
    text = (SITE / page).read_text(encoding="utf-8")
    problems = [f"unrendered markup in the page text: {t}" for t in raw_markup(text)]
    problems += [f"inert control (drawn, does nothing on a static page): {t}" for t in inert_controls(text)]
    assert not problems, f"{page}:\n  " + "\n  ".join(problems)


# ------------------------------------------------------------------------------------ make lab, headless
def test_make_lab_opens_markdown_notebooks_as_notebooks(tmp_path):
    """`make lab` starts JupyterLab with .jupyter/labconfig, so a double click on a chapter's .md opens the
    Jupytext Notebook viewer (not the text editor), and the server reads the .md as a notebook."""
    import json
    import secrets
    import signal
    import socket
    import subprocess
    import time
    import urllib.request

    chapter = next(iter(sorted((ROOT / "notebooks").glob("ch*.md"))), None)
    assert chapter is not None, "no chapter notebooks/ch*.md to open"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "user-settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"))
    lab_args = f"--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token={token} --ServerApp.port_retries=0"
    proc = subprocess.Popen(["make", "-s", "lab", f"LAB_ARGS={lab_args}"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)

    def get(path):
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.load(r)

    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                get("/api/status")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("`make lab` did not start JupyterLab:\n" + (proc.stdout.read() if proc.poll() is not None else "(timed out)"))
                time.sleep(0.5)
        plugin = get("/lab/api/settings/@jupyterlab/docmanager-extension:plugin")
        viewers = plugin["schema"]["properties"]["defaultViewers"]["default"]
        assert viewers.get("markdown") == "Jupytext Notebook", f"default viewers seen by JupyterLab: {viewers}"
        assert viewers.get("myst") == "Jupytext Notebook", f"default viewers seen by JupyterLab: {viewers}"
        model = get(f"/api/contents/{chapter.relative_to(ROOT).as_posix()}?type=notebook&content=1")
        assert model["type"] == "notebook" and model["content"]["cells"], "the server did not read the .md as a notebook"
        assert model["content"]["metadata"]["kernelspec"]["name"] == "python3"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ------------------------------------------------------------------------------ the kernel the book uses
def test_book_executes_pages_with_this_environments_python(monkeypatch):
    """Every page asks for the `python3` kernel, and (as `make book` runs it, JUPYTER_PREFER_ENV_PATH=1)
    that kernel is this environment's Python, not some other python3 kernelspec found in ~/.local."""
    import sys

    import yaml
    from jupyter_client.kernelspec import KernelSpecManager

    pages = sorted((ROOT / "notebooks").glob("ch*.md")) + sorted((ROOT / "exercises").glob("ch*.md"))
    assert pages, "no notebooks found"
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert text.startswith("---\n"), f"{page.relative_to(ROOT)} has no jupytext header"
        header = yaml.safe_load(text.split("---\n", 2)[1])
        assert header.get("kernelspec", {}).get("name") == "python3", f"{page.relative_to(ROOT)}: kernelspec is not python3"
    monkeypatch.setenv("JUPYTER_PREFER_ENV_PATH", "1")
    spec = KernelSpecManager().get_kernel_spec("python3")
    exe = spec.argv[0]
    # jupyter_client runs a bare "python" as sys.executable, i.e. this environment's interpreter.
    assert exe in ("python", "python3") or Path(exe).resolve().is_relative_to(Path(sys.prefix).resolve()), \
        f"the python3 kernel runs {exe}, not this environment ({sys.prefix}); spec in {spec.resource_dir}"
