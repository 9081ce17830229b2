"""Figures and extra measurements for chapter 10 (RoPE, the KV cache, decode attention).

Plots read committed JSON (book/data/bench/h100/...) or compute small things in NumPy. The
measurement entry point runs on the GPU machine and writes what the registry benchmark cannot:

    python -m kernels_src.figures.rope measure OUT_DIR

  rope_inplace_gpu.json             RoPE in place (course rung 2 with y = x) against torch eager and
                                    torch.compile doing the same in-place update, at T=16384 H=32 D=128
  decode_attention_extras_gpu.json  split-K decode at B=1 Hq=32 Hkv=8 L=32768 D=128 for a sweep of the
                                    number of chunks S; SDPA forced to each backend; a determinism check
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from ..paths import BENCH_DATA

# ------------------------------------------------------------------------------- model shapes
# (name, layers, query heads, kv heads, head dim, rope base, source); from each model's config.json
MODELS = [
    ("Llama-2-7B", 32, 32, 32, 128, 10000.0, "meta-llama/Llama-2-7b-hf"),
    ("Llama-2-70B", 80, 64, 8, 128, 10000.0, "meta-llama/Llama-2-70b-hf"),
    ("Llama-3-8B", 32, 32, 8, 128, 500000.0, "meta-llama/Meta-Llama-3-8B"),
    ("Mistral-7B", 32, 32, 8, 128, 10000.0, "mistralai/Mistral-7B-v0.1"),
    ("Falcon-7B (MQA)", 32, 71, 1, 64, 10000.0, "tiiuae/falcon-7b"),
]


def kv_bytes_per_token(layers, hkv, d, itemsize=2):
    """K and V of one token in every layer: 2 * Hkv * D * itemsize per layer."""
    return 2 * hkv * d * itemsize * layers


def kv_table(itemsize=2) -> list[dict]:
    rows = []
    for name, layers, hq, hkv, d, base, src in MODELS:
        per_layer = 2 * hkv * d * itemsize
        rows.append({"model": name, "layers": layers, "Hq": hq, "Hkv": hkv, "D": d, "group": hq // hkv,
                     "per_layer_bytes": per_layer, "per_token_bytes": per_layer * layers,
                     "mha_per_token_bytes": 2 * hq * d * itemsize * layers, "source": src})
    return rows


def plot_kv_memory(ax=None, max_ctx=131072, itemsize=2, batch=1):
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(7, 4))[1]
    ctx = np.linspace(0, max_ctx, 200)
    for r in kv_table(itemsize):
        ax.plot(ctx / 1024, batch * ctx * r["per_token_bytes"] / 2**30, label=f"{r['model']} (Hkv={r['Hkv']})")
    ax.axhline(80, color="gray", ls=":", lw=1)
    ax.text(1, 82, "80 GB (one H100)", color="gray", fontsize=8)
    ax.set_xlabel("context length (k tokens)")
    ax.set_ylabel("KV cache, GiB (fp16, one sequence)")
    ax.set_title("KV-cache memory grows linearly with context")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax


# ------------------------------------------------------------------------------- precision
def bf16_trunc(x):
    """bfloat16 by truncation: keep the top 16 bits of the float32 pattern (what a cast without
    rounding does)."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
    return b.view(np.float32)


def angle_errors(positions, rotary_dim=128, base=10000.0) -> dict:
    """Max over the pairs i of |angle_lowprec - angle_exact| for each position, where the angle
    pos * theta_i is computed as a product in each precision (inputs rounded to it first)."""
    pos = np.asarray(positions, dtype=np.float64)
    theta = base ** (-2.0 * np.arange(rotary_dim // 2) / rotary_dim)
    exact = np.outer(pos, theta)
    out = {}
    f32 = np.outer(pos.astype(np.float32), theta.astype(np.float32)).astype(np.float32)
    out["float32"] = np.max(np.abs(f32.astype(np.float64) - exact), axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        f16 = np.outer(pos.astype(np.float16), theta.astype(np.float16)).astype(np.float16)
        out["float16"] = np.max(np.abs(f16.astype(np.float64) - exact), axis=1)
    bf = bf16_trunc(np.outer(bf16_trunc(pos), bf16_trunc(theta)))
    out["bfloat16 (truncated)"] = np.max(np.abs(bf.astype(np.float64) - exact), axis=1)
    return out


def plot_angle_errors(ax=None, max_pos=131072):
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(7, 4))[1]
    pos = np.unique(np.geomspace(1, max_pos, 400).astype(np.int64))
    errs = angle_errors(pos)
    for name, e in errs.items():
        fin = np.isfinite(e)
        ax.loglog(pos[fin], np.maximum(e[fin], 1e-12), label=name)
        if not fin.all():
            ax.axvline(pos[~fin][0], color="C1", ls=":", lw=1)
            ax.text(pos[~fin][0] * 0.55, 1e-6, "float16\noverflows\n(65504)", color="C1", fontsize=8)
    ax.set_xlabel("position")
    ax.set_ylabel("max angle error (rad)")
    ax.set_title("Error of pos * theta_i by precision (R=128, base 10000)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return ax


# ------------------------------------------------------------------------------- rotation picture
def plot_rotation(position=5, pairs=(0, 8, 16, 32, 63), rotary_dim=128, base=10000.0, ax=None):
    """Where the unit vector (1, 0) of pair i goes at ``position``: fast pairs spin, slow ones barely move."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(4.5, 4.5))[1]
    theta = base ** (-2.0 * np.arange(rotary_dim // 2) / rotary_dim)
    t = np.linspace(0, 2 * np.pi, 200)
    ax.plot(np.cos(t), np.sin(t), color="lightgray", lw=1)
    for k, i in enumerate(pairs):
        a = position * theta[i]
        ax.annotate("", xy=(math.cos(a), math.sin(a)), xytext=(0, 0),
                    arrowprops=dict(arrowstyle="->", color=f"C{k}", lw=2))
        # every other label nudged up, the others down: slow pairs point the same way and their labels collided
        ax.annotate(f"i={i}", (1.14 * math.cos(a), 1.14 * math.sin(a)), xytext=(0, 6 if k % 2 else -6),
                    textcoords="offset points", color=f"C{k}", fontsize=9, ha="center", va="center")
    ax.set_xlim(-1.45, 1.45)
    ax.set_ylim(-1.45, 1.45)
    ax.set_aspect("equal")
    ax.set_title(f"pairs rotated at position {position}")
    ax.set_xticks([])
    ax.set_yticks([])
    return ax


def rotation_widget():
    """A slider over the position: the rotated pairs, and <R_m q, R_n k> for a fixed q, k as m moves."""
    import matplotlib.pyplot as plt

    from .controls import interact

    def draw(position=5):
        fig, axes = plt.subplots(1, 2, figsize=(9, 4))
        plot_rotation(position, ax=axes[0])
        plot_relative_scores(m=position, ax=axes[1])
        plt.show()

    return interact(draw, lambda W: dict(position=W.IntSlider(value=5, min=0, max=200, step=1, description="position")),
                    action="move the slider")


def relative_scores(m, n_max=200, d=64, seed=0):
    """<R_m q, R_n k> for n = 0..n_max: the score depends only on m - n."""
    from ..ops import rope

    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 1, d))
    k = rng.standard_normal((1, 1, d))
    cos, sin = rope.cos_sin_cache(max(n_max, m) + 1, d, dtype=np.float64)
    qm = rope.rotate(q, np.array([m]), cos, sin)[0, 0]
    ks = rope.rotate(np.repeat(k, n_max + 1, axis=0), np.arange(n_max + 1), cos, sin)[:, 0]
    return ks @ qm


def plot_relative_scores(m=50, ax=None, n_max=200):
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(6, 3.5))[1]
    n = np.arange(n_max + 1)
    ax.plot(n - m, relative_scores(m, n_max), label=f"query at m = {m}")
    ax.plot(n - 0, relative_scores(0, n_max), ls="--", label="query at m = 0")
    ax.set_xlabel("n - m (key position minus query position)")
    ax.set_ylabel("<R_m q, R_n k>")
    ax.set_title("the score is a function of n - m")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax


# ------------------------------------------------------------------------------- incremental decoding
def _rope():
    from ..ops import rope

    return rope


def causal_attention_with_rope(x, wq, wk, wv, hq, hkv, cos, sin):
    """float64 full causal attention over a whole sequence x (T,C), RoPE at positions 0..T-1."""
    t_n = x.shape[0]
    d = wq.shape[1] // hq
    pos = np.arange(t_n)
    q = _rope().rotate((x @ wq).reshape(t_n, hq, d), pos, cos, sin)
    k = _rope().rotate((x @ wk).reshape(t_n, hkv, d), pos, cos, sin)
    v = (x @ wv).reshape(t_n, hkv, d)
    g = hq // hkv
    out = np.zeros((t_n, hq, d))
    for h in range(hq):
        s = q[:, h] @ k[:, h // g].T / math.sqrt(d)
        s[np.triu_indices(t_n, 1)] = -np.inf
        p = np.exp(s - s.max(1, keepdims=True))
        out[:, h] = (p / p.sum(1, keepdims=True)) @ v[:, h // g]
    return out


# ------------------------------------------------------------------------------- decode figures
def decode_rows(result, b=1, hq=32, hkv=8, d=128):
    out = {}
    for r in result["rows"]:
        s = r["size"]
        if "median_s" in r and s[0] == b and s[1] == hq and s[2] == hkv and s[4] == d:
            out.setdefault(r["variant"], []).append((s[3], r))
    return {k: sorted(v) for k, v in out.items()}


def plot_decode_vs_length(result, ax=None):
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(7, 4))[1]
    for name, pts in decode_rows(result).items():
        ls = "--" if pts[0][1]["baseline"] else "-"
        ax.semilogx([p[0] for p in pts], [p[1]["gbps"] for p in pts], ls, marker="o", label=name, base=2)
    copy = (result.get("peaks") or {}).get("copy_gbps")
    if copy:
        ax.axhline(copy, color="gray", ls=":", lw=1)
        ax.text(1100, copy * 0.94, "copy bandwidth", color="gray", fontsize=8)
    ax.set_xlabel("cache length L (B=1, Hq=32, Hkv=8, D=128)")
    ax.set_ylabel("GB/s on K and V read")
    ax.set_title("decode attention: one block per head vs split-K")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax


def plot_splits(extras, ax=None):
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(6, 3.5))[1]
    rows = extras["splits"]
    ax.semilogx([r["splits"] for r in rows], [r["gbps"] for r in rows], marker="o", base=2)
    if extras.get("copy_gbps"):
        ax.axhline(extras["copy_gbps"], color="gray", ls=":", lw=1)
    ax.set_xlabel("chunks S per (batch, kv head)")
    ax.set_ylabel("GB/s")
    ax.set_title(f"split-K at L={extras['size'][3]}: blocks = S x {extras['size'][0] * extras['size'][2]}")
    ax.grid(alpha=0.3)
    return ax


# ------------------------------------------------------------------------------- measurement (GPU)
def _gbps(nbytes, t):
    return nbytes / t / 1e9


def measure_rope_inplace(size=(16384, 32, 128, 128), repeat=20) -> dict:
    import torch

    from .. import bench, device
    from ..ops import rope
    from ..ops.reductions import torch_view

    rng = np.random.default_rng(0)
    x, pos, cos, sin = rope.make_inputs(size, np.dtype("float32"), rng)
    cuda = device.cuda
    sets = [(cuda.to_device(x), cuda.to_device(pos), cuda.to_device(cos), cuda.to_device(sin)) for _ in range(2)]
    nbytes = rope._bytes(size, 4)
    peaks = bench.measure_peaks("gpu")
    out = {"size": list(size), "bytes": nbytes, "copy_gbps": peaks.get("copy_gbps"), "copy_what": peaks.get("copy_what"),
           "meta": bench.environment(), "rows": []}

    def add(name, fn, arg_sets):
        t = float(np.median(bench.time_gpu(fn, arg_sets, repeat=repeat)))
        out["rows"].append({"variant": name, "median_s": t, "gbps": _gbps(nbytes, t)})
        print(f"{name:24s} {t * 1e6:9.1f} us {_gbps(nbytes, t):8.0f} GB/s", flush=True)

    add("unrolled (in place)", lambda xx, p, c, s: rope.rope_inplace(xx, p, c, s), sets)
    ys = [cuda.device_array_like(s[0]) for s in sets]
    add("unrolled (out of place)", lambda y, xx, p, c, s: rope.launch_unrolled(False, False, y, xx, p, c, s),
        [(y, *s) for y, s in zip(ys, sets)])
    tsets = []
    for s in sets:
        c, sn = rope.torch_cos_sin(s[1], s[2], s[3])
        tsets.append((torch_view(s[0]), c, sn))
    add("torch eager (in place)", rope._hf_inplace, tsets)
    add("torch.compile (in place)", rope.compiled("rope_inplace"), tsets)
    # correctness of the in-place rung on the real GPU
    xd = cuda.to_device(x)
    rope.rope_inplace(xd, *[cuda.to_device(a) for a in (pos, cos, sin)])
    ref = rope.reference(x, pos, cos, sin)
    out["inplace_max_abs_err"] = float(np.max(np.abs(xd.copy_to_host() - ref)))
    return out


def measure_decode(size=(1, 32, 8, 32768, 128), repeat=20) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from .. import bench, device
    from ..ops import decode_attention as da
    from ..ops.reductions import torch_view

    cuda = device.cuda
    rng = np.random.default_rng(0)
    q, k, v, lengths = da.make_inputs(size, np.dtype("float32"), rng)
    dq, dk, dv, dl = (cuda.to_device(a) for a in (q, k, v, lengths))
    b_n, hq, hkv, l_max, d = size
    o = cuda.device_array((b_n, hq, d), dtype=np.float32)
    nbytes = da._bytes(size, 4)
    peaks = bench.measure_peaks("gpu")
    out = {"size": list(size), "bytes": nbytes, "copy_gbps": peaks.get("copy_gbps"), "meta": bench.environment(),
           "splits": [], "sdpa_backends": []}
    for s in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        chunk = da.ceil_div(da.ceil_div(l_max, s), da.TILE) * da.TILE
        ns = da.ceil_div(l_max, chunk)
        op_ = cuda.device_array((b_n, hq, ns, d), dtype=np.float32)
        ls = cuda.device_array((b_n, hq, ns), dtype=np.float32)

        def run(ns=ns, chunk=chunk, op_=op_, ls=ls):
            da.launch_decode(op_, ls, dq, dk, dv, dl, ns, chunk)
            da.merge_kernel[b_n * hq, 128](o, op_, ls)

        t = float(np.median(bench.time_gpu(run, [()], repeat=repeat)))
        out["splits"].append({"splits": ns, "chunk": chunk, "blocks": ns * b_n * hkv, "median_s": t,
                              "gbps": _gbps(nbytes, t)})
        print(f"S={ns:4d} chunk={chunk:6d} {t * 1e6:9.1f} us {_gbps(nbytes, t):8.0f} GB/s", flush=True)
    qt, kt, vt = torch_view(dq)[:, :, None], torch_view(dk), torch_view(dv)
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, be in (("math", SDPBackend.MATH), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                     ("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel([be]):
                fn = lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)  # noqa: E731
                t = float(np.median(bench.time_gpu(fn, [()], repeat=repeat)))
            out["sdpa_backends"].append({"backend": name, "median_s": t, "gbps": _gbps(nbytes, t)})
            print(f"SDPA {name}: {t * 1e6:.1f} us", flush=True)
        except Exception as e:  # noqa: BLE001
            out["sdpa_backends"].append({"backend": name, "error": f"{type(e).__name__}: {str(e)[:200]}"})
            print(f"SDPA {name}: {type(e).__name__}", flush=True)
    # determinism: ten runs of the split-K rung, bitwise
    res = []
    for _ in range(10):
        da.decode_attention_splitk(o, dq, dk, dv, dl)
        res.append(o.copy_to_host())
    out["splitk_bitwise_identical_runs"] = int(sum(np.array_equal(res[0], r) for r in res))
    ref = da.reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), lengths)
    out["splitk_max_abs_err"] = float(np.max(np.abs(res[0] - ref)))
    return out


def measure_vec_splits(sizes=((1, 32, 8, 4096, 128), (1, 32, 8, 32768, 128), (1, 32, 8, 131072, 128),
                                (16, 32, 8, 4096, 128)), per_sm=(0.5, 1, 2, 3, 4, 6, 8, 12, 16), repeat=20) -> dict:
    """Time decode rung 8 (the butterfly) and rung 7 at several split counts: ``per_sm`` blocks per SM in the
    grid (splits = per_sm * SMs / (B * Hkv)). Chooses VEC_SPLITS_PER_SM from measurement, not from a model."""
    from .. import bench, device
    from ..ops import decode_attention as da

    cuda = device.cuda
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    out = {"sms": sms, "meta": bench.environment(), "rows": []}
    for size in sizes:
        q, k, v, lengths = da.make_inputs(size, np.dtype("float32"), np.random.default_rng(0))
        args = [cuda.to_device(a) for a in (q, k, v, lengths)]
        b_n, hq, hkv, l_max, d = size
        o = cuda.device_array((b_n, hq, d), dtype=np.float32)
        nbytes = da._bytes(size, 4)
        ref = da.reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), lengths)
        for ps in per_sm:
            s = max(1, int(round(ps * sms / (b_n * hkv))))
            for name, fn in (("bfly", lambda *a, s=s: da.launch_bfly(*a, splits=s)),
                             ("vec_shfl", lambda *a, s=s: da.launch_vec(True, *a, splits=s))):
                t = float(np.median(bench.time_gpu(fn, [(o, *args)], repeat=repeat)))
                err = float(np.max(np.abs(o.copy_to_host() - ref)))
                out["rows"].append({"size": list(size), "variant": name, "per_sm": ps, "splits": s,
                                    "median_s": t, "gbps": _gbps(nbytes, t), "max_abs_err": err})
                print(out["rows"][-1], flush=True)
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2 or argv[0] != "measure":
        print(__doc__)
        return 2
    dest = Path(argv[1])
    dest.mkdir(parents=True, exist_ok=True)
    rc = 0
    for name, fn in (("rope_inplace_gpu.json", measure_rope_inplace), ("decode_attention_extras_gpu.json", measure_decode)):
        try:
            (dest / name).write_text(json.dumps(fn(), indent=1) + "\n")
        except Exception as e:  # noqa: BLE001  (one failed measurement must not lose the other)
            import traceback

            traceback.print_exc()
            print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)
            rc = 1
    return rc


if __name__ == "__main__":
    raise SystemExit(main())


# ------------------------------------------------------------------------------- tables
def prediction(variant) -> str:
    """The sentence of a variant's docstring that predicts its speed (from the registry)."""
    import re

    doc = " ".join(variant.doc.split())
    for sent in re.split(r"(?<=\.)\s+", doc):
        if "redict" in sent:
            return sent.rstrip(".")
    return variant.summary


def ladder_table(result: dict, size) -> str:
    """Markdown: rung, variant, the registry's prediction, measured time, GB/s, % of copy, vs the
    fastest baseline, for one size of one benchmark file."""
    import kernels_src
    from ..bench import fmt_time

    lines = ["| rung | variant | predicted (docstring) | median | GB/s | % of copy | vs best torch |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "median_s" not in r or tuple(r["size"]) != tuple(size):
            continue
        v = kernels_src.get_variant(f"{result['op']}/gpu/{r['variant']}")
        pred = "baseline" if r["baseline"] else prediction(v)
        vs = f"{r['vs_baseline']:.2f}x" if "vs_baseline" in r else "-"
        lines.append(f"| {'base' if r['baseline'] else r['rung']} | `{r['variant']}` | {pred} | "
                     f"{fmt_time(r['median_s'], 'µs')} | {r['gbps']:,.0f} | {100 * r['frac_copy_bw']:.0f} % | {vs} |")
    return "\n".join(lines)


def row(result: dict, variant: str, size) -> dict:
    for r in result["rows"]:
        if r["variant"] == variant and tuple(r["size"]) == tuple(size) and "median_s" in r:
            return r
    raise KeyError(f"{result['op']}: no row {variant} at {size}")


def ncu_metrics(path=None) -> list[dict]:
    """The kernels in a saved Nsight Compute text report: [{'kernel', 'launch', metric name: value}]."""
    import re

    path = Path(path) if path else BENCH_DATA / "h100" / "rope_decode_ncu.txt"
    out = []
    for line in path.read_text().splitlines():
        m = re.match(r"\s+\S*::(\w+)\[.*\) (\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\))", line)
        if m:
            out.append({"kernel": m.group(1), "launch": m.group(2)})
            continue
        parts = re.split(r"\s{2,}", line.strip())
        if out and len(parts) >= 2 and not line.strip().startswith(("-", "Section", "Metric Name")):
            val = parts[-1].replace(",", "")
            try:
                out[-1][parts[0]] = float(val)
            except ValueError:
                out[-1][parts[0]] = parts[-1]
    return out
