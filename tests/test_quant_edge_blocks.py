"""Q4_0 / Q8_0 quantize on blocks holding NaN, +-inf, -0.0 or a tiny subnormal max (issue 36).

The rule (kernels_src/ops/quant.py, above the references): Q4_0 follows GGML's quantize_row_q4_0_ref loop exactly
(a NaN never becomes the block's max; a block with no |v| > 0 keeps max = +0, so d = -0.0), Q8_0 takes the same
rule for its amax (a NaN never sets it), and a quantized value that is not finite stores 0 (what x86's
conversion gives GGML's compiled loop). Two checks, both byte for byte:

* the float64/float32 NumPy reference against a literal scalar transcription of GGML's loops (below), the spec;
* every registered q4_0_quantize / q8_0_quantize variant against the reference: CPU ones directly, GPU ones in
  the simulator (as tests/test_registry.py runs them), or on the GPU where there is one.
"""
import contextlib
import importlib.util

import numpy as np
import pytest

from kernels_src import device, parity, simulator
from kernels_src.ops import quant
from kernels_src.registry import get_op, variants

QK = quant.QK
f32 = np.float32
HAS_GREENLET = importlib.util.find_spec("greenlet") is not None


def _c_int8(v):
    """C's (int8_t)(float) as x86 compiles it: cvttss2si to int32 (0x80000000 for NaN, inf or out of range),
    then the low byte."""
    v = float(v)
    i = int(v) if np.isfinite(v) and abs(v) < 2**31 else -2**31
    return ((i & 0xFF) ^ 0x80) - 0x80


def _fp16_bytes(d):
    h = int(np.array([d], np.float32).astype(np.float16).view(np.uint16)[0])
    return [h & 0xFF, h >> 8]


def ggml_q4_0_block(x):
    """quantize_row_q4_0_ref for one block, statement by statement, in float32."""
    amax, mx = f32(0), f32(0)
    for v in x:
        if amax < abs(f32(v)):
            amax, mx = abs(f32(v)), f32(v)
    d = f32(mx / f32(-8))
    idv = f32(1) / d if d else f32(0)
    out = _fp16_bytes(d)
    for j in range(QK // 2):
        x0, x1 = f32(f32(x[j]) * idv), f32(f32(x[j + QK // 2]) * idv)
        xi0 = min(15, _c_int8(f32(x0 + f32(8.5)))) & 0xFF  # const uint8_t xi0 = MIN(15, (int8_t)(x0 + 8.5f))
        xi1 = min(15, _c_int8(f32(x1 + f32(8.5)))) & 0xFF
        out.append((xi0 | (xi1 << 4)) & 0xFF)
    return out


def course_q8_0_block(x):
    """quantize_row_q8_0_ref for one block, except its amax line: GGML's MAX(amax, fabsf(v)) is
    `amax > |v| ? amax : |v|`, where a NaN resets the running max; the course keeps amax unless |v| > amax."""
    amax = f32(0)
    for v in x:
        amax = abs(f32(v)) if abs(f32(v)) > amax else amax
    d = f32(amax / f32(127))
    idv = f32(1) / d if d else f32(0)
    out = _fp16_bytes(d)
    for j in range(QK):
        x0 = f32(f32(x[j]) * idv)
        r = np.sign(x0) * np.floor(abs(float(x0)) + 0.5) if np.isfinite(x0) else x0  # roundf
        out.append(_c_int8(r) & 0xFF)
    return out


BLOCK = {"q4_0": ggml_q4_0_block, "q8_0": course_q8_0_block}


def spec(fmt, X):
    M, K = X.shape
    with np.errstate(all="ignore"):  # the loops meet inf * 0 and 1/subnormal on purpose
        return np.array([sum((BLOCK[fmt](X[m, b * QK:(b + 1) * QK]) for b in range(K // QK)), [])
                         for m in range(M)], dtype=np.uint8)


def edge_matrix():
    """(n, 64): row i holds nonfinite block i and, second, block n-1-i (each kind in both positions of a row),
    plus two rows of ordinary values."""
    rng = np.random.default_rng(36)
    b = np.array(quant.nonfinite_blocks(rng), dtype=np.float64)
    X = np.concatenate([b, b[::-1]], axis=1)
    X = np.concatenate([X, rng.standard_normal((2, 2 * QK)) * 3], axis=0)
    with np.errstate(over="ignore", under="ignore"):
        return X.astype(np.float32)


with np.errstate(all="ignore"):
    X_EDGE = edge_matrix()


@pytest.mark.parametrize("fmt", ["q4_0", "q8_0"])
def test_reference_follows_the_rule(fmt):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the reference must not warn on NaN or inf (np.errstate inside)
        got = quant.QUANT[fmt](X_EDGE)
    want = spec(fmt, X_EDGE)
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{fmt} reference differs from the loop at (row, byte) {bad[:8].tolist()}: " \
                          f"got {got[tuple(bad[0])]}, want {want[tuple(bad[0])]}"


def test_nonfinite_blocks_cover_the_cases():
    """The cases the rule decides: a NaN in a block that also has a larger value, an all-zero block whose first
    zero is -0.0, an infinite max, and a block whose 1/d overflows."""
    x = X_EDGE[:, :QK]
    ab = np.abs(x)
    assert (np.isnan(x).any(1) & (np.nanmax(np.where(np.isnan(ab), 0, ab), 1) > 0)).any()
    assert ((ab == 0).all(1) & np.signbit(x[:, 0])).any()
    assert np.isinf(x).any()
    with np.errstate(all="ignore"):
        amax = np.where(np.isnan(ab), 0, ab).max(1)
        assert ((amax > 0) & np.isinf(np.float32(1) / (amax / np.float32(8)))).any()


def _keys():
    return [v.key for op in ("q4_0_quantize", "q8_0_quantize") for v in variants(op)]


@pytest.mark.parametrize("key", _keys())
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_variant_bytes_on_nonfinite_blocks(key):
    v = next(v for v in variants() if v.key == key)
    ok, why = v.available()
    if not ok:
        pytest.skip(why)
    ref = quant.QUANT[v.op.split("_quantize")[0]](X_EDGE)
    outs = parity.empty_outputs([ref], "float32")
    engine = simulator.threads_as_greenlets() if v.backend == "gpu" and device.SIMULATED and HAS_GREENLET \
        else contextlib.nullcontext()
    with engine, np.errstate(all="ignore"):
        (got,) = parity.run_variant(v, (X_EDGE,), outs)
    bad = np.argwhere(got != ref)
    assert bad.size == 0, (f"{key}: {len(bad)} bytes differ; first (row, byte, got, want): "
                           + str([(int(r), int(c), int(got[r, c]), int(ref[r, c])) for r, c in bad[:8]]))
    assert get_op(v.op).tol == (0.0, 0.0)
