"""Chapter 11, question 7: the int8 GEMV with dp4a. The tolerance's claim (a right answer is well inside it, a block
left out is far outside), the integer rules the prompt states (packing, sign extension), and the edge inputs.

The right answer is computed here with NumPy from the prompt's rules (not from the code under test): x quantized
with Q8_0's float32 steps, the integer products summed exactly, the scales applied in float32."""
import math

import numpy as np
import pytest

from kernels_src.compiler.inline_ptx import dp4a_reference
from kernels_src.ops import int8_dot
from kernels_src.registry import find_op

OP = find_op("q8_0_dp4a_gemv")


def _quantize_x(x):
    """Q8_0's rule on activations, in float32 as the prompt says: (q (K,) int64, d (K/32,) float32)."""
    xb = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(xb).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    p = (xb * idv[:, None]).astype(np.float32).astype(np.float64)
    q = (np.sign(p) * np.floor(np.abs(p) + 0.5)).astype(np.int64)
    return q.reshape(-1), d


def _answer(x, Wq, drop_block=None):
    N = Wq.shape[0]
    blocks = Wq.reshape(N, -1, 34)
    dw = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    qw = blocks[..., 2:].copy().view(np.int8).astype(np.int64)
    qx, dx = _quantize_x(x)
    s = (qw * qx.reshape(-1, 32)[None]).sum(axis=2)  # exact integer sums per block
    terms = (dw * dx[None, :]).astype(np.float32) * s.astype(np.float32)
    if drop_block is not None:
        terms[:, drop_block] = 0
    y = np.zeros(N, np.float32)
    for b in range(terms.shape[1]):
        y += terms[:, b]
    return y


def _cases():
    for size in [(32, 1), (96, 7), (224, 13), (1184, 37), (4096, 64)]:
        for seed in range(4):
            for make in (OP.make_inputs, OP.edge_inputs):
                yield size, seed, make


@pytest.mark.parametrize("size,seed,make", list(_cases()))
def test_right_answer_is_well_inside_the_tolerance(size, seed, make):
    x, Wq = make(size, np.dtype("float32"), np.random.default_rng(seed))
    ref = OP.reference(x, Wq)
    rtol, atol = int8_dot.dp4a_tol(size, "float32")
    err = np.abs(_answer(x, Wq) - ref)
    assert np.all(err <= (atol + rtol * np.abs(ref)) / 2), (err.max(), atol)  # half the band: 4.5 sigma


@pytest.mark.parametrize("size", [(96, 7), (224, 13), (1184, 37)])
def test_a_block_left_out_is_caught(size):
    x, Wq = OP.make_inputs(size, np.dtype("float32"), np.random.default_rng(7))
    ref = OP.reference(x, Wq)
    rtol, atol = int8_dot.dp4a_tol(size, "float32")
    bad = np.abs(_answer(x, Wq, drop_block=size[0] // 32 - 1) - ref) > atol + rtol * np.abs(ref)
    assert bad.mean() > 0.5


def _pack(b, mask=True):
    w = 0
    for k, v in enumerate(b):
        w |= ((v & 0xFF) if (mask or k == 3) else v) << (8 * k)
    w &= 0xFFFFFFFF
    return w - (1 << 32) if w >= 1 << 31 else w


@pytest.mark.parametrize("b", [(-3, 5, -128, 127), (0, -1, 0, -1), (127, -128, 1, -2), (-128, -128, -128, -128)])
def test_packing_rules_of_the_prompt(b):
    """Masked bytes come back through dp4a one by one (dp4a with a unit in byte k reads byte k, sign-extended);
    an unmasked negative byte overwrites the bytes above it; the packed word fits an int32 (-128 << 24 = -2^31)."""
    w = _pack(b)
    assert -(2**31) <= w < 2**31
    for k in range(4):
        assert dp4a_reference(w, 1 << (8 * k), 0) == b[k]
    if any(v < 0 for v in b[:3]):
        assert any(dp4a_reference(_pack(b, mask=False), 1 << (8 * k), 0) != b[k] for k in range(4))


def test_edge_inputs_hold_what_they_promise():
    x, Wq = OP.edge_inputs((160, 9), np.dtype("float32"), np.random.default_rng(3))
    xb = x.reshape(-1, 32)
    assert (np.abs(xb).max(axis=1) == 0).any()  # a block of zeros
    assert (np.abs(xb).max(axis=1) < 0.01).sum() >= 2  # the zero block and the small one
    blocks = Wq.reshape(-1, 34)
    d = blocks[:, 0:2].copy().view(np.float16)[:, 0]
    assert (d == 0).any() and (d < 0).any()
    q = blocks[:, 2:].view(np.int8)
    assert (q == -128).any() and (q == 127).any()
    assert np.isfinite(OP.reference(x, Wq)).all()


def test_tolerance_grows_like_sqrt_k():
    assert int8_dot.dp4a_tol((4 * 1184, 1), "float32")[1] == pytest.approx(2 * int8_dot.dp4a_tol((1184, 1), "float32")[1])
    assert int8_dot.dp4a_tol((1184, 1), "float32")[1] < math.sqrt(32)  # a dropped block stays visible
