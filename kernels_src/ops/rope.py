"""Rotary position embedding (RoPE), both pair conventions, forward and backward, and a fused
RoPE + KV-cache write (chapter 10).

Shapes: x (T,H,D) one row of H heads per token; pos (T,) int32 the token positions;
        cos, sin (P, R/2) the cache: cos[p, i] = cos(p * theta_i), theta_i = base^(-2i/R), P >= max(pos)+1
        -> y (T,H,D). R = rotary_dim <= D (even); dimensions R..D-1 pass through unchanged (partial rotary).
Each rotated pair (a, b) of a head becomes (a c - b s, b c + a s) with c, s = cos, sin[pos[t], i].
  half-split  (GPT-NeoX, Hugging Face `rotate_half`): pair i is (i, i + R/2)
  interleaved (GPT-J, Meta's Llama weights, llama.cpp "normal"): pair i is (2i, 2i + 1)
Backward: the map is a rotation, so its Jacobian transpose is the rotation by -theta: dx = R(-theta) dy,
the same kernel with sin negated (ops `rope_bwd`, `rope_interleaved_bwd`).
Cost: 6 FLOPs per rotated pair (4 mul, 2 add); bytes: read x, write y (2*T*H*D elements) plus the
gathered cache rows (T*R elements), so at H = 32 the cache adds 1.6 % to the traffic. Memory-bound.

Ladder (every op: rope, rope_bwd, rope_interleaved, rope_interleaved_bwd)
  cpu/loop      rung 1  three nested loops (token, head, pair)
  cpu/prange    rung 2  tokens spread over the cores
  gpu/elem      rung 1  one thread per OUTPUT element: it loads its own value, its partner and (c, s)
  gpu/token     rung 2  one block per token; a thread owns one pair index i, loads (c, s) once and loops
                        over the heads: half the loads of rung 1, and safe to run in place
  gpu/unrolled  rung 3  rung 2 with 8 heads per thread in a loop of compile-time length: all 16 loads of
                        a thread are in flight before its first store (memory-level parallelism)
  gpu/torch     baseline (rope only) Hugging Face's formula in torch eager: x*cos + rotate_half(x)*sin
  gpu/compile   baseline (rope only) the same function through torch.compile (one fused Triton kernel)

Fused op rope_kv_write (decode/prefill glue): qkv (B,T,Hq+2Hkv,D) -- a projection's output, heads
in the order [q heads | k heads | v heads] -- start (B,) int32, cos, sin (P, D/2) ->
  q (B,Hq,T,D)        rotated queries, head-major for attention
  K, V (B,Hkv,Lmax,D) the cache, with rows start[b] .. start[b]+T-1 written (K rotated, V copied).
The reference leaves every other cache row undefined (NaN): a kernel must not touch them, so in
`kernels check` an unwritten row passes only because it stays the poison NaN, and a stray write fails.
  cpu/loop rung 1, gpu/token rung 1 (one block per token: one read of qkv, one write of everything).

In place: rungs gpu/token and gpu/unrolled read a pair and writes it back from the same thread, so `rope_inplace(x, ...)`
may pass y = x; the element rung may not (a thread could overwrite its partner before the partner's
thread reads it).
"""
import math

import numpy as np
from ..compiler import cuda, float32, njit, prange

from .. import device
from ..device import ceil_div
from ..registry import define_op, register
from .reductions import FAST_MATH, torch_gpu, torch_view

BASE = 10000.0  # Llama 1/2 and GPT-NeoX; Llama 3 uses 500000


# --------------------------------------------------------------------------------------- the math
def inv_freq(rotary_dim, base=BASE, dtype=np.float64):
    """theta_i = base^(-2i/R), i = 0 .. R/2-1: the angle per position of pair i (radians)."""
    i = np.arange(rotary_dim // 2, dtype=np.float64)
    return (base ** (-2.0 * i / rotary_dim)).astype(dtype)


def cos_sin_cache(n_pos, rotary_dim, base=BASE, dtype=np.float32):
    """The (P, R/2) cos and sin tables, computed in float64 and rounded once to ``dtype``."""
    ang = np.outer(np.arange(n_pos, dtype=np.float64), inv_freq(rotary_dim, base))
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def pair_index(rotary_dim, interleaved):
    """(first, second) dimension of each pair i, as two index arrays of length R/2."""
    i = np.arange(rotary_dim // 2)
    return (2 * i, 2 * i + 1) if interleaved else (i, i + rotary_dim // 2)


def rotate(x, pos, cos, sin, interleaved=False, inverse=False):
    """float64 oracle for every RoPE op: rotate the pairs of x (T,H,D) by +-theta(pos)."""
    x = np.asarray(x, dtype=np.float64)
    r2 = cos.shape[1]
    c = np.asarray(cos, np.float64)[pos][:, None, :]  # (T,1,R/2)
    s = np.asarray(sin, np.float64)[pos][:, None, :] * (-1.0 if inverse else 1.0)
    i0, i1 = pair_index(2 * r2, interleaved)
    a, b = x[..., i0], x[..., i1]
    y = x.copy()
    y[..., i0] = a * c - b * s
    y[..., i1] = b * c + a * s
    return y


def reference(x, pos, cos, sin):
    return rotate(x, pos, cos, sin)


def reference_bwd(dy, pos, cos, sin):
    return rotate(dy, pos, cos, sin, inverse=True)


def reference_interleaved(x, pos, cos, sin):
    return rotate(x, pos, cos, sin, interleaved=True)


def reference_interleaved_bwd(dy, pos, cos, sin):
    return rotate(dy, pos, cos, sin, interleaved=True, inverse=True)


def make_inputs(size, dtype, rng):
    """x ~ N(0,1) (T,H,D); positions drawn from [0, 2T+8) (not sorted: the kernel must gather);
    the cache for base 10000 and rotary_dim R."""
    t, h, d, r = size
    x = rng.standard_normal((t, h, d)).astype(dtype)
    n_pos = 2 * t + 8
    pos = rng.integers(0, n_pos, size=t).astype(np.int32)
    cos, sin = cos_sin_cache(n_pos, r, dtype=dtype)
    return x, pos, cos, sin


def make_edge_inputs(size, dtype, rng):
    """Zeros, signed zeros, huge (1e30: a*c - b*s must not overflow in float32 for |c|,|s| <= 1
    unless both terms are huge) and tiny values, inf and NaN in x; the largest position in the cache."""
    x, pos, cos, sin = make_inputs(size, dtype, rng)
    flat = x.reshape(-1)
    vals = [0.0, -0.0, 1e30, -1e30, 1e-30, 1e-40, np.inf, np.nan]
    where = rng.permutation(flat.size)[: len(vals)]
    flat[where] = np.asarray(vals, dtype=dtype)[: len(where)]
    pos[-1] = cos.shape[0] - 1
    return x, pos, cos, sin


def _bytes(s, b):
    t, h, d, r = s
    return (2 * t * h * d + t * r) * b + 4 * t  # x, y, the gathered cos/sin rows, the positions


def _flops(s):
    t, h, d, r = s
    return 6 * t * h * (r // 2)


# Each output is a*c - b*s: two products and one add of O(1) values, one or two roundings in float32.
TOL = (1e-5, 2e-6)
SIZES = {"check": [(1, 1, 2, 2), (7, 3, 12, 8), (5, 4, 64, 64), (13, 2, 128, 64), (33, 5, 130, 130), (2, 1, 6, 4)],
         "check_sim": [(1, 1, 2, 2), (3, 2, 12, 8), (2, 3, 10, 10)],
         "bench": [(1024, 32, 128, 128)],
         "bench_gpu": [(1024, 32, 128, 128), (16384, 32, 128, 128)],
         "bench_sim": [(3, 2, 12, 8)]}
_common = dict(make_inputs=make_inputs, edge_inputs=make_edge_inputs, chapter=10, size_names=("T", "H", "D", "R"), kind="memory", tol=TOL,
               output_names=("y",), sizes=SIZES, flops=_flops, bytes=_bytes)
define_op("rope", reference=reference, title="RoPE, half-split pairs (GPT-NeoX / HF)", **_common)
define_op("rope_bwd", reference=reference_bwd, title="RoPE backward, half-split (rotation by -theta)",
          **{**_common, "output_names": ("dx",)})
define_op("rope_interleaved", reference=reference_interleaved, title="RoPE, interleaved pairs (GPT-J / Meta)",
          **_common)
define_op("rope_interleaved_bwd", reference=reference_interleaved_bwd, title="RoPE backward, interleaved",
          **{**_common, "output_names": ("dx",)})
OPS = {("rope", False, False), ("rope_bwd", False, True), ("rope_interleaved", True, False),
       ("rope_interleaved_bwd", True, True)}


# --------------------------------------------------------------------------------------------- CPU
def make_cpu(interleaved, inverse, parallel):
    sgn = np.float32(-1.0 if inverse else 1.0)

    @njit(parallel=parallel, cache=False, fastmath=FAST_MATH, error_model="numpy")
    def rope_cpu(y, x, pos, cos, sin):
        # x (T,H,D), pos (T,), cos/sin (P,R/2) -> y (T,H,D)
        t_n, h_n, d_n = x.shape
        r2 = cos.shape[1]
        for t in prange(t_n):
            p = pos[t]
            for h in range(h_n):
                for i in range(r2):
                    c = cos[p, i]
                    s = sgn * sin[p, i]
                    if interleaved:
                        i0 = 2 * i
                        i1 = 2 * i + 1
                    else:
                        i0 = i
                        i1 = i + r2
                    a = x[t, h, i0]
                    b = x[t, h, i1]
                    y[t, h, i0] = a * c - b * s
                    y[t, h, i1] = b * c + a * s
                for d in range(2 * r2, d_n):  # partial rotary: the rest passes through
                    y[t, h, d] = x[t, h, d]

    return rope_cpu


_CPU = {(il, inv, par): make_cpu(il, inv, par) for il in (False, True) for inv in (False, True)
        for par in (False, True)}


def _reg_cpu(op, il, inv):
    @register(op, "cpu", "loop", rung=1)
    def rope_loop(y, x, pos, cos, sin):
        """Three loops (token, head, pair); (c, s) looked up at the token's position. One pass over x:
        predict single-core memory bandwidth once T*H*D passes the caches."""
        _CPU[(il, inv, False)](y, x, pos, cos, sin)

    @register(op, "cpu", "prange", rung=2)
    def rope_prange(y, x, pos, cos, sin):
        """Tokens spread over the cores with prange (tokens are independent): predict up to the
        all-core copy bandwidth."""
        _CPU[(il, inv, True)](y, x, pos, cos, sin)


for _op, _il, _inv in sorted(OPS):
    _reg_cpu(_op, _il, _inv)


# --------------------------------------------------------------------------------------------- GPU
def _jit():
    return cuda.jit(fastmath=FAST_MATH)


def make_elem_kernel(interleaved, inverse):
    sgn = np.float32(-1.0 if inverse else 1.0)

    @_jit()
    def rope_elem_kernel(y, x, pos, cos, sin):
        # one thread per element of y (T,H,D); flat index -> (t, h, d)
        idx = cuda.grid(1)
        t_n, h_n, d_n = x.shape
        if idx >= t_n * h_n * d_n:
            return
        d = idx % d_n
        th = idx // d_n
        h = th % h_n
        t = th // h_n
        r2 = cos.shape[1]
        if d >= 2 * r2:  # partial rotary: pass through
            y[t, h, d] = x[t, h, d]
            return
        if interleaved:
            i = d // 2
            first = d % 2 == 0
            other = d + 1 if first else d - 1
        else:
            first = d < r2
            i = d if first else d - r2
            other = d + r2 if first else d - r2
        p = pos[t]
        c = cos[p, i]
        s = sgn * sin[p, i]
        if first:
            y[t, h, d] = x[t, h, d] * c - x[t, h, other] * s
        else:
            y[t, h, d] = x[t, h, d] * c + x[t, h, other] * s

    return rope_elem_kernel


def make_token_kernel(interleaved, inverse):
    sgn = np.float32(-1.0 if inverse else 1.0)

    @_jit()
    def rope_token_kernel(y, x, pos, cos, sin):
        # block t = one token; thread (i, lane): pair i of heads lane, lane + L, ... (L = blockDim / R2)
        t = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        h_n = x.shape[1]
        d_n = x.shape[2]
        r2 = cos.shape[1]
        lanes = cuda.blockDim.x // r2
        p = pos[t]
        i = tid % r2
        lane = tid // r2
        if lane < lanes:
            c = cos[p, i]
            s = sgn * sin[p, i]
            if interleaved:
                i0 = 2 * i
                i1 = 2 * i + 1
            else:
                i0 = i
                i1 = i + r2
            for h in range(lane, h_n, lanes):
                a = x[t, h, i0]
                b = x[t, h, i1]
                y[t, h, i0] = a * c - b * s
                y[t, h, i1] = b * c + a * s
        rest = d_n - 2 * r2
        if rest > 0:  # partial rotary: copy the other dimensions
            for j in range(tid, h_n * rest, cuda.blockDim.x):
                h = j // rest
                d = 2 * r2 + j % rest
                y[t, h, d] = x[t, h, d]

    return rope_token_kernel


HPT = 8  # heads per thread in rung 3 (a compile-time constant: the loop unrolls)


def make_unrolled_kernel(interleaved, inverse, hpt=HPT):
    sgn = np.float32(-1.0 if inverse else 1.0)

    @_jit()
    def rope_unrolled_kernel(y, x, pos, cos, sin):
        # block (t, head group): thread (i, lane) rotates pair i of heads hb + lane + k*lanes, k < hpt;
        # all 2*hpt loads are issued before the first store (local arrays of compile-time size)
        t = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        h_n = x.shape[1]
        d_n = x.shape[2]
        r2 = cos.shape[1]
        lanes = cuda.blockDim.x // r2
        i = tid % r2
        lane = tid // r2
        hb = cuda.blockIdx.y * lanes * hpt + lane
        if lane < lanes:
            p = pos[t]
            c = cos[p, i]
            s = sgn * sin[p, i]
            if interleaved:
                i0 = 2 * i
                i1 = 2 * i + 1
            else:
                i0 = i
                i1 = i + r2
            va = cuda.local.array(hpt, float32)
            vb = cuda.local.array(hpt, float32)
            for k in range(hpt):
                h = hb + k * lanes
                if h < h_n:
                    va[k] = x[t, h, i0]
                    vb[k] = x[t, h, i1]
            for k in range(hpt):
                h = hb + k * lanes
                if h < h_n:
                    y[t, h, i0] = va[k] * c - vb[k] * s
                    y[t, h, i1] = vb[k] * c + va[k] * s
        rest = d_n - 2 * r2
        if rest > 0 and cuda.blockIdx.y == 0:  # partial rotary: copy the other dimensions
            for j in range(tid, h_n * rest, cuda.blockDim.x):
                h = j // rest
                d = 2 * r2 + j % rest
                y[t, h, d] = x[t, h, d]

    return rope_unrolled_kernel


ELEM = {(il, inv): make_elem_kernel(il, inv) for il in (False, True) for inv in (False, True)}
TOKEN = {(il, inv): make_token_kernel(il, inv) for il in (False, True) for inv in (False, True)}
UNROLLED = {(il, inv): make_unrolled_kernel(il, inv) for il in (False, True) for inv in (False, True)}
SIG = "void(float32[:, :, ::1], float32[:, :, ::1], int32[::1], float32[:, ::1], float32[:, ::1])"
ELEM_THREADS = 256
TOKEN_THREADS = 256  # target block size of rung 2 (rounded down to a multiple of R/2)


def launch_elem(il, inv, y, x, pos, cos, sin):
    n = x.shape[0] * x.shape[1] * x.shape[2]
    if n:
        ELEM[(il, inv)][ceil_div(n, ELEM_THREADS), ELEM_THREADS](y, x, pos, cos, sin)


def token_threads(h, r2, target=TOKEN_THREADS):
    """Threads per block for rung 2: R/2 pair lanes times as many head lanes as fit in ``target``
    (at most H; at least 1, so R/2 up to 1024 works), and at least one warp."""
    if device.SIMULATED:
        target = 32
    lanes = max(1, min(h, target // max(r2, 1)))
    return max(32, min(1024, r2 * lanes)) if r2 else 32


def launch_token(il, inv, y, x, pos, cos, sin):
    t, h, d = x.shape
    if t:
        TOKEN[(il, inv)][t, token_threads(h, cos.shape[1])](y, x, pos, cos, sin)


def launch_unrolled(il, inv, y, x, pos, cos, sin):
    t, h, d = x.shape
    if t:
        threads = token_threads(h, cos.shape[1])
        lanes = max(1, threads // cos.shape[1])
        UNROLLED[(il, inv)][(t, ceil_div(h, lanes * HPT)), threads](y, x, pos, cos, sin)


def _reg_gpu(op, il, inv):
    @register(op, "gpu", "elem", rung=1, ptx=[(ELEM[(il, inv)], SIG)])
    def rope_elem(y, x, pos, cos, sin):
        """One thread per output element: each loads its value, its partner, the position and (c, s).
        Every x value is loaded twice (the second time from L1/L2) and (c, s) once per element
        instead of once per pair: DRAM traffic is still ~2 passes, so predict 70-90 % of copy
        bandwidth, limited by the extra load instructions and the index divisions."""
        launch_elem(il, inv, y, x, pos, cos, sin)

    @register(op, "gpu", "token", rung=2, ptx=[(TOKEN[(il, inv)], SIG)])
    def rope_token(y, x, pos, cos, sin):
        """One block per token; a thread owns pair i, loads (c, s) once and loops over heads: each x
        value is loaded once, the cache row once per token. Predict >= 90 % of copy bandwidth, and
        it can run in place (y = x)."""
        launch_token(il, inv, y, x, pos, cos, sin)

    @register(op, "gpu", "unrolled", rung=3, ptx=[(UNROLLED[(il, inv)], SIG)])
    def rope_unrolled(y, x, pos, cos, sin):
        """Rung 2 with the head loop unrolled (8 heads per thread, a compile-time count): each thread
        issues its 16 loads before its first store. On the H100 rung 2 keeps ~2 loads in flight per
        thread at 50 % occupancy (ncu: latency-bound). With 8x more bytes in flight, predict >= 90 %
        of copy bandwidth."""
        launch_unrolled(il, inv, y, x, pos, cos, sin)


for _op, _il, _inv in sorted(OPS):
    _reg_gpu(_op, _il, _inv)


def rope_inplace(x, pos, cos, sin, interleaved=False, inverse=False):
    """Rotate x in place on the GPU with the rung-3 kernel (what a model does to q and k)."""
    launch_unrolled(interleaved, inverse, x, x, pos, cos, sin)


# ------------------------------------------------------------------------------- torch baselines
_tcache: dict = {}


def torch_cos_sin(pos, cos, sin):
    """Hugging Face's layout: cos, sin gathered by position and duplicated to (T,1,R), computed once
    per forward pass (here: once per input set, outside the timed call)."""
    import torch

    key = (id(pos), id(cos), id(sin))
    hit = _tcache.get(key)
    if hit is None or hit[0] is not pos:
        p = torch_view(pos).long()
        c = torch_view(cos)[p]
        s = torch_view(sin)[p]
        hit = _tcache[key] = (pos, torch.cat((c, c), -1)[:, None, :].contiguous(),
                              torch.cat((s, s), -1)[:, None, :].contiguous())
    return hit[1], hit[2]


def rotate_half(x):
    """Hugging Face's rotate_half: (x1, x2) -> (-x2, x1) over the two halves of the last axis."""
    import torch

    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def hf_rope(y, x, c, s):
    """y[..., :R] = x*cos + rotate_half(x)*sin, y[..., R:] = x[..., R:] (torch tensors)."""
    r = c.shape[-1]
    xr = x[..., :r]
    y[..., :r] = xr * c + rotate_half(xr) * s
    if r < x.shape[-1]:
        y[..., r:] = x[..., r:]


_compiled: dict = {}


def compiled(name):
    import torch

    if name not in _compiled:
        fn = {"rope": hf_rope, "rope_inplace": _hf_inplace}[name]
        _compiled[name] = torch.compile(fn, dynamic=False)
    return _compiled[name]


def _hf_inplace(x, c, s):
    r = c.shape[-1]
    xr = x[..., :r]
    xr.copy_(xr * c + rotate_half(xr) * s)


@register("rope", "gpu", "torch", baseline=True, requires=torch_gpu)
def rope_torch(y, x, pos, cos, sin):
    """Hugging Face's apply_rotary_pos_emb in torch eager: x*cos + rotate_half(x)*sin, cos/sin
    gathered and duplicated beforehand. Several kernels and temporaries."""
    c, s = torch_cos_sin(pos, cos, sin)
    hf_rope(torch_view(y), torch_view(x), c, s)


@register("rope", "gpu", "compile", baseline=True, requires=torch_gpu)
def rope_compile(y, x, pos, cos, sin):
    """The same Python function through torch.compile (Inductor fuses it into one Triton kernel)."""
    c, s = torch_cos_sin(pos, cos, sin)
    compiled("rope")(torch_view(y), torch_view(x), c, s)


# -------------------------------------------------------------------- fused RoPE + KV-cache write
def reference_kv(qkv, start, cos, sin, hkv, l_max):
    """float64 oracle of rope_kv_write: (q (B,Hq,T,D), K (B,Hkv,Lmax,D), V) with NaN where not written."""
    qkv = np.asarray(qkv, np.float64)
    b_n, t_n, nh, d = qkv.shape
    hq = nh - 2 * hkv
    q = np.empty((b_n, hq, t_n, d))
    k = np.full((b_n, hkv, l_max, d), np.nan)
    v = np.full((b_n, hkv, l_max, d), np.nan)
    for b in range(b_n):
        pos = start[b] + np.arange(t_n)
        q[b] = rotate(qkv[b, :, :hq], pos, cos, sin).transpose(1, 0, 2)
        k[b, :, pos] = rotate(qkv[b, :, hq:hq + hkv], pos, cos, sin)  # (T,Hkv,D) rows
        v[b, :, pos] = qkv[b, :, hq + hkv:]
    return q, k, v


def make_inputs_kv(size, dtype, rng):
    """qkv (B,T,Hq+2Hkv,D) ~ N(0,1), start positions with start + T <= Lmax, the cache tables, and
    Hkv and Lmax as plain ints (how qkv splits, and the cache capacity)."""
    b_n, t_n, hq, hkv, d, l_max = size
    qkv = rng.standard_normal((b_n, t_n, hq + 2 * hkv, d)).astype(dtype)
    start = rng.integers(0, l_max - t_n + 1, size=b_n).astype(np.int32)
    cos, sin = cos_sin_cache(l_max, d, dtype=dtype)
    return qkv, start, cos, sin, hkv, l_max


KV_SIZES = {"check": [(1, 1, 1, 1, 2, 1), (2, 3, 4, 2, 8, 7), (3, 5, 6, 3, 12, 11), (1, 7, 8, 2, 64, 13)],
            "check_sim": [(1, 1, 1, 1, 2, 1), (2, 3, 4, 2, 8, 5)],
            "bench": [(1, 64, 32, 8, 128, 128)],
            "bench_gpu": [(64, 1, 32, 8, 128, 4096), (1, 4096, 32, 8, 128, 4096)],
            "bench_sim": [(2, 3, 4, 2, 8, 5)]}
define_op("rope_kv_write", reference=reference_kv, make_inputs=make_inputs_kv, chapter=10,
          title="fused RoPE + KV-cache write", size_names=("B", "T", "Hq", "Hkv", "D", "Lmax"), kind="memory",
          tol=TOL, output_names=("q", "K", "V"), sizes=KV_SIZES,
          flops=lambda s: 6 * s[0] * s[1] * (s[2] + s[3]) * s[4] // 2,
          bytes=lambda s, b: 2 * s[0] * s[1] * (s[2] + 2 * s[3]) * s[4] * b + s[0] * s[1] * s[4] * b)


@njit(cache=False, fastmath=FAST_MATH, error_model="numpy")
def rope_kv_cpu(q, k_cache, v_cache, qkv, start, cos, sin):
    b_n, t_n, nh, d = qkv.shape
    hq = q.shape[1]
    hkv = k_cache.shape[1]
    r2 = d // 2
    for b in range(b_n):
        for t in range(t_n):
            p = start[b] + t
            for j in range(hq + hkv):
                for i in range(r2):
                    c = cos[p, i]
                    s = sin[p, i]
                    a = qkv[b, t, j, i]
                    bb = qkv[b, t, j, i + r2]
                    if j < hq:
                        q[b, j, t, i] = a * c - bb * s
                        q[b, j, t, i + r2] = bb * c + a * s
                    else:
                        k_cache[b, j - hq, p, i] = a * c - bb * s
                        k_cache[b, j - hq, p, i + r2] = bb * c + a * s
            for j in range(hkv):
                for i in range(d):
                    v_cache[b, j, p, i] = qkv[b, t, hq + hkv + j, i]


@register("rope_kv_write", "cpu", "loop", rung=1)
def rope_kv_write_cpu(q, k_cache, v_cache, qkv, start, cos, sin, hkv, l_max):
    """Loops over (batch, token, head, pair): q rotated into (B,Hq,T,D), k rotated and v copied into
    the cache rows start[b] + t. One read of qkv, one write of each output element."""
    rope_kv_cpu(q, k_cache, v_cache, qkv, start, cos, sin)


@njit(parallel=True, cache=False, fastmath=FAST_MATH, error_model="numpy")
def rope_kv_prange(q, k_cache, v_cache, qkv, start, cos, sin):
    b_n, t_n, nh, d = qkv.shape
    hq = q.shape[1]
    hkv = k_cache.shape[1]
    r2 = d // 2
    for btj in prange(b_n * t_n * nh):  # one head row of one token per iteration: D contiguous floats
        j = btj % nh
        t = (btj // nh) % t_n
        b = btj // (nh * t_n)
        p = start[b] + t
        if j < hq:  # the branch is outside the pair loop, so each loop below is straight-line SIMD
            for i in range(r2):
                a = qkv[b, t, j, i]
                bb = qkv[b, t, j, i + r2]
                q[b, j, t, i] = a * cos[p, i] - bb * sin[p, i]
                q[b, j, t, i + r2] = bb * cos[p, i] + a * sin[p, i]
        elif j < hq + hkv:
            for i in range(r2):
                a = qkv[b, t, j, i]
                bb = qkv[b, t, j, i + r2]
                k_cache[b, j - hq, p, i] = a * cos[p, i] - bb * sin[p, i]
                k_cache[b, j - hq, p, i + r2] = bb * cos[p, i] + a * sin[p, i]
        else:
            for i in range(d):
                v_cache[b, j - hq - hkv, p, i] = qkv[b, t, j, i]


@register("rope_kv_write", "cpu", "prange", rung=2)
def rope_kv_write_prange(q, k_cache, v_cache, qkv, start, cos, sin, hkv, l_max):
    """Head rows over the cores (issue 36): prange over (batch, token, head), the q / k / v choice made once
    per row instead of once per pair, so each row is one unit-stride loop of packed multiplies and FMAs (kernels
    asm). Rung 1 ran serially at ~43 % of copy; predict >= 70 %."""
    rope_kv_prange(q, k_cache, v_cache, qkv, start, cos, sin)


@_jit()
def rope_kv_kernel(q, k_cache, v_cache, qkv, start, cos, sin):
    # block (t, b): one token; threads stride over (head j of Hq+2Hkv, pair i of D/2)
    t = cuda.blockIdx.x
    b = cuda.blockIdx.y
    nh = qkv.shape[2]
    d = qkv.shape[3]
    hq = q.shape[1]
    hkv = k_cache.shape[1]
    r2 = d // 2
    p = start[b] + t
    for j in range(cuda.threadIdx.x, nh * r2, cuda.blockDim.x):
        h = j // r2
        i = j % r2
        a = qkv[b, t, h, i]
        bb = qkv[b, t, h, i + r2]
        if h < hq + hkv:
            c = cos[p, i]
            s = sin[p, i]
            y0 = a * c - bb * s
            y1 = bb * c + a * s
            if h < hq:
                q[b, h, t, i] = y0
                q[b, h, t, i + r2] = y1
            else:
                k_cache[b, h - hq, p, i] = y0
                k_cache[b, h - hq, p, i + r2] = y1
        else:
            v_cache[b, h - hq - hkv, p, i] = a
            v_cache[b, h - hq - hkv, p, i + r2] = bb


SIG_KV = ("void(float32[:, :, :, ::1], float32[:, :, :, ::1], float32[:, :, :, ::1], float32[:, :, :, ::1], "
          "int32[::1], float32[:, ::1], float32[:, ::1])")


@register("rope_kv_write", "gpu", "token", rung=1, ptx=[(rope_kv_kernel, SIG_KV)])
def rope_kv_write_gpu(q, k_cache, v_cache, qkv, start, cos, sin, hkv, l_max):
    """One block per (token, batch): the token's Hq+2Hkv heads are read once; q and k are rotated,
    v copied, each written once to its place (q head-major, k and v at cache row start+t). Fusing
    saves the separate passes a rope-then-copy pipeline makes (read qkv, write q/k, read k/v, write
    the cache): predict ~2x fewer bytes than unfused, near copy bandwidth for prefill (T large)."""
    b_n, t_n, nh, d = qkv.shape
    if b_n * t_n:
        threads = 32 if device.SIMULATED else 256
        rope_kv_kernel[(t_n, b_n), threads](q, k_cache, v_cache, qkv, start, cos, sin)
