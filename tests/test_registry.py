"""Every registered variant, against its float64 reference, on every size in its sweep.

These tests enumerate the registry, so a chapter that adds a kernel family is tested here with no
extra code: CPU variants at the op's ``check`` sizes, GPU variants in the simulator at ``check_sim``.

Against the reference, simulated GPU variants run each block's threads as greenlets
(:func:`kernels_src.simulator.threads_as_greenlets`): the same sizes, seeds and arithmetic in one schedule a GPU
may run, several times faster than one OS thread per CUDA thread. A race-free kernel's results do not depend on
the schedule, and whether a kernel is race-free is checked below with the race detector
(test_gpu_variant_has_no_shared_memory_race, every GPU variant at its largest simulated size). The detector's
verdict does not depend on the thread schedule, so it runs the blocks' threads as greenlets too (its engine
"greenlets", tested against the same faulty kernels as the grader's OS threads in tests/test_grading_race.py):
about 10x faster than one OS thread per CUDA thread.
"""
import contextlib
import importlib.util
import zlib

import numpy as np
import pytest

import kernels_src
from kernels_src import device, parity, simulator
from kernels_src.registry import get_op, ops, variants

HAS_GREENLET = importlib.util.find_spec("greenlet") is not None


def _engine(v):
    if v.backend != "gpu" or not device.SIMULATED or not HAS_GREENLET:
        return contextlib.nullcontext()
    return simulator.threads_as_greenlets()


def _cases():
    cases = []
    for v in variants():
        op = get_op(v.op)
        for size in parity.default_check_sizes(op, v.backend):
            for dt in v.dtypes:
                cases.append(pytest.param(v.key, tuple(size), dt, id=f"{v.key}-{op.size_label(size)}-{dt}"))
    return cases


@pytest.mark.parametrize("key,size,dtype", _cases())
def test_variant_matches_reference(key, size, dtype):
    v = kernels_src.get_variant(key)
    # a stable per-case seed (str hashes change between processes), so a failure can be reproduced
    seed = zlib.crc32(f"{key}{size}{dtype}".encode())
    with _engine(v):
        rep = parity.check_variant(v, get_op(v.op), size, dtype, seed=seed)
    if rep.skipped:
        pytest.skip(rep.skipped)
    assert rep.ok, str(rep)


def _edge_cases():
    """Every variant of every op that defines edge inputs, at one size per backend: the largest simulator
    size on the GPU (the simulator is slow), a mid-sized check size on the CPU."""
    from kernels_src.registry import find_edge_inputs

    cases = []
    for v in variants():
        op = get_op(v.op)
        if find_edge_inputs(op, module_fallback=False) is None:
            continue
        sizes = [tuple(s) for s in parity.default_check_sizes(op, v.backend)]
        size = max(sizes, key=lambda s: int(np.prod(s))) if v.backend == "gpu" else sizes[len(sizes) // 2]
        cases.append(pytest.param(v.key, size, id=f"{v.key}-{op.size_label(size)}-edge"))
    return cases


@pytest.mark.parametrize("key,size", _edge_cases())
def test_variant_matches_reference_on_edge_values(key, size):
    """NaN propagates, infinities and signed zeros come out as the float64 reference says (the course's
    rule for non-finite inputs, NumPy's and torch's)."""
    v = kernels_src.get_variant(key)
    if v.edge_exempt:
        pytest.skip(f"{key} is exempt: {v.edge_exempt}")
    with _engine(v):
        rep = parity.check_variant(v, get_op(v.op), size, "float32", seed=zlib.crc32(f"{key}{size}edge".encode()),
                                   edge=True)
    if rep.skipped:
        pytest.skip(rep.skipped)
    assert rep.ok, str(rep)


@pytest.mark.parametrize("name", [o.name for o in ops()])
def test_op_has_awkward_sizes(name):
    """Each op's check sweep includes a size with a 1 in it and a dimension that is a prime >= 7."""
    op = get_op(name)
    sizes = [tuple(s) for s in op.sizes["check"]]

    def is_prime(n):
        return n >= 2 and all(n % d for d in range(2, int(n**0.5) + 1))

    assert any(1 in s for s in sizes), f"{name}: no size with a dimension of 1 in {sizes}"
    assert any(is_prime(d) and d >= 7 for s in sizes for d in s), f"{name}: no prime dimension >= 7 in {sizes}"
    sim = [tuple(s) for s in op.sizes.get("check_sim", sizes)]
    assert any(1 in s for s in sim), f"{name}: check_sim has no size with a 1"


@pytest.mark.parametrize("name", [o.name for o in ops()])
def test_op_reference_is_float64(name):
    op = get_op(name)
    inputs = parity.as_tuple(op.make_inputs(tuple(op.sizes["check"][0]), np.dtype("float32"), np.random.default_rng(0)))
    for out in parity.reference_outputs(op, inputs):
        if np.issubdtype(out.dtype, np.floating):
            assert out.dtype == np.float64, f"{name}: reference returned {out.dtype}"


@pytest.mark.parametrize("key", [v.key for v in variants()])
def test_variant_is_documented_and_compilable(key):
    v = kernels_src.get_variant(key)
    assert v.summary, f"{key}: the docstring must say what this rung changes"
    if v.backend == "gpu" and not v.baseline:
        assert v.ptx, f"{key}: list its kernels with register(..., ptx=[(kernel, signature)])"


def test_registry_has_both_backends():
    backends = {v.backend for v in variants()}
    assert backends == {"cpu", "gpu"}


def test_simulated_gpu_variants_really_ran():
    """In CI the GPU variants must run (simulated), not be skipped wholesale."""
    assert device.GPU_VARIANTS_RUN or device.MODE == "cpu"


def _race_cases():
    cases = []
    for v in variants(backend="gpu", baselines=False):
        op = get_op(v.op)
        sizes = [tuple(s) for s in parity.default_check_sizes(op, "gpu")]
        # the largest simulated size: it spans several blocks/tiles, where barriers matter
        size = max(sizes, key=lambda s: int(np.prod(s)))
        cases.append(pytest.param(v.key, size, id=f"{v.key}-{op.size_label(size)}"))
    return cases


@pytest.mark.skipif(not device.SIMULATED, reason="the race detector instruments the CUDA simulator")
@pytest.mark.parametrize("key,size", _race_cases())
def test_gpu_variant_has_no_shared_memory_race(key, size):
    """The course's own kernels pass the race detector the grader applies to students' kernels: no
    unsynchronised shared-memory conflict between threads of a block, no barrier some threads skip."""
    from kernels_src.grading.racecheck import instrumented

    v = kernels_src.get_variant(key)
    if not v.available()[0]:
        pytest.skip(v.available()[1])
    with instrumented(engine="greenlets" if HAS_GREENLET else "threads") as session:
        rep = parity.check_variant(v, get_op(v.op), size, v.dtypes[0], seed=1)
    assert rep.ok, str(rep)
    races = session.report()
    assert races.ok, str(races)
