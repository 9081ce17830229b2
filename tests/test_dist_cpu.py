"""CPU ranks (kernels_src.dist.comm): every collective against NumPy on real processes, and every way a launch
can go wrong ends it with a CollectiveError naming the rank, quickly, with no process or shared memory left.

Few launches (each starts n interpreters): one launch per rank count runs every collective at several sizes."""
import multiprocessing as mp
import os
import time

import numpy as np
import pytest

from kernels_src.dist.comm import CollectiveError, launch
from kernels_src.dist.schedule import allclose_sum, chunk_bounds

SIZES = (1, 2, 7, 1000, 5, 10007)  # one element, fewer elements than ranks, primes; the buffers grow and shrink
DTYPES = ("float32", "float64")
ALGOS = ("ring", "oneshot")


def inputs(n, L, dtype, seed):
    """Every rank's vector, rebuilt identically in the parent and in every rank."""
    x = np.random.default_rng(seed).uniform(-1, 1, (n, L)).astype(dtype)
    if L >= 3:
        x[n - 1, 1] = np.nan  # a NaN on the last rank only: NaN everywhere, sum and max
        x[0, 2] = np.inf
    return x


def every_collective(comm):
    n, r = comm.size, comm.rank
    out = {"env": (os.environ.get("RANK"), os.environ.get("WORLD_SIZE"), os.environ.get("NCCL_NVLS_ENABLE"))}
    for seed, L in enumerate(SIZES):
        for dtype in DTYPES:
            xs = inputs(n, L, dtype, seed)
            lo, hi = chunk_bounds(L, n, r)
            for algo in ALGOS:
                k = (L, dtype, algo)
                out[("sum",) + k] = comm.all_reduce(xs[r].copy(), algorithm=algo)
                out[("max",) + k] = comm.all_reduce(xs[r].copy(), op="max", algorithm=algo)
                out[("rs",) + k] = comm.reduce_scatter(xs[r].copy(), algorithm=algo)
                out[("ag",) + k] = comm.all_gather(xs[r, lo:hi].copy(), L, algorithm=algo)
                out[("bc",) + k] = comm.broadcast(xs[r].copy(), root=n - 1, algorithm=algo)
    x2 = np.arange(6.0).reshape(2, 3) + r  # 2-D arrays reduce in place too
    out["2d"] = comm.all_reduce(x2)
    comm.barrier()
    return out


@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_collective_against_numpy(n):
    results = launch(every_collective, n, timeout=30)
    assert len(results) == n
    for r, out in enumerate(results):
        assert out["env"] == (str(r), str(n), "0")
        np.testing.assert_array_equal(out["2d"], sum(np.arange(6.0).reshape(2, 3) + k for k in range(n)))
        for seed, L in enumerate(SIZES):
            for dtype in DTYPES:
                xs = inputs(n, L, dtype, seed)
                x64 = xs.astype(np.float64)
                with np.errstate(invalid="ignore"):
                    total, abs_sum, mx = x64.sum(0), np.abs(x64).sum(0), x64.max(0)
                lo, hi = chunk_bounds(L, n, r)
                gathered = np.concatenate([xs[k, slice(*chunk_bounds(L, n, k))] for k in range(n)])
                for algo in ALGOS:
                    k = (L, dtype, algo)
                    got = out[("sum",) + k]
                    assert got.dtype == np.dtype(dtype) and got.shape == (L,)
                    assert allclose_sum(got, total, abs_sum, n, dtype).all(), k
                    if L >= 3:
                        assert np.isnan(got[1]) and np.isnan(out[("max",) + k][1])
                    np.testing.assert_array_equal(out[("max",) + k], mx.astype(dtype))
                    rs = out[("rs",) + k]
                    assert rs.shape == (hi - lo,)
                    assert allclose_sum(rs, total[lo:hi], abs_sum[lo:hi], n, dtype).all(), k
                    np.testing.assert_array_equal(out[("ag",) + k], gathered)
                    np.testing.assert_array_equal(out[("bc",) + k], xs[n - 1])


def _no_leftovers():
    assert mp.active_children() == []
    prefix = f"kc{os.getpid()}_"
    if os.path.isdir("/dev/shm"):
        assert not [f for f in os.listdir("/dev/shm") if f.startswith(prefix)]


def misbehave(comm, how):
    if comm.rank == 1:
        if how == "raise":
            raise ValueError("rank one gives up")
        if how == "exit":
            os._exit(7)
        if how == "hang":
            time.sleep(600)
        if how == "early":
            return "gone"
    x = np.ones(5)
    comm.all_reduce(x)
    comm.all_reduce(x)
    return x


@pytest.mark.parametrize("how,expect", [("raise", r"rank 1 raised ValueError: rank one gives up"),
                                        ("exit", r"rank 1 died: it exited with code 7"),
                                        ("hang", r"rank 1 did not answer within 2 s"),
                                        ("early", r"rank 1 did not answer within 2 s")])
def test_a_failing_rank_ends_the_launch_naming_it(how, expect):
    t0 = time.monotonic()
    with pytest.raises(CollectiveError, match=expect):
        launch(misbehave, 3 if how == "hang" else 2, how, timeout=2.0)
    assert time.monotonic() - t0 < 40  # start-up of the interpreters + the 2 s timeout, never a hang
    _no_leftovers()


def disagree(comm):
    r = comm.rank
    msgs = []
    for make in (lambda: np.zeros(5 + r, np.float32),  # lengths differ
                 lambda: np.zeros(5, np.float32 if r == 0 else np.float64),  # dtypes differ
                 lambda: np.zeros(5, np.int32)):  # nobody can reduce int32
        try:
            comm.all_reduce(make())
            msgs.append(None)
        except CollectiveError as e:
            msgs.append(str(e))
    try:
        comm.all_gather(np.zeros(4), 7)  # the chunk of 7 over 2 ranks is 4 and 3 elements
        msgs.append(None)
    except CollectiveError as e:
        msgs.append(str(e))
    x = np.full(3, r + 1.0)  # after the errors the ranks still work together
    msgs.append(comm.all_reduce(x).tolist())
    return msgs


def test_ranks_that_disagree_all_get_a_clear_error():
    results = launch(disagree, 2, timeout=20)
    for msgs in results:
        size_msg, dtype_msg, int_msg, chunk_msg, after = msgs
        assert "rank 0: all_reduce of float32 (5,)" in size_msg and "rank 1: all_reduce of float32 (6,)" in size_msg
        assert "float32 (5,)" in dtype_msg and "float64 (5,)" in dtype_msg
        assert "only contiguous float32 and float64" in int_msg
        assert "from a chunk (4,) where chunk 1 has (3,)" in chunk_msg
        assert after == [3.0, 3.0, 3.0]
    assert results[0] == results[1]
    _no_leftovers()


def test_launch_rejects_bad_arguments():
    with pytest.raises(ValueError):
        launch(disagree, 0)
