"""Counter-based random numbers (Philox-4x32-10) and dropout that regenerates its mask (chapter 16).

Philox-4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC11) is a
function, not a state machine: 128 bits of counter and 64 bits of key in, 128 random bits out. Any thread can
compute any part of the stream directly, so a GPU needs no generator state per thread, and the CPU, the CUDA
simulator and the GPU produce the same bits. One round on four 32-bit words (c0, c1, c2, c3), key (k0, k1):

    hi0:lo0 = 0xD2511F53 * c0        (the 64-bit product split into its high and low 32-bit halves)
    hi1:lo1 = 0xCD9E8D57 * c2
    (c0, c1, c2, c3) <- (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)

ten rounds, the key bumped by the Weyl constants (k0 += 0x9E3779B9, k1 += 0xBB67AE85, mod 2^32) between
rounds. Checked against the known-answer vectors of the Random123 distribution (tests/kat_vectors).

Ops and shapes
  philox           ctr (n,4) uint32, key (2,) uint32        -> out (n,4) uint32    (the raw block function)
  philox_uniform   seed, offset, n                           -> u (n,) float32 in [0, 1)
  dropout          x (n,) f32, p, seed, offset               -> y (n,)   y = keep ? x / (1 - p) : 0
  dropout_bwd      dy (n,) f32, p, seed, offset              -> dx (n,)  dx = keep ? dy / (1 - p) : 0

The stream (one convention for every op of the chapter, and for sampling's draws):
  element i of the stream (seed, offset) is word i % 4 of philox(ctr, key) with
  ctr = (g mod 2^32, g >> 32, offset mod 2^32, offset >> 32), g = i // 4, and key = (seed mod 2^32, seed >> 32).
  uniform(bits) = (bits >> 8) * 2^-24: the top 24 bits, exactly representable in float32, in [0, 1 - 2^-24].
  dropout keeps element i iff (bits_i >> 8) >= ceil(p * 2^24), which is exactly uniform(bits_i) >= p, so p = 0
  keeps everything and p = 1 nothing. A dropped element is exactly 0 (a select, not a product: a NaN that is
  dropped does not come back), a kept one is x * float32(1 / (1 - p)); p = 1 uses scale 0 (no division).

Cost: philox is 10 rounds of two 32x32->64 multiplies, four XORs and a key bump: about 80 integer instructions
per 4 outputs (20 per output). dropout reads 4 and writes 4 bytes per element: memory-bound on the H100 if the
integer work hides under the memory time (about 5 G integer ops at 2^28 elements against 0.7 ms of traffic).

Ladder
  philox          cpu/loop rung 1 (@njit), cpu/prange rung 2, gpu/thread rung 1 (64-bit product for the high
                  half), gpu/mulhi rung 2 (libdevice umulhi; real GPU only: the simulator has no mulhi)
  philox_uniform  cpu/numpy base, cpu/loop 1, cpu/prange 2, gpu/thread4 1 (one thread per 4 outputs),
                  gpu/vec4 2 (one 16-byte store per thread)
  dropout(_bwd)   cpu/numpy base, cpu/torch base (speed only: torch's stream differs), cpu/loop 1, cpu/prange 2,
                  gpu/torch base (speed only), gpu/thread4 1 (one thread per 4 elements, one Philox call, four
                  4-byte loads/stores), gpu/vec4 2 (the same with one 16-byte load and one 16-byte store)
"""
import math

import numpy as np

from .. import device
from ..compiler import cuda, load4, njit, prange, store4
from ..device import ceil_div
from ..registry import EDGE_INPUTS, define_op, register
from ..registry import sprinkle as _sprinkle
from .cpu_baselines import torch_cpu, tviews
from .reductions import torch_gpu
from .softmax import _aligned16

# ------------------------------------------------------------------------------------------- constants
ROUNDS = 10
M0, M1 = 0xD2511F53, 0xCD9E8D57  # the round multipliers
W0, W1 = 0x9E3779B9, 0xBB67AE85  # the Weyl key increments (golden ratio, sqrt(3) - 1)
# Known answers from the Random123 distribution, tests/kat_vectors (D. E. Shaw Research), the three
# "philox4x32 10" lines: counter (4 words), key (2 words) -> expected output (4 words).
KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]
# The same file's 7-round answers (Philox-4x32-7), for the exercise that builds the rounds one at a time.
KAT7 = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x5F6FB709, 0x0D893F64, 0x4F121F81, 0x4F730A48)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x5207DDC2, 0x45165E59, 0x4D8EE751, 0x8C52F662)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0x4DFCCABA, 0x190A87F0, 0xC47362BA, 0xB6B5242A)),
]
TWO24 = 1 << 24
U24 = 2.0 ** -24

# NumPy scalar globals: Numba freezes them as typed constants, so the kernel arithmetic stays in uint32/uint64
# on every target, and the simulator (NumPy scalars) computes the same thing without overflow warnings.
M0_64, M1_64 = np.uint64(M0), np.uint64(M1)
M0_32, M1_32 = np.uint32(M0), np.uint32(M1)
W0_64, W1_64 = np.uint64(W0), np.uint64(W1)
LO32 = np.uint64(0xFFFFFFFF)
SH32 = np.uint64(32)
SH8 = np.uint32(8)
F0 = np.float32(0.0)
U24_F32 = np.float32(U24)


# ------------------------------------------------------------------------------- the reference (NumPy)
def philox_np(ctr, key, rounds=ROUNDS):
    """Philox-4x32-``rounds`` in NumPy uint64 arithmetic (every product is exact: < 2^64).

    ctr (n,4) unsigned, key (2,) or (n,2) unsigned -> (n,4) uint32. The oracle of every op here."""
    c = np.asarray(ctr, dtype=np.uint64).reshape(-1, 4)
    k = np.asarray(key, dtype=np.uint64)
    k0, k1 = (k[..., 0], k[..., 1])
    c0, c1, c2, c3 = c[:, 0].copy(), c[:, 1].copy(), c[:, 2].copy(), c[:, 3].copy()
    mask, s32 = np.uint64(0xFFFFFFFF), np.uint64(32)
    for r in range(rounds):
        if r:
            k0 = (k0 + np.uint64(W0)) & mask
            k1 = (k1 + np.uint64(W1)) & mask
        p0 = c0 * np.uint64(M0)
        p1 = c2 * np.uint64(M1)
        c0, c1, c2, c3 = (p1 >> s32) ^ c1 ^ k0, p1 & mask, (p0 >> s32) ^ c3 ^ k1, p0 & mask
    return np.stack([c0, c1, c2, c3], axis=1).astype(np.uint32)


def split64(v):
    """A 64-bit integer as its (low, high) 32-bit words, as np.uint32."""
    v = int(v)
    if not 0 <= v < 1 << 64:
        raise ValueError(f"seeds and offsets are integers in [0, 2^64), not {v}")
    return np.uint32(v & 0xFFFFFFFF), np.uint32(v >> 32)


def stream_bits(seed, offset, n):
    """The first n uint32 of the stream (seed, offset), by the convention of the module docstring."""
    g = np.arange((n + 3) // 4, dtype=np.uint64)
    o0, o1 = split64(offset)
    ctr = np.stack([g & np.uint64(0xFFFFFFFF), g >> np.uint64(32), np.full_like(g, o0), np.full_like(g, o1)], 1)
    return philox_np(ctr, split64(seed)).reshape(-1)[:n]


def uniform_from_bits(bits):
    """(bits >> 8) * 2^-24 in float64 (exact, and exactly representable in float32): [0, 1 - 2^-24]."""
    return (np.asarray(bits, dtype=np.uint32) >> np.uint32(8)).astype(np.float64) * U24


def uniforms(seed, offset, n):
    """The first n uniforms in [0, 1) of the stream (seed, offset), float64 holding float32-exact values."""
    return uniform_from_bits(stream_bits(seed, offset, n))


def check_p(p):
    """A dropout probability: a number in [0, 1], else ValueError."""
    try:
        p = float(p)
    except (TypeError, ValueError):
        raise ValueError(f"dropout probability p must be a number in [0, 1], not {p!r}") from None
    if not 0.0 <= p <= 1.0:  # NaN fails both comparisons
        raise ValueError(f"dropout probability p must be in [0, 1], not {p}")
    return p


def keep_threshold(p):
    """ceil(p * 2^24): element kept iff (bits >> 8) >= it (p * 2^24 is exact in float64)."""
    return int(math.ceil(check_p(p) * TWO24))


def dropout_scale(p):
    """float32(1 / (1 - p)), and 0 for p = 1 (everything is dropped: nothing to scale, no division by zero)."""
    p = check_p(p)
    return np.float32(0.0) if p == 1.0 else np.float32(1.0 / (1.0 - p))


def keep_mask(p, seed, offset, n):
    """The dropout mask of the stream (seed, offset): True where element i is kept."""
    return (stream_bits(seed, offset, n) >> np.uint32(8)) >= keep_threshold(p)


def philox_ref(ctr, key):
    return philox_np(ctr, key)


def philox_uniform_ref(seed, offset, n):
    return uniforms(seed, offset, n)


def dropout_ref(x, p, seed, offset):
    """y = x / (1 - p) where kept, exactly 0 where dropped (float64)."""
    p = check_p(p)
    keep = keep_mask(p, seed, offset, x.size).reshape(x.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(keep, x * (0.0 if p == 1.0 else 1.0 / (1.0 - p)), 0.0)


def dropout_bwd_ref(dy, p, seed, offset):
    """dx = dy / (1 - p) where the forward kept the element, 0 elsewhere: the same mask, regenerated."""
    return dropout_ref(dy, p, seed, offset)


# ------------------------------------------------------------------ one scalar Philox for CPU and GPU
def philox10(c0, c1, c2, c3, k0, k1):
    """Philox-4x32-10 of one counter: four uint32 in, four uint32 out. The high half of each 32x32 product
    is taken from a 64-bit product (exact, since both factors are < 2^32)."""
    c0, c1, c2, c3 = np.uint32(c0), np.uint32(c1), np.uint32(c2), np.uint32(c3)
    k0, k1 = np.uint32(k0), np.uint32(k1)
    for r in range(ROUNDS):
        if r > 0:  # bump the key between rounds
            k0 = np.uint32((np.uint64(k0) + W0_64) & LO32)
            k1 = np.uint32((np.uint64(k1) + W1_64) & LO32)
        p0 = np.uint64(c0) * M0_64
        p1 = np.uint64(c2) * M1_64
        c0, c1, c2, c3 = (np.uint32((p1 >> SH32) ^ np.uint64(c1) ^ np.uint64(k0)), np.uint32(p1 & LO32),
                          np.uint32((p0 >> SH32) ^ np.uint64(c3) ^ np.uint64(k1)), np.uint32(p0 & LO32))
    return c0, c1, c2, c3


def philox10_mulhi(c0, c1, c2, c3, k0, k1):
    """The same function with libdevice umulhi (cuda.libdevice.umulhi, PTX mul.hi.u32) for the high halves and a 32-bit product (mul.lo)
    for the low ones: two instructions where the 64-bit product may be one mul.wide (GPU only)."""
    c0, c1, c2, c3 = np.uint32(c0), np.uint32(c1), np.uint32(c2), np.uint32(c3)
    k0, k1 = np.uint32(k0), np.uint32(k1)
    for r in range(ROUNDS):
        if r > 0:
            k0 = np.uint32(k0 + np.uint32(W0))
            k1 = np.uint32(k1 + np.uint32(W1))
        hi0 = cuda.libdevice.umulhi(c0, M0_32)
        hi1 = cuda.libdevice.umulhi(c2, M1_32)
        lo0 = np.uint32(c0 * M0_32)
        lo1 = np.uint32(c2 * M1_32)
        c0, c1, c2, c3 = np.uint32(hi1 ^ c1 ^ k0), lo1, np.uint32(hi0 ^ c3 ^ k1), lo0
    return c0, c1, c2, c3


def keep_s(bits, t):
    """Is the element with these random bits kept? (bits >> 8) >= t, t = ceil(p * 2^24)."""
    return (np.uint32(bits) >> SH8) >= t


def drop_s(v, bits, t, scale):
    """One dropout element: v * scale if kept, else exactly 0."""
    return v * scale if (np.uint32(bits) >> SH8) >= t else F0


def uniform_s(bits):
    return np.float32(np.uint32(bits) >> SH8) * U24_F32


philox10_cpu = njit(inline="always")(philox10)
philox10_dev = cuda.jit(device=True, inline="always")(philox10)
philox10_mulhi_dev = cuda.jit(device=True, inline="always")(philox10_mulhi)
drop_cpu = njit(inline="always")(drop_s)
drop_dev = cuda.jit(device=True, inline="always")(drop_s)
uniform_cpu = njit(inline="always")(uniform_s)
uniform_dev = cuda.jit(device=True, inline="always")(uniform_s)

THREADS = 256
U1, U2, F1D = "uint32[:, ::1]", "uint32[::1]", "float32[::1]"
F2D = "float32[:, ::1]"
SCALARS = "uint32, float32, uint32, uint32, uint32, uint32"  # t, scale, k0, k1, o0, o1


def _threads():
    return 32 if device.SIMULATED else THREADS


# =============================================================================== op 1: philox (KAT form)
def philox_inputs(size, dtype, rng):
    (n,) = size
    ctr = rng.integers(0, 1 << 32, size=(n, 4), dtype=np.uint64).astype(np.uint32)
    key = rng.integers(0, 1 << 32, size=2, dtype=np.uint64).astype(np.uint32)
    k = min(n, len(KAT))  # the known answers' counters ride along in the first rows (with this key)
    for i in range(k):
        ctr[i] = KAT[i][0]
    return ctr, key


define_op("philox", reference=philox_ref, make_inputs=philox_inputs, chapter=16,
          title="Philox-4x32-10 block function", size_names=("n",), kind="memory", tol=(0.0, 0.0),
          output_names=("out",),
          sizes={"check": [(1,), (3,), (7,), (1000,), (4099,)], "check_sim": [(1,), (3,), (37,)],
                 "bench": [(1 << 20,)], "bench_gpu": [(1 << 26,)], "bench_sim": [(37,)]},
          # integer work: 10 rounds of 2 multiplies (wide), 4 XORs, 2 key adds = ~80 instructions per counter
          flops=lambda s: 80 * s[0], bytes=lambda s, b: 32 * s[0])  # 16 bytes in, 16 out per counter


@njit
def philox_loop(out, ctr, key):
    for i in range(ctr.shape[0]):
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = philox10_cpu(ctr[i, 0], ctr[i, 1], ctr[i, 2], ctr[i, 3],
                                                                  key[0], key[1])


@njit(parallel=True)
def philox_ploop(out, ctr, key):
    for i in prange(ctr.shape[0]):
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = philox10_cpu(ctr[i, 0], ctr[i, 1], ctr[i, 2], ctr[i, 3],
                                                                  key[0], key[1])


@register("philox", "cpu", "loop", rung=1)
def philox_cpu(out, ctr, key):
    """@njit loop, one counter at a time: ten rounds of 64-bit products on one core."""
    philox_loop(out, ctr, key)


@register("philox", "cpu", "prange", rung=2)
def philox_cpu_par(out, ctr, key):
    """The counters split over the cores with prange: every counter is independent (that is the point of a
    counter-based generator), so predict a speed-up equal to the number of cores while compute-bound."""
    philox_ploop(out, ctr, key)


@cuda.jit
def philox_kernel(out, ctr, key):
    i = cuda.grid(1)
    if i < ctr.shape[0]:
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = philox10_dev(ctr[i, 0], ctr[i, 1], ctr[i, 2], ctr[i, 3],
                                                                  key[0], key[1])


@cuda.jit
def philox_mulhi_kernel(out, ctr, key):
    i = cuda.grid(1)
    if i < ctr.shape[0]:
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = philox10_mulhi_dev(ctr[i, 0], ctr[i, 1], ctr[i, 2],
                                                                        ctr[i, 3], key[0], key[1])


@register("philox", "gpu", "thread", rung=1, ptx=[(philox_kernel, f"void({U1}, {U1}, {U2})")])
def philox_gpu(out, ctr, key):
    """One thread per counter; the high half of each product from a 64-bit product (PTX mul.wide.u32). Reads
    16 and writes 16 bytes per counter against ~80 integer instructions: predict memory-bound, near copy
    bandwidth on the H100."""
    n = ctr.shape[0]
    philox_kernel[max(1, ceil_div(n, _threads())), _threads()](out, ctr, key)


def _mulhi_gpu():
    """``requires=`` for the mulhi rung: umulhi exists on a real GPU (and in PTX), not in the simulator."""
    if device.MODE != "gpu":
        return False, "umulhi needs a real GPU (the CUDA simulator has no mulhi)"
    return True, ""


@register("philox", "gpu", "mulhi", rung=2, requires=_mulhi_gpu,
          ptx=[(philox_mulhi_kernel, f"void({U1}, {U1}, {U2})")])
def philox_gpu_mulhi(out, ctr, key):
    """libdevice umulhi (mul.hi.u32) and a 32-bit mul.lo instead of one 64-bit product: the form CUDA C's Philox
    uses. Same bits (checked against the same reference); predict the same time as rung 1 (memory-bound).
    Real GPU only: the CUDA simulator has no umulhi."""
    n = ctr.shape[0]
    philox_mulhi_kernel[max(1, ceil_div(n, THREADS)), THREADS](out, ctr, key)


# ================================================================= op 2: philox_uniform (the stream)
def uniform_inputs(size, dtype, rng):
    (n,) = size
    return int(rng.integers(0, 1 << 63)) * 2 + 1, int(rng.integers(0, 1 << 40)), n  # seed, offset, n


define_op("philox_uniform", reference=philox_uniform_ref, make_inputs=uniform_inputs, chapter=16,
          title="uniform float32 stream from Philox", size_names=("n",), kind="memory", tol=(0.0, 0.0),
          output_names=("u",),
          sizes={"check": [(1,), (3,), (7,), (1000,), (4099,)], "check_sim": [(1,), (7,), (130,)],
                 "bench": [(1 << 22,)], "bench_gpu": [(1 << 28,)], "bench_sim": [(130,)]},
          flops=lambda s: 20 * s[0], bytes=lambda s, b: 4 * s[0])  # writes 4 bytes per number, reads nothing


@register("philox_uniform", "cpu", "numpy", baseline=True)
def uniform_numpy(u, seed, offset, n):
    """The NumPy formula: Philox over all counters at once in uint64 arrays, then (bits >> 8) * 2^-24."""
    u[:] = uniforms(seed, offset, n)


def _stream_args(seed, offset):
    k0, k1 = split64(seed)
    o0, o1 = split64(offset)
    return k0, k1, o0, o1


@njit
def uniform_loop(u, k0, k1, o0, o1):
    n = u.size
    for g in range((n + 3) // 4):
        r = philox10_cpu(np.uint32(g & 0xFFFFFFFF), np.uint32(g >> 32), o0, o1, k0, k1)
        for j in range(min(4, n - 4 * g)):
            u[4 * g + j] = uniform_cpu(r[j])


@njit(parallel=True)
def uniform_ploop(u, k0, k1, o0, o1):
    n = u.size
    for g in prange((n + 3) // 4):
        r = philox10_cpu(np.uint32(g & 0xFFFFFFFF), np.uint32(g >> 32), o0, o1, k0, k1)
        for j in range(min(4, n - 4 * g)):
            u[4 * g + j] = uniform_cpu(r[j])


@register("philox_uniform", "cpu", "loop", rung=1)
def uniform_cpu_loop(u, seed, offset, n):
    """@njit: one Philox call per group of four outputs, then (bits >> 8) * 2^-24 in float32."""
    uniform_loop(u, *_stream_args(seed, offset))


@register("philox_uniform", "cpu", "prange", rung=2)
def uniform_cpu_par(u, seed, offset, n):
    """The groups of four over the cores (prange): compute-bound, so predict a speed-up equal to the cores."""
    uniform_ploop(u, *_stream_args(seed, offset))


@cuda.jit
def uniform_thread4_kernel(u, k0, k1, o0, o1):
    g = cuda.grid(1)
    n = u.size
    i = 4 * g
    if i < n:
        r0, r1, r2, r3 = philox10_dev(np.uint32(g), np.uint32(0), o0, o1, k0, k1)
        u[i] = uniform_dev(r0)
        if i + 1 < n:
            u[i + 1] = uniform_dev(r1)
        if i + 2 < n:
            u[i + 2] = uniform_dev(r2)
        if i + 3 < n:
            u[i + 3] = uniform_dev(r3)


@cuda.jit
def uniform_vec4_kernel(u, k0, k1, o0, o1):
    g = cuda.grid(1)
    n = u.size
    if 4 * g < n:
        r0, r1, r2, r3 = philox10_dev(np.uint32(g), np.uint32(0), o0, o1, k0, k1)
        if 4 * g + 3 < n:
            store4(u, g, uniform_dev(r0), uniform_dev(r1), uniform_dev(r2), uniform_dev(r3))
        else:  # the ragged last group: at most 3 elements, one at a time
            u[4 * g] = uniform_dev(r0)
            if 4 * g + 1 < n:
                u[4 * g + 1] = uniform_dev(r1)
            if 4 * g + 2 < n:
                u[4 * g + 2] = uniform_dev(r2)


U_SIG = f"void({F1D}, uint32, uint32, uint32, uint32)"


def _groups_check(n):
    if n > (1 << 34):  # g must fit in 32 bits for the GPU kernels' counter word c0 (c1 is 0)
        raise ValueError(f"the GPU stream kernels handle up to 2^34 elements, not {n}")
    return (n + 3) // 4


@register("philox_uniform", "gpu", "thread4", rung=1, ptx=[(uniform_thread4_kernel, U_SIG)])
def uniform_gpu_thread4(u, seed, offset, n):
    """One thread per Philox call, i.e. per 4 outputs, written as four 4-byte stores. ~80 integer instructions
    per 16 bytes written: predict near copy bandwidth's write half, if the integer units keep up."""
    groups = _groups_check(n)
    uniform_thread4_kernel[max(1, ceil_div(groups, _threads())), _threads()](u, *_stream_args(seed, offset))


@register("philox_uniform", "gpu", "vec4", rung=2, ptx=[(uniform_vec4_kernel, U_SIG)])
def uniform_gpu_vec4(u, seed, offset, n):
    """The four outputs of one Philox call written with one 16-byte store (store4): a quarter of the store
    instructions of rung 1. Predict a few percent faster than rung 1 (stores were not the limit)."""
    groups = _groups_check(n)
    uniform_vec4_kernel[max(1, ceil_div(groups, _threads())), _threads()](u, *_stream_args(seed, offset))


# ========================================================================= op 3 and 4: dropout, backward
def dropout_inputs(size, dtype, rng):
    (n,) = size
    p = float(rng.choice([0.1, 0.25, 0.5, 0.9]))
    return rng.standard_normal(n).astype(dtype), p, int(rng.integers(0, 1 << 62)), int(rng.integers(0, 1 << 40))


def dropout_edge_inputs(size, dtype, rng):
    """p = 1, 1/3 or 1/2 with NaN and infinities in an eighth of x and signed zeros: a dropped NaN or infinity must
    come out exactly 0 (a product by 0 would give NaN). p = 0 is tested by tests/test_ch16_random.py."""
    x, _, seed, offset = dropout_inputs(size, dtype, rng)
    n_bad = max(1, x.size // 8)
    pos = rng.permutation(x.size)[:n_bad]
    x[pos] = rng.choice(np.array([np.nan, np.inf, -np.inf], dtype=x.dtype), size=pos.size)
    _sprinkle(x, rng, [-0.0, 0.0, 1e30, -1e-30])
    return x, float(rng.choice([1.0, 1.0 / 3.0, 0.5])), seed, offset


DROPOUT_SIZES = {"check": [(1,), (3,), (7,), (257,), (1000,), (4099,)], "check_sim": [(1,), (7,), (130,)],
                 "bench": [(1 << 22,)], "bench_gpu": [(1 << 28,)], "bench_sim": [(130,)]}
# A kept element is x * float32(1 / (1 - p)): two roundings (the scale, the product) against the float64
# reference, so |err| <= 2^-23 |y|; rtol 1e-6 leaves room, atol 0 (a dropped element is exactly 0).
DROPOUT_TOL = (1e-6, 0.0)
for _name, _ref, _title in (("dropout", dropout_ref, "dropout forward (mask regenerated from seed, offset)"),
                            ("dropout_bwd", dropout_bwd_ref, "dropout backward (the same mask, regenerated)")):
    define_op(_name, reference=_ref, make_inputs=dropout_inputs, chapter=16, title=_title, size_names=("n",),
              kind="memory", tol=DROPOUT_TOL, output_names=("y",) if _name == "dropout" else ("dx",),
              sizes=DROPOUT_SIZES, flops=lambda s: 21 * s[0], bytes=lambda s, b: 2 * s[0] * b,
              edge_inputs=dropout_edge_inputs)
EDGE_INPUTS["dropout"] = EDGE_INPUTS["dropout_bwd"] = dropout_edge_inputs


def dropout_args(p, seed, offset):
    """The kernels' scalar arguments: t = ceil(p 2^24), scale, the key and the offset as uint32 words."""
    return (np.uint32(keep_threshold(p)), dropout_scale(p), *_stream_args(seed, offset))


@njit
def dropout_loop(y, x, t, scale, k0, k1, o0, o1):
    n = x.size
    for g in range((n + 3) // 4):
        r = philox10_cpu(np.uint32(g & 0xFFFFFFFF), np.uint32(g >> 32), o0, o1, k0, k1)
        for j in range(min(4, n - 4 * g)):
            y[4 * g + j] = drop_cpu(x[4 * g + j], r[j], t, scale)


@njit(parallel=True)
def dropout_ploop(y, x, t, scale, k0, k1, o0, o1):
    n = x.size
    for g in prange((n + 3) // 4):
        r = philox10_cpu(np.uint32(g & 0xFFFFFFFF), np.uint32(g >> 32), o0, o1, k0, k1)
        for j in range(min(4, n - 4 * g)):
            y[4 * g + j] = drop_cpu(x[4 * g + j], r[j], t, scale)


@cuda.jit
def dropout_thread4_kernel(y, x, t, scale, k0, k1, o0, o1):
    # x (n,) -> y (n,): thread g owns elements 4g .. 4g+3 and makes their four random words with ONE Philox
    # call at counter (g, 0, offset): no mask is read or written
    g = cuda.grid(1)
    n = x.size
    i = 4 * g
    if i < n:
        r0, r1, r2, r3 = philox10_dev(np.uint32(g), np.uint32(0), o0, o1, k0, k1)
        y[i] = drop_dev(x[i], r0, t, scale)
        if i + 1 < n:
            y[i + 1] = drop_dev(x[i + 1], r1, t, scale)
        if i + 2 < n:
            y[i + 2] = drop_dev(x[i + 2], r2, t, scale)
        if i + 3 < n:
            y[i + 3] = drop_dev(x[i + 3], r3, t, scale)


@cuda.jit
def dropout_vec4_kernel(y, x, t, scale, k0, k1, o0, o1):
    # as dropout_thread4_kernel, with the four elements read by one 16-byte load and written by one store
    g = cuda.grid(1)
    n = x.size
    if 4 * g < n:
        r0, r1, r2, r3 = philox10_dev(np.uint32(g), np.uint32(0), o0, o1, k0, k1)
        if 4 * g + 3 < n:
            a, b, c, d = load4(x, g)
            store4(y, g, drop_dev(a, r0, t, scale), drop_dev(b, r1, t, scale), drop_dev(c, r2, t, scale),
                   drop_dev(d, r3, t, scale))
        else:  # the ragged last group (n % 4 elements), one element at a time
            y[4 * g] = drop_dev(x[4 * g], r0, t, scale)
            if 4 * g + 1 < n:
                y[4 * g + 1] = drop_dev(x[4 * g + 1], r1, t, scale)
            if 4 * g + 2 < n:
                y[4 * g + 2] = drop_dev(x[4 * g + 2], r2, t, scale)


D_SIG = f"void({F1D}, {F1D}, {SCALARS})"


def dropout_cpu(y, x, p, seed, offset):
    """@njit loop over groups of four: one Philox call gives the four random words of a group; the mask is
    never stored."""
    dropout_loop(y, x, *dropout_args(p, seed, offset))


def dropout_cpu_par(y, x, p, seed, offset):
    """The groups over the cores with prange. Rung 1 is bound by Philox's ~20 integer instructions per element
    on one core; predict a speed-up equal to the number of cores."""
    dropout_ploop(y, x, *dropout_args(p, seed, offset))


def dropout_gpu_thread4(y, x, p, seed, offset):
    """One thread per four elements: one Philox call makes their four random words in registers; four 4-byte
    loads and stores. 8 bytes per element cross the bus and no mask: predict ~85 % of copy bandwidth."""
    args = dropout_args(p, seed, offset)
    groups = _groups_check(x.size)
    dropout_thread4_kernel[max(1, ceil_div(groups, _threads())), _threads()](y, x, *args)


def dropout_gpu_vec4(y, x, p, seed, offset):
    """Rung 1 with one 16-byte load of x and one 16-byte store of y per thread (load4/store4): a quarter of the
    memory instructions. Predict >= 90 % of copy bandwidth at 2^28 elements, so faster than torch's dropout,
    which also writes a mask (1 byte per element) it keeps for the backward."""
    args = dropout_args(p, seed, offset)
    if not _aligned16(y, x):
        return dropout_gpu_thread4(y, x, p, seed, offset)
    groups = _groups_check(x.size)
    dropout_vec4_kernel[max(1, ceil_div(groups, _threads())), _threads()](y, x, *args)


def dropout_numpy(y, x, p, seed, offset):
    """The NumPy formula: the whole stream's bits in uint64 arrays, a boolean mask, then np.where."""
    keep = keep_mask(p, seed, offset, x.size)
    np.multiply(x, dropout_scale(p), out=y)
    y[~keep] = F0


# torch's own dropout draws from torch's generator in its own layout, so its output cannot match the course's
# stream element by element. It is a speed yardstick only: (0, inf) accepts any finite value where the
# reference is finite (a NaN or an unwritten, poisoned element still fails); non-finite inputs are exempt.
STREAM_DIFFERS = (0.0, math.inf)
STREAM_EXEMPT = "torch's dropout uses torch's generator, not the course's stream: a speed yardstick only"


def dropout_torch_cpu(y, x, p, seed, offset):
    """torch.nn.functional.dropout(x, p, training=True) on the CPU (torch's generator: speed only), copied into
    y (torch has no out= for dropout); it draws a Bernoulli mask tensor, then multiplies."""
    import torch

    ty, tx = tviews(y, x)
    ty.copy_(torch.nn.functional.dropout(tx, p, training=True))


def dropout_torch_gpu(y, x, p, seed, offset):
    """torch.nn.functional.dropout(x, p, training=True) on the GPU: torch's fused kernel reads x, writes its
    output and a 1-byte mask it keeps for the backward (9 bytes per element); copied into y (torch has no out=
    for dropout), which adds 8 bytes per element to what is timed. Speed only: torch's stream differs."""
    import torch

    ty, tx = torch.as_tensor(y, device="cuda"), torch.as_tensor(x, device="cuda")
    ty.copy_(torch.nn.functional.dropout(tx, p, training=True))


def _torch_bytes(s, b):
    return 17 * s[0]  # x read, output and mask written by dropout (9 bytes), then the copy into y (8)


for _name in ("dropout", "dropout_bwd"):
    register(_name, "cpu", "numpy", baseline=True)(dropout_numpy)
    register(_name, "cpu", "torch", baseline=True, requires=torch_cpu, tol=STREAM_DIFFERS,
             edge_exempt=STREAM_EXEMPT)(dropout_torch_cpu)
    register(_name, "cpu", "loop", rung=1)(dropout_cpu)
    register(_name, "cpu", "prange", rung=2)(dropout_cpu_par)
    register(_name, "gpu", "torch", baseline=True, requires=torch_gpu, tol=STREAM_DIFFERS, bytes=_torch_bytes,
             edge_exempt=STREAM_EXEMPT)(dropout_torch_gpu)
    register(_name, "gpu", "thread4", rung=1, ptx=[(dropout_thread4_kernel, D_SIG)])(dropout_gpu_thread4)
    register(_name, "gpu", "vec4", rung=2, ptx=[(dropout_vec4_kernel, D_SIG)])(dropout_gpu_vec4)


def dropout(x, p, seed, offset=0, out=None):
    """y = dropout(x) on whatever ``x`` is (a NumPy array: the CPU prange rung; a device array: the GPU vec4
    rung), with the mask of the stream (seed, offset). The backward is the same call on dy."""
    check_p(p)
    x_is_dev = hasattr(x, "__cuda_array_interface__") and not isinstance(x, np.ndarray)
    if x_is_dev:
        y = out if out is not None else cuda.device_array_like(x)
        dropout_gpu_vec4(y.reshape(-1), x.reshape(-1), p, seed, offset)
        return y
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = out if out is not None else np.empty_like(x)
    dropout_cpu_par(y.reshape(-1), x.reshape(-1), p, seed, offset)
    return y
