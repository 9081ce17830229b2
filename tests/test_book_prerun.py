"""book/_ext/kfs_prerun.py: the book's pages are executed side by side before Sphinx reads them, and what
the site shows and how a failing page fails stay myst-nb's."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PAGE = """---
jupytext:
  text_representation: {{extension: .md, format_name: myst}}
kernelspec: {{display_name: Python 3, language: python, name: python3}}
{front}---

# Page {name}

```{{code-cell}} ipython3
import json, time
t0 = time.time()
time.sleep({sleep})
{body}
with open({log!r}, "a") as f:
    f.write(json.dumps(["{name}", t0, time.time()]) + "\\n")
print("page {name} says", 6 * 7)
```
"""


def _book(tmp: Path, pages: dict[str, str], jobs: str) -> tuple[int, str, Path]:
    from test_lab_chapter import build_book

    log = tmp / "ran.jsonl"  # written by the pages, once build_book has made tmp
    texts = {name: PAGE.format(name=name, sleep=2, body=body, log=str(log),
                               front="kfs_build: {runs_alone: it times code}\n" if name == "solo" else "")
             for name, body in pages.items()}
    rc, out = build_book(tmp, texts, KERNELS_BOOK_JOBS=jobs)
    return rc, out, log


def _runs(log: Path) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        name, t0, t1 = json.loads(line)
        out.setdefault(name, []).append((t0, t1))
    return out


@pytest.mark.slow
def test_pages_run_side_by_side_once_and_a_failing_page_fails_as_myst_nb_reports_it(tmp_path):
    pages = {"a": "", "b": "", "c": "", "solo": "", "bad": "raise ValueError('page bad is broken')"}
    rc, log, ran = _book(tmp_path / "b", pages, jobs="2")
    assert "kfs_prerun: executing 4 pages, 2 at a time" in log, log[-3000:]
    assert "solo.md runs alone (it times code)" in log, log[-3000:]
    runs = _runs(ran)
    assert sorted(runs) == ["a", "b", "c", "solo"] and all(len(r) == 1 for r in runs.values()), runs  # once each
    spans = sorted(runs[n][0] for n in "abc")
    assert spans[1][0] < spans[0][1] or spans[2][0] < spans[1][1], f"no two pages ran at the same time: {spans}"
    solo = runs["solo"][0]
    assert all(solo[0] >= s[1] for s in spans), f"the page that runs alone overlapped another: {solo}, {spans}"
    assert log.count("Using cached notebook") == 3, log[-3000:]
    for name in ("a", "b", "c", "solo"):
        html = (tmp_path / "b" / "_build" / "html" / f"{name}.html").read_text()
        assert f"page {name} says 42" in html
    # the page that raises: left out of the cache here, executed again by myst-nb, whose report fails the build;
    # the page that runs alone: executed by myst-nb
    assert "bad.md failed here" in log and log.count("Executing notebook using local CWD") == 2, log[-3000:]
    assert rc != 0 and "Executing notebook failed" in log and "page bad is broken" in log, log[-3000:]


@pytest.mark.slow
def test_one_job_leaves_the_pages_to_myst_nb(tmp_path):
    rc, log, ran = _book(tmp_path / "b", {"a": "", "b": ""}, jobs="1")
    assert rc == 0, log[-3000:]
    assert "kfs_prerun" not in log and log.count("Executing notebook using local CWD") == 2, log[-3000:]
    spans = sorted(r[0] for r in _runs(ran).values())
    assert len(spans) == 2 and spans[1][0] >= spans[0][1], spans


def test_pages_that_time_code_run_alone():
    """A page that times code on the machine that builds it must not share the machine with another page: its
    front matter says so (kfs_build: runs_alone), and kfs_prerun leaves it to myst-nb, which runs it alone."""
    import re

    timer = re.compile(r"time\.perf_counter|time\.time\(|timeit|\bseconds=")
    bad = []
    for path in sorted((ROOT / "notebooks").glob("ch*.md")) + [ROOT / "book" / "intro.md"]:
        text = path.read_text(encoding="utf-8")
        front = text.split("\n---\n", 1)[0]
        code = "\n".join(re.findall(r"```\{code-cell\}[^\n]*\n(.*?)```", text, re.S))
        if timer.search(code) and "runs_alone:" not in front:
            bad.append(path.name)
    assert not bad, f"these pages time code but may run beside another page: {bad} (kfs_build: runs_alone: why)"
