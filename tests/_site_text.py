"""What a reader of the built site sees as text, and the markup that must never be part of it.

Pure functions over HTML (the standard library's parser, no browser), so they are unit tested on small strings
(tests/test_site_markup.py) and run over every page of `_build/html`, both from the files on disk and from the
DOM after the browser has run the page's scripts (tests/test_site.py).

:func:`visible_prose` is the text a reader reads as prose: the page's ``<article>`` (the whole ``<body>`` when
it has none), without code and without mathematics. Deliberately left out, because literal syntax is their
content: ``pre``, ``code``, ``kbd``, ``samp``, ``script``, ``style``, ``textarea``, ``svg`` and MathML
elements; elements of class ``math`` (MathJax's input), ``mjx-container`` (its output), ``highlight``
(highlighted code) and ``cell_input`` (a code cell's source); ``headerlink`` (the theme's "#" glyph beside a
heading). A code cell's plain-text, stream and traceback outputs are ``pre`` and so are left out: they are
what the program printed, and Python's ``**`` or a backtick in a message is right there. Markdown and HTML
outputs (``display(Markdown(...))``, tables built by code) ARE prose and are checked: the book renders them like
page text, so raw syntax in them is a bug of the Python that wrote them. Block elements (paragraphs, list items,
table cells, headings, ...) start a new line, so the line rules (a leading ``#``, a ``| a | b |`` row) see
where a block begins.

:func:`raw_markup` lists every piece of unrendered MyST or Markdown in that text, with the rule it breaks and
a few words around it. The rules, and what keeps each from firing on honest prose:

- ``backtick``: any ````` (inline code that was not rendered, or the start of a fence);
- ``bold``: ``**`` anywhere; ``__text__`` only as a pair that is not inside a word;
- ``italics``: ``*text*`` or ``_text_`` whose opening mark is not preceded, and whose closing mark is not
  followed, by a letter/digit, and with no space just inside the marks. So ``a * b``, ``2*3*4``, ``x_i``,
  ``snake_case`` and ``f(*args, *rest)`` pass;
- ``link``: ``[text](target)`` and ``![alt](src)``;
- ``role``: ``{name}`` followed by a backtick, or a known role/directive name (``{glue:text}``, ``{term}``,
  ``{ref}``, ``{note}``, ...) or any ``{prefix:name}``;
- ``fence``: ``:::`` or ``~~~``;
- ``heading``: a line of a block that starts with 1 to 6 ``#`` and a space;
- ``table``: a delimiter row ``|---|`` or a line that starts with ``|`` and has three or more ``|``;
- ``tag``: an HTML tag shown as text (``<div>``, ``</span>``, ``<br/>``, ``<!--``), for real HTML element
  names only, so ``a <b>`` is flagged but ``x <y and z> w`` and ``check <op>`` are not;
- ``entity``: an HTML entity shown literally (``&amp;``, ``&#8212;``), i.e. escaped twice;
- ``latex``: ``$$`` or a LaTeX command (``\\frac``, ``\\sum``, ``\\text``, ...) outside math.

:func:`inert_controls` lists what would be drawn as a control and do nothing on a static page: an ``<input>``
or ``<select>`` in the page's content, and any Jupyter widget (saved widget state, a widget view, widget DOM).
"""
from __future__ import annotations

import re
from html.parser import HTMLParser

SKIP_TAGS = frozenset({"pre", "code", "kbd", "samp", "script", "style", "textarea", "svg", "math", "template",
                       "noscript", "head", "title", "mjx-container", "mjx-assistive-mml"})
SKIP_CLASSES = frozenset({"math", "highlight", "cell_input", "headerlink", "MathJax", "MathJax_Preview"})
BLOCK_TAGS = frozenset({"p", "li", "ul", "ol", "dl", "dt", "dd", "td", "th", "tr", "table", "thead", "tbody",
                        "caption", "figcaption", "figure", "blockquote", "div", "section", "article", "aside",
                        "header", "footer", "nav", "main", "h1", "h2", "h3", "h4", "h5", "h6", "br", "hr",
                        "details", "summary", "body"})
VOID_TAGS = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
                       "source", "track", "wbr"})
HTML_NAMES = ("a|abbr|article|audio|b|blockquote|br|caption|center|code|dd|del|details|div|dl|dt|em|figcaption|"
              "figure|font|h[1-6]|hr|i|iframe|img|input|ins|kbd|li|mark|math|ol|p|pre|s|script|section|select|"
              "small|span|strong|style|sub|summary|sup|svg|table|tbody|td|th|thead|tr|tt|u|ul|var|video")
ROLE_NAMES = ("glue|glue:text|glue:md|glue:any|glue:figure|glue:math|term|ref|doc|numref|eq|math|cite|download|"
              "abbr|sub|sup|code|code-cell|note|warning|tip|important|caution|admonition|seealso|figure|image|"
              "dropdown|raw|raw-cell|list-table|table|literalinclude|index|toctree|eval|func|class|mod|envvar|"
              "prf:[a-z]+")

INLINE_RULES: tuple[tuple[str, re.Pattern], ...] = tuple((name, re.compile(rx)) for name, rx in (
    ("backtick", r"`[^`\n]{1,80}`|`+"),  # a code span that was not rendered counts once
    ("bold", r"\*\*|(?<![\w_])__(?=[^\s_])[^\n]*?(?<=[^\s_])__(?![\w_])"),
    ("italics", r"(?<![\w*\\])\*(?=[^\s*])[^*\n]*?(?<=[^\s*\\])\*(?![\w*])"),
    ("italics", r"(?<![\w_\\])_(?=[^\s_])[^_\n]*?(?<=[^\s_\\])_(?![\w_])"),
    ("link", r"!?\[[^\]\n]*\]\([^)\s]*\)"),
    ("role", rf"\{{[A-Za-z][\w.-]*(?::[\w.-]+)*\}}(?=`)|\{{(?:{ROLE_NAMES})\}}|\{{[a-z][\w-]*:[\w:-]+\}}"),
    ("fence", r":::|~~~"),
    ("tag", rf"</?(?:{HTML_NAMES})(?:\s[^<>\n]*)?/?>|<!--"),
    ("entity", r"&(?:[A-Za-z][A-Za-z0-9]{1,31}|#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6});"),
    ("latex", r"\$\$|\\(?:frac|sum|prod|mathrm|mathbf|text|left|right|begin|end|cdot|times|sqrt|operatorname|"
              r"alpha|beta|gamma|theta|sigma|lambda|epsilon|approx|le|ge|ldots|cdots)(?![A-Za-z])"),
))
LINE_RULES: tuple[tuple[str, re.Pattern], ...] = tuple((name, re.compile(rx)) for name, rx in (
    ("heading", r"^[ \t]*#{1,6}[ \t]+\S"),
    ("table", r"\|[ \t]*:?-{3,}:?[ \t]*\||^[ \t]*\|[^|\n]*\|[^|\n]*\|"),
))


class _Prose(HTMLParser):
    """Collects the text of ``<article>`` (or of the whole document), skipping code and math subtrees."""

    def __init__(self, scope: str | None):
        super().__init__(convert_charrefs=True)
        self.scope = scope          # "article", or None for the whole document
        self.stack: list[tuple[str, bool, bool]] = []   # (tag, opens a skipped subtree, opens the scope)
        self.skip = 0
        self.inside = 0 if scope else 1
        self.parts: list[str] = []
        self.found_scope = False

    def handle_starttag(self, tag, attrs):
        classes = set((dict(attrs).get("class") or "").split())
        if tag in BLOCK_TAGS and self.inside and not self.skip:
            self.parts.append("\n")
        if tag in VOID_TAGS:
            return
        skipped = tag in SKIP_TAGS or bool(classes & SKIP_CLASSES)
        scope = tag == self.scope
        self.stack.append((tag, skipped, scope))
        self.skip += skipped
        if scope:
            self.inside += 1
            self.found_scope = True

    def handle_startendtag(self, tag, attrs):
        if tag in BLOCK_TAGS and self.inside and not self.skip:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if not any(t == tag for t, _, _ in self.stack):
            return  # a stray end tag: ignore it, as browsers do
        while self.stack:
            t, skipped, scope = self.stack.pop()
            self.skip -= skipped
            self.inside -= scope
            if t == tag:
                break
        if tag in BLOCK_TAGS and self.inside and not self.skip:
            self.parts.append("\n")

    def handle_data(self, data):
        if self.inside and not self.skip:
            self.parts.append(data)


def visible_prose(page_html: str) -> str:
    """The prose of a page as a reader sees it (see the module docstring for what is left out)."""
    p = _Prose("article")
    p.feed(page_html)
    p.close()
    if not p.found_scope:
        p = _Prose(None)
        p.feed(page_html)
        p.close()
    text = "".join(p.parts).replace("\xa0", " ")
    return re.sub(r"\n[ \t]*(?=\n)", "\n", text)


def _around(text: str, start: int, end: int, width: int = 40) -> str:
    return re.sub(r"\s+", " ", text[max(0, start - width): end + width]).strip()


def raw_markup(page_html: str) -> list[str]:
    """Every piece of unrendered MyST/Markdown/HTML/LaTeX syntax in the page's prose, as
    ``"rule: ...context..."`` strings (empty when the page is clean)."""
    text = visible_prose(page_html)
    found = []
    for name, rx in INLINE_RULES:
        for m in rx.finditer(text):
            found.append((m.start(), f"{name} {m.group(0)[:30]!r}: ...{_around(text, m.start(), m.end())}..."))
    offset = 0
    for line in text.split("\n"):
        for name, rx in LINE_RULES:
            m = rx.search(line)
            if m:
                found.append((offset + m.start(), f"{name} {line.strip()[:30]!r}: ...{_around(line, m.start(), m.end())}..."))
        offset += len(line) + 1
    return [msg for _, msg in sorted(found)]


class _Controls(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []
        self.depth_article = 0
        self.saw_article = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        kind = (a.get("type") or "").lower()
        if tag == "article":
            self.depth_article += 1
            self.saw_article = True
        if tag == "script" and kind.startswith("application/vnd.jupyter.widget"):
            self.found.append(f"saved Jupyter widget ({kind})")
        elif any(c == "jupyter-widgets" or c.startswith("widget-") for c in classes):
            self.found.append(f"widget DOM <{tag} class={' '.join(classes)!r}>")
        elif tag in ("input", "select", "textarea") and self.depth_article:
            self.found.append(f"form control <{tag}{' type=' + kind if kind else ''}> in the page content")

    def handle_endtag(self, tag):
        if tag == "article" and self.depth_article:
            self.depth_article -= 1


def inert_controls(page_html: str) -> list[str]:
    """Everything on the page that would look like a control and do nothing without a kernel: Jupyter widget
    state, views or DOM anywhere, and ``<input>``/``<select>``/``<textarea>`` inside the page's article (the
    theme's own search box and toggles live outside it)."""
    p = _Controls()
    p.feed(page_html)
    p.close()
    return p.found
