"""The "predict, then measure" questions of chapters 1-8: exercise-only ops whose oracle is the committed
H100 measurement.

Each op's reference reads ``book/data/bench/h100/<op>_gpu.json`` (through :data:`kernels_src.paths.BENCH_DATA`,
so the Gradescope autograder finds the data it ships beside the package) **when the check runs**: the
numbers are never copied here, so a re-measurement changes what the question accepts, not its code. Its
inputs are the measured sizes, drawn in a random order; the student's ``@njit`` function predicts the
quantity at each. The band is the op's relative tolerance (``tol=(band, 0)``), stated in the question.

| op | chapter | quantity (per measured size) | band |
|---|---|---|---|
| ``axpy_time_prediction`` | 1 | axpy ``thread`` rung, median µs | ±40 % |
| ``regression_time_prediction`` | 2 | ``atomic`` and ``blockatomic`` rungs, median µs | ±50 % |
| ``db_speedup_prediction`` | 3 | ``column`` time / ``tree`` time of ``linear_bwd_db`` | ±30 % |
| ``gemv_time_prediction`` | 4 | ``thread_per_col`` and ``splitk_grid`` rungs of ``gemv``, median µs | ±50 % |
| ``gemm_smem_prediction`` | 5 | TFLOP/s of the ``smem`` rung of ``gemm`` | ±30 % |
| ``fusion_speedup_prediction`` | 6 | ``unfused`` time / ``fused`` time of ``bias_gelu`` | ±30 % |
| ``layernorm_time_prediction`` | 7 | ``regs`` rung of ``layernorm``, median µs | ±40 % |
| ``softmax_pass_prediction`` | 8 | ``safe`` time / ``regs`` time of ``softmax`` | ±40 % |

Sizes where a rung is overhead-bound (under ``MIN_US``) are left out of the ratio questions: there the
launch, not the model, sets the time.
"""
from __future__ import annotations

import json

import numpy as np

from ..paths import BENCH_DATA
from ..registry import exercise_op

MIN_US = 20.0  # ratio questions use only sizes where both rungs take at least this long


def measured_us(op: str, variant: str) -> dict:
    """{size tuple: median microseconds} of ``variant`` in the committed H100 file of ``op``."""
    path = BENCH_DATA / "h100" / f"{op}_gpu.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: this predict-then-measure question grades against committed data")
    rows = json.loads(path.read_text())["rows"]
    return {tuple(int(v) for v in r["size"]): r["median_s"] * 1e6 for r in rows
            if r.get("variant") == variant and "median_s" in r}


def _common(op, variants, min_us=0.0):
    data = [measured_us(op, v) for v in variants]
    sizes = sorted(set.intersection(*(set(d) for d in data)))
    sizes = [s for s in sizes if all(d[s] >= min_us for d in data)]
    if not sizes:
        raise FileNotFoundError(f"no size of {op} has every one of {variants} measured")
    return sizes, data


def _draw(sizes, k, rng):
    """k of the measured sizes (each at least once when k allows), in a random order."""
    order = [sizes[i % len(sizes)] for i in range(max(k, len(sizes)))]
    return [order[i] for i in rng.permutation(len(order))[:k]]


def _columns(picked, ndim):
    return tuple(np.array([float(s[d]) for s in picked]) for d in range(ndim))


def _declare(name, chapter, title, reference, make_inputs, size_names, output_names, band):
    exercise_op(name, reference=reference, make_inputs=make_inputs, chapter=chapter, title=title,
                size_names=size_names, kind="memory", output_names=output_names, tol=(band, 0.0),
                flops=lambda s: 0, bytes=lambda s, b: 0,
                sizes={"check": [(3,), (5,)], "check_sim": [(3,), (5,)], "bench": [(5,)]})


# ----------------------------------------------------------------------------------- chapter 1: axpy
def axpy_time_inputs(size, dtype, rng):
    sizes, _ = _common("axpy", ["thread"])
    return _columns(_draw(sizes, size[0], rng), 1)


def axpy_time_reference(n):
    d = measured_us("axpy", "thread")
    return np.array([d[(int(v),)] for v in n])


_declare("axpy_time_prediction", 1, "predicted vs measured time of axpy (thread rung) on the H100",
         axpy_time_reference, axpy_time_inputs, ("k",), ("us",), 0.4)


# ------------------------------------------------------------------------ chapter 2: regression_grad
def regression_time_inputs(size, dtype, rng):
    sizes, _ = _common("regression_grad", ["atomic", "blockatomic"])
    return _columns(_draw(sizes, size[0], rng), 1)


def regression_time_reference(n):
    a, b = measured_us("regression_grad", "atomic"), measured_us("regression_grad", "blockatomic")
    return np.array([[a[(int(v),)], b[(int(v),)]] for v in n]).reshape(len(n), 2)


_declare("regression_time_prediction", 2, "predicted vs measured time of the atomic and blockatomic rungs",
         regression_time_reference, regression_time_inputs, ("k",), ("us",), 0.5)


# ------------------------------------------------------------------------- chapter 3: linear_bwd_db
def db_speedup_inputs(size, dtype, rng):
    sizes, _ = _common("linear_bwd_db", ["column", "tree"], MIN_US)
    return _columns(_draw(sizes, size[0], rng), 2)


def db_speedup_reference(M, N):
    col, tree = measured_us("linear_bwd_db", "column"), measured_us("linear_bwd_db", "tree")
    keys = [(int(m), int(n)) for m, n in zip(M, N)]
    return np.array([col[k] / tree[k] for k in keys])


_declare("db_speedup_prediction", 3, "predicted vs measured speed-up of the db tree over one thread per column",
         db_speedup_reference, db_speedup_inputs, ("k",), ("s",), 0.3)


# ----------------------------------------------------------------------------------- chapter 4: gemv
def gemv_time_inputs(size, dtype, rng):
    sizes, _ = _common("gemv", ["thread_per_col", "splitk_grid"])
    return _columns(_draw(sizes, size[0], rng), 2)


def gemv_time_reference(K, N):
    col, grid = measured_us("gemv", "thread_per_col"), measured_us("gemv", "splitk_grid")
    keys = [(int(k), int(n)) for k, n in zip(K, N)]
    return np.array([[col[k], grid[k]] for k in keys]).reshape(len(keys), 2)


_declare("gemv_time_prediction", 4, "predicted vs measured time of GEMV thread_per_col and splitk_grid",
         gemv_time_reference, gemv_time_inputs, ("k",), ("us",), 0.5)


# ----------------------------------------------------------------------------------- chapter 5: gemm
def gemm_smem_inputs(size, dtype, rng):
    sizes, _ = _common("gemm", ["smem"], MIN_US)
    return _columns(_draw(sizes, size[0], rng), 3)


def gemm_smem_reference(M, N, K):
    d = measured_us("gemm", "smem")
    return np.array([2.0 * m * n * k / (d[(int(m), int(n), int(k))] * 1e-6) / 1e12 for m, n, k in zip(M, N, K)])


_declare("gemm_smem_prediction", 5, "predicted vs measured TFLOP/s of the shared-memory GEMM rung",
         gemm_smem_reference, gemm_smem_inputs, ("k",), ("tflops",), 0.3)


# ------------------------------------------------------------------------------ chapter 6: bias_gelu
def fusion_speedup_inputs(size, dtype, rng):
    sizes, _ = _common("bias_gelu", ["unfused", "fused"], MIN_US)
    return _columns(_draw(sizes, size[0], rng), 2)


def fusion_speedup_reference(M, N):
    un, fu = measured_us("bias_gelu", "unfused"), measured_us("bias_gelu", "fused")
    return np.array([un[(int(m), int(n))] / fu[(int(m), int(n))] for m, n in zip(M, N)])


_declare("fusion_speedup_prediction", 6, "predicted vs measured speed-up of fusing bias + GELU",
         fusion_speedup_reference, fusion_speedup_inputs, ("k",), ("s",), 0.3)


# ------------------------------------------------------------------------------ chapter 7: layernorm
def layernorm_time_inputs(size, dtype, rng):
    sizes, _ = _common("layernorm", ["regs"])
    return _columns(_draw(sizes, size[0], rng), 2)


def layernorm_time_reference(M, N):
    d = measured_us("layernorm", "regs")
    return np.array([d[(int(m), int(n))] for m, n in zip(M, N)])


_declare("layernorm_time_prediction", 7, "predicted vs measured time of the regs LayerNorm rung",
         layernorm_time_reference, layernorm_time_inputs, ("k",), ("us",), 0.4)


# -------------------------------------------------------------------------------- chapter 8: softmax
def softmax_pass_inputs(size, dtype, rng):
    sizes, _ = _common("softmax", ["safe", "regs"], MIN_US)
    return _columns(_draw(sizes, size[0], rng), 2)


def softmax_pass_reference(M, N):
    safe, regs = measured_us("softmax", "safe"), measured_us("softmax", "regs")
    return np.array([safe[(int(m), int(n))] / regs[(int(m), int(n))] for m, n in zip(M, N)])


_declare("softmax_pass_prediction", 8, "predicted vs measured time of the three-pass softmax over the one-pass",
         softmax_pass_reference, softmax_pass_inputs, ("k",), ("r",), 0.4)
