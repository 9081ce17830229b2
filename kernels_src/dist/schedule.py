"""The arithmetic of collectives: who holds which chunk, who sends what to whom, how far two correct sums may
differ, and how a measured time becomes a bandwidth. Pure Python (no Numba, no GPU), so the chapter, the
exercises, the CPU ranks (``comm``), the virtual-rank ops (``ops/collectives.py``) and the multi-GPU kernels all
read the same definitions.

**Chunks.** A vector of ``length`` elements is split over ``n`` ranks into ``n`` contiguous chunks; when ``n`` does
not divide ``length``, the first ``length % n`` chunks get one element more (NumPy's ``array_split`` does the same).
Chunk ``c`` is ``x[lo:hi]`` with ``(lo, hi) = chunk_bounds(length, n, c)``; chunks may be empty when
``length < n``.

**The ring.** The ranks sit on a ring, rank ``r`` sends only to ``r + 1`` and receives only from ``r - 1``.
An all-reduce is a reduce-scatter followed by an all-gather:

- reduce-scatter, ``n - 1`` steps: at step ``s`` rank ``r`` sends its partial sum of chunk ``(r - s) % n`` to the
  right and adds the partial sum of chunk ``(r - s - 1) % n`` that arrives from the left into its own copy. Each
  chunk travels once around the ring picking up one rank's contribution per hop, so after ``n - 1`` steps rank
  ``r`` holds the complete sum of chunk ``(r + 1) % n``;
- all-gather, ``n - 1`` steps: at step ``s`` rank ``r`` sends chunk ``(r + 1 - s) % n`` (complete) and receives
  chunk ``(r - s) % n``, which it copies over its own.

Every rank sends ``2 (n - 1)`` chunks of ``length / n`` elements: ``2 (n - 1) / n`` of the vector, whatever ``n``
is. That fraction is why the ring's bandwidth does not fall as ranks are added, and it is the "bus factor" below.

**Bandwidth, as nccl-tests reports it** (its ``doc/PERFORMANCE.md``, paraphrased). For a collective on ``S``
bytes that took ``t`` seconds:

- *algorithm bandwidth* ``algbw = S / t``: the size the user asked for over the time. Easy to read, but not
  comparable across rank counts, because an all-reduce over more ranks must move more bytes per rank.
- *bus bandwidth* ``busbw = algbw * factor``, where the factor counts the bytes each rank must put on its link
  with an optimal algorithm: ``2 (n - 1) / n`` for all-reduce, ``(n - 1) / n`` for reduce-scatter and all-gather
  (``S`` there is the full vector, ``n`` chunks), ``1`` for broadcast and reduce. Bus bandwidth does not depend
  on ``n`` for an ideal algorithm, so it compares with the link's peak (NVLink per direction) directly.

Both are in GB/s with G = 10**9, as nccl-tests prints them.

**The alpha-beta model.** A message of ``b`` bytes costs ``t = alpha + b / beta``: a fixed latency ``alpha`` (launch,
synchronisation, the first byte's trip) and a bandwidth ``beta``. ``fit_alpha_beta`` fits both to a sweep.

**How far two correct sums may differ.** Summing ``n`` floats in two different orders (the ring adds chunk ``c``
starting at rank ``c + 1``, a one-shot kernel adds ranks ``0..n-1`` in order) gives two results that both differ
from the exact sum by at most about ``(n - 1) u sum|x_i|`` (``u = eps / 2``, the unit roundoff; Higham,
*Accuracy and Stability of Numerical Algorithms*, ch. 4), so from each other by at most
``(n - 1) eps sum|x_i|``. ``sum_tolerance`` states that bound once; every test of a sum uses it.
"""
from __future__ import annotations

import math

import numpy as np

#: bytes each rank puts on its link, per byte of the user's vector, for an optimal algorithm (nccl-tests)
BUS_FACTORS = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def _check_n(n):
    if int(n) != n or n < 1:
        raise ValueError(f"the number of ranks must be a positive integer, got {n!r}")
    return int(n)


def chunk_bounds(length: int, n: int, r: int) -> tuple[int, int]:
    """``(lo, hi)`` of chunk ``r`` when ``length`` elements are split over ``n`` ranks.

    The first ``length % n`` chunks have ``length // n + 1`` elements, the others ``length // n``; the chunks
    are contiguous, in rank order, and cover ``0..length`` exactly (the split of ``np.array_split``).

    >>> [chunk_bounds(10, 4, r) for r in range(4)]
    [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    n = _check_n(n)
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    if not 0 <= r < n:
        raise ValueError(f"chunk {r} is outside 0..{n - 1}")
    q, extra = divmod(int(length), n)
    lo = r * q + min(r, extra)
    return lo, lo + q + (1 if r < extra else 0)


def ring_steps(n: int) -> list[tuple[str, int, int, int, int]]:
    """The ring all-reduce schedule for ``n`` ranks, as ``(phase, step, rank, send_chunk, recv_chunk)`` tuples.

    ``phase`` is ``"reduce_scatter"`` (the received chunk is added into the rank's copy) or ``"all_gather"``
    (it is copied over). Within a step every rank sends to ``(rank + 1) % n`` and receives from
    ``(rank - 1) % n``; the chunk a rank receives at a step is the one its left neighbour sends at that step.
    Tuples come phase by phase, step by step, rank by rank; ``n = 1`` has no steps.

    >>> [t for t in ring_steps(3) if t[1] == 0 and t[0] == "reduce_scatter"]
    [('reduce_scatter', 0, 0, 0, 2), ('reduce_scatter', 0, 1, 1, 0), ('reduce_scatter', 0, 2, 2, 1)]
    """
    n = _check_n(n)
    steps = []
    for s in range(n - 1):
        for r in range(n):
            steps.append(("reduce_scatter", s, r, (r - s) % n, (r - s - 1) % n))
    for s in range(n - 1):
        for r in range(n):
            steps.append(("all_gather", s, r, (r + 1 - s) % n, (r - s) % n))
    return steps


def owned_chunk(n: int, r: int) -> int:
    """The chunk whose complete sum rank ``r`` holds after the ring's reduce-scatter phase: ``(r + 1) % n``."""
    n = _check_n(n)
    return (r + 1) % n


def sum_tolerance(n: int, dtype) -> tuple[float, float]:
    """``(rtol, atol_factor)`` for comparing a sum of ``n`` values in ``dtype`` with another correct sum.

    Two sums of the same ``n`` numbers in different orders, each rounded to ``dtype``, may differ by
    ``(n - 1) * eps * sum_i |x_i|`` (``eps`` the format's machine epsilon; see the module docstring). The
    comparison is ``|a - b| <= atol_factor * sum_i |x_i| + rtol * |b|`` with ``atol_factor = (n - 1) * eps`` and
    ``rtol = eps``, the one final rounding of a value computed in higher precision (the float64 reference, or a
    float32 sum accumulated in float64). Note ``sum|x_i|``, not ``|sum x_i|``: with cancellation the result may be
    tiny while the rounding errors of the partial sums are not.

    >>> sum_tolerance(1, "float32")[1]
    0.0
    """
    n = _check_n(n)
    eps = float(np.finfo(np.dtype(dtype)).eps)
    return eps, (n - 1) * eps


def allclose_sum(a, b, abs_sum, n: int, dtype) -> np.ndarray:
    """Elementwise: is ``a`` within ``sum_tolerance(n, dtype)`` of ``b``? ``abs_sum`` is ``sum_i |x_i|`` per
    element (same shape). NaN and inf must match exactly in place (a NaN never passes against a number)."""
    rtol, atol_factor = sum_tolerance(n, dtype)
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    abs_sum = np.asarray(abs_sum, dtype=np.float64)
    finite = np.isfinite(a) & np.isfinite(b)
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.abs(a - b) <= atol_factor * abs_sum + rtol * np.abs(b)
    same_special = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))
    return np.where(finite, close, same_special)


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (10**9 bytes per second): the user's message size over the time."""
    if seconds <= 0:
        raise ValueError(f"a time must be positive, got {seconds}")
    return float(nbytes) / float(seconds) / 1e9


def bus_factor(n: int, collective: str = "all_reduce") -> float:
    """Bytes each rank must send per byte of the message, for an optimal algorithm on ``n`` ranks."""
    n = _check_n(n)
    try:
        return BUS_FACTORS[collective](n)
    except KeyError:
        raise ValueError(f"unknown collective {collective!r}; one of {sorted(BUS_FACTORS)}") from None


def busbw(nbytes: float, seconds: float, n: int, collective: str = "all_reduce") -> float:
    """Bus bandwidth in GB/s: ``algbw * bus_factor(n, collective)`` (nccl-tests' definition).

    ``nbytes`` is the size of the whole vector (for reduce-scatter and all-gather: all ``n`` chunks). For one
    rank the all-reduce's factor is 0: nothing has to move.

    >>> busbw(1e9, 1.0, 2)        # 1 GB all-reduced over 2 ranks in 1 s: each rank sent half of it
    1.0
    """
    return algbw(nbytes, seconds) * bus_factor(n, collective)


def fit_alpha_beta(nbytes, seconds, *, relative: bool = True) -> tuple[float, float]:
    """Fit ``t = alpha + nbytes / beta`` to measured points; returns ``(alpha_s, beta_Bps)``.

    A linear least-squares fit of ``t`` against ``nbytes`` (intercept ``alpha``, slope ``1 / beta``). With
    ``relative=True`` (the default) each residual is divided by its measured time: a sweep from 8 B to 1 GiB
    spans several decades of time, and plain residuals would let the largest messages decide everything, leaving
    ``alpha`` (microseconds) lost in their rounding. ``beta`` is ``inf`` when the fitted slope is not positive
    (the times do not grow with size: all latency); at least two distinct sizes are needed.
    """
    b = np.asarray(nbytes, dtype=np.float64).ravel()
    t = np.asarray(seconds, dtype=np.float64).ravel()
    if b.shape != t.shape:
        raise ValueError(f"nbytes and seconds differ in length: {b.size} and {t.size}")
    if np.unique(b).size < 2:
        raise ValueError("fit_alpha_beta needs at least two distinct message sizes")
    if not (np.all(np.isfinite(t)) and np.all(t > 0)):
        raise ValueError("times must be finite and positive")
    w = 1.0 / t if relative else np.ones_like(t)
    design = np.stack([np.ones_like(b), b], axis=1) * w[:, None]
    (alpha, slope), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    beta = 1.0 / slope if slope > 0 else math.inf
    return float(alpha), float(beta)


def alpha_beta_time(nbytes, alpha_s: float, beta_Bps: float):
    """The model's time for a message of ``nbytes``: ``alpha + nbytes / beta``."""
    return alpha_s + np.asarray(nbytes, dtype=np.float64) / beta_Bps
