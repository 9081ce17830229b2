"""Figures and tables for the quantization chapter: error sweeps on outlier weights, the GGML byte layout,
the histogram widget, and the accuracy-versus-speed table built from committed H100 JSON."""
from __future__ import annotations

import numpy as np

from ..ops import quant as q
from ..plots import load_bench


def error_table(w) -> list[dict]:
    """MSE, max error and SNR of every scheme on weights w (M, K)."""
    out = []
    for name, fn in [("int8 sym, per tensor", lambda: q.int8_symmetric(w)[0]),
                     ("int8 sym, per row", lambda: q.int8_symmetric(w, axis=1)[0]),
                     ("int8 sym, block 32", lambda: q.int8_symmetric(w, block=32)[0]),
                     ("int8 asym, per row", lambda: q.int8_asymmetric(w, axis=1)[0]),
                     ("Q8_0 (GGML)", lambda: q.q8_0_dequantize_ref(q.q8_0_quantize_ref(w))),
                     ("Q4_0 (GGML)", lambda: q.q4_0_dequantize_ref(q.q4_0_quantize_ref(w)))]:
        out.append({"scheme": name, **q.errors(w, fn())})
    return out


def markdown_errors(rows) -> str:
    t = ["| scheme | MSE | max abs error | SNR (dB) |", "|---|---|---|---|"]
    t += [f"| {r['scheme']} | {r['mse']:.2e} | {r['max']:.2e} | {r['snr_db']:.1f} |" for r in rows]
    return "\n".join(t)


def snr_vs_block(w, blocks=(32, 64, 128, 256, 512, 1024, 4096)):
    """SNR of symmetric int8 and of a 4-bit symmetric scheme with one scale per `block` weights."""
    res = {"block": list(blocks), "int8": [], "int4": []}
    for b in blocks:
        res["int8"].append(q.errors(w, q.int8_symmetric(w, block=b)[0])["snr_db"])
        g = w.reshape(*w.shape[:-1], -1, b).astype(np.float64)
        s = np.abs(g).max(-1, keepdims=True) / 7
        s[s == 0] = 1
        res["int4"].append(q.errors(w, (np.clip(np.rint(g / s), -8, 7) * s).reshape(w.shape))["snr_db"])
    return res


def plot_snr_vs_block(w, ax=None):
    import matplotlib.pyplot as plt

    r = snr_vs_block(w)
    ax = ax or plt.subplots(figsize=(6, 3.5))[1]
    ax.semilogx(r["block"], r["int8"], "o-", label="int8, symmetric")
    ax.semilogx(r["block"], r["int4"], "s-", label="int4, symmetric")
    ax.set_xlabel("weights per scale (block size)")
    ax.set_ylabel("SNR (dB), higher is better")
    ax.set_title("smaller blocks isolate the outliers")
    ax.legend()
    return ax


def plot_byte_layout(ax=None):
    """The two blocks, byte by byte, at the same width per byte: the fp16 scale d (2 bytes), then the quants.
    Q8_0: one int8 per byte. Q4_0: two 4-bit quants per byte, drawn as the byte's two halves (low nibble
    below, high nibble above). Drawn at the page's width, so its labels are shown at 11 px or more."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, ax = plt.subplots(figsize=(7.4, 2.9)) if ax is None else (ax.figure, ax)
    u = 1.0  # one byte
    for name, nq, y in [("Q8_0: 34 bytes = d (fp16) + 32 int8 quants q0 ... q31", 32, 2.3),
                        ("Q4_0: 18 bytes = d (fp16) + 16 bytes of two 4-bit quants each", 16, 0.35)]:
        ax.text(0, y + 1.12, name, ha="left", va="bottom", fontsize=9)
        ax.add_patch(Rectangle((0, y), 2 * u, 1, fc="#f4b183", ec="k"))
        ax.text(u, y + 0.5, "d", ha="center", va="center", fontsize=9, style="italic")
        for j in range(nq):
            x = 2 * u + j * u
            if nq == 32:
                ax.add_patch(Rectangle((x, y), u, 1, fc="#9dc3e6", ec="k", lw=0.8))
                ax.text(x + u / 2, y + 0.5, f"{j}", ha="center", va="center", fontsize=8)
            else:
                ax.add_patch(Rectangle((x, y), u, 0.5, fc="#a9d18e", ec="k", lw=0.8))
                ax.add_patch(Rectangle((x, y + 0.5), u, 0.5, fc="#c5e0b4", ec="k", lw=0.8))
                ax.text(x + u / 2, y + 0.25, f"{j}", ha="center", va="center", fontsize=8)
                ax.text(x + u / 2, y + 0.75, f"{j + 16}", ha="center", va="center", fontsize=8)
    ax.text(18.6, 0.6, "byte j: low nibble = element j (below),\nhigh nibble = element j+16 (above)",
            ha="left", va="center", fontsize=8.5)
    ax.text(0, -0.25, "Q8_0: value = q * d, q an int8.    Q4_0: value = (nibble - 8) * d.", ha="left", va="top",
            fontsize=9)
    ax.set_xlim(-0.1, 34.1)
    ax.set_ylim(-0.8, 3.8)
    ax.axis("off")
    return ax


def histogram_widget(seed=0):
    """A histogram of one row of weights with the quantization grid of its first block drawn over it;
    sliders for the block size and the outlier magnitude."""
    import matplotlib.pyplot as plt

    from .controls import interact

    rng = np.random.default_rng(seed)
    base = rng.standard_normal(4096) * 0.02
    where = rng.random(4096) < 0.002

    def draw(block=32, outlier=20.0, bits=8):
        w = base.copy()
        w[where] *= outlier
        levels = 2 ** (bits - 1) - 1
        first = w[:block]
        scale = np.abs(first).max() / levels
        fig, ax = plt.subplots(figsize=(8, 3.2))
        ax.hist(w, bins=200, color="#9dc3e6")
        shown = np.arange(-levels, levels + 1) * scale
        shown = shown[np.abs(shown) <= 0.12]
        for g in shown:
            ax.axvline(g, color="k", lw=0.4, alpha=0.6)
        wb = w[: (w.size // block) * block].reshape(-1, block)
        s = np.abs(wb).max(1, keepdims=True) / levels
        e = q.errors(wb, np.clip(np.rint(wb / s), -levels, levels) * s)
        ax.set_xlim(-0.12, 0.12)
        ax.set_title(f"int{bits}, one scale per {block} weights: grid of the first block ({scale:.2e} apart), "
                     f"SNR over all blocks {e['snr_db']:.1f} dB", fontsize=9)
        ax.set_xlabel("weight value")
        plt.show()

    return interact(draw, lambda W: dict(
        block=W.SelectionSlider(options=[32, 64, 128, 256, 1024, 4096], value=32, description="block"),
        outlier=W.FloatLogSlider(value=20.0, base=10, min=0, max=2.5, step=0.1, description="outlier"),
        bits=W.IntSlider(value=8, min=3, max=8, description="bits")), action="move the sliders")


def gemv_relative_error(fmt, K=1024, N=256, seed=0):
    """Relative L2 error of y = x . dequant(quant(W)) against fp32 y on outlier-bearing weights."""
    rng = np.random.default_rng(seed)
    W = q.outlier_weights((N, K), rng).astype(np.float64)
    x = rng.standard_normal(K)
    y = W @ x
    if fmt == "fp32":
        return 0.0
    yq = q.DEQUANT[fmt](q.QUANT[fmt](W.astype(np.float32))) @ x
    return float(np.linalg.norm(yq - y) / np.linalg.norm(y))


def row(res, variant, size):
    for r in res["rows"]:
        if r["variant"] == variant and tuple(r["size"]) == tuple(size) and "median_s" in r:
            return r
    return None


def accuracy_speed(size=(8192, 8192)):
    """Per format: bytes per weight, GEMV error, the fastest course kernel's time and GB/s, and its
    speed-up over chapter 4's fp32 GEMV and over torch, from the committed H100 files."""
    out = []
    base = None
    for fmt in ("q8_0", "q4_0"):
        res = load_bench(f"h100/qgemv_{fmt}_gpu")
        best = min((r for r in res["rows"] if "median_s" in r and not r["baseline"] and tuple(r["size"]) == size),
                   key=lambda r: r["median_s"])
        fp32 = row(res, "fp32_gemv", size)
        torch = row(res, "torch", size)
        if base is None:
            base = {"format": "fp32 (chapter 4, splitk_grid)", "bpw": 4.0, "err": 0.0, "variant": "fp32_gemv",
                    "time": fp32["median_s"], "gbps": fp32["gbps"], "frac": fp32.get("frac_copy_bw"),
                    "vs_fp32": 1.0, "vs_torch": torch["median_s"] / fp32["median_s"], "predicted": 1.0}
            out.append(base)
        bpw = q.FORMATS[fmt] / q.QK
        out.append({"format": fmt.upper(), "bpw": bpw, "err": gemv_relative_error(fmt), "variant": best["variant"],
                    "time": best["median_s"], "gbps": best["gbps"], "frac": best.get("frac_copy_bw"),
                    "vs_fp32": fp32["median_s"] / best["median_s"], "vs_torch": torch["median_s"] / best["median_s"],
                    "predicted": 4.0 / bpw})
    return out


def markdown_accuracy_speed(rows) -> str:
    from ..bench import fmt_time

    t = ["| format | bytes/weight | GEMV rel. error | best kernel | time | GB/s (bytes read) | % of copy | "
         "predicted speed-up (4/bytes) | measured vs fp32 GEMV | vs torch fp32 |", "|" + "---|" * 10]
    for r in rows:
        t.append(f"| {r['format']} | {r['bpw']:.4g} | {r['err']:.2e} | `{r['variant']}` | {fmt_time(r['time'], 'µs')} | "
                 f"{r['gbps']:,.0f} | {100 * r['frac']:.0f} % | {r['predicted']:.2f}× | {r['vs_fp32']:.2f}× | "
                 f"{r['vs_torch']:.2f}× |")
    return "\n".join(t)


def ncu_metrics(path=None) -> dict:
    """Parse the committed Nsight Compute report (book/data/bench/h100/qgemv_ncu.txt) into
    {kernel name: {metric: value}} for the metrics the chapter quotes."""
    import re

    from ..plots import DATA

    path = path or DATA / "h100" / "qgemv_ncu.txt"
    out, cur = {}, None
    want = {"DRAM Throughput": "dram_pct", "Compute (SM) Throughput": "sm_pct", "Duration": "duration_us",
            "Achieved Occupancy": "occupancy_pct", "Registers Per Thread": "registers",
            "Block Limit Registers": "blocks_per_sm"}
    for line in open(path):
        m = re.match(r"^  (\w+_kernel)\[", line)
        if m:
            cur = out.setdefault(m.group(1), {})
            continue
        if cur is None:
            continue
        for label, key in want.items():
            if line.strip().startswith(label) and key not in cur:
                cur[key] = float(line.split()[-1].replace(",", ""))
    return out


# ============================================================================ the error model (Delta^2 / 12)
def markdown_error_model(rows) -> str:
    """The error-model table: per weights and format, the Gaussian formula, the prediction from the
    blocks' own steps, the measured RMS, measured/predicted, SNR, and the outliers' share."""
    t = ["| weights | format | Gaussian formula | predicted from the blocks' Δ | measured | measured / predicted | "
         "SNR (dB) | blocks with an outlier | their share of the squared error |", "|" + "---|" * 9]
    for r in rows:
        g = f"{r['gauss']:.3e}" if r["gauss"] is not None else "–"
        t.append(f"| {r['weights']} | {r['format']} | {g} | {r['predicted']:.3e} | {r['measured']:.3e} | "
                 f"{r['ratio']:.3f} | {r['snr_db']:.1f} | {100 * r['outlier_blocks']:.1f} % | "
                 f"{100 * r['outlier_share']:.0f} % |")
    return "\n".join(t)


def plot_error_model(weights, row_with_outlier=None, axes=None):
    """Three panels. (1) The rounding error divided by its block's step, on Gaussian weights: flat on
    [-1/2, 1/2] (the uniform model), with Q4_0's clamped weights beyond. (2) Predicted against measured RMS
    error for each set of weights and format. (3) One row with an outlier: each block's Q4_0 step and
    measured RMS error; the outlier inflates its own block's step only."""
    import matplotlib.pyplot as plt

    from ..ops import quant_error as qe

    # one panel above the other at the page's width (side by side at 15 in, the page showed its labels at 5 px)
    fig, axes = plt.subplots(3, 1, figsize=(7.4, 11)) if axes is None else (axes[0].figure, axes)
    ax = axes[0]
    g = weights["Gaussian"][0]
    bins = np.linspace(-1.0, 1.0, 81)
    for fmt, c in (("q8_0", "#2e75b6"), ("q4_0", "#c55a11")):
        e = qe.roundtrip_error(g, fmt).reshape(g.shape[0], -1, q.QK)
        u = (e / qe.block_steps(g, fmt)[..., None]).ravel()
        ax.hist(u, bins=bins, density=True, histtype="step", lw=1.5, color=c, label=fmt.upper())
    ax.plot([-0.5, -0.5, 0.5, 0.5], [0, 1, 1, 0], "k--", lw=1, label="uniform on [-Δ/2, Δ/2]")
    ax.set_yscale("log")
    ax.set_ylim(1e-3, 3)
    ax.set_xlabel("error / Δ (Gaussian weights)")
    ax.set_ylabel("density")
    ax.set_title("rounding error in units of the step", fontsize=10)
    ax.legend(fontsize=8, loc="lower center")

    ax = axes[1]
    rows = qe.error_model_rows(weights)
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["predicted"] for r in rows], 0.4, color="#bdd7ee", ec="k", label="predicted √(mean Δ²/12)")
    ax.bar(x + 0.2, [r["measured"] for r in rows], 0.4, color="#f4b183", ec="k", label="measured")
    gx = [i for i, r in enumerate(rows) if r["gauss"] is not None]
    ax.plot(gx, [rows[i]["gauss"] for i in gx], "k*", ms=9, label="Gaussian formula (E[amax²])")
    ax.set_yscale("log")
    ax.set_xticks(x, [f"{r['format']}\n{r['weights']}" for r in rows], fontsize=8)
    ax.set_ylabel("RMS error")
    ax.set_title("prediction against measurement", fontsize=10)
    ax.legend(fontsize=8)

    ax = axes[2]
    W = weights["Gaussian + outliers"][0] if row_with_outlier is None else row_with_outlier
    ob = qe.outlier_blocks(W)
    r = int(np.argmax(ob.any(axis=1))) if row_with_outlier is None else 0
    Wr = np.asarray(W)[r:r + 1]
    pred, meas = qe.block_rms(Wr, "q4_0")
    b = np.arange(pred.shape[1])
    ax.step(b, pred[0], where="mid", color="#c55a11", lw=1.2, label="predicted Δ/√12 (Q4_0 step of the block)")
    ax.plot(b, meas[0], ".", color="k", ms=4, label="measured RMS error of the block")
    ax.axhline(np.abs(Wr).max() / 8 / np.sqrt(12), color="#7f7f7f", ls=":", lw=1,
               label="Δ/√12 with one scale for the row")
    ax.set_yscale("log")
    ax.set_ylabel("RMS error")
    ax.set_xlabel(f"block along row {r} (32 weights each)")
    ax.set_title("an outlier inflates only its own block's Δ", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return axes
