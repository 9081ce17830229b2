"""Chapter 11's rungs 8-10 (qgemv_packed.packed_split, packed_prmt, packed_words): the quantized GEMV shaped for a
decode step's small products, the same with one prmt (byte_perm) per weight, and with one word of quants a lane
(x read coalesced); the fused up projection + GELU (qgemv_gelu_*) in a quantized decode step.

The shape rule (rows per block, warps per row) is checked on the capstone's products; the kernels run in the
CUDA simulator against the float64 reference with every split they can take (one warp per row, several warps
sharing a row, splits with no chunk at all, rows past the end), on outputs poisoned with NaN first. byte_perm's
simulator emulation is checked against PTX's definition, written out byte by byte here."""
import zlib

import numpy as np
import pytest

from kernels_src import parity
from kernels_src.compiler import byte_perm, cuda
from kernels_src.ops import qgemv_packed as P
from kernels_src.ops.quant import QUANT, qgemv_ref, qgemv_tol
from kernels_src.registry import get_op, get_variant


@pytest.mark.parametrize("fmt,K,shape", [
    ("q4_0", 768, (8, 1)),     # 24 chunks: one warp a row, 8 rows a block
    ("q4_0", 3072, (2, 3)),    # 96 chunks: three warps a row (the MLP's down projection)
    ("q8_0", 768, (4, 2)),     # 48 chunks of 16 weights: two warps a row
    ("q8_0", 3072, (1, 6)),
    ("q4_0", 8192, (1, 8)),    # 256 chunks: capped at SPLIT_MAX warps, each lane loops
    ("q4_0", 32, (8, 1)),
])
def test_split_shape_on_the_capstone_products(fmt, K, shape):
    assert P.split_shape(fmt, K) == shape
    R, S = shape
    C = K // (16 if fmt == "q8_0" else 32)
    assert R * S <= P.SPLIT_WARPS and (S == P.SPLIT_MAX or 32 * S >= C)  # one chunk a lane unless capped


def _run(fmt, K, N, R, S, seed, prmt=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(K).astype(np.float32)
    Wq = QUANT[fmt](rng.standard_normal((N, K)).astype(np.float32))
    qs, d = P.repack_host(Wq, fmt)
    y = cuda.to_device(np.full(N, np.nan, np.float32))  # poisoned: an output never written stays NaN
    P.launch_split(y, cuda.to_device(x), cuda.to_device(qs), cuda.to_device(d), fmt, R, S, prmt)
    got = y.copy_to_host()
    want = qgemv_ref(fmt)(x, Wq)
    rtol, atol = qgemv_tol((K, N), np.float32)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return got


@pytest.mark.parametrize("prmt", [False, True])
@pytest.mark.parametrize("fmt", ["q4_0", "q8_0"])
@pytest.mark.parametrize("K,N,R,S", [
    (96, 5, 1, 1),     # fewer chunks than lanes
    (160, 7, 3, 2),    # a second warp per row with nothing to do; a last block with one row past the end
    (64, 3, 2, 3),     # splits past the row's chunks
])
def test_forced_splits_match_reference(fmt, K, N, R, S, prmt, sim_greenlets):
    _run(fmt, K, N, R, S, zlib.crc32(f"{fmt}{K}{N}{R}{S}".encode()), prmt)


@pytest.mark.parametrize("variant", ["packed_split", "packed_prmt"])
@pytest.mark.parametrize("fmt,K,N", [("q4_0", 1056, 3), ("q8_0", 544, 5)])
def test_registered_rung_splits_long_rows(fmt, K, N, variant, sim_greenlets):
    """Rows longer than 32 chunks take S = 2 by the rule: the registered launcher, checked by parity."""
    assert P.split_shape(fmt, K)[1] == 2
    v = get_variant(f"qgemv_{fmt}/gpu/{variant}")
    rep = parity.check_variant(v, get_op(v.op), (K, N), "float32", seed=zlib.crc32(f"{fmt}{K}".encode()))
    assert rep.ok and not rep.skipped, str(rep)


@pytest.mark.parametrize("prmt", [False, True])
def test_rows_loop_past_the_split_cap(prmt, sim_greenlets):
    """More chunks than 32 * S lanes: each lane sums several chunks (rungs 8-9 at 8192^2 do, with S = 8)."""
    _run("q4_0", 32 * 70, 2, 1, 2, 7, prmt)


def _prmt_spec(x, y, s):
    """PTX ISA, prmt.b32 default mode: the 8 bytes {y, x} numbered 0-3 (x) and 4-7 (y); result byte n is byte
    number (s >> 4n) & 7 (bit 3 of each selector nibble, sign replication, is not used here)."""
    src = list(int(x).to_bytes(4, "little", signed=True)) + list(int(y).to_bytes(4, "little", signed=True))
    return int.from_bytes(bytes(src[(s >> (4 * n)) & 7] for n in range(4)), "little", signed=True)


def test_byte_perm_emulation_follows_ptx():
    rng = np.random.default_rng(3)
    words = [0, -1, 0x0F0F0F0F, -0x7F7F7F80, 0x4B000000, 0x12345678] + list(rng.integers(-2**31, 2**31, 20))
    sels = list(P.SEL) + [0x3210, 0x7654, 0x0123, 0x4444, 0x1F2E]  # 0x1F2E: bit 3 set, only the low 3 bits count
    for x in words:
        for y in words[:8]:
            for s in sels:
                assert int(byte_perm(np.int32(x), np.int32(y), s)) == _prmt_spec(x, y, s & 0x7777), (x, y, s)
    # the rung's use: nibble/byte j of a word as the float 2^23 + value
    assert np.float32(np.int32(_prmt_spec(0x0B0A0908, 0x4B000000, P.SEL[2])).view(np.float32)) == 2.0 ** 23 + 10


@pytest.mark.gpu
@pytest.mark.parametrize("prmt", [False, True])
@pytest.mark.parametrize("fmt", ["q4_0", "q8_0"])
@pytest.mark.parametrize("K,N", [(768, 2304), (768, 768), (768, 3072), (3072, 768), (768, 96), (8192, 37)])
def test_decode_shapes_on_the_gpu(fmt, K, N, prmt):
    _run(fmt, K, N, None, None, K + N, prmt)


@pytest.mark.parametrize("fmt", ["q4_0", "q8_0"])
def test_quantized_decode_in_the_simulator_matches_the_dequantized_forward(fmt, sim_greenlets):
    """The GPU backend in the simulator: a quantized decode step runs rung 10 for every product and the fused
    up projection + GELU (qgemv_gelu), and its logits equal the fp32 forward on the dequantized weights (CPU)."""
    from kernels_src import device
    from kernels_src.model.gpt import GPT, backend
    from kernels_src.model.reference import Config, init_params

    if not device.GPU_VARIANTS_RUN:
        pytest.skip(device.REASON)
    cfg = Config(vocab=11, ctx=8, width=32, heads=2, layers=1)
    p = init_params(cfg, 2)
    model = GPT(cfg, p, backend("gpu"))
    model.be.log = []
    qw, deq = model.quantize(fmt)
    toks = [5, 1, 9]
    kv = model.new_cache()
    for pos, t in enumerate(toks):
        dec = model.decode_step([t], pos, kv, qw)[0]
    used = {d.variant for d in model.be.log if d.role.startswith("qgemv")}
    assert used == {f"qgemv_{fmt}/gpu/packed_words", f"qgemv_gelu_{fmt}/gpu/packed_words"}, used
    p2 = dict(p)
    p2.update(deq)
    fwd = GPT(cfg, p2, "cpu").forward(np.array([toks]))[0][-1]
    assert np.isfinite(dec).all()
    assert np.abs(dec - fwd).max() <= 1e-4 * np.abs(fwd).max() + 1e-5


@pytest.mark.parametrize("fmt,K,shape", [
    ("q4_0", 768, (8, 1, 3)),    # 96 words: one warp a row, 3 words a lane
    ("q4_0", 3072, (2, 3, 4)),   # 384 words: three warps a row
    ("q8_0", 768, (4, 2, 3)),    # 192 words
    ("q8_0", 3072, (1, 6, 4)),
    ("q4_0", 8192, (1, 8, 4)),   # 1024 words: one trip
    ("q8_0", 8192, (1, 8, 4)),   # 2048 words: capped, each lane loops twice
    ("q4_0", 32, (8, 1, 1)),
])
def test_words_shape_on_the_capstone_products(fmt, K, shape):
    assert P.words_shape(fmt, K) == shape
    R, S, U = shape
    W = K // (4 if fmt == "q8_0" else 8)
    assert R * S <= P.SPLIT_WARPS and U <= P.WORDS_U and (32 * S * U >= W or (S, U) == (P.SPLIT_MAX, P.WORDS_U))


def _run_words(fmt, K, N, R, S, U, seed, act=False, shfl=False):
    from kernels_src.ops.activations import gelu_ref

    rng = np.random.default_rng(seed)
    x = rng.standard_normal(K).astype(np.float32)
    Wq = QUANT[fmt](rng.standard_normal((N, K)).astype(np.float32))
    qs, d = P.repack_host(Wq, fmt)
    y = cuda.to_device(np.full(N, np.nan, np.float32))  # poisoned
    P.launch_words(y, cuda.to_device(x), cuda.to_device(qs), cuda.to_device(d), fmt, R, S, U, act, shfl)
    got = y.copy_to_host()
    want = qgemv_ref(fmt)(x, Wq)
    if act:
        want = gelu_ref(want)
    rtol, atol = qgemv_tol((K, N), np.float32)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("fmt", ["q4_0", "q8_0"])
@pytest.mark.parametrize("K,N,R,S,U", [
    (96, 5, 1, 1, 1),    # fewer words than lanes
    (160, 7, 3, 2, 2),   # words past the row in the unrolled trip; a last block with rows past the end
    (64, 3, 2, 3, 4),    # splits with nothing to do
    (32 * 40, 2, 1, 2, 2),  # several trips a lane (Q8_0: 320 words over 128 lanes' slots)
])
def test_words_forced_shapes_match_reference(fmt, K, N, R, S, U, sim_greenlets):
    _run_words(fmt, K, N, R, S, U, zlib.crc32(f"w{fmt}{K}{N}{R}{S}{U}".encode()))


@pytest.mark.parametrize("fmt", ["q4_0", "q8_0"])
def test_words_with_gelu_match_reference(fmt, sim_greenlets):
    _run_words(fmt, 160, 9, 2, 2, 2, 11, act=True)


@pytest.mark.parametrize("fmt,K,N", [("q4_0", 1056, 3), ("q8_0", 544, 5)])
def test_registered_words_rung_splits_long_rows(fmt, K, N, sim_greenlets):
    assert P.words_shape(fmt, K)[1] == 2
    v = get_variant(f"qgemv_{fmt}/gpu/packed_words")
    rep = parity.check_variant(v, get_op(v.op), (K, N), "float32", seed=zlib.crc32(f"w{fmt}{K}".encode()))
    assert rep.ok and not rep.skipped, str(rep)


@pytest.mark.gpu
@pytest.mark.parametrize("shfl", [False, True])
@pytest.mark.parametrize("act", [False, True])
@pytest.mark.parametrize("fmt", ["q4_0", "q8_0"])
@pytest.mark.parametrize("K,N", [(768, 2304), (768, 768), (768, 3072), (3072, 768), (768, 96), (8192, 37)])
def test_words_decode_shapes_on_the_gpu(fmt, K, N, act, shfl):
    _run_words(fmt, K, N, None, None, None, K + N, act, shfl)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["q4_0", "q8_0"])
@pytest.mark.parametrize("K,N,R,S,U", [(96, 5, 1, 1, 1), (160, 7, 3, 2, 2), (64, 3, 2, 3, 4), (32 * 40, 2, 1, 2, 2)])
def test_words_shfl_forced_shapes_on_the_gpu(fmt, K, N, R, S, U):
    _run_words(fmt, K, N, R, S, U, K * N, shfl=True)
