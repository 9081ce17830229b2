"""Tables, training loop and plots for chapter 13 (the capstone GPT)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from .. import registry
from ..model import data
from ..model.data import evaluate
from ..model.gpt import GPT
from ..model.reference import Config, ReferenceGPT, init_params, param_shapes

H100 = Path(__file__).resolve().parents[2] / "book" / "data" / "bench" / "h100"
CHAPTER_FILES = {1: "ch01_what_is_a_kernel", 3: "ch03_backprop_mlp", 5: "ch05_gemm", 6: "ch06_activations_fusion",
                 7: "ch07_reductions_norms", 8: "ch08_softmax", 9: "ch09_attention", 10: "ch10_rope_kv_cache",
                 11: "ch11_quantization", 12: "ch12_optimizers", 13: "ch13_capstone_gpt"}

# (what, shape, role) in the order a training step runs them
ARCH = [
    ("token embedding x = wte[ids]", "ids (B,T) -> x (N,C)", "embedding"),
    ("RMSNorm (before attention, before the MLP, at the end)", "x (N,C) -> h (N,C), rstd (N,)", "rmsnorm"),
    ("QKV projection h Wqkv", "(N,C) @ (C,3C) -> (N,3C)", "gemm"),
    ("RoPE on q and k, heads split out (the cache write)", "(B,T,3H,D) -> q, k, v (B,H,T,D)", "rope_qkv"),
    ("causal attention", "q, k, v (B,H,T,D) -> o (B,H,T,D), lse (B,H,T)", "attention"),
    ("heads merged back", "(B,H,T,D) -> (B,T,C)", "heads_merge"),
    ("output projection, MLP up and down", "(N,C)@(C,C), (N,C)@(C,F), (N,F)@(F,C)", "gemm"),
    ("GELU", "(N,F) -> (N,F)", "gelu"),
    ("residual adds x + f(x)", "(N,C) + (N,C)", "add"),
    ("tied LM head xf wte^T", "(N,C) @ (C,V) -> logits (N,V)", "gemm"),
    ("fused softmax cross-entropy", "logits (N,V), targets (N,) -> loss (N,), lse (N,)", "cross_entropy"),
    ("mean loss", "(N,) -> (1,)", "sum"),
    ("backward: its cross-entropy, norms, GELU, attention, RoPE", "same shapes", "cross_entropy_bwd"),
    ("backward: every product as a GEMM on a transposed copy", "dX = G W^T, dW = X^T G", "transpose"),
    ("backward: embedding scatter-add", "dx (N,C) -> dwte (V,C)", "embedding_bwd"),
    ("AdamW on the flat parameter buffer", "p, g, m, v (P,)", "adamw"),
    ("decode: attention of one new token against the KV cache", "q (1,H,D), K, V (1,H,L,D)", "decode_attention"),
    ("decode on quantized weights: dequantizing GEMV", "x (C,) . Wq -> (N,)", "qgemv_q8_0"),
]


def chapter_of(variant_key: str) -> int:
    return registry.get_op(variant_key.split("/")[0]).chapter


def link(ch: int) -> str:
    return f"[{ch}]({CHAPTER_FILES[ch]}.md)" if ch in CHAPTER_FILES else str(ch)


def architecture_table(be) -> str:
    rows = ["| step | shapes | kernel (op/backend/variant) | chapter |", "|---|---|---|---|"]
    for what, shape, role in ARCH:
        key = be.table[role]
        rows.append(f"| {what} | `{shape}` | `{key}` | {link(chapter_of(key))} |")
    return "\n".join(rows)


def param_table(cfg: Config) -> tuple[str, int]:
    shapes = param_shapes(cfg)
    groups = {}
    for n, s in shapes.items():
        key = n.split(".")[-1]
        groups.setdefault(key, [0, s])[0] += int(np.prod(s))
    total = sum(v[0] for v in groups.values())
    rows = ["| tensor | shape (each) | parameters (all layers) |", "|---|---|---|"]
    for k, (n, s) in groups.items():
        rows.append(f"| `{k}` | `{s}` | {n:,} |")
    rows.append(f"| **total** | | **{total:,}** |")
    return "\n".join(rows), total


def parity_table(cfg: Config, B=2, T=11, seed=1) -> str:
    """Max error of the course-kernel GPT (CPU backend) against the float64 reference, per tensor."""
    p = init_params(cfg, seed)
    rng = np.random.default_rng(seed + 100)
    p = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in p.items()}
    ids = rng.integers(0, cfg.vocab, (B, T))
    tg = rng.integers(0, cfg.vocab, (B, T))
    ref = ReferenceGPT(cfg, p)
    lr, loss_r = ref.forward(ids, tg)
    gr = ref.backward()
    m = GPT(cfg, p, "cpu")
    logits, loss = m.forward(ids, tg)
    m.backward()
    g = m.grads()
    rows = ["| tensor | max abs error | max abs value (float64) | error / max value |", "|---|---|---|---|"]

    def row(name, got, want):
        e, s = float(np.abs(got - want).max()), float(np.abs(want).max())
        rows.append(f"| `{name}` | {e:.2e} | {s:.3g} | {e / s:.1e} |")

    row("logits", m.be.host(logits), lr.reshape(B * T, -1))
    row("loss", np.array([loss]), np.array([loss_r]))
    for k in gr:
        row("d " + k, g[k], gr[k])
    return "\n".join(rows)


def train(model: GPT, tokens, steps, batch, ctx, lr, warmup=10, seconds=None, seed=0, every=5, val=None):
    """AdamW with linear warm-up and cosine decay; returns {"step", "loss", "val", "seconds"}. Stops
    early after ``seconds`` of wall time (the book build has a budget)."""
    it = data.batches(tokens, batch, ctx, seed)
    hist = {"step": [], "loss": [], "val_step": [], "val": [], "seconds": 0.0, "tokens": 0}
    t0 = time.perf_counter()
    for s in range(steps):
        frac = min(1.0, (s + 1) / warmup)
        lr_s = lr * frac * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * s / steps)))
        ids, tg = next(it)
        loss = model.train_step(ids, tg, lr_s)
        hist["step"].append(s + 1)
        hist["loss"].append(loss)
        hist["tokens"] += ids.size
        out_of_time = seconds is not None and time.perf_counter() - t0 > seconds
        # held-out loss every `every` steps, after the first step, and at the last step (also when time runs out)
        if val is not None and (s == 0 or (s + 1) % every == 0 or s == steps - 1 or out_of_time):
            hist["val_step"].append(s + 1)
            hist["val"].append(evaluate(model, val, batch, ctx))
        if out_of_time:
            break
    hist["seconds"] = time.perf_counter() - t0
    return hist


def bytes_per_token(cfg: Config, fmt: str, position: int) -> dict:
    """Bytes one decode step must read: every weight matrix once (in its format) plus the KV cache
    rows of all layers up to ``position``. Norm gains and activations are negligible."""
    per_weight = {"fp32": 4.0, "q8_0": 34 / 32, "q4_0": 18 / 32}[fmt]
    shapes = param_shapes(cfg)
    n_mat = sum(int(np.prod(s)) for s in shapes.values() if len(s) == 2)
    kv = 2 * cfg.layers * cfg.width * 4 * position
    return {"weights": n_mat * per_weight, "kv": kv, "total": n_mat * per_weight + kv}


def read_h100(name="gpt_gpu.json"):
    try:
        return json.loads((H100 / name).read_text())
    except (OSError, ValueError):
        return None


def breakdown_by_chapter(times: dict, table: dict) -> dict:
    """{chapter: seconds} from a profile {role: seconds}."""
    out = {}
    for role, t in times.items():
        ch = chapter_of(table[role])
        out[ch] = out.get(ch, 0.0) + t
    return dict(sorted(out.items()))


def stacked_bar(ax, label_times: dict, table: dict, title=""):
    """One stacked bar per label, each segment a chapter's share of the step's time."""
    import matplotlib.pyplot as plt

    labels = list(label_times)
    per = [breakdown_by_chapter(t, table) for t in label_times.values()]
    chapters = sorted({c for d in per for c in d})
    cmap = plt.get_cmap("tab20")
    for i, lab in enumerate(labels):
        total = sum(per[i].values())
        left = 0.0
        for j, ch in enumerate(chapters):
            w = 100 * per[i].get(ch, 0.0) / total
            ax.barh(i, w, left=left, color=cmap(j % 20), label=f"ch {ch}" if i == 0 else None)
            if w > 6:
                ax.text(left + w / 2, i, f"ch{ch}\n{w:.0f}%", ha="center", va="center", fontsize=8)
            left += w
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("% of the step's kernel time")
    ax.set_title(title)
    ax.legend(ncol=6, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25))
