"""bias_gelu_dropout (chapter 16): dropout(gelu(x + b)) in one pass. Every course rung against the float64 reference
(chapter 6's bias_gelu reference, then chapter 16's dropout reference) at p = 0, p = 1 and on awkward shapes; the mask
is dropout's own (the same stream element for the same flat index); the scale is 1 / (1 - p); bad p is refused."""
import numpy as np
import pytest

from kernels_src import device, parity
from kernels_src.ops import activations as act
from kernels_src.ops import bias_gelu_dropout as B
from kernels_src.ops import philox as P
from kernels_src.registry import get_op, variants

OP = get_op("bias_gelu_dropout")
COURSE = [v for v in variants("bias_gelu_dropout") if not v.baseline]
SHAPES = [(1, 1), (1, 3), (3, 7), (5, 33), (3, 36), (2, 257)]


def _run(v, x, b, p, seed, offset):
    refs = (np.asarray(B.reference(x.astype(np.float64), b.astype(np.float64), p, seed, offset)),)
    outs = parity.empty_outputs(refs, "float32")
    (y,) = parity.run_variant(v, (x, b, p, seed, offset), outs)
    return y, refs[0]


def _inputs(shape, seed=0):
    rng = np.random.default_rng(seed)
    x, b = act.bias_gelu_make_inputs(shape, np.float32, rng)
    return x, b


def _skip_unavailable(v):
    ok, why = v.available()
    if not ok:
        pytest.skip(why)


@pytest.mark.parametrize("key", [v.key for v in COURSE])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_p0_is_bias_gelu(key, shape):
    """p = 0 keeps every element with scale exactly 1: the output is bias_gelu's."""
    v = next(v for v in COURSE if v.key == key)
    _skip_unavailable(v)
    x, b = _inputs(shape)
    y, ref = _run(v, x, b, 0.0, 123, 4)
    np.testing.assert_allclose(y, act.bias_gelu_ref(x.astype(np.float64), b.astype(np.float64)), rtol=2e-5,
                               atol=2e-6)
    assert parity.compare("y", y, ref, *B.TOL).ok


@pytest.mark.parametrize("key", [v.key for v in COURSE])
def test_p1_drops_everything_even_nan(key):
    """p = 1: every element exactly +0, including NaN and infinite inputs (a select, not a product)."""
    v = next(v for v in COURSE if v.key == key)
    _skip_unavailable(v)
    x, b = _inputs((3, 36), 1)
    x[0, :3] = [np.nan, np.inf, -np.inf]
    y, ref = _run(v, x, b, 1.0, 5, 0)
    assert (ref == 0).all()
    assert (y == 0).all() and not np.signbit(y).any()


@pytest.mark.parametrize("key", [v.key for v in COURSE])
@pytest.mark.parametrize("shape", [(3, 7), (5, 36), (2, 257)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_mask_is_dropouts_and_scale(key, shape):
    """Kept elements are exactly those of dropout's mask on the flat array, each gelu(x + b) / (1 - p)."""
    v = next(v for v in COURSE if v.key == key)
    _skip_unavailable(v)
    x, b = _inputs(shape, 2)
    p, seed, offset = 0.3, 2**40 + 7, 2**33 + 1
    y, ref = _run(v, x, b, p, seed, offset)
    keep = P.keep_mask(p, seed, offset, x.size).reshape(shape)
    g = act.bias_gelu_ref(x.astype(np.float64), b.astype(np.float64))
    assert (y[~keep] == 0).all()
    np.testing.assert_allclose(y[keep], g[keep] / (1 - p), rtol=2e-5, atol=2e-6)
    assert parity.compare("y", y, ref, *B.TOL).ok


def test_reference_is_the_chain_of_the_two_references():
    """The oracle is built from the existing ones, not from the code under test."""
    x, b = _inputs((4, 9), 3)
    x64, b64 = x.astype(np.float64), b.astype(np.float64)
    chain = P.dropout_ref(act.bias_gelu_ref(x64, b64).reshape(-1), 0.5, 9, 2).reshape(4, 9)
    np.testing.assert_array_equal(B.reference(x64, b64, 0.5, 9, 2), chain)


@pytest.mark.skipif(not device.GPU_VARIANTS_RUN, reason=device.REASON)
def test_gpu_rungs_match_cpu_bit_for_bit_in_mask():
    """The CPU and GPU rungs drop the same elements (the stream is the same on every backend)."""
    x, b = _inputs((3, 36), 4)
    ys = {}
    for v in COURSE:
        ok, _ = v.available()
        if ok:
            ys[v.key] = _run(v, x, b, 0.5, 77, 3)[0]
    masks = {k: (y != 0) for k, y in ys.items()}
    first = next(iter(masks.values()))
    for k, m in masks.items():
        np.testing.assert_array_equal(m, first, err_msg=k)


@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan"), "x"])
def test_bad_p(p):
    x, b = _inputs((2, 4))
    with pytest.raises(ValueError, match="probability"):
        B.bias_gelu_dropout(x, b, p, 1)


def test_convenience_call_cpu():
    x, b = _inputs((3, 8), 5)
    y = B.bias_gelu_dropout(x, b, 0.25, 11, 2)
    assert parity.compare("y", y, B.reference(x.astype(np.float64), b.astype(np.float64), 0.25, 11, 2), *B.TOL).ok


# ------------------------------------------------------------------------------------------ backward
BWD = [v for v in variants("bias_gelu_dropout_bwd") if not v.baseline]


def _run_bwd(v, dy, x, b, p, seed, offset):
    refs = (np.asarray(B.reference_bwd(dy.astype(np.float64), x.astype(np.float64), b.astype(np.float64), p, seed,
                                       offset)),)
    (dx,) = parity.run_variant(v, (dy, x, b, p, seed, offset), parity.empty_outputs(refs, "float32"))
    return dx, refs[0]


@pytest.mark.parametrize("key", [v.key for v in BWD])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (3, 36), (2, 257)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_bwd_p0_p1_and_mask(key, shape):
    """p = 0: GELU's derivative times dy; p = 1: exactly 0 (NaN in dy included); p = 0.3: zero exactly where the
    forward dropped, dy / (1 - p) times the derivative elsewhere."""
    v = next(v for v in BWD if v.key == key)
    _skip_unavailable(v)
    x, b = _inputs(shape, 6)
    dy = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    t = x.astype(np.float64) + b.astype(np.float64)
    dx, ref = _run_bwd(v, dy, x, b, 0.0, 3, 1)
    np.testing.assert_allclose(dx, act.gelu_tanh_bwd_ref(dy.astype(np.float64), t), rtol=2e-5, atol=2e-6)
    dy_nan = dy.copy()
    dy_nan.flat[0] = np.nan
    dx, ref = _run_bwd(v, dy_nan, x, b, 1.0, 3, 1)
    assert (dx == 0).all()
    dx, ref = _run_bwd(v, dy, x, b, 0.3, 3, 1)
    keep = P.keep_mask(0.3, 3, 1, x.size).reshape(shape)
    assert (dx[~keep] == 0).all()
    np.testing.assert_allclose(dx[keep], (act.gelu_tanh_bwd_ref(dy.astype(np.float64), t) / 0.7)[keep], rtol=2e-5,
                               atol=2e-6)
    assert parity.compare("dx", dx, ref, *B.TOL).ok
