"""Segmented prefix sum: an inclusive scan that restarts at every segment head (chapter 15).

Shapes: x (n,), heads (n,) int32 -> out (n,)
        out[i] = x[h] + x[h + 1] + ... + x[i], where h <= i is the last index with heads[h] != 0 (or 0 if none)
Cost:   n - 1 additions; 12n bytes in int32/float32 (x and heads read once, out written once).

Why head flags and not offsets. The segments come as one int32 flag per element (nonzero: a segment starts
here), not as an offsets array (S + 1 segment starts). A flag travels with its element, so every scan rung
tiles x and heads the same way and a tile never searches for its segments; and the operator on (flag, value)
pairs, (f1, v1) + (f2, v2) = (f1 | f2, v2 if f2 else v1 + v2), is associative, so each rung of ``scan``
becomes segmented by swapping its addition for that operator and nothing else. An empty segment has no
element to flag and no output, so it changes nothing: :func:`heads_from_offsets` turns offsets (empty
segments included) into flags. The price is 4 bytes of flags per element (12n bytes instead of the scan's
8n); one byte per flag would make it 9n.

Exact for int32 (wrapping like NumPy's int32 additions); float32 within the scan's error model
(:func:`kernels_src.ops.scan.scan_tol`: a segment's sum is a shorter sum than the whole scan's).

Ladder
  cpu/numpy        baseline  np.cumsum in float64 (int64), minus the running sum at each segment's start
  cpu/seq          rung 1    one compiled loop; the running total restarts at each head
  cpu/two_pass     rung 2    prange over chunks: each chunk's carry-out (the sum after its last head, and
                             whether it has one), a scan of the carries, each chunk rescanned from its carry
  cpu/blocked      rung 3    scan's rung 3 with the (flag, value) operator: one DRAM pass, 4 chains at once;
                             a carry is added only up to a sub-block's first head
  gpu/one_block    rung 1    ONE block walks x in tiles of T: a segmented Hillis-Steele in shared memory,
                             a carry between tiles (runs in the simulator)
  gpu/decoupled    rung 2    scan's rung 5 with the (flag, value) operator: single pass, warp-wide look-back;
                             a tile containing a head publishes its inclusive value at once, so look-backs
                             stop there. Real GPU only (shuffles)
  gpu/torch        baseline  torch.cumsum in float64 (int64) minus the running sum at each segment's start
"""
import numpy as np

from ..compiler import cuda, int32, njit, prange
from .. import device
from ..registry import define_op, register
from . import scan as _scan

DTYPES = ("int32", "float32")


# --------------------------------------------------------------------------------------- reference
def reference(x, heads):
    """Segmented inclusive scan by recursive doubling in NumPy (log2 n vectorised steps of the (flag, value)
    operator): float inputs in float64, int32 exactly (NumPy's int32 additions wrap modulo 2**32)."""
    v = x.astype(np.float64) if x.dtype.kind == "f" else x.copy()
    n = v.size
    f = heads != 0
    d = 1
    while d < n:
        left_v, left_f = v[:-d], f[:-d]
        nv = v.copy()
        nv[d:] = np.where(f[d:], v[d:], left_v + v[d:])
        f = f.copy()
        f[d:] = f[d:] | left_f
        v = nv
        d *= 2
    return v


def heads_from_offsets(offsets, n):
    """Head flags (n,) int32 from segment offsets (S + 1,) with offsets[0] = 0 and offsets[-1] = n. Empty
    segments (offsets[s] == offsets[s + 1]) flag nothing: they have no element and no output."""
    offsets = np.asarray(offsets)
    if offsets.size == 0 or offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) < 0):
        raise ValueError("offsets must start at 0, end at n and never decrease")
    heads = np.zeros(n, np.int32)
    starts = offsets[:-1][offsets[:-1] < n]
    heads[starts] = 1
    return heads


def make_inputs(size, dtype, rng):
    """x as for ``scan`` (int32 in [-1000, 1000]; float32 in [0.5, 1), so |out| is the sum of |x| the error
    model scales with); heads: about one element in 16 starts a segment, head values other than 1 included
    (any nonzero flag is a head), and heads[0] left to chance (the first segment starts at 0 either way)."""
    (n,) = size
    (x,) = _scan.make_inputs(size, dtype, rng)
    heads = np.where(rng.random(n) < 1 / 16, rng.integers(1, 4, n), 0).astype(np.int32)
    return x, heads


def make_edge_inputs(size, dtype, rng):
    """The scan's edge values (int32 sums that wrap; a +inf, a NaN and a -0.0 among the floats), with heads
    right after the inf and the NaN so that a segment must forget them."""
    (n,) = size
    (x,) = _scan.make_edge_inputs(size, dtype, rng)
    heads = np.where(rng.random(n) < 1 / 16, 1, 0).astype(np.int32)
    if n and x.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(x))
        after = bad[bad + 1 < n] + 1
        heads[after] = 1
    return x, heads


def seg_tol(size, dtype):
    return _scan.scan_tol(size, dtype)


define_op("segmented_scan", reference=reference, make_inputs=make_inputs, chapter=15,
          title="segmented inclusive prefix sum (head flags)", size_names=("n",), kind="memory", tol=seg_tol,
          output_names=("out",), sizes=_scan.SIZES, edge_inputs=make_edge_inputs,
          flops=lambda s: max(s[0] - 1, 0), bytes=lambda s, b: s[0] * (2 * b + 4))


# --------------------------------------------------------------------------------------------- CPU
@njit(cache=True)
def seg_seq(out, x, heads):
    acc = x.dtype.type(0)
    for i in range(x.size):
        if heads[i] != 0:
            acc = x[i]
        else:
            acc = acc + x[i]
        out[i] = acc


@njit(parallel=True, cache=True)
def seg_two_pass(out, x, heads, carry, has_head):
    # x, heads (n,) -> out (n,); carry, has_head (P,): per chunk, the sum after its last head and whether it has one
    n = x.size
    P = carry.size
    per = (n + P - 1) // P
    for p in prange(P):  # pass 1: each chunk's carry-out
        acc = x.dtype.type(0)
        h = 0
        for i in range(p * per, min(n, (p + 1) * per)):
            if heads[i] != 0:
                acc = x[i]
                h = 1
            else:
                acc = acc + x[i]
        carry[p] = acc
        has_head[p] = h
    run = x.dtype.type(0)  # the carry INTO each chunk: a segmented scan of the P carry-outs
    for p in range(P):
        c = carry[p]
        carry[p] = run
        run = c if has_head[p] != 0 else run + c
    for p in prange(P):  # pass 2: rescan each chunk from its carry-in, restarting at heads
        acc = carry[p]
        for i in range(p * per, min(n, (p + 1) * per)):
            if heads[i] != 0:
                acc = x[i]
            else:
                acc = acc + x[i]
            out[i] = acc


@njit(cache=True)
def seg_chains4(out, x, heads, s, L, tot, hh, p, j0):
    # x, heads [s : s + 4L] -> out: 4 sub-blocks of L (numbers j0..j0+3 of their block) scanned at once, each
    # from (no head, 0); tot[p, j], hh[p, j]: sub-block j's carry-out and whether it has a head. Four chains,
    # not eight: with their heads too, eight run out of registers and spill.
    xb = x[s:s + 4 * L]  # indexed from 0 by k + jL >= 0: no negative-index checks in the loop
    hb = heads[s:s + 4 * L]
    ob = out[s:s + 4 * L]
    z = x.dtype.type(0)
    a0 = z; a1 = z; a2 = z; a3 = z  # noqa: E702
    for k in range(L):  # 4 independent chains; at a head the chain's sum restarts from 0
        i1 = k + L; i2 = i1 + L; i3 = i2 + L  # noqa: E702
        a0 = (z if hb[k] != 0 else a0) + xb[k]
        a1 = (z if hb[i1] != 0 else a1) + xb[i1]
        a2 = (z if hb[i2] != 0 else a2) + xb[i2]
        a3 = (z if hb[i3] != 0 else a3) + xb[i3]
        ob[k] = a0; ob[i1] = a1; ob[i2] = a2; ob[i3] = a3  # noqa: E702
    tot[p, j0] = a0; tot[p, j0 + 1] = a1; tot[p, j0 + 2] = a2; tot[p, j0 + 3] = a3  # noqa: E702
    for j in range(4):  # has a head? Stops at the first one: ~16 reads at one head in 16, from L1
        h = 0
        for k in range(j * L, (j + 1) * L):
            if hb[k] != 0:
                h = 1
                break
        hh[p, j0 + j] = h


@njit(parallel=True, cache=True)
def seg_blocked(out, x, heads, tot, hh, off, L):
    # scan.scan_blocked with the (flag, value) operator. The carry into a sub-block changes only its values
    # before its first head, so the next round's fix-up reads heads from L2 up to that head and stops.
    n = x.size
    P = tot.shape[0]
    B = 8 * L
    nblk = n // B
    R = (nblk + P - 1) // P
    run = x.dtype.type(0)
    for r in range(R + 1):
        for p in prange(P):
            b = (r - 1) * P + p
            if r > 0 and b < nblk:
                for j in range(8):
                    c = off[p, j]
                    i = b * B + j * L
                    end = i + L
                    while i < end and heads[i] == 0:
                        out[i] += c
                        i += 1
            b = r * P + p
            if r < R and b < nblk:
                seg_chains4(out, x, heads, b * B, L, tot, hh, p, 0)
                seg_chains4(out, x, heads, b * B + 4 * L, L, tot, hh, p, 4)
        if r < R:
            for p in range(P):
                if r * P + p < nblk:
                    for j in range(8):
                        off[p, j] = run
                        run = tot[p, j] if hh[p, j] != 0 else run + tot[p, j]
    for i in range(nblk * B, n):  # the tail (< one block): one chain from the running carry
        run = x[i] if heads[i] != 0 else run + x[i]
        out[i] = run


def _minus_start(cs, x, heads):
    """cs - (the running sum just before each element's segment start): the segmented scan from a plain one
    (NumPy arrays; the torch baseline does the same with torch.cummax)."""
    idx = np.arange(x.size)
    start = np.maximum.accumulate(np.where(heads != 0, idx, 0))
    return cs - (cs[start] - x[start].astype(cs.dtype))


@register("segmented_scan", "cpu", "numpy", baseline=True, dtypes=DTYPES,
          edge_exempt="subtracting two running sums turns every value after an inf into NaN")
def numpy_minus_start(out, x, heads):
    """What a NumPy user writes: one cumsum in float64 (int64), minus the sum before each segment's start
    (a running max of head positions), rounded back to x's dtype (int64 -> int32 wraps as int32 does)."""
    if x.size == 0:
        return
    wide = np.float64 if x.dtype.kind == "f" else np.int64
    cs = np.cumsum(x, dtype=wide)
    out[:] = _minus_start(cs, x, heads).astype(out.dtype)


@register("segmented_scan", "cpu", "seq", rung=1, dtypes=DTYPES)
def seq(out, x, heads):
    """One compiled loop; the running total restarts at each head: a chain of n dependent adds, like the
    scan's rung 1, plus one predictable branch per element."""
    seg_seq(out, x, heads)


@register("segmented_scan", "cpu", "two_pass", rung=2, dtypes=DTYPES)
def two_pass(out, x, heads):
    """The scan's two-pass prange with the (flag, value) operator: each chunk's carry-out and whether it has
    a head, a sequential scan of the P carries, each chunk rescanned from its carry-in. Reads x and heads
    twice: 20n bytes for the op's 12n, P dependency chains at once."""
    from ..compiler import get_num_threads

    P = max(1, min(x.size, 4 * get_num_threads()))
    carry = np.empty(P, x.dtype)
    has_head = np.empty(P, np.int32)
    seg_two_pass(out, x, heads, carry, has_head)


@register("segmented_scan", "cpu", "blocked", rung=3, dtypes=DTYPES)
def blocked(out, x, heads):
    """Scan's rung 3 with the (flag, value) operator: rounds of one 64K-value block per thread, its 8 sub-blocks
    scanned 4 at a time (4 independent chains: with the heads to load as well, 8 chains spill registers), and
    each sub-block's carry added next round only up to its first head (~16 values at one head in 16). x and
    heads read once, out written once: 12n bytes, the op's own count. Prediction: about 1.5 cycles per value
    per core (a load of x and of heads, a store, and a head that the branch predictor misses now and then),
    2 cores x ~2.5 GHz x 12 bytes / 1.5 = ~40 GB/s, so ~80 % of copy at 2^24, against rung 1's one value
    per add-and-select latency."""
    from ..compiler import get_num_threads

    P = max(1, get_num_threads())
    tot = np.empty((P, 8), x.dtype)
    hh = np.empty((P, 8), np.int32)
    off = np.empty((P, 8), x.dtype)
    seg_blocked(out, x, heads, tot, hh, off, _scan.SUB)


# --------------------------------------------------------------------------------------------- GPU
def one_block_kernel(dt, T):
    def build():
        nbt = _scan._TYPES[dt]
        ZERO = nbt(0)

        @cuda.jit
        def seg_scan_one_block(out, x, heads):
            # x, heads (n,) -> out (n,): one block of T threads walks x in tiles of T
            buf = cuda.shared.array(T, nbt)
            fbuf = cuda.shared.array(T, int32)
            tid = cuda.threadIdx.x
            n = x.size
            carry = ZERO
            for base in range(0, n, T):
                g = base + tid
                v = ZERO
                f = int32(0)
                if g < n:
                    v = x[g]
                    if heads[g] != 0:
                        f = int32(1)
                buf[tid] = v
                fbuf[tid] = f
                cuda.syncthreads()
                off = 1
                while off < T:  # segmented Hillis-Steele: (lf, lv) + (f, v) = (lf | f, v if f else lv + v)
                    lv = ZERO
                    lf = int32(0)
                    if tid >= off:
                        lv = buf[tid - off]
                        lf = fbuf[tid - off]
                    cuda.syncthreads()  # everybody has read before anybody writes
                    if tid >= off:
                        if f == 0:
                            v = lv + v
                        f = f | lf
                        buf[tid] = v
                        fbuf[tid] = f
                    cuda.syncthreads()
                    off *= 2
                if g < n:
                    out[g] = v if f != 0 else carry + v
                last_v = buf[T - 1]
                last_f = fbuf[T - 1]
                cuda.syncthreads()  # everybody has the tile's last pair before the next tile overwrites it
                carry = last_v if last_f != 0 else carry + last_v

        return seg_scan_one_block

    return _scan._cached(("seg1", dt, T), build)


def seg_one_block(out, x, heads):
    if x.size == 0:
        return
    T = 32 if device.SIMULATED else 1024
    one_block_kernel(_scan._dt(x), T)[1, T](out, x, heads)


def _ptx_one_block():
    return [(one_block_kernel(dt, 1024), f"void({dt}[::1], {dt}[::1], int32[::1])") for dt in DTYPES]


def _ptx_decoupled():
    return [(_scan.decoupled_kernel(dt, False, vec, True), _scan.DL_SIG.format(dt=dt))
            for dt in DTYPES for vec in (True, False)]


@register("segmented_scan", "gpu", "one_block", rung=1, ptx=_ptx_one_block(), dtypes=DTYPES)
def one_block(out, x, heads):
    """ONE block of 1024 threads, a segmented Hillis-Steele per tile of 1024 (two shared arrays: values and
    flags), a carry between tiles: the scan's rung 1 with the (flag, value) operator. One SM: ~1 % of copy."""
    seg_one_block(out, x, heads)


@register("segmented_scan", "gpu", "decoupled", rung=2, ptx=_ptx_decoupled(), dtypes=DTYPES,
          requires=device.needs_real_gpu)
def decoupled(out, x, heads):
    """The scan's rung 5 with the (flag, value) operator in its lane, warp and tile scans. A tile with a head
    publishes its inclusive value at once (nothing before the head matters after it), so look-backs stop
    there. 12n bytes: predict 12n / copy bandwidth, 1.07 ms at 2^28 and 3000 GB/s."""
    _scan.scan_decoupled(out, x, False, heads=heads)


def _torch_gpu():
    return _scan._torch_gpu()


@register("segmented_scan", "gpu", "torch", baseline=True, requires=_torch_gpu, dtypes=DTYPES,
          edge_exempt="subtracting two running sums turns every value after an inf into NaN")
def torch_minus_start(out, x, heads):
    """torch has no segmented scan; what a user writes: torch.cumsum in float64 (int64), minus the running sum
    before each segment's start (torch.cummax of head positions), cast back."""
    import torch

    from .reductions import torch_view

    if x.size == 0:
        return
    to, tx, th = torch_view(out), torch_view(x), torch_view(heads)
    wide = torch.float64 if tx.dtype == torch.float32 else torch.int64
    cs = torch.cumsum(tx, 0, dtype=wide)
    idx = torch.arange(tx.shape[0], device=tx.device)
    start = torch.cummax(torch.where(th != 0, idx, torch.zeros_like(idx)), 0).values
    to.copy_((cs - (cs[start] - tx[start].to(wide))).to(to.dtype))
