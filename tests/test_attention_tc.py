"""attention_f16 / attention_bf16 (kernels_src.ops.attention_tc): the tolerance derived from the formats can both
pass the rounding the kernel does and fail the mistakes a kernel makes; the tensor-core kernel against the float64
reference on shapes that cross tiles (several key tiles, partial query and key tiles, causal with S != T, a head
size that is zero-padded), in the simulator or on the GPU. The generic registry tests check the op's check sizes."""
import numpy as np
import pytest

from kernels_src import device, parity
from kernels_src.ops import attention_tc as at
from kernels_src.ops.gemm_tc import bf16_bits, bf16_values, decode
from kernels_src.registry import get_op, get_variant

needs_kernels = pytest.mark.skipif(device.MODE not in ("gpu", "sim"), reason="needs a GPU or the CUDA simulator")


def _round(x, fmt):
    """float64 values rounded to the format (nearest even), as float64."""
    if fmt == "f16":
        return np.asarray(x, np.float64).astype(np.float16).astype(np.float64)
    return bf16_values(bf16_bits(np.asarray(x, np.float32))).astype(np.float64)


def _flash_model(q, k, v, causal, fmt, drop_last=0):
    """What the kernel computes, in float64 except for P rounded to the format before P V and O rounded at the end
    (``drop_last``: a kernel that forgets the last ``drop_last`` keys)."""
    q, k, v = decode(q), decode(k), decode(v)
    S, T, D = q.shape[2], k.shape[2], q.shape[3]
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
    vis = np.ones((S, T), bool)
    if causal:
        vis = np.arange(T)[None, :] <= np.arange(S)[:, None] + (T - S)
    if drop_last:
        vis[:, T - drop_last:] = False
    s = np.where(vis, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    l = p.sum(axis=-1, keepdims=True)
    o = (_round(p, fmt) @ v) / np.where(l > 0, l, 1.0)
    return _round(o, fmt)


def _passes(got, ref, size, fmt):
    rtol, atol = at.tc_attention_tol(fmt)(size, "float32")
    return bool(np.all(np.abs(got - ref) <= atol + rtol * np.abs(ref)))


@pytest.mark.parametrize("fmt", ["f16", "bf16"])
def test_the_tolerance_passes_the_formats_rounding(fmt):
    """P and O rounded to the format (what the kernel does on top of float32 arithmetic) stay inside the tolerance,
    with room: the observed error is a fraction of it."""
    rng = np.random.default_rng(0)
    for size in [(1, 2, 37, 37, 64, 1), (2, 1, 5, 300, 32, 0), (1, 1, 130, 130, 128, 1)]:
        q, k, v, causal = get_op(at.OPS[fmt]).make_inputs(size, "float32", rng)
        ref = at.reference(q, k, v, causal)
        got = _flash_model(q, k, v, causal, fmt)
        assert _passes(got, ref, size, fmt), size
        rtol, atol = at.tc_attention_tol(fmt)(size, "float32")
        assert np.max(np.abs(got - ref) / (atol + rtol * np.abs(ref))) < 0.5


@pytest.mark.parametrize("fmt", ["f16", "bf16"])
def test_the_tolerance_fails_a_dropped_key_tile(fmt):
    """A kernel that skips the last partial key tile (here 6 of 70 keys) fails, in both formats."""
    rng = np.random.default_rng(1)
    size = (1, 2, 70, 70, 64, 0)
    q, k, v, causal = get_op(at.OPS[fmt]).make_inputs(size, "float32", rng)
    ref = at.reference(q, k, v, causal)
    assert not _passes(_flash_model(q, k, v, causal, fmt, drop_last=6), ref, size, fmt)


def test_padded_words():
    assert [at.padded_words(d) for d in (1, 16, 32, 33, 64, 80, 128)] == [16, 16, 16, 32, 32, 48, 64]


@needs_kernels
@pytest.mark.parametrize("fmt", ["f16", "bf16"])
def test_the_kernel_across_tiles(fmt):
    """Two key tiles (the second partial), causal with T > S (the diagonal inside a tile), D = 20 padded to 32;
    on a GPU also two query blocks, D = 128, and every rung."""
    op = get_op(at.OPS[fmt])
    sizes = [(1, 1, 17, 70, 20, 1)] if device.SIMULATED else [(1, 1, 17, 70, 20, 1), (2, 3, 131, 200, 128, 1),
                                                              (1, 2, 100, 65, 64, 0)]
    names = ["mma_smem"] if device.SIMULATED else [v.name for v in op.variants if v.backend == "gpu" and not v.baseline]
    for name in names:
        v = get_variant(f"{at.OPS[fmt]}/gpu/{name}")
        for size in sizes:
            rep = parity.check_variant(v, op, size, "float32", seed=3)
            assert rep.ok, str(rep)


@needs_kernels
@pytest.mark.parametrize("fmt", ["f16", "bf16"])
def test_the_swizzled_double_buffered_staging(fmt):
    """Rungs 3-4's staging (swizzled unpadded rows, conflict-free V transposes, two buffers), run with the
    shared-memory reductions so that the simulator can run it: three key tiles (the last partial), D = 64 (the
    swizzled K rows) and D = 20 (padded to 32 values: K rows of 16 words, not swizzled); rung 5's 8 warps and
    rung 6's exponent (ex2). In the simulator each launch also goes through the race detector (blocks' threads
    as greenlets: its verdict does not depend on the schedule), so the staging is race-free as well as right."""
    import contextlib

    if device.SIMULATED:
        from kernels_src.grading.racecheck import instrumented

        checked = instrumented(engine="greenlets")
    else:
        checked = contextlib.nullcontext()
    rng = np.random.default_rng(4)
    op = get_op(at.OPS[fmt])
    cases = [((1, 1, 5, 150, 64, 1), 4, False), ((1, 1, 3, 70, 20, 0), 4, True), ((1, 1, 2, 70, 64, 1), 8, True)]
    with checked as session:
        for size, nw, ex2 in cases if fmt == "bf16" else cases[:2]:  # the layouts once, in bf16
            _staging_case(fmt, op, rng, size, nw, ex2)
    if session is not None:
        races = session.report()
        staged = [la for la in races.launches if la.kernel == "make_kernel.<locals>.kernel"]
        assert len(staged) == (3 if fmt == "bf16" else 2) and races.ok, str(races)


def _staging_case(fmt, op, rng, size, nw, ex2):
    import math

    from kernels_src.compiler import cuda

    q, k, v, causal = op.make_inputs(size, "float32", rng)
    B, H, S, T, D, _ = size
    DW = at.padded_words(D)
    kern = at.make_kernel(fmt, DW, False, True, True, nw, ex2)
    o = cuda.to_device(np.full((B * H * S, D), 0x7E5D, np.uint16))  # poisoned (a NaN in both formats)
    kern[(1, B * H), kern.threads](o, at.as_words(cuda.to_device(q), DW), at.as_words(cuda.to_device(k), DW),
                                   at.as_words(cuda.to_device(v), DW), S, T, causal, np.float32(1 / math.sqrt(D)))
    bits = o.copy_to_host().reshape(B, H, S, D)
    got = decode(bits) if fmt == "bf16" else bits.view(np.float16).astype(np.float64)
    assert _passes(got, at.reference(q, k, v, causal), size, fmt), size
