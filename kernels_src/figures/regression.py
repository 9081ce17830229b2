"""Chapter 2's pictures and one measurement: the loss surface of y = w*x + b, gradient-descent paths,
the interactive explorer, and "transfers dominate small problems" on the GPU.

``python -m kernels_src.figures.regression transfers --json FILE`` (on the GPU machine, KERNELS_DEVICE=gpu) times,
for each n: copying x and y to the GPU (pageable and pinned host memory), the regression_grad kernel
(CUDA events, as ``kernels bench`` does), copying the results back, the whole round trip as a NumPy
user would see it (wall clock), and the CPU loop on the same host. Nothing in the book times the
simulator; the figure reads the committed JSON.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from .. import device
from ..ops import scalar_regression as sr


# ------------------------------------------------------------------------------ the math
def mse(w, b, x, y):
    """Mean squared error of y_hat = w*x + b; w and b may be arrays of the same shape (a grid)."""
    w = np.asarray(w, dtype=np.float64)[..., None]
    b = np.asarray(b, dtype=np.float64)[..., None]
    r = w * x + b - y
    return np.mean(r * r, axis=-1)


def grads(w, b, x, y):
    """dL/dw and dL/db, as derived in the chapter (float64)."""
    r = w * x + b - y
    return 2 * np.mean(r * x), 2 * np.mean(r)


def descend(x, y, w0, b0, lr, steps):
    """Plain gradient descent from (w0, b0); returns the path as an array (steps + 1, 2)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    path = [(w0, b0)]
    w, b = w0, b0
    for _ in range(steps):
        dw, db = grads(w, b, x, y)
        w, b = w - lr * dw, b - lr * db
        if not (np.isfinite(w) and np.isfinite(b)) or abs(w) > 1e6:
            break
        path.append((w, b))
    return np.array(path)


def closed_form(x, y):
    """The least-squares line (what gradient descent converges to), for reference."""
    A = np.column_stack([x, np.ones_like(x)]).astype(np.float64)
    (w, b), *_ = np.linalg.lstsq(A, np.asarray(y, dtype=np.float64), rcond=None)
    return float(w), float(b)


# ------------------------------------------------------------------------------ pictures
W_RANGE = (-1.5, 4.5)
B_RANGE = (-3.0, 2.0)


def plot_state(x, y, w, b, lr, steps=25, axes=None):
    """Left: the loss surface over (w, b) with the gradient-descent path from (w, b). Right: the data
    and the line y = w*x + b, plus where the path ends."""
    import matplotlib.pyplot as plt

    own = axes is None  # a figure of its own (the explorer): legends below the panels, sized for the page
    if own:
        fig, axes = plt.subplots(1, 2, figsize=(8.2, 4.6))
    ax0, ax1 = axes
    ws = np.linspace(*W_RANGE, 121)
    bs = np.linspace(*B_RANGE, 101)
    gw, gb = np.meshgrid(ws, bs)
    L = mse(gw, gb, x.astype(np.float64), y.astype(np.float64))
    cs = ax0.contour(gw, gb, L, levels=np.geomspace(max(L.min(), 1e-3), L.max(), 14), cmap="viridis", linewidths=1)
    ax0.clabel(cs, fontsize=8, fmt="%.2g")
    path = descend(x, y, w, b, lr, steps)
    ax0.plot(path[:, 0], path[:, 1], "o-", color="C3", ms=3, lw=1, label=f"{len(path) - 1} steps, lr = {lr:g}")
    ax0.plot(*closed_form(x, y), "k*", ms=10, label="least-squares optimum")
    ax0.set_xlim(*W_RANGE)
    ax0.set_ylim(*B_RANGE)
    ax0.set_xlabel("w")
    ax0.set_ylabel("b")
    ax0.set_title(f"loss surface; start L = {mse(w, b, x, y):.3g},\nend L = {mse(*path[-1], x, y):.3g}",
                  fontsize=10)
    below = dict(loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False) if own else dict(loc="upper left")
    ax0.legend(fontsize=8, **below)
    ax1.scatter(x, y, s=6, alpha=0.5, color="C0", label="data")
    xs = np.array([x.min(), x.max()])
    ax1.plot(xs, w * xs + b, "--", color="C3", lw=1, label=f"start: y = {w:.2f} x + {b:.2f}")
    we, be = path[-1]
    ax1.plot(xs, we * xs + be, "-", color="C3", lw=2, label=f"after descent: y = {we:.2f} x + {be:.2f}")
    ax1.set_xlabel("x")
    ax1.set_ylabel("y")
    ax1.set_ylim(y.min() - 1, y.max() + 1)
    ax1.locator_params(axis="x", nbins=5)
    ax1.legend(fontsize=8, **below)
    ax1.set_title("the data and the line", fontsize=10)
    return axes


def explorer(x, y):
    """The interactive: sliders for w, b and the learning rate redraw both panels."""
    import matplotlib.pyplot as plt

    from .controls import interact

    def draw(w=-0.5, b=1.5, lr=0.1, steps=25):
        plot_state(x, y, w, b, lr, steps)
        plt.tight_layout()
        plt.show()

    return interact(draw, lambda W: dict(
        w=W.FloatSlider(value=-0.5, min=W_RANGE[0], max=W_RANGE[1], step=0.1, description="w"),
        b=W.FloatSlider(value=1.5, min=B_RANGE[0], max=B_RANGE[1], step=0.1, description="b"),
        lr=W.FloatLogSlider(value=0.1, base=10, min=-3, max=0, step=0.1, description="learning rate"),
        steps=W.IntSlider(value=25, min=1, max=200, description="steps")),
        action="move the sliders", labels={"lr": "learning rate"})


def transfer_plot(res, ax=None):
    """Time against n for each piece of a GPU round trip, with the CPU loop on the same host."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(7.5, 4.3))[1]
    rows = res["rows"]
    n = [r["n"] for r in rows]
    series = [("h2d_pageable_s", "copy x, y to GPU (pageable memory)", "C0", "o-"),
              ("h2d_pinned_s", "copy x, y to GPU (pinned memory)", "C0", "o--"),
              ("kernel_s", "kernel (twopass), CUDA events", "C3", "s-"),
              ("d2h_s", "copy 3 results back", "C2", "^-"),
              ("roundtrip_s", "whole round trip from NumPy arrays", "k", "D-"),
              ("cpu_loop_s", f"CPU @njit loop, same host ({res['meta']['cpu_count']} cores)", "C1", "v:"),
              ("cpu_prange_s", "CPU prange, same host", "C1", "v-")]
    for key, label, color, style in series:
        ax.plot(n, [r[key] * 1e6 for r in rows], style, color=color, label=label, ms=4)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("n (samples)")
    ax.set_ylabel("time (µs, median)")
    ax.set_title(f"regression_grad: where the time goes, {res['meta']['device'].get('name', '?')}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return ax


# ------------------------------------------------------------------------------ measurement
TRANSFER_SIZES = [1 << k for k in (10, 12, 14, 16, 18, 20, 22, 24)]


def _events_median(fn, repeat):
    if device.SIMULATED:  # the simulator has no events; its numbers only test this code path
        return _wall_median(fn, repeat)
    cuda = device.cuda
    start, end = cuda.event(), cuda.event()
    times = []
    for _ in range(repeat):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cuda.event_elapsed_time(start, end) / 1e3)
    return float(np.median(times))


def _wall_median(fn, repeat):
    times = []
    for _ in range(repeat):
        device.synchronize()
        t0 = time.perf_counter()
        fn()
        device.synchronize()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def measure_transfers(sizes=None, repeat: int = 20) -> dict:
    from ..bench import environment, time_cpu, time_gpu

    cuda = device.cuda
    sizes = sizes or TRANSFER_SIZES
    res = {"what": "regression_grad round trip: host->device copies, kernel, device->host, CPU loop",
           "simulated": device.SIMULATED, "meta": environment(), "rows": []}
    rng = np.random.default_rng(0)
    for n in sizes:
        w, b, hx, hy = sr.make_inputs((n,), np.dtype(np.float32), rng)
        px, py = cuda.pinned_array(n, dtype=np.float32), cuda.pinned_array(n, dtype=np.float32)
        px[:] = hx
        py[:] = hy
        dx, dy = cuda.device_array(n, dtype=np.float32), cuda.device_array(n, dtype=np.float32)
        outs = [cuda.device_array(1, dtype=np.float32) for _ in range(3)]
        host_outs = [np.empty(1, dtype=np.float32) for _ in range(3)]

        def h2d(a, b_):
            dx.copy_to_device(a)
            dy.copy_to_device(b_)

        def d2h():
            for d, h in zip(outs, host_outs):
                d.copy_to_host(h)

        def roundtrip():
            gx, gy = cuda.to_device(hx), cuda.to_device(hy)
            sr.regression_grad_twopass(*outs, w, b, gx, gy)
            return [o.copy_to_host() for o in outs]

        kernel = lambda: sr.regression_grad_twopass(*outs, w, b, dx, dy)  # noqa: E731
        h2d(hx, hy)
        kernel()
        roundtrip()  # warm-up: compile, allocate
        cpu_outs = [np.empty(1, dtype=np.float32) for _ in range(3)]
        row = {"n": n, "bytes_in": 2 * n * 4,
               "h2d_pageable_s": _events_median(lambda: h2d(hx, hy), repeat),
               "h2d_pinned_s": _events_median(lambda: h2d(px, py), repeat),
               "kernel_s": float(np.median(time_gpu(lambda *a: kernel(), [()], repeat=repeat))),
               "d2h_s": _events_median(d2h, repeat),
               "roundtrip_s": _wall_median(roundtrip, repeat),
               "cpu_loop_s": float(np.median(time_cpu(sr.regression_grad_loop, (*cpu_outs, w, b, hx, hy)))),
               "cpu_prange_s": float(np.median(time_cpu(sr.regression_grad_prange, (*cpu_outs, w, b, hx, hy))))}
        res["rows"].append(row)
        print(f"n={n:>9}: h2d {row['h2d_pageable_s'] * 1e6:9.1f} us (pinned {row['h2d_pinned_s'] * 1e6:9.1f}), "
              f"kernel {row['kernel_s'] * 1e6:8.1f} us, d2h {row['d2h_s'] * 1e6:6.1f} us, "
              f"round trip {row['roundtrip_s'] * 1e6:9.1f} us, CPU loop {row['cpu_loop_s'] * 1e6:9.1f} us, "
              f"prange {row['cpu_prange_s'] * 1e6:9.1f} us", flush=True)
    return res


def measure_determinism(n: int = 1 << 24, runs: int = 20) -> dict:
    """Run each GPU variant ``runs`` times on the same inputs: how many distinct results does it give,
    and how far is it from the float64 reference (relative error, worst of loss, dw, db)?"""
    from ..registry import variants

    cuda = device.cuda
    rng = np.random.default_rng(1)
    w, b, hx, hy = sr.make_inputs((n,), np.dtype(np.float32), rng)
    ref = [r[0] for r in sr.reference(float(w), float(b), hx.astype(np.float64), hy.astype(np.float64))]
    dx, dy = cuda.to_device(hx), cuda.to_device(hy)
    outs = [cuda.device_array(1, dtype=np.float32) for _ in range(3)]
    res = {"n": n, "runs": runs, "variants": {}}
    for v in variants("regression_grad", "gpu"):
        results = []
        for _ in range(runs):
            v.fn(*outs, w, b, dx, dy)
            results.append(tuple(float(o.copy_to_host()[0]) for o in outs))
        rel = max(abs(g - r) / abs(r) for res_ in results for g, r in zip(res_, ref))
        res["variants"][v.name] = {"distinct_results": len(set(results)), "max_rel_err": rel}
        print(f"{v.name:>12}: {len(set(results))} distinct results in {runs} runs, max rel error {rel:.2e}")
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernels_src.figures.regression")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("transfers", help="time the GPU round trip of regression_grad against its kernel")
    t.add_argument("--json")
    t.add_argument("--sizes", help="comma-separated n (default 2^10 ... 2^24)")
    t.add_argument("--repeat", type=int, default=20)
    args = p.parse_args(argv)
    if not device.GPU_VARIANTS_RUN:
        print(f"error: no GPU kernels can run here ({device.REASON})", file=sys.stderr)
        return 2
    from ..bench import save_json
    from ..usage import parse_sizes

    sizes = [s[0] for s in parse_sizes(args.sizes)] if args.sizes else None
    res = measure_transfers(sizes, args.repeat)
    res["determinism"] = measure_determinism(n=max(sizes or TRANSFER_SIZES))
    if args.json:
        print(f"wrote {save_json(res, args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
