"""The compiler door's streaming (non-temporal) stores and the rungs built on them (issue 36).

- ``vstream16`` + ``sfence`` copy exactly what a plain copy gives, for lengths 1, primes, non-multiples of 16 and
  views at every offset into a 64-byte line (the head up to the first aligned line and the tail take ordinary
  stores; the output is poisoned with NaN first, so an element nothing wrote cannot pass);
- ``stream_head`` finds the first index where every array starts a line, or says -1 when they disagree;
- the rungs give rung 2's results bit for bit (same operations, same order) also on views whose outputs share no
  alignment (then ordinary stores throughout), and the 16 x 16 transpose blocks stream where Y's lines allow it;
- the rungs' machine code has ``vmovntps`` (``%zmm`` where the CPU has AVX-512) and an ``sfence``.
"""
import platform
import re

import numpy as np
import pytest

import kernels_src.ops  # noqa: F401  (registers every op)
from kernels_src.compiler import njit, prange, sfence, stream_head, vload16, vstore16, vstream16, zmm_kernels
from kernels_src.registry import get_op, get_variant

X86 = platform.machine() in ("x86_64", "AMD64")
pytestmark = pytest.mark.skipif(not X86, reason="non-temporal stores are x86 instructions (vmovntps, sfence)")


def _copy_stream_py(out, x, head, nch):
    n = x.size
    h = min(max(head, 0), n)
    nb = (n - h) // 16
    for i in range(h):
        out[i] = x[i]
    for i in range(h + nb * 16, n):
        out[i] = x[i]
    for c in prange(nch):
        for b in range(c * nb // nch, (c + 1) * nb // nch):
            i = h + 16 * b
            if head >= 0:
                vstream16(out, i, vload16(x, i))
            else:
                vstore16(out, i, vload16(x, i))
        if head >= 0:
            sfence()


_copy_stream = njit(parallel=True)(_copy_stream_py)


def _placed(n, off, rng):
    """A float32 view of n elements starting ``off`` floats after a 64-byte line."""
    buf = np.empty(n + 32, np.float32)
    s = (-(buf.ctypes.data // 4)) % 16 + off
    return buf[s:s + n]


@pytest.mark.parametrize("n", [1, 2, 13, 16, 17, 31, 97, 1021, 4099, 65537])
def test_vstream16_copies_exactly(n):
    rng = np.random.default_rng(n)
    for ox in (0, 5):
        for oy in range(0, 16, 3):
            x = _placed(n, ox, rng)
            x[:] = rng.standard_normal(n)
            y = _placed(n, oy, rng)
            y[:] = np.nan
            head = stream_head(y)
            assert head == (16 - oy) % 16
            _copy_stream(y, x, head, 2)
            assert np.array_equal(y.view(np.int32), x.view(np.int32)), (n, ox, oy)


def test_stream_head():
    buf = np.empty(256, np.float32)
    a = _placed(64, 0, None)
    assert stream_head(a) == 0 and stream_head(a[3:]) == 13 and stream_head(a[16:], a) == 0
    assert stream_head(a[1:], a[2:]) == -1  # no common alignment: ordinary stores
    assert stream_head(buf.view(np.uint8)[1:61].view(np.float32)) == -1  # not even 4-byte aligned


def _inputs(name, size, seed=5):
    op = get_op(name)
    inputs = op.make_inputs(size, np.dtype("float32"), np.random.default_rng(seed))
    return op, inputs if isinstance(inputs, tuple) else (inputs,)


@pytest.mark.parametrize("name", ["adamw", "adam", "adamw_clip", "sgd_momentum", "adam_first_update"])
@pytest.mark.parametrize("n", [1, 17, 1021, 65537])
@pytest.mark.parametrize("offsets", [(0, 0, 0), (3, 3, 3), (1, 6, 11)])
def test_stream_rungs_match_rung2_bits_on_any_placement(name, n, offsets):
    op, inputs = _inputs(name, (n, 1) if name == "sgd_momentum" else (n,))
    ref = op.reference(*inputs)
    ref = ref if isinstance(ref, tuple) else (ref,)
    rng = np.random.default_rng(0)
    new = [_placed(n, offsets[j % 3], rng) for j in range(len(ref))]
    for o in new:
        o[:] = np.nan
    old = [np.full(n, np.nan, np.float32) for _ in ref]
    get_variant(f"{name}/cpu/stream").fn(*new, *inputs)
    get_variant(f"{name}/cpu/prange").fn(*old, *inputs)
    for a, b, r in zip(new, old, ref):
        assert not np.isnan(a).any()
        if name in ("sgd_momentum", "adam_first_update"):  # float32 lanes where rung 2 computes in float64
            np.testing.assert_allclose(a, r, rtol=op.tol[0], atol=op.tol[1])
        else:
            assert np.array_equal(a.view(np.int32), b.view(np.int32)), (name, n, offsets)


def test_transpose_stream_any_placement():
    from kernels_src.ops import embedding as E

    def placed(shape, off):
        n = int(np.prod(shape))
        buf = np.empty(n + 64, np.float32)
        s = (-(buf.ctypes.data // 4)) % 16 + off
        return buf[s:s + n].reshape(shape)

    rng = np.random.default_rng(16)
    for shape in [(80, 96), (96, 80), (64, 64), (48, 17), (16, 16), (33, 32), (1, 16), (160, 48)]:
        for ox in range(0, 16, 5):
            for oy in (0, 4, 7):
                X = placed(shape, ox)
                X[:] = rng.standard_normal(shape)
                Y = placed(shape[::-1], oy)
                Y[:] = np.nan
                E.transpose_stream(Y, X)
                assert np.array_equal(Y, X.T), (shape, ox, oy)


def _asm(dispatcher_py, *args, parallel=False):
    """Machine code of a fresh (uncached) compile of ``dispatcher_py``, run once on ``args``. Serial by default: the
    prange loop becomes a plain loop with the same body, so the stores it compiles to are the same, and the compile
    takes a few seconds instead of the parallel pipeline's ten or more (the suite's time is a budget)."""
    fresh = njit(parallel=parallel)(dispatcher_py)
    fresh(*args)
    return "\n".join(fresh.inspect_asm().values())


def test_rungs_compile_to_streaming_stores():
    from kernels_src.ops import embedding as E
    from kernels_src.ops import optim

    n = 4099
    rng = np.random.default_rng(1)
    p, g, m = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    v = np.abs(rng.standard_normal(n)).astype(np.float32)
    outs = [np.empty_like(p) for _ in range(3)]
    co = optim._adam_coeffs(3, 1e-3, 0.9, 0.999, 1e-8, 0.01)
    adam = _asm(optim._adam_stream.py_func, *outs, p, g, m, v, np.float32(1), *co, stream_head(*outs), 2)
    X = _placed(64 * 64, 0, rng).reshape(64, 64)  # both start a line: every block row of Y does
    X[:] = rng.standard_normal((64, 64))
    Y = _placed(64 * 64, 0, rng).reshape(64, 64)
    tr = _asm(E._transpose_stream.py_func, Y, X, 0, 0, True)
    assert np.array_equal(Y, X.T)
    ok, _ = zmm_kernels()
    reg = "zmm" if ok else "[yz]mm"  # AVX2: each 16-float store is two 32-byte ones
    for code, stores in ((adam, 3), (tr, 16)):
        nt = re.findall(rf"^\s+vmovntps\s+%({reg})\d+", code, re.M)
        assert len(nt) >= stores, nt
        assert re.search(r"^\s+sfence", code, re.M)


@pytest.mark.skipif(not zmm_kernels()[0], reason="needs AVX-512 (zmm_kernels): %zmm streaming stores")
def test_streaming_store_is_one_zmm_instruction():
    code = _asm(_copy_stream_py, np.empty(64, np.float32), np.ones(64, np.float32), 0, 1)
    assert re.search(r"^\s+vmovntps\s+%zmm\d+", code, re.M)
