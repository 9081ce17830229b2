"""Operations that exist only as exercises, plus the edge-value inputs of every graded op.

An exercise checks a student's function against an op's float64 reference. Most exercises use an op
registered by a chapter (``kernels_src/ops/*.py``, looked up by name). An op that is only an exercise,
with no ladder of course variants, is declared here with the same :class:`~kernels_src.registry.Op`
record, so it shows up in no benchmark or table.

Edge values: a function ``make_edge_inputs(size, dtype, rng) -> inputs``, defined next to the op's
``make_inputs`` in its ``kernels_src/ops/<family>.py`` (or in ``EDGE_INPUTS`` here), puts the values where
kernels go wrong (zeros, signed zeros, infinities, NaN, tiny and huge magnitudes that do not overflow in
the op's own arithmetic) into otherwise random inputs. ``check_*(..., edge=True)`` uses it.

An exercise-only op can also be declared in a chapter's ops module: ``from kernels_src.registry import
exercise_op`` and call ``exercise_op(name, reference=..., make_inputs=..., sizes=..., ...)``; edge values go
in ``define_op(..., edge_inputs=...)``, ``registry.EDGE_INPUTS[name]`` or a module-level
``make_edge_inputs``. Ops modules never import from ``kernels_src.grading``.
"""
from __future__ import annotations

import numpy as np

# What an op needs for grading (edge inputs, exercise-only ops) belongs to its definition, in the registry,
# where the tests and `kernels check` read it too; these names are re-exported for the grader.
from ..registry import EDGE_INPUTS, EXERCISE_OPS, exercise_op, find_edge_inputs, find_op  # noqa: F401
from ..registry import sprinkle as _sprinkle


# ------------------------------------------------------------------------------ axpy (chapter 1)
def _axpy_edges(size, dtype, rng):
    (n,) = size
    a = dtype.type(rng.choice([-1.5, 0.75, 2.0]))
    x = rng.standard_normal(n).astype(dtype)
    y = rng.standard_normal(n).astype(dtype)
    # zeros, a signed zero, infinities and NaN must come out as a*x + y does; 1e30 * 2 stays finite in float32
    _sprinkle(x, rng, [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e-30, 1e-40])
    _sprinkle(y, rng, [0.0, np.nan, -np.inf, 1e30])
    return a, x, y


EDGE_INPUTS["axpy"] = _axpy_edges


# ------------------------------------------------------- axpy_block_sum (chapter 1, second exercise)
BLOCK = 128  # threads per block, and elements summed per block


def block_sum_reference(a, x, y):
    """float64 oracle: out[b] = sum of (a*x[i] + y[i]) over i in [b*BLOCK, min(n, (b+1)*BLOCK))."""
    v = a * x + y
    n = v.shape[0]
    return np.add.reduceat(v, np.arange(0, n, BLOCK)) if n else np.zeros(0)


def _block_sum_inputs(size, dtype, rng):
    (n,) = size
    a = dtype.type(rng.uniform(0.5, 2.0))
    return a, rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)


def _block_sum_tol(size, dtype):
    # A tree sum of BLOCK float32 terms of size ~1 has an error ~ log2(BLOCK) * eps * sum|terms|, up to
    # about 7 * 6e-8 * 128 * 3 = 1.6e-4 in the worst case; typical errors are 100x smaller.
    return (1e-4, 2e-4) if np.dtype(dtype) == np.float32 else (1e-10, 1e-10)


exercise_op(
    "axpy_block_sum", reference=block_sum_reference, make_inputs=_block_sum_inputs, chapter=1,
    title="per-block sums of a*x + y", size_names=("n",), kind="memory",
    flops=lambda s: 3 * s[0], bytes=lambda s, b: 2 * s[0] * b, tol=_block_sum_tol, output_names=("out",),
    # 1 and 127: one partial block; 128: exactly one; 129 and 300: a partial last block
    sizes={"check": [(1,), (127,), (128,), (129,), (300,)], "check_sim": [(1,), (127,), (129,), (300,)],
           "bench": [(1 << 20,)]},
)


def _block_sum_edges(size, dtype, rng):
    (n,) = size
    a = dtype.type(rng.choice([-1.0, 0.5]))
    x = rng.standard_normal(n).astype(dtype)
    y = rng.standard_normal(n).astype(dtype)
    # an infinity in one block and a NaN in another: the whole block's sum must follow
    _sprinkle(x, rng, [np.inf, 0.0, -0.0])
    if n > BLOCK:
        x[-1] = np.nan
    return a, x, y


EDGE_INPUTS["axpy_block_sum"] = _block_sum_edges
