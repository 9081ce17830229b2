"""Launch planning for the attention kernels of chapters 9 and 10: plain Python, no kernels.

Two questions every attention launcher answers before it launches:

* **How many blocks of a kernel fit on one SM?** (:func:`blocks_per_sm`) Each resident block holds its
  registers (registers per thread x threads) and its shared memory for as long as it runs, and an SM has a
  fixed register file, shared-memory pool, and caps on resident blocks and threads. The smallest of those
  quotients is the number of blocks that run at once on one SM; times the SM count it is one **wave**.
* **Into how many chunks should a decode step cut the cache?** (:func:`choose_splits`) Split-K decode
  (chapter 10) launches ``pairs * splits`` blocks, ``pairs`` = batch x kv heads. Too few blocks leave SMs
  idle; a grid that spills a few blocks into an extra wave makes every block of the step wait for them.

And one for the causal forward (chapter 9): **which key tiles does a query block need?**
(:func:`causal_tile_visible`, :func:`causal_tiles`).

``kernels_src.ops.decode_attention`` imports :func:`blocks_per_sm` and :func:`choose_splits`; chapter 9's and
chapter 10's exercises ask the reader to write the same rules, graded against these functions (the
exercise-only ops declared at the end of this module; no kernels are registered here).
"""
from __future__ import annotations

import numpy as np

from ..registry import exercise_op

# H100 SXM (compute capability 9.0) per-SM limits, from NVIDIA's CUDA C++ Programming Guide, table
# "Technical Specifications per Compute Capability": 64 K 32-bit registers, 2048 resident threads,
# 32 resident blocks, 228 KiB of shared memory per SM (of which at most 227 KiB for one block).
REGFILE = 65536
MAX_THREADS = 2048
MAX_BLOCKS = 32
SMEM_PER_SM = 228 * 1024
H100_SMS = 132


def blocks_per_sm(regs_per_thread, threads, smem_bytes=0, smem_per_sm=228 * 1024, max_blocks=32,
                  max_threads=2048, regfile=65536):
    """Blocks of one kernel that can be resident on one SM at the same time.

    The smallest of four limits::

        by registers      floor(regfile / (regs_per_thread * threads))
        by shared memory  floor(smem_per_sm / smem_bytes)          (no limit when smem_bytes == 0)
        by blocks         max_blocks
        by threads        floor(max_threads / threads)

    ``regs_per_thread`` is what the compiler reports (``ncu``'s "Registers Per Thread", or
    ``kernel.get_regs_per_thread()`` in numba-cuda); ``smem_bytes`` is the block's static plus dynamic
    shared memory. Example: the decode kernel profiled in issue 24 uses 165 registers with 128 threads,
    floor(65536 / 21120) = 3 blocks per SM.

    This is the textbook count. The hardware allocates registers per warp in units of 256 and reserves
    1 KiB of shared memory per block, so a kernel near a boundary may fit one block fewer than this says;
    ``ncu``'s "Block Limit Registers" / "Block Limit Shared Mem" are the final word. Returns 0 when one block
    does not fit at all (the launch would fail).
    """
    regs_per_thread, threads = int(regs_per_thread), int(threads)
    if threads < 1 or regs_per_thread < 1:
        raise ValueError(f"threads ({threads}) and regs_per_thread ({regs_per_thread}) must be >= 1")
    limits = [regfile // (regs_per_thread * threads), int(max_blocks), max_threads // threads]
    if smem_bytes > 0:
        limits.append(int(smem_per_sm) // int(smem_bytes))
    return max(0, min(limits))


def split_chunk(length, splits, tile=32):
    """Rows per split when ``length`` rows are cut into ``splits`` chunks of whole tiles, and the number of
    non-empty splits that gives: ``chunk = tile * ceil(length / (splits * tile))``,
    ``used = ceil(length / chunk)`` (``used <= splits``; with ``length = 0``, one empty split)."""
    length, splits, tile = int(length), max(1, int(splits)), max(1, int(tile))
    if length <= 0:
        return tile, 1
    chunk = tile * (-(-length // (splits * tile)))
    return chunk, -(-length // chunk)


def choose_splits(pairs, length, blocks_per_sm, sms=132, tile=32, min_rows=256) -> int:
    """Number of chunks (splits) of a decode step's cache, chosen from occupancy and waves.

    Inputs: ``pairs`` = batch x kv heads (the blocks of an unsplit launch), ``length`` = cache rows to read,
    ``blocks_per_sm`` from :func:`blocks_per_sm`, ``sms`` the SM count; chunks are whole ``tile``s of rows.

    The model: a decode block streams its chunk at a rate set by the loads it keeps in flight, so a wave of
    blocks lasts as long as one chunk takes, whether the wave is full or not. With ``slots = blocks_per_sm *
    sms`` blocks per wave, ``s`` splits give::

        chunk(s) = tile * ceil(length / (s * tile))      rows per split (whole tiles)
        used(s)  = ceil(length / chunk(s))               non-empty splits (<= s)
        waves(s) = ceil(pairs * used(s) / slots)
        cost(s)  = waves(s) * chunk(s)                   rows one slot streams, one after another

    The rule: over ``s = 1 .. max(1, floor(length / min_rows))`` (so that every split but the last has at
    least ``min_rows`` rows and the merge stays a small fraction of the traffic), return ``used(s)`` for the
    ``s`` of least cost; among equal costs, the fewest splits (least merge work). ``cost`` is the step's time
    in the model, so minimising it is the same as minimising the share of slots the last, partial wave leaves
    empty: ``pairs * length / (slots * cost)`` is the fraction of slot-time that does useful work.

    Edge cases: ``length <= min_rows`` (a short cache, ``length = 1`` included) gives 1; ``pairs >= slots``
    (the unsplit grid already fills a wave) still splits when that evens out the last wave (pairs = slots + 1
    runs 2 waves of full length unsplit, 3 waves of half length with 2 splits); ``sms = 1`` works the same
    with ``slots = blocks_per_sm``.
    """
    pairs, length, bps, sms = int(pairs), int(length), int(blocks_per_sm), int(sms)
    if pairs < 1 or sms < 1 or bps < 1:
        raise ValueError(f"pairs ({pairs}), sms ({sms}) and blocks_per_sm ({bps}) must be >= 1")
    if length <= 0:
        return 1
    slots = bps * sms
    best = None
    for s in range(1, max(1, length // max(1, int(min_rows))) + 1):
        chunk, used = split_chunk(length, s, tile)
        cost = (-(-(pairs * used) // slots)) * chunk
        if best is None or (cost, used) < best:
            best = (cost, used)
    return best[1]


def causal_lim(i0, br, S, T, kv_len, causal):
    """Keys ``0 .. lim - 1`` are visible to at least one row of the query block ``i0 .. min(i0+br, S) - 1``:
    the block's last row sees the most keys (``j <= i + T - S``), and padding cuts at ``kv_len``."""
    last = min(int(i0) + int(br), int(S)) - 1
    if last < int(i0):
        return 0  # a block past the last query row sees nothing
    lim = min(int(kv_len), int(T))
    if causal:
        lim = min(lim, last + int(T) - int(S) + 1)
    return max(0, lim)


def causal_tile_visible(i0, br, j0, bc, S, T, kv_len, causal):
    """Does key tile ``j0 .. j0+bc-1`` hold a key that some row of query block ``i0 .. i0+br-1`` can see?"""
    return int(j0) < causal_lim(i0, br, S, T, kv_len, causal) and int(bc) > 0


def causal_tiles(i0, br, bc, S, T, kv_len, causal):
    """Key tiles of width ``bc`` the query block must visit: tiles 0 .. ceil(lim / bc) - 1 (visibility is a
    prefix of the keys for every row, so the visited tiles are a prefix too)."""
    return -(-causal_lim(i0, br, S, T, kv_len, causal) // int(bc))


# ------------------------------------------------------------------- exercise-only ops (graded questions)
# Chapter 9: the causal tile-skip test; chapter 10: the split chooser and the merge's associativity.
# The references below are deliberately brute force (every (row, key) pair, every split count), so that
# they check the closed forms above as well as the reader's code.

def _tile_cases(n, rng):
    rows = []
    fixed = [(0, 1, 0, 1, 1, 1, 1, 1), (0, 64, 0, 32, 2048, 2048, 2048, 1), (1984, 64, 2016, 32, 2048, 2048, 2048, 1),
             (0, 64, 32, 32, 2048, 2048, 2048, 1), (0, 4, 0, 4, 9, 3, 3, 1), (8, 4, 0, 4, 9, 3, 3, 1),
             (12, 4, 0, 4, 9, 3, 3, 1), (0, 8, 8, 8, 5, 40, 40, 1), (0, 8, 40, 8, 5, 40, 40, 1),
             (0, 16, 16, 16, 64, 64, 10, 0), (0, 16, 0, 16, 64, 64, 0, 0), (16, 16, 0, 16, 20, 20, 20, 1)]
    for k in range(n):
        if k < len(fixed):
            rows.append(fixed[k])
            continue
        S = int(rng.integers(1, 200))
        T = int(rng.integers(1, 200))
        br = int(rng.choice([1, 2, 3, 4, 8, 16, 32, 64]))
        bc = int(rng.choice([1, 2, 3, 4, 8, 16, 32, 48, 64]))
        i0 = br * int(rng.integers(0, -(-S // br) + 1))  # the one-past-the-end block sometimes
        j0 = bc * int(rng.integers(0, -(-T // bc)))
        kv = int(rng.choice([T, T, int(rng.integers(0, T + 1))]))
        rows.append((i0, br, j0, bc, S, T, kv, int(rng.integers(0, 2))))
    return np.array(rows, dtype=np.int64).reshape(n, 8)


def tile_skip_inputs(size, dtype, rng):
    """cases (n, 8) int64: i0, br, j0, bc, S, T, kv_len, causal. Fixed boundary cases (the diagonal tile, the
    tile just past it, S > T rows that see nothing, kv_len = 0, the block past the end), then random ones."""
    return (_tile_cases(size[0], rng),)


def tile_skip_reference(cases):
    """Brute force over every (row, key) pair of the block and the tile: visible (n,) int32, tiles (n,) int32."""
    vis = np.zeros(len(cases), np.int32)
    tiles = np.zeros(len(cases), np.int32)
    for r, (i0, br, j0, bc, S, T, kv, causal) in enumerate(cases):
        i = np.arange(i0, min(i0 + br, S))[:, None]
        j = np.arange(0, T)[None, :]
        seen = (j < kv) & ((j <= i + (T - S)) if causal else True)
        seen = np.broadcast_to(seen, (i.shape[0], T))
        vis[r] = int(seen[:, j0:j0 + bc].any())
        tiles[r] = sum(int(seen[:, t:t + bc].any()) for t in range(0, T, bc))
    return vis, tiles


exercise_op("attention_tile_skip", reference=tile_skip_reference, make_inputs=tile_skip_inputs, chapter=9,
            title="causal tile skipping: is a key tile visible to a query block, and how many tiles it visits",
            size_names=("n",), kind="memory", output_names=("visible", "tiles"), tol=(0.0, 0.0),
            flops=lambda s: 0, bytes=lambda s, b: 0,
            sizes={"check": [(12,), (40,)], "check_sim": [(12,), (40,)], "bench": [(40,)]})


def _split_cases(n, rng):
    # pairs, length, regs, threads, sms, min_rows, tile
    fixed = [(8, 32768, 165, 128, 132, 256, 32), (8, 4096, 165, 128, 132, 256, 32), (1, 1, 64, 128, 132, 256, 32),
             (512, 2048, 64, 128, 132, 256, 32), (397, 8192, 165, 128, 132, 256, 32), (8, 32768, 80, 128, 1, 256, 32),
             (4, 300, 40, 256, 132, 256, 32), (8, 131072, 255, 256, 132, 128, 64), (64, 2048, 96, 128, 132, 256, 32),
             (2, 100000, 32, 64, 8, 512, 16), (16, 20000, 16, 256, 132, 256, 32), (3, 5000, 24, 32, 132, 256, 32)]
    rows = []
    for k in range(n):
        if k < len(fixed):
            rows.append(fixed[k])
            continue
        threads = int(rng.choice([32, 64, 96, 128, 256, 512, 1024]))
        regs = int(rng.integers(16, min(255, 65536 // threads) + 1))
        rows.append((int(rng.choice([1, 2, 4, 8, 16, 32, 64, 128, 256, 400])), int(rng.choice([1, 17, 255, 256, 1000, 4096, 32768, 65536])) + int(rng.integers(0, 64)),
                     regs, threads, int(rng.choice([1, 2, 16, 108, 132])), int(rng.choice([64, 128, 256, 512])),
                     int(rng.choice([16, 32, 64]))))
    return np.array(rows, dtype=np.int64).reshape(n, 7)


def split_plan_inputs(size, dtype, rng):
    """cases (n, 7) int64: pairs, length, regs_per_thread, threads, sms, min_rows, tile. The issue-24 decode
    shape first (8 pairs, 165 registers, 128 threads, 132 SMs), then edges (length 1, more pairs than a wave,
    one SM), then random ones."""
    return (_split_cases(size[0], rng),)


def split_plan_reference(cases):
    """bps (n,) int32 by the four limits written out, and splits (n,) int32 by trying every split count."""
    bps = np.zeros(len(cases), np.int32)
    splits = np.zeros(len(cases), np.int32)
    for r, (pairs, length, regs, threads, sms, min_rows, tile) in enumerate(cases):
        b = min(65536 // (regs * threads), 32, 2048 // threads)
        bps[r] = b
        best = None
        for s in range(1, max(1, length // min_rows) + 1):
            per = -(-length // s)
            chunk = -(-per // tile) * tile
            used = -(-length // chunk)
            waves = -(-(pairs * used) // (b * sms))
            if best is None or (waves * chunk, used) < best:
                best = (waves * chunk, used)
        splits[r] = best[1]
    return bps, splits


exercise_op("decode_split_plan", reference=split_plan_reference, make_inputs=split_plan_inputs, chapter=10,
            title="decode split count from occupancy and waves", size_names=("n",), kind="memory",
            output_names=("bps", "splits"), tol=(0.0, 0.0), flops=lambda s: 0, bytes=lambda s, b: 0,
            sizes={"check": [(10,), (40,)], "check_sim": [(10,), (40,)], "bench": [(40,)]})


def merge_order_inputs(size, dtype, rng):
    """parts (n, P, D+2): P partial states (m, l, O_0 .. O_{D-1}) of one query row each, from random chunks
    of a random score row (so l > 0 and O = sum exp(s - m) v are consistent); about one part in four is empty
    (m = -inf, l = 0, O = 0) and row 0 is all empty. order (n, P) int64: a random permutation per row.
    mode (n,) int64: 0 = fold left to right in ``order``, 1 = pairwise tree over ``order``."""
    n, p_n, d_n = size
    parts = np.zeros((n, p_n, d_n + 2))
    for r in range(n):
        for p in range(p_n):
            if r == 0 or rng.random() < 0.25:
                parts[r, p, 0] = -np.inf
                continue
            rows = int(rng.integers(1, 6))
            s = rng.standard_normal(rows) * 3 + rng.choice([0.0, 0.0, 1e4, -1e4])
            v = rng.standard_normal((rows, d_n))
            m = s.max()
            w = np.exp(s - m)
            parts[r, p, 0], parts[r, p, 1], parts[r, p, 2:] = m, w.sum(), w @ v
    order = np.array([rng.permutation(p_n) for _ in range(n)], dtype=np.int64).reshape(n, p_n)
    mode = rng.integers(0, 2, n).astype(np.int64)
    return parts.astype(dtype), order, mode


def merge_order_reference(parts, order, mode):
    """The merge of all P states of a row in one step, in float64: m = max m_p, l = sum l_p e^(m_p - m),
    O = sum O_p e^(m_p - m) (empty parts weigh 0; a row of empty parts stays (-inf, 0, 0)). The order and
    the bracketing do not appear: that they do not matter is what the question checks."""
    p = parts.astype(np.float64)
    m = p[..., 0].max(axis=1)
    mf = np.where(np.isfinite(m), m, 0.0)
    w = np.where(np.isfinite(p[..., 0]), np.exp(p[..., 0] - mf[:, None]), 0.0)
    out = np.empty((p.shape[0], p.shape[2]))
    out[:, 0] = m
    out[:, 1:] = np.einsum("np,npd->nd", w, p[..., 1:])
    return (out,)


exercise_op("attn_merge_order", reference=merge_order_reference, make_inputs=merge_order_inputs, chapter=10,
            title="the (m, l, O) merge in any order and bracketing", size_names=("n", "P", "D"), kind="memory",
            output_names=("state",), tol=(2e-5, 1e-5), flops=lambda s: 0, bytes=lambda s, b: 0,
            sizes={"check": [(4, 5, 3), (6, 8, 4)], "check_sim": [(4, 5, 3), (6, 8, 4)], "bench": [(6, 8, 4)]})
