"""The shared-memory race detector (kernels_src.grading.racecheck) on the kernels it must catch.

Tiled GEMM missing either barrier, a tree reduction missing its barrier, a barrier not reached by every
thread: each must be reported every time, whatever order the simulator happens to run the threads in,
and the correct kernels must come out clean. Every case runs with both of the detector's engines: the
simulator's OS threads (the grader's) and greenlets (tests/test_registry.py's race test of every GPU variant).
"""
import importlib.util

import numpy as np
import pytest

import kernels_src
from kernels_src.device import cuda
from numba import float32

from kernels_src.grading.racecheck import racecheck as _racecheck

pytestmark = pytest.mark.skipif(not kernels_src.device.SIMULATED, reason="the race detector instruments the simulator")

TILE = 4
REPEATS = 3  # the verdict must not depend on the thread schedule
ENGINES = ["threads"] + (["greenlets"] if importlib.util.find_spec("greenlet") is not None else [])


@pytest.fixture(params=ENGINES)
def engine(request):
    return request.param


def racecheck(kernel, griddim, blockdim, *args, engine):
    return _racecheck(kernel, griddim, blockdim, *args, engine=engine)


def _gemm(first_barrier: bool, second_barrier: bool):
    @cuda.jit
    def gemm_tiled(C, A, B):
        sA = cuda.shared.array((TILE, TILE), float32)
        sB = cuda.shared.array((TILE, TILE), float32)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        row = cuda.blockIdx.y * TILE + ty
        col = cuda.blockIdx.x * TILE + tx
        M, K = A.shape
        N = B.shape[1]
        acc = float32(0.0)
        for t in range((K + TILE - 1) // TILE):
            k = t * TILE
            sA[ty, tx] = A[row, k + tx] if row < M and k + tx < K else float32(0.0)
            sB[ty, tx] = B[k + ty, col] if k + ty < K and col < N else float32(0.0)
            if first_barrier:
                cuda.syncthreads()
            for j in range(TILE):
                acc += sA[ty, j] * sB[j, tx]
            if second_barrier:
                cuda.syncthreads()
        if row < M and col < N:
            C[row, col] = acc

    return gemm_tiled


def _gemm_args(rng, M=6, N=5, K=9):  # K spans 3 tiles, so the second barrier matters
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    C = np.zeros((M, N), np.float32)
    grid = ((N + TILE - 1) // TILE, (M + TILE - 1) // TILE)
    return grid, (TILE, TILE), C, A, B


def test_tiled_gemm_correct_is_clean_and_right(engine):
    rng = np.random.default_rng(0)
    grid, block, C, A, B = _gemm_args(rng)
    rep = racecheck(_gemm(True, True), grid, block, C, A, B, engine=engine)
    assert rep.ok, str(rep)
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("first,second,kind", [(False, True, "read-after-write"), (True, False, "write-after-read")])
def test_tiled_gemm_missing_a_barrier_is_always_caught(first, second, kind, engine):
    kernel = _gemm(first, second)
    for seed in range(REPEATS):
        grid, block, C, A, B = _gemm_args(np.random.default_rng(seed))
        rep = racecheck(kernel, grid, block, C, A, B, engine=engine)
        assert not rep.ok
        text = str(rep)
        assert rep.races and all(r.array in ("sA", "sB") for r in rep.races), text
        # the two accesses are by different threads, and the report names the array, index and lines
        r = rep.races[0]
        assert r.first.thread != r.second.thread
        assert "shared array `s" in text and "thread (" in text and "line" in text
        if not first:  # loads then reads in one interval: the reads race with other threads' stores
            assert any(x.kind in ("RAW", "WAR") for x in rep.races)
        else:  # next tile's stores race with this tile's reads
            assert any(x.kind == "WAR" or x.kind == "RAW" for x in rep.races)


BLOCK = 32


def _reduction(loop_barrier: bool, load_barrier: bool = True):
    @cuda.jit
    def tree_sum(out, x):
        s = cuda.shared.array(BLOCK, float32)
        t = cuda.threadIdx.x
        i = cuda.grid(1)
        s[t] = x[i] if i < x.size else float32(0.0)
        if load_barrier:
            cuda.syncthreads()
        stride = BLOCK // 2
        while stride > 0:
            if t < stride:
                s[t] += s[t + stride]
            if loop_barrier:
                cuda.syncthreads()
            stride //= 2
        if t == 0:
            out[cuda.blockIdx.x] = s[0]

    return tree_sum


def test_tree_reduction_correct_is_clean(engine):
    x = np.random.default_rng(1).standard_normal(70).astype(np.float32)
    out = np.zeros(3, np.float32)
    rep = racecheck(_reduction(True), 3, BLOCK, out, x, engine=engine)
    assert rep.ok, str(rep)
    np.testing.assert_allclose(out, np.add.reduceat(x.astype(np.float64), [0, 32, 64]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("loop_barrier,load_barrier", [(False, True), (True, False)])
def test_tree_reduction_missing_barrier_is_always_caught(loop_barrier, load_barrier, engine):
    kernel = _reduction(loop_barrier, load_barrier)
    for seed in range(REPEATS):
        x = np.random.default_rng(seed).standard_normal(40).astype(np.float32)
        rep = racecheck(kernel, 2, BLOCK, np.zeros(2, np.float32), x, engine=engine)
        assert rep.races, f"missed the race (seed {seed})"
        assert rep.races[0].array == "s"
        assert "s[t] += s[t + stride]" in str(rep)


@cuda.jit
def early_return(out, x):
    s = cuda.shared.array(BLOCK, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    if i >= x.size:
        return
    s[t] = x[i]
    cuda.syncthreads()
    if t == 0:
        out[cuda.blockIdx.x] = s[0]


@cuda.jit
def barrier_in_branch(out, x):
    t = cuda.threadIdx.x
    if t < 16:
        cuda.syncthreads()
    else:
        cuda.syncthreads()
    out[0] = x[0]


def test_barrier_not_reached_by_every_thread(engine):
    x = np.ones(40, np.float32)
    rep = racecheck(early_return, 2, BLOCK, np.zeros(2, np.float32), x, engine=engine)
    assert rep.barrier_problems and not rep.ok
    p = rep.barrier_problems[0]
    assert p.kind == "divergent" and p.reached == 8 and p.total == BLOCK and p.block == (1, 0, 0)
    assert "reached by only 8 of the 32 threads" in str(rep)


def test_threads_waiting_at_different_barriers(engine):
    rep = racecheck(barrier_in_branch, 1, BLOCK, np.zeros(1, np.float32), np.ones(1, np.float32), engine=engine)
    assert any(p.kind == "mismatched" for p in rep.barrier_problems), str(rep)


@cuda.jit
def atomic_block_sum(out, x):
    s = cuda.shared.array(1, float32)
    if cuda.threadIdx.x == 0:
        s[0] = 0
    cuda.syncthreads()
    cuda.atomic.add(s, 0, x[cuda.grid(1)])
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        out[cuda.blockIdx.x] = s[0]


@cuda.jit
def atomic_then_plain_read(out, x):
    s = cuda.shared.array(1, float32)
    if cuda.threadIdx.x == 0:
        s[0] = 0
    cuda.syncthreads()
    cuda.atomic.add(s, 0, x[cuda.grid(1)])
    out[cuda.grid(1)] = s[0]  # reads while other threads still add: no barrier


def test_atomics_do_not_race_with_each_other_but_do_with_plain_reads(engine):
    x = np.ones(64, np.float32)
    out = np.zeros(2, np.float32)
    assert racecheck(atomic_block_sum, 2, BLOCK, out, x, engine=engine).ok
    assert out.tolist() == [32.0, 32.0]
    rep = racecheck(atomic_then_plain_read, 2, BLOCK, np.zeros(64, np.float32), x, engine=engine)
    assert any(r.kind == "ATOMIC" for r in rep.races), str(rep)


def test_launches_are_recorded_with_types(engine):
    rep = racecheck(early_return, 1, BLOCK, np.zeros(1, np.float32), np.ones(3, np.float32), engine=engine)
    (la,) = rep.launches
    assert la.kernel == "early_return" and la.grid == (1, 1, 1) and la.block == (BLOCK, 1, 1)
    assert la.argtypes == ["float32[::1]", "float32[::1]"]


def test_simulator_is_restored_after_racecheck(engine):
    from numba.cuda.simulator import kernel as skernel
    from numba.cuda.simulator import kernelapi

    def state():
        return (skernel.BlockManager.run, kernelapi.FakeCUDAShared.array, skernel.FakeCUDAKernel.__call__,
                skernel.BlockThread.syncthreads, kernelapi.threading)

    before = state()
    racecheck(atomic_block_sum, 1, BLOCK, np.zeros(1, np.float32), np.ones(32, np.float32), engine=engine)
    assert before == state()


def test_an_unknown_engine_is_refused():
    with pytest.raises(ValueError, match="engine"):
        _racecheck(atomic_block_sum, 1, BLOCK, np.zeros(1, np.float32), np.ones(32, np.float32), engine="fibres")
