"""Exercise-only ops of chapter 21 (collectives): the ring's schedule, one reduce-scatter step, bus bandwidth,
and the alpha-beta model of a link.

    ring_allreduce_schedule  out (n,L) = sum over ranks of x (n,L), on every rank: a ring all-reduce run by
                             a given simulator with the student's schedule (the schedule is what is graded)
    reduce_scatter_step      out (L,) = buf (L,) with the message msg (m,) added into chunk (r - s - 1) mod n
    collective_busbw         out (k,3) = bus bandwidth in GB/s of all-reduce, reduce-scatter, all-gather
    alpha_beta_predict       out (k,3) = alpha (us), beta (GB/s) from two timed messages, and a third's time

The references are written from the definitions, independently of ``kernels_src.dist.schedule``: the ring is
judged by its *result* (the float64 sum on every rank), so any correct schedule passes; chunks are
``np.array_split``'s; alpha and beta come from a 2x2 linear solve.
"""
from __future__ import annotations

import numpy as np

from ..registry import exercise_op, sprinkle


# ---------------------------------------------------------------------------------------- q1: the ring
def reference_ring(x):
    """float64 oracle: every rank ends with the sum over ranks."""
    return np.broadcast_to(x.sum(axis=0), x.shape).copy()


def make_inputs_ring(size, dtype, rng):
    n, L = size
    return (rng.uniform(-1.0, 1.0, (n, L)).astype(dtype),)


def ring_tol(size, dtype):
    """Two correct sums of n values in different orders differ by at most (n - 1) eps sum|x_i| (each of the
    n - 1 additions rounds once, by at most eps times the partial sum, itself at most sum|x_i|). Here |x| <= 1,
    so sum|x_i| <= n. A chunk that misses one rank's term is off by ~0.5."""
    n = size[0]
    eps = float(np.finfo(np.dtype(dtype)).eps)
    return 0.0, max(n - 1, 1) * eps * n


exercise_op("ring_allreduce_schedule", reference=reference_ring, make_inputs=make_inputs_ring, chapter=21,
            title="a ring all-reduce run with a given send/receive schedule", size_names=("n", "L"),
            kind="memory", output_names=("out",), tol=ring_tol, flops=lambda s: (s[0] - 1) * s[1],
            bytes=lambda s, b: 2 * s[0] * s[1] * b,
            # n = 1 (no steps), 2, 3; L not a multiple of n, and L < n (empty chunks)
            sizes={"check": [(1, 5), (2, 7), (3, 10), (4, 2)], "check_sim": [(3, 10)], "bench": [(4, 1024)]})


# ------------------------------------------------------------------------------- q2: one reduce-scatter step
def reference_rs_step(buf, msg, n, r, s):
    """float64 oracle: the chunk rank r receives at reduce-scatter step s is (r - s - 1) mod n of the
    np.array_split of its buffer into n pieces; the message is added there, the rest is copied."""
    out = np.array(buf, np.float64)
    c = (r - s - 1) % n
    idx = np.array_split(np.arange(buf.size), n)[c]
    out[idx] += msg
    return out


def make_inputs_rs_step(size, dtype, rng):
    L, n, r, s = size
    buf = rng.standard_normal(L).astype(dtype)
    c = (r - s - 1) % n
    m = len(np.array_split(np.arange(L), n)[c])
    return buf, rng.standard_normal(m).astype(dtype), int(n), int(r), int(s)


def make_edge_inputs_rs_step(size, dtype, rng):
    buf, msg, n, r, s = make_inputs_rs_step(size, dtype, rng)
    sprinkle(buf, rng, [np.nan, np.inf, -0.0, 0.0])
    sprinkle(msg, rng, [np.nan, -np.inf, 0.0])
    return buf, msg, n, r, s


exercise_op("reduce_scatter_step", reference=reference_rs_step, make_inputs=make_inputs_rs_step, chapter=21,
            edge_inputs=make_edge_inputs_rs_step,
            title="one reduce-scatter step: the received chunk added at its bounds", size_names=("L", "n", "r", "s"),
            kind="memory", output_names=("out",), tol=(1e-6, 1e-6), flops=lambda s: s[0] / s[1],
            bytes=lambda s, b: 3 * s[0] * b,
            # chunk indices 0 and >0, L % n != 0 (the first L % n chunks are one longer), L < n, n = 1
            sizes={"check": [(10, 3, 0, 0), (10, 3, 2, 0), (7, 4, 1, 1), (1, 1, 0, 0)],
                   "check_sim": [(10, 3, 2, 0)], "bench": [(1 << 20, 8, 3, 2)]})


# ------------------------------------------------------------------------------------ q3: bus bandwidth
BUS_FACTOR = {"all_reduce": lambda n: 2.0 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
              "all_gather": lambda n: (n - 1) / n}


def reference_busbw(n, nbytes, seconds):
    """float64 oracle, nccl-tests' definitions: algbw = size / time (GB/s, 1 GB = 1e9 bytes), busbw = algbw
    times the collective's factor (all-reduce 2(n-1)/n; reduce-scatter and all-gather (n-1)/n), ``size`` the
    whole vector (for all-gather the gathered result, for reduce-scatter the input)."""
    n = np.asarray(n, np.float64)
    algbw = np.asarray(nbytes, np.float64) / np.asarray(seconds, np.float64) / 1e9
    return np.stack([algbw * BUS_FACTOR[c](n) for c in ("all_reduce", "reduce_scatter", "all_gather")], axis=1)


def make_inputs_busbw(size, dtype, rng):
    (k,) = size
    n = rng.integers(1, 17, k).astype(np.int64)
    n[: min(k, 2)] = (2, 8)[: min(k, 2)]
    nbytes = (2 ** rng.integers(3, 31, k)).astype(np.int64) * rng.integers(1, 4, k)
    seconds = 10.0 ** rng.uniform(-6, -1, k)
    return n, nbytes, seconds


exercise_op("collective_busbw", reference=reference_busbw, make_inputs=make_inputs_busbw, chapter=21,
            title="bus bandwidth of all-reduce, reduce-scatter and all-gather from a measured time",
            size_names=("k",), kind="memory", output_names=("out",), tol=(1e-5, 0.0),
            flops=lambda s: 0, bytes=lambda s, b: 0,
            sizes={"check": [(1,), (5,)], "check_sim": [(5,)], "bench": [(5,)]})


# ----------------------------------------------------------------------------------- q4: alpha and beta
def reference_alpha_beta(b, t):
    """float64 oracle: t = alpha + b / beta through the first two (bytes, microseconds) points, solved as a 2x2
    linear system in (alpha, 1/beta); beta reported in GB/s (1e3 bytes per microsecond), and the third
    message's predicted time."""
    out = np.empty((b.shape[0], 3))
    for i in range(b.shape[0]):
        a, inv = np.linalg.solve(np.array([[1.0, b[i, 0]], [1.0, b[i, 1]]]), t[i, :2])
        out[i] = a, 1.0 / inv / 1e3, a + b[i, 2] * inv
    return out


def make_inputs_alpha_beta(size, dtype, rng):
    (k,) = size
    alpha = rng.uniform(1.0, 30.0, k)  # us
    beta = rng.uniform(10.0, 900.0, k)  # GB/s
    b = np.empty((k, 3))
    for i in range(k):
        b[i] = rng.choice(2 ** np.arange(3, 31), 3, replace=False) * rng.integers(1, 4)  # three distinct sizes
    t = alpha[:, None] + b[:, :2] / (beta[:, None] * 1e3)
    return b, t


exercise_op("alpha_beta_predict", reference=reference_alpha_beta, make_inputs=make_inputs_alpha_beta, chapter=21,
            title="alpha and beta of a link from two timed messages, and a third message's time",
            size_names=("k",), kind="memory", output_names=("out",), tol=(1e-5, 1e-6),
            flops=lambda s: 0, bytes=lambda s, b: 0,
            sizes={"check": [(1,), (4,)], "check_sim": [(4,)], "bench": [(4,)]})
