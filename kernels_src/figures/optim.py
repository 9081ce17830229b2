"""Chapter 12's data and figures: trajectories on a 2-D loss surface, the mixed-precision lab, and the
in-place step timings against torch.

``measure_inplace(path)`` (run on the GPU machine) times optimizer steps the way training runs them, in
place: the course's fused kernels called with outputs aliased to inputs, against
``torch.optim.AdamW(fused=True)`` and ``torch.optim.SGD(momentum=...)`` stepping the same tensors in place,
with the harness's timing (CUDA events, L2 flushed before each launch, median). Two layouts: one flat
tensor (16.7 M and 100 M parameters) and the 148 tensors of a GPT-2-small-shaped model (124 M).
"""
from __future__ import annotations

import numpy as np

from ..ops import optim

# ----------------------------------------------------------------------------- 2-D loss surface
A_DIAG = (1.0, 25.0)  # an ill-conditioned quadratic bowl: curvature 1 along x, 25 along y


def bowl(xy):
    """f(x, y) = 0.5 (x^2 + 25 y^2): the classic narrow valley where plain SGD zig-zags."""
    x, y = xy[..., 0], xy[..., 1]
    return 0.5 * (A_DIAG[0] * x**2 + A_DIAG[1] * y**2)


def bowl_grad(xy):
    return np.asarray(xy) * np.array(A_DIAG)


def run_2d(kind, steps=60, start=(-4.0, 1.5), lr=0.035, momentum=0.9, wd=0.0, betas=(0.9, 0.999), eps=1e-8,
           grad=bowl_grad):
    """Trajectory of ``kind`` in {'sgd', 'heavy_ball', 'nesterov', 'adam', 'adamw'} on the bowl, driven by
    the float64 references of kernels_src.ops.optim. Returns an array (steps + 1, 2)."""
    p = np.array(start, dtype=np.float64)
    b = np.zeros(2)
    m = np.zeros(2)
    v = np.zeros(2)
    path = [p.copy()]
    for t in range(1, steps + 1):
        g = grad(p)
        if kind in ("sgd", "heavy_ball", "nesterov"):
            mu = 0.0 if kind == "sgd" else momentum
            p, b = optim.sgd_momentum_reference(p, g, b, lr, mu, wd, kind == "nesterov")
        elif kind == "adam":
            p, m, v = optim.adam_l2_reference(p, g, m, v, t, lr, betas[0], betas[1], eps, wd)
        else:
            p, m, v = optim.adamw_reference(p, g, m, v, t, lr, betas[0], betas[1], eps, wd)
        path.append(p.copy())
    return np.array(path)


# ----------------------------------------------------------------------------- mixed precision
def linreg_problem(n=256, d=16, seed=0):
    """A least-squares problem whose solution has weights near 1 (so small updates meet coarse ulps)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    w_true = 1.0 + 0.01 * rng.standard_normal(d)
    y = X @ w_true
    return X, y, w_true


def train_low_precision(dtype, master, steps=400, lr=0.01, seed=0):
    """Plain SGD on ``linreg_problem`` with weights stored in ``dtype`` ('float16', 'bfloat16' emulated,
    'float32'). ``master=True`` keeps an fp32 master copy that takes the update, and casts it to ``dtype``
    for the forward/backward pass (the mixed-precision recipe). Returns the loss per step (float64 loss
    of the weights the model uses)."""
    X, y, _ = linreg_problem(seed=seed)
    w = np.ones(X.shape[1]) * 0.9  # start 10 % off: the needed updates are small relative to w
    w_model = optim.cast(w, dtype).astype(np.float64)
    w_master = w.astype(np.float32)
    losses = []
    for _ in range(steps):
        r = X @ w_model - y
        losses.append(0.5 * np.mean(r**2))
        g = X.T @ r / len(y)
        g_low = optim.cast(g, dtype).astype(np.float64)  # gradients arrive in the low precision too
        if master:
            w_master = (w_master - np.float32(lr) * g_low.astype(np.float32)).astype(np.float32)
            w_model = optim.cast(w_master, dtype).astype(np.float64)
        else:
            w_model = optim.cast(w_model - lr * g_low, dtype).astype(np.float64)
    return np.array(losses)


# ----------------------------------------------------------------------------- bench JSON helpers
def rows(result, **match):
    """Rows of a bench/in-place JSON whose fields equal ``match`` (and that were timed)."""
    return [r for r in result["rows"] if "median_s" in r and all(r.get(k) == v for k, v in match.items())]


# ----------------------------------------------------------------------------- the GPU measurement
def measure_inplace(path, repeat=30):
    """Time in-place optimizer steps (course vs torch) on the GPU; write JSON to ``path``."""
    import torch

    from .. import bench, device

    cuda = device.cuda
    result = {"what": "in-place optimizer steps, fp32; 28 B/param for AdamW, 20 B/param for SGD+momentum",
              "meta": bench.environment(), "peaks": bench.measure_peaks("gpu"), "rows": []}
    copy = result["peaks"].get("copy_gbps")
    h = optim.HYPER
    step = 10

    def record(layout, impl, n, t_count, fn, bpp=28, note=""):
        try:
            times = bench.time_gpu(fn, [()], repeat=repeat)
            t = float(np.median(times))
            row = {"layout": layout, "impl": impl, "n_params": n, "n_tensors": t_count, "median_s": t,
                   "q1_s": float(np.percentile(times, 25)), "q3_s": float(np.percentile(times, 75)),
                   "bytes": bpp * n, "gbps": bpp * n / t / 1e9, "note": note}
            if copy:
                row["frac_copy_bw"] = row["gbps"] / copy
        except Exception as e:  # noqa: BLE001 (record and go on: one failing baseline must not lose the run)
            row = {"layout": layout, "impl": impl, "n_params": n, "n_tensors": t_count, "error": repr(e)[:300]}
        result["rows"].append(row)
        print(row, flush=True)

    def state(n):
        g = torch.Generator(device="cuda").manual_seed(0)
        p = torch.randn(n, device="cuda", generator=g)
        gr = torch.randn(n, device="cuda", generator=g)
        m = 0.1 * torch.randn(n, device="cuda", generator=g)
        v = m * m + 0.01 * torch.randn(n, device="cuda", generator=g) ** 2
        return p, gr, m, v

    hyper = (step, h["lr"], h["beta1"], h["beta2"], h["eps"], h["wd"])
    try:
        result["parity"] = parity_vs_torch()
    except Exception as e:  # noqa: BLE001
        result["parity"] = {"error": repr(e)[:300]}
    print(result["parity"], flush=True)
    for n in (1 << 24, 100_000_000):
        tp, tg, tm, tv = state(n)
        p, g, m, v = (cuda.as_cuda_array(x) for x in (tp, tg, tm, tv))
        for name, fn in (("course fused", optim.adamw_fused), ("course fused_ilp4", optim.adamw_fused_ilp4)):
            record("flat", name, n, 1, lambda fn=fn: fn(p, m, v, p, g, m, v, *hyper))
        record("flat", "torch AdamW(fused=True)", n, 1,
               lambda: optim.torch_adamw_step([tp], [tg], [tm], [tv], None, *hyper[1:]))
        record("flat", "torch AdamW(foreach=True)", n, 1,
               lambda: optim.torch_adamw_step([tp], [tg], [tm], [tv], None, *hyper[1:], fused=False))
        if hasattr(torch, "_fused_adamw_"):  # the kernel alone, without optimizer.step()'s Python
            st = [torch.full((), float(step), device="cuda")]
            record("flat", "torch _fused_adamw_ (kernel only)", n, 1,
                   lambda: torch._fused_adamw_([tp], [tg], [tm], [tv], [], st, lr=h["lr"], beta1=h["beta1"],
                                               beta2=h["beta2"], weight_decay=h["wd"], eps=h["eps"],
                                               amsgrad=False, maximize=False))
        if n == 1 << 24:  # SGD with momentum, in place: 20 B/param
            b = m
            record("flat", "course sgd_momentum fused", n, 1,
                   lambda: optim.sgd_momentum_fused(p, b, p, g, b, 1e-3, 0.9, 0.0, 0), bpp=20)
            record("flat", "torch SGD(momentum=0.9)", n, 1,
                   lambda: optim.torch_sgd_step([tp], [tg], [tm], 1e-3, 0.9, 0.0, False), bpp=20)
        del p, g, m, v, tp, tg, tm, tv
        torch.cuda.empty_cache()

    lengths = optim.gpt_lengths()
    n = int(sum(lengths))
    tp, tg, tm, tv = state(n)
    p, g, m, v = (cuda.as_cuda_array(x) for x in (tp, tg, tm, tv))
    T = len(lengths)
    record("gpt2-small", "course flat", n, T, lambda: optim.adamw_flat(p, m, v, p, g, m, v, lengths, *hyper))
    record("gpt2-small", "course multi_tensor", n, T,
           lambda: optim.adamw_multi_tensor(p, m, v, p, g, m, v, lengths, *hyper))
    record("gpt2-small", "course per_tensor", n, T,
           lambda: optim.adamw_per_tensor(p, m, v, p, g, m, v, lengths, *hyper))
    # torch over separately allocated tensors, as a model's parameters are
    sp, sg, sm, sv = ([x.clone() for x in t.split(list(lengths))] for t in (tp, tg, tm, tv))
    record("gpt2-small", "torch AdamW(fused=True)", n, T,
           lambda: optim.torch_adamw_step(sp, sg, sm, sv, None, *hyper[1:]))
    record("gpt2-small", "torch AdamW(foreach=True)", n, T,
           lambda: optim.torch_adamw_step(sp, sg, sm, sv, None, *hyper[1:], fused=False))
    bench.save_json(result, path)
    return result


def parity_vs_torch(n=100_003, steps=10, seed=0):
    """10-step trajectories from one state and one gradient sequence: the course's fused AdamW and SGD
    (Nesterov) kernels and torch.optim.AdamW(fused=True) / SGD(momentum, nesterov), each against the
    float64 reference trajectory. Returns the max abs error of p, m, v (b) after the last step for each."""
    import torch

    from .. import device

    cuda = device.cuda
    rng = np.random.default_rng(seed)
    p0 = rng.standard_normal(n).astype(np.float32)
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(steps)]
    h = dict(optim.CHECK_HYPER)
    hyper = (h["lr"], h["beta1"], h["beta2"], h["eps"], h["wd"])
    zero = np.zeros(n, dtype=np.float32)
    ref = optim.trajectory(optim.adamw_reference, (p0.astype(np.float64), zero.astype(np.float64),
                                                   zero.astype(np.float64)),
                           [g.astype(np.float64) for g in grads], hyper)[-1]
    out = {"n": n, "steps": steps, "hyper": h}
    # course, in place on device arrays
    p, m, v = (cuda.to_device(a.copy()) for a in (p0, zero, zero))
    for t, g in enumerate(grads, start=1):
        optim.adamw_fused(p, m, v, p, cuda.to_device(g), m, v, t, *hyper)
    out["adamw course fused"] = [float(np.max(np.abs(a.copy_to_host() - r))) for a, r in zip((p, m, v), ref)]
    tp, tm, tv = (torch.tensor(a.copy(), device="cuda") for a in (p0, zero, zero))
    for t, g in enumerate(grads, start=1):
        optim.torch_adamw_step([tp], [torch.tensor(g, device="cuda")], [tm], [tv], t, *hyper)
    out["adamw torch fused"] = [float(np.max(np.abs(a.cpu().numpy() - r))) for a, r in zip((tp, tm, tv), ref)]
    lr, mu, wd = 0.05, 0.9, 0.01
    ref = optim.trajectory(optim.sgd_momentum_reference, (p0.astype(np.float64), zero.astype(np.float64)),
                           [g.astype(np.float64) for g in grads], (lr, mu, wd, True), with_step=False)[-1]
    p, b = (cuda.to_device(a.copy()) for a in (p0, zero))
    for g in grads:
        optim.sgd_momentum_fused(p, b, p, cuda.to_device(g), b, lr, mu, wd, 1)
    out["sgd nesterov course fused"] = [float(np.max(np.abs(a.copy_to_host() - r))) for a, r in zip((p, b), ref)]
    tp, tb = (torch.tensor(a.copy(), device="cuda") for a in (p0, zero))
    for g in grads:
        optim.torch_sgd_step([tp], [torch.tensor(g, device="cuda")], [tb], lr, mu, wd, True)
    out["sgd nesterov torch"] = [float(np.max(np.abs(a.cpu().numpy() - r))) for a, r in zip((tp, tb), ref)]
    return out
