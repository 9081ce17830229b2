"""The capstone's corpus and tokenizer: the course's own prose, read from notebooks/*.md at run time.

Code cells, YAML headers, MyST directives, tables, math blocks and HTML are dropped; what is left is
the chapters' sentences. Characters are the tokens: printable ASCII (32..126) plus the newline, 96
in all, with every other character mapped to '?' (a fixed vocabulary, so a model never depends on
which chapters happen to exist). No download, no licence question: the text is the course's own.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
VOCAB = len(CHARS)  # 96
_INDEX = {c: i for i, c in enumerate(CHARS)}
_UNK = _INDEX["?"]
_FOLD = {"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-",
         "\u2026": "...", "\u00d7": "x", "\u2264": "<=", "\u2265": ">=", "\u2248": "~", "\u2192": "->"}


def prose(text: str) -> str:
    """The prose of one MyST notebook: its Markdown cells without directives, math, tables or HTML."""
    out = []
    for source in _markdown_cells(text):
        skip = False
        for line in source.splitlines():
            s = line.strip()
            if s.startswith(("```", "$$", ":::")):
                skip = not skip
                continue
            if skip or s.startswith(("|", "<", "+++", "(", "#", "![", ":")):
                continue
            s = re.sub(r"\{(?:glue[a-z:]*|eval)\}`[^`]*`", "", s)  # computed numbers: left out
            s = re.sub(r"\{[a-z:]+\}`([^`<]*)(<[^`]*>)?`", r"\1", s)  # {term}`warp` -> warp
            s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)  # [text](link) -> text
            s = re.sub(r"[`*_$]", "", s)
            out.append(s)
        out.append("")
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip() + "\n"


def _markdown_cells(text):
    """The Markdown cells' sources (jupytext when installed; else split at the code-cell fences)."""
    try:
        import jupytext
    except ImportError:
        parts = re.split(r"^```\{code-cell\}[^\n]*\n.*?^```[ \t]*$", text, flags=re.M | re.S)
        return [p.split("\n---\n", 1)[-1] if i == 0 else p for i, p in enumerate(parts)]
    return [c.source for c in jupytext.reads(text, fmt="md:myst").cells if c.cell_type == "markdown"]


def corpus(pattern: str = "ch*.md") -> str:
    """The prose of every chapter matching pattern, in file order."""
    return "".join(prose(p.read_text(encoding="utf-8")) for p in sorted((ROOT / "notebooks").glob(pattern)))


def encode(text: str) -> np.ndarray:
    for a, b in _FOLD.items():
        text = text.replace(a, b)
    return np.array([_INDEX.get(c, _UNK) for c in text], dtype=np.int32)


def decode(ids) -> str:
    return "".join(CHARS[int(i)] for i in ids)


def batches(tokens: np.ndarray, batch: int, ctx: int, seed: int = 0):
    """An endless stream of (ids, targets), each (batch, ctx): random windows, targets shifted by one."""
    rng = np.random.default_rng(seed)
    while True:
        start = rng.integers(0, len(tokens) - ctx - 1, batch)
        idx = start[:, None] + np.arange(ctx)[None, :]
        yield tokens[idx], tokens[idx + 1]


def evaluate(model, tokens, batch, ctx, n_batches=2, seed=123) -> float:
    """The mean loss of ``model`` (anything with ``forward(ids, targets) -> (logits, loss)``) over ``n_batches``
    fixed random batches of ``tokens``: the validation loss of the training curves."""
    it = batches(tokens, batch, ctx, seed)
    return float(np.mean([model.forward(*next(it))[1] for _ in range(n_batches)]))


def split(tokens: np.ndarray, val_frac: float = 0.1):
    """(train, validation): the last val_frac of the text is held out."""
    n = int(len(tokens) * (1 - val_frac))
    return tokens[:n], tokens[n:]
