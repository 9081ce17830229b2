"""The site's raw-markup and inert-control checks (tests/_site_text.py), on small HTML strings: no browser, no
built site. Each rule is shown to fire on the leak it is for, and to stay quiet on the honest prose that looks
like it (maths in words, subscripts, code and program output)."""
from __future__ import annotations

import pytest

from tests._site_text import inert_controls, raw_markup, visible_prose


def page(body: str) -> str:
    return f"<html><head><title>t `x`</title></head><body><nav>**menu**</nav><article>{body}</article></body></html>"


# ------------------------------------------------------------------------------------------ leaks caught
LEAKS = [
    ("backtick", "<p>the value is `kv_len` here</p>"),
    ("backtick", "<p>```python</p>"),
    ("bold", "<p>this is **important** text</p>"),
    ("bold", "<li>a __strong__ word</li>"),
    ("italics", "<p>an *emphasised* word</p>"),
    ("italics", "<p>an _emphasised_ word</p>"),
    ("link", "<p>see [chapter 5](ch05_gemm.md) for more</p>"),
    ("link", "<p>see [](../exercises/ch01_axpy.md)</p>"),
    ("link", "<p>![a figure](fig.png)</p>"),
    ("role", "<p>The limit is {glue:text}lr_max.</p>"),
    ("role", "<p>a {term}`warp` is</p>"),
    ("role", "<p>a {term} is</p>"),
    ("role", "<p>x {abc}`y` z</p>"),
    ("fence", "<p>:::{note}</p>"),
    ("fence", "<p>~~~</p>"),
    ("heading", "<p>## Results</p>"),
    ("heading", "<div class='output text_markdown'><p>text</p><p># Title</p></div>"),
    ("table", "<p>| a | b |</p>"),
    ("table", "<p>|---|---|</p>"),
    ("table", "<p>text |:---:| text</p>"),
    ("tag", "<p>a &lt;div class=&quot;x&quot;&gt; shown</p>"),
    ("tag", "<p>a &lt;br/&gt; shown</p>"),
    ("tag", "<p>&lt;!-- a comment --&gt;</p>"),
    ("entity", "<p>Tom &amp;amp; Jerry</p>"),
    ("entity", "<p>an &amp;#8212; dash</p>"),
    ("latex", "<p>cost $$O(n)$$</p>"),
    ("latex", "<p>ratio \\frac{a}{b}</p>"),
    # Markdown written by Python (display(Markdown(...))) is prose: its leaks count
    ("bold", "<div class='cell_output'><div class='output text_markdown'><p>**best**: 3 ms</p></div></div>"),
    ("backtick", "<div class='cell_output'><div class='output text_html'><table><tr><td>`gemm`</td></tr></table></div></div>"),
    # a leak right after a code element or math is still a leak
    ("bold", "<p><code>x</code>**y**</p>"),
    ("bold", "<p><span class='math'>x</span> and **y**</p>"),
]


@pytest.mark.parametrize("rule,body", LEAKS, ids=[f"{r}-{i}" for i, (r, _) in enumerate(LEAKS)])
def test_leak_is_reported(rule, body):
    found = raw_markup(page(body))
    assert any(f.startswith(rule + " ") for f in found), f"{rule} not found in {body!r}: {found}"


# -------------------------------------------------------------------------------------- honest prose passes
CLEAN = [
    "<p>the cost is a * b FLOPs, and 2*3*4 = 24</p>",
    "<p>each x_i and y_j, in snake_case_names and file ch01_axpy.md</p>",
    "<p>the launcher is called as f(*outputs, *inputs)</p>",
    "<p>a set {0, 1} and a range [0, 1) and (a) [b]</p>",
    "<p>if x &lt; y and z &gt; w then; run check &lt;op&gt;; a &amp; b</p>",
    "<p>costs 5 $ per hour; 100 % of peak; C# and F#</p>",
    "<p>item #3 is the third</p>",
    "<p>the absolute value |x| of x</p>",
    "<p><strong>bold</strong> and <em>italic</em> and <a href='x.html'>a link</a></p>",
    "<h2>Heading<a class='headerlink' href='#h'>#</a></h2>",
    "<table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>2</td></tr></table>",
    # code, program output and math keep their literal syntax
    "<p>use <code class='docutils literal'>**kwargs</code> and <code>`x`</code></p>",
    "<div class='highlight'><pre>x = a ** 2  # `note`\n## not a heading\n| a | b |</pre></div>",
    "<div class='cell_input'><div>y = **x</div></div>",
    "<div class='cell_output'><div class='output stream'><pre>**kwargs _x_ [a](b) &lt;div&gt;</pre></div></div>",
    "<div class='cell_output'><div class='output text_plain'><pre>| a | b |\n|---|---|</pre></div></div>",
    "<p>inline <span class='math notranslate'>\\(\\frac{a}{b}\\)</span> math</p>",
    "<div class='math notranslate'>\\[\\sum_i x_i $$\\]</div>",
    "<p><mjx-container><mjx-math>\\frac</mjx-math></mjx-container></p>",
    "<script>var a = '**x**';</script><style>a{}</style>",
]


@pytest.mark.parametrize("body", CLEAN)
def test_honest_prose_passes(body):
    assert raw_markup(page(body)) == []


def test_only_the_article_is_read_and_blocks_start_lines():
    text = visible_prose(page("<p>one</p><p>two <b>bold</b></p><ul><li>a</li><li>b</li></ul>"))
    assert "menu" not in text and "`x`" not in text
    assert [line.strip() for line in text.split("\n") if line.strip()] == ["one", "two bold", "a", "b"]


def test_page_without_article_reads_the_body():
    assert raw_markup("<html><body><p>a **b**</p></body></html>")
    assert raw_markup("<p>a **b**</p>")


def test_unclosed_and_stray_tags_do_not_hide_text():
    # a stray </code> must not end skipping early, nor an unclosed <p> swallow what follows
    assert raw_markup(page("<p>one <code>`a`</code></code> **two**<p>three")) != []
    assert raw_markup(page("<p>one<p>two *three*")) != []
    assert raw_markup(page("<p><img src='x.png'>**after an image**</p>")) != []


# ------------------------------------------------------------------------------------------- inert controls
@pytest.mark.parametrize("html,what", [
    ('<article><input type="range" min="0" max="10"></article>', "form control"),
    ('<article><select><option>a</option></select></article>', "form control"),
    ('<script type="application/vnd.jupyter.widget-state+json">{}</script>', "saved Jupyter widget"),
    ('<article><script type="application/vnd.jupyter.widget-view+json">{}</script></article>', "saved Jupyter widget"),
    ('<article><div class="jupyter-widgets widget-slider"></div></article>', "widget DOM"),
])
def test_inert_control_is_reported(html, what):
    found = inert_controls(f"<html><body>{html}</body></html>")
    assert any(f.startswith(what) for f in found), found


def test_theme_controls_and_static_figures_pass():
    html = ('<html><body><nav><input type="checkbox" id="toggle"><input type="search"></nav>'
            '<article><p>a figure</p><img src="a.png"><p><em>run this chapter in JupyterLab</em></p></article>'
            '<form class="bd-search"><input name="q"></form></body></html>')
    assert inert_controls(html) == []
