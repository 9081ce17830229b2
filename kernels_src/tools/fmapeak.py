"""The CPU core's FMA peak, measured: a loop of fused multiply-adds on registers only (no loads, no stores).

    python -m kernels_src.tools.fmapeak

Independent 16-float accumulators (``vfma16`` from the compiler door) are updated over and over. With AVX-512
each is one zmm register and one ``vfmadd231ps`` per update, twelve chains; with AVX2 and FMA each is two ymm
registers and two ``vfmadd231ps``, six chains, so that the twelve ymm accumulators and the two operands fit the
16 ymm registers without a spill. Twelve register chains cover an FMA's latency (4-5 cycles) on two FMA units,
so the loop runs at the core's FMA throughput. ``fma_per_s`` counts machine instructions (one per register
updated): the rate the vector-port model of ``figures.cpu`` reads a hot loop's instruction count against;
``gflops`` = ``fma_per_s`` x the register's float32 lanes x 2. Timed with the process's CPU time (a busy shared
machine takes wall time away, not CPU time); ``fma_peak_all`` runs it on every thread at once (wall time).
Without AVX-512 or AVX2 + FMA it says why and returns None.
"""
from __future__ import annotations

import time

import numpy as np

from ..compiler import get_num_threads, njit, prange, vfma16, vsplat16, vstore16, zmm_kernels

REGS = 12  # machine registers each loop updates per iteration, one FMA each: 12 zmm, or 6 f32x16 = 12 ymm


def _avx2_fma() -> bool:
    try:
        import llvmlite.binding as ll

        f = ll.get_host_cpu_features()
        return bool(f.get("avx2") and f.get("fma"))
    except Exception:  # noqa: BLE001
        return False


def target() -> tuple[int, str]:
    """``(bits, "")``: the register width of the FMA loop that suits this CPU (512 or 256), or ``(0, why)``."""
    ok, why = zmm_kernels()
    if ok:
        return 512, ""
    if _avx2_fma():
        return 256, ""
    return 0, f"{why}; and no AVX2 with FMA either"


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


@njit(fastmath=False, cache=False)
def _fma_loop_ymm(out, n):
    x = vsplat16(np.float32(1.0000001))
    y = vsplat16(np.float32(1e-9))
    a0 = a1 = a2 = vsplat16(np.float32(0.5))
    a3 = a4 = a5 = vsplat16(np.float32(0.25))
    for _ in range(n):
        a0 = vfma16(a0, x, y)
        a1 = vfma16(a1, x, y)
        a2 = vfma16(a2, x, y)
        a3 = vfma16(a3, x, y)
        a4 = vfma16(a4, x, y)
        a5 = vfma16(a5, x, y)
    for i, a in enumerate((a0, a1, a2, a3, a4, a5)):
        vstore16(out, 16 * i, a)


@njit(parallel=True, fastmath=False, cache=False)
def _fma_par(out, n, parts):
    for p in prange(parts):  # one register-only FMA loop per thread, all at once
        _fma_loop(out[192 * p:192 * (p + 1)], n)


@njit(parallel=True, fastmath=False, cache=False)
def _fma_par_ymm(out, n, parts):
    for p in prange(parts):
        _fma_loop_ymm(out[192 * p:192 * (p + 1)], n)


def _timed(run, n, regs, bits, repeat, clock):
    """Best of ``repeat`` calls of ``run(n)``: ``n`` iterations of ``regs`` FMA instructions on ``bits``-bit
    registers."""
    run(1000)  # compile and warm up
    best = float("inf")
    for _ in range(repeat):
        t = clock()
        run(n)
        best = min(best, clock() - t)
    fmas = regs * n / best  # machine FMA instructions per second
    return {"fma_per_s": fmas, "gflops": fmas * (bits // 32) * 2 / 1e9, "bits": bits}


def fma_peak_all(n: int = 20_000_000, repeat: int = 5):
    """The machine's float32 FMA rate with every Numba thread running the same loop at once (wall time, best of
    ``repeat``): ``{"threads", "fma_per_s", "gflops", "bits"}``, or None without AVX-512 or AVX2 + FMA. Against
    :func:`fma_peak` it says whether the threads have FMA units of their own (about threads x one core's rate)
    or share them (two hardware threads of one core: about one core's rate)."""
    bits, why = target()
    if not bits:
        print(f"fmapeak: skipped ({why})")
        return None
    parts = int(get_num_threads())
    out = np.empty(192 * parts, np.float32)
    par = _fma_par if bits == 512 else _fma_par_ymm
    run = lambda k: par(out, k, parts)  # noqa: E731
    return {"threads": parts, **_timed(run, n, REGS * parts, bits, repeat, time.perf_counter)}


def fma_peak(n: int = 20_000_000, repeat: int = 5):
    """One core's measured float32 FMA peak: ``{"fma_per_s", "gflops", "bits"}`` (best of ``repeat``, CPU time),
    or None."""
    bits, why = target()
    if not bits:
        print(f"fmapeak: skipped ({why})")
        return None
    out = np.empty(192, np.float32)
    loop = _fma_loop if bits == 512 else _fma_loop_ymm
    return _timed(lambda k: loop(out, k), n, REGS, bits, repeat, time.process_time)


if __name__ == "__main__":  # pragma: no cover
    r = fma_peak()
    if r:
        reg = {512: "zmm", 256: "ymm"}[r["bits"]]
        print(f"one core: {r['fma_per_s'] / 1e9:.2f} G {reg} FMAs/s = {r['gflops']:.0f} GFLOP/s float32")
        a = fma_peak_all()
        print(f"all {a['threads']} threads at once: {a['fma_per_s'] / 1e9:.2f} G {reg} FMAs/s = "
              f"{a['gflops']:.0f} GFLOP/s")
