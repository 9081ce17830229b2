"""Which kernel each call of one capstone step gets, and why: the dispatcher's decisions, listed without
running anything (``kernels dispatch --explain train|decode``, chapter 14's tables).

The model drives a recording backend whose arrays are never computed, with the dispatcher that ``dev`` and
``table`` give. This lives above the model, not in the runtime: the dispatcher serves the model and never
imports it.

    rows = explain("train", cfg)     # one row per distinct (role, shape, variant), with its number of calls
    print(explain_text(rows))
"""
from __future__ import annotations

import numpy as np

from ..runtime.dispatch import TABLES, Dispatcher, shape_text
from .configs import BATCH, BENCH
from .gpt import GPT, Backend
from .reference import Config, param_shapes


def explain(step: str = "train", cfg=None, dev: str = "gpu", table=None, batch: int | None = None,
            seq: int | None = None, pos: int = 128) -> list[dict]:
    """Every distinct call of one training step (``step='train'``) or one decode step (``'decode'``) of the
    capstone model, in the order the model makes them: role, shape, calls per step, the variant picked, the
    rule and why (and the table entry when one decided). Nothing runs: the model drives a recording backend
    whose arrays are never computed, with the dispatcher that ``dev`` and ``table`` give (the device's
    committed table by default, as on that device)."""
    cfg = cfg or Config(**BENCH)
    if table is None and dev == "gpu":
        table = TABLES / "nvidia-h100-80gb-hbm3.json"
        table = table if table.exists() else {}
    disp = Dispatcher(dev, table=table, check=False)
    be = Backend("cpu", dispatcher=disp, dry=True)
    params = {n: np.zeros(s, np.float32) for n, s in param_shapes(cfg).items()}
    model = GPT(cfg, params, be)
    be.log = []
    if step == "train":
        B, T = batch or BATCH, seq or cfg.ctx
        ids = np.zeros((B, T), np.int64)
        model.forward(ids, ids)
        model.backward()
        model.adamw(1e-4)
    elif step == "decode":
        cache = model.new_cache(batch or 1)
        model.decode_step([0] * (batch or 1), pos, cache)
    else:
        raise ValueError(f"step must be 'train' or 'decode', not {step!r}")
    rows, index = [], {}
    for d in be.log:
        k = (d.role, shape_text(d.shape), d.variant)
        if k in index:
            rows[index[k]]["calls"] += 1
            continue
        index[k] = len(rows)
        rows.append({**d.row(), "calls": 1})
    return rows


def explain_text(rows: list[dict]) -> str:
    """The rows of :func:`explain` as an aligned text table (the command line's answer)."""
    cols = ["role", "shape", "calls", "variant", "rule", "why"]
    data = [[str(r[c]) if c != "why" else r[c][:70] for c in cols] for r in rows]
    w = [max(len(x) for x in col) for col in zip(cols, *data)]
    fmt = "  ".join("{:<%d}" % n for n in w)
    return "\n".join([fmt.format(*cols), fmt.format(*("-" * n for n in w))] + [fmt.format(*r) for r in data])
