"""The CPU core's FMA peak, measured: a loop of fused multiply-adds on registers only (no loads, no stores).

    python -m kernels_src.tools.fmapeak

Twelve independent 16-float accumulators (``vfma16`` from the compiler door: one ``vfmadd231ps`` on a zmm
register each) are updated over and over. Twelve chains are enough to cover an FMA's latency (4 cycles) on two
FMA units, so the loop runs at the core's FMA throughput: FMAs per second x 16 lanes x 2 FLOPs is the one-core
float32 peak a GEMM micro-kernel can be held against. Timed with the process's CPU time (a busy shared machine
takes wall time away, not CPU time); ``fma_peak_all`` runs it on every thread at once (wall time). Needs
AVX-512 (``zmm_kernels``); elsewhere it says why and returns None.
"""
from __future__ import annotations

import time

import numpy as np

from ..compiler import get_num_threads, njit, prange, vfma16, vsplat16, vstore16, zmm_kernels


@njit(fastmath=False, cache=False)
def _fma_loop(out, n):
    x = vsplat16(np.float32(1.0000001))
    y = vsplat16(np.float32(1e-9))
    a0 = a1 = a2 = a3 = a4 = a5 = vsplat16(np.float32(0.5))
    a6 = a7 = a8 = a9 = a10 = a11 = vsplat16(np.float32(0.25))
    for _ in range(n):
        a0 = vfma16(a0, x, y)
        a1 = vfma16(a1, x, y)
        a2 = vfma16(a2, x, y)
        a3 = vfma16(a3, x, y)
        a4 = vfma16(a4, x, y)
        a5 = vfma16(a5, x, y)
        a6 = vfma16(a6, x, y)
        a7 = vfma16(a7, x, y)
        a8 = vfma16(a8, x, y)
        a9 = vfma16(a9, x, y)
        a10 = vfma16(a10, x, y)
        a11 = vfma16(a11, x, y)
    for i, a in enumerate((a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11)):  # keep every chain alive
        vstore16(out, 16 * i, a)


@njit(parallel=True, fastmath=False, cache=False)
def _fma_par(out, n, parts):
    for p in prange(parts):  # one register-only FMA loop per thread, all at once
        _fma_loop(out[192 * p:192 * (p + 1)], n)


def fma_peak_all(n: int = 20_000_000, repeat: int = 5):
    """The machine's float32 FMA rate with every Numba thread running the same loop at once (wall time, best of
    ``repeat``): ``{"threads", "fma_per_s", "gflops"}``, or None without AVX-512. Against :func:`fma_peak` it
    says whether the threads have FMA units of their own (about threads x one core's rate) or share them
    (two hardware threads of one core: about one core's rate)."""
    ok, why = zmm_kernels()
    if not ok:
        print(f"fmapeak: skipped ({why})")
        return None
    parts = int(get_num_threads())
    out = np.empty(192 * parts, np.float32)
    _fma_par(out, 1000, parts)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        _fma_par(out, n, parts)
        best = min(best, time.perf_counter() - t)
    fmas = 12 * n * parts / best
    return {"threads": parts, "fma_per_s": fmas, "gflops": fmas * 16 * 2 / 1e9}


def fma_peak(n: int = 20_000_000, repeat: int = 5):
    """One core's measured float32 FMA peak: ``{"fma_per_s", "gflops"}`` (best of ``repeat``), or None."""
    ok, why = zmm_kernels()
    if not ok:
        print(f"fmapeak: skipped ({why})")
        return None
    out = np.empty(16 * 12, np.float32)
    _fma_loop(out, 1000)
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        _fma_loop(out, n)
        best = min(best, time.process_time() - t)
    fmas = 12 * n / best
    return {"fma_per_s": fmas, "gflops": fmas * 16 * 2 / 1e9}


if __name__ == "__main__":  # pragma: no cover
    r = fma_peak()
    if r:
        print(f"one core: {r['fma_per_s'] / 1e9:.2f} G zmm FMAs/s = {r['gflops']:.0f} GFLOP/s float32")
        a = fma_peak_all()
        print(f"all {a['threads']} threads at once: {a['fma_per_s'] / 1e9:.2f} G zmm FMAs/s = "
              f"{a['gflops']:.0f} GFLOP/s")
