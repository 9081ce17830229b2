"""Chapter 19's own promises: the bf16 and fp16 conversions on the host and in kernels, over all 65536 bit
patterns, against a float64 oracle built from the formats' fields; overflow, NaN and subnormals; the one
tolerance rule; and the half-precision storage plumbing of the parity checks (poison, decode, NaN).
(Parity of every registered rung on awkward shapes is in tests/test_registry.py.)"""
import os
import subprocess
import sys

import numpy as np
import pytest

from kernels_src import device, parity
from kernels_src.compiler import bf16_to_f32, cuda, f16bits_to_f32, f32_to_bf16, f32_to_f16, f32_to_f16bits
from kernels_src.ops import half
from kernels_src.registry import get_op, get_variant

ALL = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def field_value(h, exp_bits, man_bits):
    """float64 value of 16-bit patterns from their sign, exponent and mantissa fields (no bit casts)."""
    h = h.astype(np.int64)
    s = np.where(h >> 15, -1.0, 1.0)
    e = (h >> man_bits) & ((1 << exp_bits) - 1)
    m = (h & ((1 << man_bits) - 1)).astype(np.float64)
    bias = (1 << (exp_bits - 1)) - 1
    top = (1 << exp_bits) - 1
    with np.errstate(invalid="ignore"):
        v = np.where(e == 0, np.ldexp(m, 1 - bias - man_bits),
                     np.ldexp(1.0 + m / (1 << man_bits), e - bias))
        v = np.where(e == top, np.where(m == 0, np.inf, np.nan), v)
    return s * v


def same(a, b):
    """Equal as values, NaN where NaN, and signed zeros kept apart."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.all((a == b) & (np.signbit(a) == np.signbit(b)) | (np.isnan(a) & np.isnan(b)))


def test_decoding_every_pattern_matches_the_fields():
    assert same(half.decode(ALL, "bfloat16"), field_value(ALL, 8, 7))
    assert same(half.decode(ALL.view(np.float16), "float16"), field_value(ALL, 5, 10))
    # the constants the chapter quotes
    assert half.MAX_FINITE["float16"] == field_value(np.array([0x7BFF], np.uint16), 5, 10)[0] == 65504.0
    assert half.MAX_FINITE["bfloat16"] == field_value(np.array([0x7F7F], np.uint16), 8, 7)[0]


def _probes(fmt):
    """Every finite number of the format, the midpoints between neighbours (ties), points a quarter of the way,
    and values just above and below the overflow threshold, as float32."""
    v = field_value(ALL, 8, 7) if fmt == "bfloat16" else field_value(ALL, 5, 10)
    v = np.unique(v[np.isfinite(v)])
    mid = (v[:-1] + v[1:]) / 2
    quarter = v[:-1] + (v[1:] - v[:-1]) / 4
    big = half.MAX_FINITE[fmt]
    ulp = half.spacing(big, fmt)
    edge = np.array([big + ulp / 2, -(big + ulp / 2), big + ulp / 2 * (1 - 2**-10), np.inf, -np.inf, 0.0, -0.0])
    return np.concatenate([v, mid, quarter, edge]).astype(np.float32)


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_encoding_rounds_to_nearest_even_against_the_float64_oracle(fmt):
    x = _probes(fmt)
    got = half.decode(half.encode(x, fmt), fmt)
    want = half.round_to(x.astype(np.float64), fmt)
    assert same(got, want)
    # ties went to the even neighbour (last mantissa bit 0), not always up or down
    v = np.unique(half.decode(ALL if fmt == "bfloat16" else ALL.view(np.float16), fmt))
    v = v[np.isfinite(v) & (v > 0)][:-1]
    mids = ((v[:-1] + v[1:]) / 2).astype(np.float32)
    bits = half.encode(mids, fmt).view(np.uint16)
    assert np.all(bits & 1 == 0)
    # NaN stays NaN (bf16 as the quiet NaN 0x7FC0)
    nan = half.encode(np.array([np.nan, -np.nan], np.float32), fmt)
    assert np.all(np.isnan(half.decode(nan, fmt)))
    if fmt == "bfloat16":
        assert nan.tolist() == [half.NAN16, half.NAN16]


def test_fp16_overflow_becomes_inf_at_65520():
    """65504 is the largest fp16; 65520 lies half-way to the next power-of-two step, a tie that rounds to the
    even neighbour 65536, which fp16 cannot hold: inf. Just below, it rounds down to 65504. bf16 holds it."""
    x = np.array([65504.0, 65519.996, 65520.0, 70000.0, -1e5, 1e-8, 2.0**-25, 2.0**-24], np.float32)
    got = half.decode(half.encode(x, "float16"), "float16")
    assert got[:2].tolist() == [65504.0, 65504.0]
    assert np.isposinf(got[2]) and np.isposinf(got[3]) and np.isneginf(got[4])
    assert got[5] == 0.0 and got[6] == 0.0  # below half the smallest subnormal: to zero (2^-25 is a tie: even 0)
    assert got[7] == 2.0**-24  # the smallest subnormal
    assert np.all(np.isfinite(half.decode(half.encode(x[:5], "bfloat16"), "bfloat16")))


def test_unit_roundoff_bounds_the_relative_error_of_storing():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(200_000) * np.exp2(rng.uniform(-6, 6, 200_000))  # the normal range of both formats
    x = x[np.abs(x) > 2.0**-13]
    for fmt, u in half.UNIT_ROUNDOFF.items():
        assert u == 2.0 ** -(half.MANTISSA_BITS[fmt] + 1)
        rel = np.abs(half.decode(half.encode(x, fmt), fmt) - x) / np.abs(x)
        assert rel.max() <= u * (1 + 2**-20) + 2**-24  # float32 first (the encode's input), then the format
        assert rel.max() > 0.9 * u  # and the bound is attained: the format really has only that many bits


# ------------------------------------------------------------------------------------ in kernels
@cuda.jit
def _device_conversions(back16, f32, f16back, x, h):
    # one thread walks all patterns (the simulator runs a thread as Python: a loop is faster than 65536 threads)
    if cuda.grid(1) == 0:
        for i in range(h.size):
            f32[i] = bf16_to_f32(h[i])
            back16[i] = f32_to_bf16(x[i])
            f16back[i] = f32_to_f16bits(f16bits_to_f32(h[i]))


def test_device_conversions_match_the_host_over_every_pattern():
    h = ALL.copy()
    x = _probes("bfloat16")[: h.size]
    x = np.concatenate([x, np.zeros(h.size - x.size, np.float32)]) if x.size < h.size else x
    x[:3] = [np.nan, np.inf, -np.inf]
    back16 = np.zeros(h.size, np.uint16)
    f32 = np.zeros(h.size, np.float32)
    f16back = np.zeros(h.size, np.uint16)
    _device_conversions[1, 1](back16, f32, f16back, x, h)
    assert same(f32, field_value(h, 8, 7))
    assert np.array_equal(back16, half.encode(x, "bfloat16"))
    v16 = h.view(np.float16)
    fin = ~np.isnan(v16)
    assert np.array_equal(f16back[fin], h[fin])  # every fp16 survives the trip through float32
    assert np.all(np.isnan(f16back[~fin].view(np.float16)))


@cuda.jit
def _store_f16(out, x):
    if cuda.grid(1) == 0:
        for i in range(x.size):
            out[i] = f32_to_f16(x[i])


def test_device_fp16_store_overflows_to_inf():
    x = np.array([65504.0, 65519.996, 65520.0, 1e6, -1e6, np.nan], np.float32)
    out = np.zeros(x.size, np.float16)
    _store_f16[1, 1](out, x)
    assert out[:2].tolist() == [65504.0, 65504.0]
    assert np.isposinf(out[2]) and np.isposinf(out[3]) and np.isneginf(out[4]) and np.isnan(out[5])


@pytest.mark.ptx
def test_conversions_and_16_byte_accesses_reach_the_ptx():
    """The fp16 conversions are the hardware's cvt instructions, without flush-to-zero; the vec16 rung moves 16
    bytes per access."""
    code = ("import re\nfrom kernels_src.ops import half\nfrom kernels_src import ptx\n"
            "for fmt in ('float16', 'bfloat16'):\n"
            "    k = half.kernel('softmax', fmt, 512, 8, True, True)\n"
            "    text = ptx.compile_one(k, half._sig('softmax', fmt, True))\n"
            "    text = text if isinstance(text, str) else text[0]\n"
            "    print('@@', fmt, 'ld.global.v4' in text, 'st.global.v4' in text, 'cvt.f32.f16' in text, "
            "'cvt.rn.f16.f32' in text, bool(re.search(r'cvt[.a-z0-9]*ftz', text)))\n")
    env = dict(os.environ, KERNELS_DEVICE="ptx", NUMBA_ENABLE_CUDASIM="0")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [line.split()[1:] for line in p.stdout.splitlines() if line.startswith("@@")]
    # no flush-to-zero conversion (fastmath would give cvt.ftz and lose the subnormals)
    assert rows == [["float16", "True", "True", "True", "True", "False"],
                    ["bfloat16", "True", "True", "False", "False", "False"]]


# ------------------------------------------------------------------------------ tolerance and plumbing
@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_the_tolerance_is_the_unit_roundoff_and_tells_rounding_from_truncation(fmt):
    rtol, atol = half.half_tol(fmt, 1e-5, 1e-7)
    assert half.UNIT_ROUNDOFF[fmt] < rtol <= half.UNIT_ROUNDOFF[fmt] + 2**-16
    rng = np.random.default_rng(1)
    y = rng.standard_normal(5000)
    rounded = half.encode(y, fmt)
    assert parity.compare("y", rounded, y, rtol, atol, fmt=fmt).ok
    # truncation (round toward zero) errs by up to 2u: the same tolerance rejects it
    trunc = half.round_to(y, fmt)
    up = np.abs(trunc) > np.abs(y)
    trunc[up] -= np.sign(y[up]) * half.spacing(np.abs(y[up]) * (1 - 2**-12), fmt)
    rep = parity.compare("y", half.encode(trunc, fmt), y, rtol, atol, fmt=fmt)
    assert not rep.ok and rep.n_bad > 100


def test_bf16_outputs_are_poisoned_with_a_nan_and_decoded_before_comparing():
    op = get_op("rmsnorm_bf16")
    assert op.storage == ("bfloat16", "")
    refs = [np.ones((2, 3)), np.ones(2)]
    y, r = parity.empty_outputs(refs, "float32", op.storage)
    assert y.dtype == np.uint16 and r.dtype == np.float32
    assert np.all(np.isnan(half.decode(y, "bfloat16"))) and parity.is_poison(y, "bfloat16").all()
    rep = parity.compare("y", y, refs[0], 1.0, 1.0, fmt="bfloat16")  # even a huge tolerance: NaN never passes
    assert not rep.ok and rep.mismatches[0].unwritten
    y[...] = half.encode(np.ones((2, 3)), "bfloat16")
    assert parity.compare("y", y, refs[0], 0.0, 0.0, fmt="bfloat16").ok  # 1.0 is 0x3F80, compared by value
    (y16,) = parity.empty_outputs([np.ones(4)], "float32", ("float16",))
    assert y16.dtype == np.float16 and np.all(np.isnan(y16)) and parity.is_poison(y16).all()


@pytest.mark.parametrize("key", ["rmsnorm_fp16/cpu/numpy32", "rmsnorm_fp16/gpu/rows"])
def test_an_output_fp16_cannot_hold_fails_the_check_loudly(key, monkeypatch):
    """gamma = 1e5 makes y ~ 1e5: the float64 reference is finite, fp16 stores inf. The check must say so, not
    hide it: the chapter's answer is bf16 (or a scaled output), never a looser tolerance."""
    op = get_op("rmsnorm_fp16")
    make = op.make_inputs

    def big_gamma(size, dtype, rng):
        x, g = make(size, dtype, rng)
        return x, np.full_like(g, 1e5)

    monkeypatch.setattr(op, "make_inputs", big_gamma)
    rep = parity.check_variant(get_variant(key), op, (3, 7))
    assert not rep.ok
    y = rep.outputs[0]
    assert y.n_nonfinite > 0


def _edge(kind, fmt, size, rng):
    """Inputs of ``kind`` with NaN, +-inf and signed zeros in the first row (or the first elements)."""
    ins = list(get_op(half.op_name(kind, {"bfloat16": "bf16", "float16": "fp16"}[fmt])).make_inputs(size, None, rng))
    special = half.encode(np.array([np.nan, np.inf, -np.inf, -0.0]), fmt)
    x = ins[-1] if kind.startswith("gelu") else ins[0]
    flat = x.reshape(-1)
    flat[[0, 17, 18, 19]] = special  # softmax (3, 16): a NaN row (zeros, chapter 8's rule), a row with +inf, -inf, -0
    return tuple(ins)


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
@pytest.mark.parametrize("kind", ["softmax", "gelu"])
@pytest.mark.parametrize("rung", ["cpu/numpy32", "cpu/prange", "gpu/rows", "gpu/vec16"])
def test_nan_and_inf_propagate_as_the_reference_says(fmt, kind, rung):
    tag = {"bfloat16": "bf16", "float16": "fp16"}[fmt]
    op = get_op(half.op_name(kind, tag))
    v = get_variant(f"{op.name}/{rung}")
    if not v.available()[0]:
        pytest.skip(v.available()[1])
    size = (3, 16) if kind == "softmax" else (40,)
    ins = _edge(kind, fmt, size, np.random.default_rng(2))
    refs = parity.reference_outputs(op, ins)
    outs = parity.empty_outputs(refs, "float32", op.storage)
    got = parity.run_variant(v, ins, outs)
    rtol, atol = parity.resolve_tol(op.tol, "float32", size)
    rep = parity.compare("y", got[0], refs[0], rtol, atol, fmt=fmt)
    assert rep.ok, "\n".join(rep.lines())
    assert not np.all(np.isfinite(refs[0]))  # the special values really reached the output


def _float32_probes():
    """float32 bit patterns for the CPU codec: every upper half (sign, exponent, top 7 mantissa bits) with lower halves
    that sit on, just beside and exactly at the rounding points of both formats (bf16 drops 16 bits, fp16 13 in its
    normal range and more below it), plus 2^20 random patterns; NaNs with every kind of payload included."""
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    lo = np.array([0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x2FFF, 0x3000, 0x3001, 0x4000, 0x7FFF,
                   0x8000, 0x8001, 0xC000, 0xF000, 0xFFFF], dtype=np.uint32)
    rnd = np.random.default_rng(19).integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([(hi[:, None] | lo[None, :]).reshape(-1), rnd]).view(np.float32)


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_cpu_kernel_codec_agrees_bit_for_bit_with_the_host(fmt):
    """The prange rungs' enc16/dec16 (integer arithmetic in Numba, no float16 type): decoding every 16-bit pattern
    gives the float32 of its value, bit for bit, and encoding gives exactly encode()'s bits (NumPy's
    astype(float16) for fp16, NaN payloads included; bf16_bits_rne for bf16) on ~2 million float32 patterns around
    every rounding point. (All 2^32 patterns were also compared once, 0 mismatches: too slow for the suite.)"""
    kind = np.int16 if fmt == "float16" else np.uint16
    got = np.empty(ALL.size, np.float32)
    half.decode_cpu(got, ALL.view(kind))
    # the float32 itself, NaN payloads included (bf16: the top half of its bits; fp16: NumPy's exact widening)
    want = (ALL.astype(np.uint32) << 16).view(np.float32) if fmt == "bfloat16" else ALL.view(np.float16).astype(
        np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    x = _float32_probes()
    bits = np.empty(x.size, kind)
    half.encode_cpu(bits, x)
    ref = half.encode(x, fmt).view(kind)
    bad = np.flatnonzero(bits != ref)
    assert bad.size == 0, [(hex(x[i:i + 1].view(np.uint32)[0]), hex(bits[i] & 0xFFFF), hex(ref[i] & 0xFFFF))
                           for i in bad[:5]]


def test_vec16_rung_takes_the_16_byte_path_only_for_whole_groups():
    assert half.vec_ok("softmax", (3, 40)) and not half.vec_ok("softmax", (3, 33))
    assert (3, 40) in [tuple(s) for s in get_op("softmax_bf16").sizes["check_sim"]]
    assert any(s[0] % 8 == 0 for s in get_op("gelu_fp16").sizes["check_sim"])


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_device_conversions_on_the_gpu(fmt):
    assert device.MODE == "gpu"
    test_device_conversions_match_the_host_over_every_pattern()
