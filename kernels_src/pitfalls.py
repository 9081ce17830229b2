"""How to time a kernel wrongly, and rightly (chapter 1).

``python -m kernels_src.pitfalls --json FILE`` times the same axpy launch four ways on the GPU:

1. the first call, which includes numba's JIT compilation;
2. a warm call timed with the wall clock but no synchronize (it measures only the launch: the GPU
   runs asynchronously and the clock stops before the kernel ends);
3. a warm call, wall clock, with ``cuda.synchronize()`` (includes launch overhead, ~microseconds);
4. CUDA events around the launch, median of repeats, L2 flushed (what ``kernels bench`` does);

and, for the "transfers dominate" lesson, the host->device and device->host copies of the same data.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from . import device
from .bench import _median, environment, save_json, time_gpu
from .device import cuda


@cuda.jit
def fresh_axpy(out, a, x, y):  # its own kernel, so the first call in this process really compiles
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


def measure(n: int = 1 << 24, repeat: int = 20) -> dict:
    rng = np.random.default_rng(0)
    hx = rng.standard_normal(n).astype(np.float32)
    hy = rng.standard_normal(n).astype(np.float32)
    t0 = time.perf_counter()
    x, y = cuda.to_device(hx), cuda.to_device(hy)
    device.synchronize()
    h2d = (time.perf_counter() - t0)
    out = cuda.device_array_like(x)
    a = np.float32(2.0)
    grid = device.ceil_div(n, 256)

    def launch(o, a_, x_, y_):
        fresh_axpy[grid, 256](o, a_, x_, y_)

    t0 = time.perf_counter()
    launch(out, a, x, y)
    device.synchronize()
    first = time.perf_counter() - t0
    nosync, synced = [], []
    for _ in range(repeat):
        device.synchronize()
        t0 = time.perf_counter()
        launch(out, a, x, y)
        nosync.append(time.perf_counter() - t0)
        device.synchronize()
        t0 = time.perf_counter()
        launch(out, a, x, y)
        device.synchronize()
        synced.append(time.perf_counter() - t0)
    events = time_gpu(launch, [(out, a, x, y)], repeat=repeat)
    t0 = time.perf_counter()
    out.copy_to_host()
    d2h = time.perf_counter() - t0
    return {"n": n, "bytes_moved_by_kernel": 3 * 4 * n, "first_call_s": first, "no_sync_s": _median(nosync),
            "wall_sync_s": _median(synced), "events_s": _median(events), "h2d_two_arrays_s": h2d,
            "d2h_one_array_s": d2h, "meta": environment()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=1 << 24)
    p.add_argument("--json")
    args = p.parse_args()
    res = measure(args.n)
    for k, v in res.items():
        if k != "meta":
            print(f"{k:24s} {v:.6g}" if isinstance(v, float) else f"{k:24s} {v}")
    if args.json:
        save_json(res, args.json)


if __name__ == "__main__":
    main()
