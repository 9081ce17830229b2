"""Chapter 12's data and figures: trajectories on a 2-D loss surface, the mixed-precision lab, and the
in-place step timings against torch.

``measure_inplace(path)`` (run on the GPU machine) times optimizer steps the way training runs them, in
place: the course's fused kernels called with outputs aliased to inputs, against
``torch.optim.AdamW(fused=True)`` and ``torch.optim.SGD(momentum=...)`` stepping the same tensors in place,
with the harness's timing (CUDA events, L2 flushed before each launch, median). Two layouts: one flat
tensor (16.7 M and 100 M parameters) and the 148 tensors of a GPT-2-small-shaped model (124 M); on the GPT
list every contender is also timed kernel-only and as a whole step (``time_kernel_and_step``).

``measure_clip_determinism(path)`` (GPU) repeats the clipping norm and the clipped step on fixed inputs and
records whether the bits change: the atomic norm of adamw_clip/gpu/fused against the two-pass one.
"""
from __future__ import annotations

import numpy as np

from ..ops import optim
from ..ops import optim_mixed as om

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


def train_low_precision(dtype, master, steps=400, lr=0.01, seed=0, sr=False):
    """Plain SGD on ``linreg_problem`` with weights stored in ``dtype`` ('float16', 'bfloat16' emulated,
    'float32'). ``master=True`` keeps an fp32 master copy that takes the update, and casts it to ``dtype``
    for the forward/backward pass (the mixed-precision recipe). ``sr=True`` (bfloat16 without a master copy)
    rounds each new weight stochastically with the Philox stream of step t (kernels_src.ops.optim_mixed).
    Returns the loss per step (float64 loss of the weights the model uses)."""
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
        elif sr:
            assert dtype == "bfloat16", "stochastic rounding is emulated for bfloat16"
            new = (w_model - lr * g_low).astype(np.float32)
            w_model = om.bf16_value(om.bf16_bits_sr(new, om.sr_bits(seed, len(losses), new.size)))
        else:
            w_model = optim.cast(w_model - lr * g_low, dtype).astype(np.float64)
    return np.array(losses)


def drift(mode, steps=2000, u=-1e-4, w0=1.0, seed=0, walkers=1):
    """A weight w0 that receives the same tiny update ``u`` every step (|u| far below half a bf16 ulp at w0).
    ``mode``: 'fp32' (float32 weight), 'bf16' (bf16 weight, round to nearest: the update vanishes),
    'master' (fp32 master copy, bf16 copy read from it), 'sr' (bf16 weight, stochastic rounding with the
    Philox stream of each step; ``walkers`` independent weights, element k of the stream each).
    Returns the weights the model sees after each step: (steps + 1,) or (steps + 1, walkers)."""
    w32 = np.full(walkers, w0, dtype=np.float32)
    h = om.bf16_bits_rne(w32)
    out = [om.bf16_value(h) if mode != "fp32" else w32.astype(np.float64)]
    for t in range(1, steps + 1):
        if mode == "fp32":
            w32 = (w32 + np.float32(u)).astype(np.float32)
            out.append(w32.astype(np.float64))
        elif mode == "master":
            w32 = (w32 + np.float32(u)).astype(np.float32)
            out.append(om.bf16_value(om.bf16_bits_rne(w32)))
        else:
            new = (om.bf16_value(h) + u).astype(np.float32)
            h = om.bf16_bits_sr(new, om.sr_bits(seed, t, walkers)) if mode == "sr" else om.bf16_bits_rne(new)
            out.append(om.bf16_value(h))
    out = np.array(out)
    return out[:, 0] if walkers == 1 else out


def gradient_sample(n=200_000, seed=0):
    """Synthetic gradient magnitudes spread log-normally over 2^-40 .. 2^-4 (median 2^-22), random signs: the
    shape of the activation-gradient histograms of Micikevicius et al. (2018), where much of the mass lies
    below float16's smallest subnormal 2^-24. Illustrative, not measured from a model."""
    rng = np.random.default_rng(seed)
    return np.sign(rng.standard_normal(n)) * 2.0 ** np.clip(rng.normal(-22.0, 6.0, n), -40, -4)


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
    # The same contenders timed two more ways: "kernel" (GPU time only: the launches are queued behind a
    # sleep kernel longer than the host's work, so the events see no host gap) and "step" (wall clock of the
    # call until the GPU is done: Python, launches and kernels, as a training loop waits for it).
    contenders = [("course flat", lambda: optim.adamw_flat(p, m, v, p, g, m, v, lengths, *hyper)),
                  ("course multi_tensor", lambda: optim.adamw_multi_tensor(p, m, v, p, g, m, v, lengths, *hyper)),
                  ("course per_tensor", lambda: optim.adamw_per_tensor(p, m, v, p, g, m, v, lengths, *hyper)),
                  ("torch AdamW(fused=True)", lambda: optim.torch_adamw_step(sp, sg, sm, sv, None, *hyper[1:]))]
    if hasattr(torch, "_fused_adamw_"):
        st = [torch.full((), float(step), device="cuda") for _ in sp]
        contenders.append(("torch _fused_adamw_ (kernel only)",
                           lambda: torch._fused_adamw_(sp, sg, sm, sv, [], st, lr=h["lr"], beta1=h["beta1"],
                                                       beta2=h["beta2"], weight_decay=h["wd"], eps=h["eps"],
                                                       amsgrad=False, maximize=False)))
    for impl, fn in contenders:
        try:
            modes = time_kernel_and_step(fn, repeat=repeat)
        except Exception as e:  # noqa: BLE001
            result["rows"].append({"layout": "gpt2-small", "impl": impl, "n_params": n, "n_tensors": T,
                                   "timing": "kernel+step", "error": repr(e)[:300]})
            continue
        for timing, (t, extra) in modes.items():
            row = {"layout": "gpt2-small", "impl": impl, "n_params": n, "n_tensors": T, "timing": timing,
                   "median_s": t, "bytes": 28 * n, "gbps": 28 * n / t / 1e9, **extra}
            if copy:
                row["frac_copy_bw"] = row["gbps"] / copy
            result["rows"].append(row)
            print(row, flush=True)
    bench.save_json(result, path)
    return result


def time_kernel_and_step(fn, repeat=30, warmup=3):
    """Median seconds of ``fn()`` on the GPU two ways: {"kernel": (t, info), "step": (t, info)}.

    kernel: L2 flushed, then ``torch.cuda._sleep`` keeps the GPU busy for twice the host time of one call
            (measured first), then the events bracket ``fn()``: every launch is queued before the GPU reaches
            the start event, so the interval is the kernels' time alone, host overhead excluded;
    step:   L2 flushed and the GPU idle, then the wall clock from the call until the GPU has finished: the
            host's Python and launch work plus the kernels, what a training loop waits for."""
    import time

    import torch

    from .. import bench

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    host = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        host.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    host_s = float(np.median(host))
    # calibrate the sleep: cycles per second of torch.cuda._sleep on this GPU
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(10_000_000)
    b.record()
    b.synchronize()
    cycles_per_s = 10_000_000 / (a.elapsed_time(b) / 1e3)
    sleep_cycles = int(max(2 * host_s + 1e-3, 2e-3) * cycles_per_s)
    kern, step = [], []
    for _ in range(repeat):
        bench.flush_l2()
        torch.cuda._sleep(sleep_cycles)
        a.record()
        fn()
        b.record()
        b.synchronize()
        kern.append(a.elapsed_time(b) / 1e3)
        bench.flush_l2()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        step.append(time.perf_counter() - t0)
    info = {"host_s": host_s, "sleep_s": sleep_cycles / cycles_per_s}
    return {"kernel": (float(np.median(kern)), {**info, "q1_s": float(np.percentile(kern, 25)),
                                                "q3_s": float(np.percentile(kern, 75))}),
            "step": (float(np.median(step)), {**info, "q1_s": float(np.percentile(step, 25)),
                                              "q3_s": float(np.percentile(step, 75))})}


def measure_clip_determinism(path, n=1 << 24, runs=50, steps=10):
    """Is global-norm clipping bit-reproducible run to run on this GPU? On one fixed gradient (n float32
    ~ N(0,1)): the sum of g^2 from the atomic norm pass (adamw_clip rungs 1-2) and from the two-pass one
    (rung 3), ``runs`` times each; then ``steps`` full clipped AdamW steps of each variant from the same
    inputs, counting the elements of p_new whose bits differ from the first run. Writes JSON to ``path``."""
    from .. import bench, device

    cuda = device.cuda
    rng = np.random.default_rng(0)
    gh = rng.standard_normal(n).astype(np.float32)
    g = cuda.to_device(gh)
    exact = float(np.sum(gh.astype(np.float64) ** 2))
    result = {"what": "bits of the clipping norm and of the clipped AdamW step, repeated on the same inputs",
              "meta": bench.environment(), "n": n, "runs": runs, "steps": steps, "sumsq_float64": exact}
    for name, det in (("atomic", False), ("two_pass", True)):
        bits = optim.clip_sumsq_bits(g, det, runs)
        vals = np.array(bits, dtype=np.uint32).view(np.float32).astype(np.float64)
        uniq, counts = np.unique(np.array(bits, dtype=np.uint32), return_counts=True)
        result[name] = {"distinct_sums": int(uniq.size), "runs": runs,
                        "values": [float(np.uint32(u).view(np.float32)) for u in uniq], "counts": counts.tolist(),
                        "max_rel_spread": float((vals.max() - vals.min()) / exact),
                        "max_rel_err_vs_float64": float(np.max(np.abs(vals - exact)) / exact)}
        print(name, result[name], flush=True)
    ins = optim.make_inputs_clip((n,), np.dtype("float32"), np.random.default_rng(1))
    d_in = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in ins]
    for name, fn in (("fused", optim.adamw_clip_fused), ("two_pass", optim.adamw_clip_two_pass)):
        first, differ, worst = None, 0, 0
        for _ in range(steps):
            outs = [cuda.device_array(n, dtype=np.float32) for _ in range(3)]
            fn(*outs, *d_in)
            pb = outs[0].copy_to_host().view(np.uint32)
            if first is None:
                first = pb
            else:
                k = int(np.sum(pb != first))
                differ += k > 0
                worst = max(worst, k)
        result[f"step_{name}"] = {"steps": steps, "runs_differing_from_first": differ,
                                  "max_elements_differing": worst}
        print(name, result[f"step_{name}"], flush=True)
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
