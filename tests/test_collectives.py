"""The arithmetic of collectives (kernels_src.dist.schedule) checked from its definitions, and the registered
collective ops' tolerance shown to bite. The ops themselves are checked against the float64 reference by
tests/test_registry.py (every variant, awkward sizes, edge values)."""
import math

import numpy as np
import pytest

from kernels_src import get_op
from kernels_src.dist import schedule
from kernels_src.dist.schedule import (algbw, allclose_sum, busbw, chunk_bounds, fit_alpha_beta, ring_steps,
                                       sum_tolerance)
from kernels_src.ops import collectives
from kernels_src import parity
from kernels_src.registry import Variant


# ------------------------------------------------------------------------------------------ chunks
@pytest.mark.parametrize("length", [0, 1, 2, 7, 10, 97, 1000])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_chunk_bounds_is_array_split(length, n):
    parts = np.array_split(np.arange(length), n)
    for r in range(n):
        lo, hi = chunk_bounds(length, n, r)
        assert list(range(lo, hi)) == parts[r].tolist()


def test_chunk_bounds_rejects_bad_arguments():
    for args in [(5, 0, 0), (5, 2, 2), (5, 2, -1), (-1, 2, 0)]:
        with pytest.raises(ValueError):
            chunk_bounds(*args)


# ------------------------------------------------------------------------------------------ the ring
def simulate_ring(x):
    """Message passing in plain NumPy: at each step every rank sends from its state at the start of the step
    (a snapshot), then every rank applies what it received. Returns the ranks' final vectors and the chunk each
    rank held complete after the reduce-scatter phase."""
    n, L = x.shape
    bufs = x.copy()
    steps = ring_steps(n)
    owned = None
    for phase in ("reduce_scatter", "all_gather"):
        for s in range(n - 1):
            now = [t for t in steps if t[0] == phase and t[1] == s]
            assert sorted(t[2] for t in now) == list(range(n)), "every rank acts once per step"
            sent = {t[2]: t[3] for t in now}
            snap = bufs.copy()
            for _, _, r, _send, recv in now:
                left = (r - 1) % n
                assert sent[left] == recv, f"rank {r} expects chunk {recv}, rank {left} sends {sent[left]}"
                lo, hi = chunk_bounds(L, n, recv)
                if phase == "reduce_scatter":
                    bufs[r, lo:hi] += snap[left, lo:hi]
                else:
                    bufs[r, lo:hi] = snap[left, lo:hi]
        if phase == "reduce_scatter":
            total = x.sum(0)
            owned = []
            for r in range(n):
                full = [c for c in range(n) if np.array_equal(bufs[r, slice(*chunk_bounds(L, n, c))],
                                                              total[slice(*chunk_bounds(L, n, c))])]
                owned.append(full)
    return bufs, owned


@pytest.mark.parametrize("n,L", [(1, 5), (2, 7), (3, 2), (3, 10), (4, 13), (5, 101), (8, 9), (8, 64)])
def test_ring_steps_all_reduce_random_data(n, L):
    rng = np.random.default_rng(n * 1000 + L)
    x = rng.integers(-1000, 1000, (n, L)).astype(np.float64)  # integers: every order sums exactly
    bufs, owned = simulate_ring(x)
    for r in range(n):
        np.testing.assert_array_equal(bufs[r], x.sum(0))
        if L >= n and n > 1:  # rank r holds the complete chunk (r + 1) % n after n - 1 steps
            assert (r + 1) % n in owned[r]


def test_ring_steps_counts_and_traffic():
    for n in range(1, 9):
        steps = ring_steps(n)
        assert len(steps) == 2 * (n - 1) * n
        for r in range(n):  # every rank sends 2(n-1) chunks: 2(n-1)/n of the vector
            assert sum(1 for t in steps if t[2] == r) == 2 * (n - 1)
        for phase in ("reduce_scatter", "all_gather"):  # each chunk leaves each rank at most once per phase
            for r in range(n):
                sends = [t[3] for t in steps if t[0] == phase and t[2] == r]
                assert len(set(sends)) == len(sends)


def test_ring_schedule_of_the_virtual_rank_ops_matches_ring_steps():
    """The ops' step tables are ring_steps (all-reduce) and ring_steps relabelled (reduce-scatter, all-gather)."""
    n = 5
    modes, recv = collectives.step_tables(n, "allreduce_sum")
    steps = ring_steps(n)
    assert recv.tolist() == [[t[4] for t in steps[k * n:(k + 1) * n]] for k in range(2 * (n - 1))]
    assert modes.tolist() == [collectives.SUM] * (n - 1) + [collectives.COPY] * (n - 1)


# ------------------------------------------------------------------------------------------ bandwidth
def test_algbw_and_busbw_from_the_definition():
    size, t = 2**30, 0.010  # 1 GiB in 10 ms
    alg = 2**30 / 0.010 / 1e9  # 107.37 GB/s
    assert algbw(size, t) == pytest.approx(alg, rel=1e-12)
    assert busbw(size, t, 8) == pytest.approx(alg * 2 * 7 / 8, rel=1e-12)  # 187.9 GB/s
    assert busbw(size, t, 2) == pytest.approx(alg, rel=1e-12)  # two ranks: each sends half, twice
    assert busbw(size, t, 8, "reduce_scatter") == pytest.approx(alg * 7 / 8, rel=1e-12)
    assert busbw(size, t, 8, "all_gather") == pytest.approx(alg * 7 / 8, rel=1e-12)
    assert busbw(size, t, 8, "broadcast") == pytest.approx(alg, rel=1e-12)
    assert busbw(size, t, 1) == 0.0  # one rank: nothing moves
    # a worked example in round numbers: 400 MB all-reduced over 4 ranks in 4 ms: algbw 100, busbw 150 GB/s
    assert algbw(400e6, 4e-3) == pytest.approx(100.0)
    assert busbw(400e6, 4e-3, 4) == pytest.approx(150.0)


def test_bandwidth_rejects_bad_input():
    with pytest.raises(ValueError):
        algbw(100, 0.0)
    with pytest.raises(ValueError):
        busbw(100, 1.0, 4, "alltoall")
    with pytest.raises(ValueError):
        busbw(100, 1.0, 0)


def test_fit_alpha_beta_recovers_known_link():
    alpha, beta = 8e-6, 150e9  # 8 us, 150 GB/s
    sizes = 2.0 ** np.arange(3, 31)
    t = alpha + sizes / beta
    a, b = fit_alpha_beta(sizes, t)
    assert a == pytest.approx(alpha, rel=1e-9) and b == pytest.approx(beta, rel=1e-9)
    a, b = fit_alpha_beta(sizes, t, relative=False)
    assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(beta, rel=1e-9)
    # 3 % multiplicative noise: still within 10 %
    rng = np.random.default_rng(0)
    a, b = fit_alpha_beta(sizes, t * (1 + 0.03 * rng.standard_normal(t.size)))
    assert a == pytest.approx(alpha, rel=0.1) and b == pytest.approx(beta, rel=0.1)
    # the model's time from the fit
    assert schedule.alpha_beta_time(1e9, alpha, beta) == pytest.approx(alpha + 1e9 / beta)


def test_fit_alpha_beta_edge_cases():
    a, b = fit_alpha_beta([8, 1024], [5e-6, 5e-6])  # flat: all latency
    assert a == pytest.approx(5e-6) and math.isinf(b)
    with pytest.raises(ValueError):
        fit_alpha_beta([8, 8], [1e-6, 2e-6])
    with pytest.raises(ValueError):
        fit_alpha_beta([8, 16], [1e-6, 0.0])


# ------------------------------------------------------------------------------------------ tolerance
def test_sum_tolerance_values():
    eps32, eps64 = float(np.finfo(np.float32).eps), float(np.finfo(np.float64).eps)
    assert sum_tolerance(1, "float32") == (eps32, 0.0)
    assert sum_tolerance(8, np.float32) == (eps32, 7 * eps32)
    assert sum_tolerance(3, "float64") == (eps64, 2 * eps64)


@pytest.mark.parametrize("n", [2, 3, 8, 64])
def test_sum_tolerance_holds_for_other_orders_and_is_not_vacuous(n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((n, 4096)) * 10.0 ** rng.integers(-3, 4, (n, 1))).astype(np.float32)
    exact = x.astype(np.float64).sum(0)
    abs_sum = np.abs(x.astype(np.float64)).sum(0)
    forward = np.zeros(x.shape[1], np.float32)
    for k in range(n):
        forward += x[k]
    backward = np.zeros(x.shape[1], np.float32)
    for k in reversed(range(n)):
        backward += x[k]
    assert allclose_sum(forward, exact, abs_sum, n, np.float32).all()
    assert allclose_sum(backward, forward, abs_sum, n, np.float32).all()
    # off by more than the bound: fails
    rtol, atol_factor = sum_tolerance(n, np.float32)
    bound = atol_factor * abs_sum + rtol * np.abs(exact)
    assert not allclose_sum(exact + 2.0 * bound + 1e-30, exact, abs_sum, n, np.float32).any()
    # a sum accumulated in float16 is far outside the float32 bound
    half = x.astype(np.float16).astype(np.float64).sum(0)
    assert not allclose_sum(half, exact, abs_sum, n, np.float32).all()
    # NaN never passes against a number; NaN against NaN and inf against the same inf do
    assert not allclose_sum(np.nan, 1.0, 1.0, n, np.float32)
    assert allclose_sum(np.nan, np.nan, 1.0, n, np.float32)
    assert allclose_sum(np.inf, np.inf, 1.0, n, np.float32)
    assert not allclose_sum(np.inf, -np.inf, 1.0, n, np.float32)


def _mutant(op, fn):
    return Variant(op=op, backend="cpu", name="mutant", fn=fn)


@pytest.mark.parametrize("size", [(3, 101), (8, 4099)])
def test_the_ops_tolerance_catches_wrong_sums(size):
    """The registered tolerance (from sum_tolerance) fails a sum that drops a rank, one accumulated in float16,
    one that adds a rank twice; and passes the honest float32 sum in reverse order."""
    op = get_op("allreduce_sum")

    def drop_last(out, x):
        out[:] = x[:-1].sum(0)

    def in_half(out, x):
        out[:] = x.astype(np.float16).sum(0, dtype=np.float16)

    def twice(out, x):
        out[:] = x.sum(0) + x[0]

    def reversed_order(out, x):
        acc = np.zeros(x.shape[1], x.dtype)
        for k in reversed(range(x.shape[0])):
            acc += x[k]
        out[:] = acc

    for bad in (drop_last, in_half, twice):
        rep = parity.check_variant(_mutant("allreduce_sum", bad), op, size, "float32")
        assert not rep.ok, bad.__name__
    assert parity.check_variant(_mutant("allreduce_sum", reversed_order), op, size, "float32").ok


def test_gather_inputs_hide_what_is_not_yours():
    """all_gather's and broadcast's inputs are NaN where a rank has nothing to send: a rung that reads there
    fails the check."""
    op = get_op("all_gather")

    def reads_rank0(out, x):
        out[:] = x[0]

    assert not parity.check_variant(_mutant("all_gather", reads_rank0), op, (3, 10), "float32").ok
    bop = get_op("broadcast")

    def reads_last(out, x):
        out[:] = x[-1]

    assert not parity.check_variant(_mutant("broadcast", reads_last), bop, (3, 10), "float32").ok
