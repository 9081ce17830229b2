"""Short reproductions of what numba-cuda-mlir 0.6 does not yet run of the course (see tools/compilers.py).

    KERNELS_COMPILER=mlir python -m kernels_src.tools.mlir_repro

Each case launches one tiny kernel in its own process (an illegal address poisons a CUDA context) and prints
one line: the case, ok or the error.
"""
from __future__ import annotations

import subprocess
import sys

CASES = {
    "global_load4": "1-D global array, load4/store4",
    "shared_load4": "1-D shared array (alignment=16), store4 then load4",
    "shared_scalar_aligned": "1-D shared array (alignment=16), scalar stores and loads",
    "shared_load4_noalign": "1-D shared array (no alignment=), store4 then load4",
}


def run_case(name: str) -> str:
    import numpy as np

    from ..compiler import cuda, float32, load4, store4

    if name == "global_load4":
        @cuda.jit
        def k(out, x):
            i = cuda.grid(1)
            if 4 * i + 3 < x.size:
                a, b, c, d = load4(x, i)
                store4(out, i, a, b, c, d)
    elif name in ("shared_load4", "shared_load4_noalign", "shared_scalar_aligned"):
        aligned = name != "shared_load4_noalign"
        vec = name != "shared_scalar_aligned"
        if aligned:
            @cuda.jit
            def k(out, x):
                s = cuda.shared.array(128, float32, alignment=16)
                t = cuda.threadIdx.x
                if vec:
                    if t < 32:
                        a, b, c, d = load4(x, t)
                        store4(s, t, a, b, c, d)
                    cuda.syncthreads()
                    if t < 32:
                        a, b, c, d = load4(s, t)
                        store4(out, t, a, b, c, d)
                else:
                    s[t] = x[t]
                    cuda.syncthreads()
                    out[t] = s[t]
        else:
            @cuda.jit
            def k(out, x):
                s = cuda.shared.array(128, float32)
                t = cuda.threadIdx.x
                if t < 32:
                    a, b, c, d = load4(x, t)
                    store4(s, t, a, b, c, d)
                cuda.syncthreads()
                if t < 32:
                    a, b, c, d = load4(s, t)
                    store4(out, t, a, b, c, d)
    else:
        raise KeyError(name)
    x = np.arange(128, dtype=np.float32)
    dx, dout = cuda.to_device(x), cuda.to_device(np.zeros_like(x))
    k[1, 128](dout, dx)
    cuda.synchronize()
    got = dout.copy_to_host()
    return "ok" if np.array_equal(got, x) else f"wrong result (first {got[:6]})"


def main() -> int:
    if len(sys.argv) > 1:
        try:
            print(run_case(sys.argv[1]))
        except Exception as e:  # noqa: BLE001
            print(f"{type(e).__name__}: {' '.join(str(e).split())[:200]}")
        return 0
    for name, what in CASES.items():
        p = subprocess.run([sys.executable, "-m", "kernels_src.tools.mlir_repro", name], capture_output=True,
                           text=True, timeout=300)
        last = (p.stdout.strip().splitlines() or [p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "?"])[-1]
        print(f"{name:24s} {what:55s} {last}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
