"""kernels_src.ops.attention_plan: blocks per SM, the decode split chooser, the causal tile test, and the
exercise references built on them (chapters 9 and 10)."""
import math

import numpy as np
import pytest

from kernels_src.ops import attention_plan as ap


# ------------------------------------------------------------------------------------ blocks_per_sm
@pytest.mark.parametrize("regs,threads,smem,want", [
    (165, 128, 0, 3),         # the decode kernel of issue 24: 65536 / 21120 = 3.1
    (167, 64, 0, 6),          # the flash forward of issue 24: 65536 / 10688 = 6.1
    (79, 128, 0, 6),          # the sweep's winner: 65536 / 10112 = 6.5
    (32, 64, 0, 32),          # the block cap: 65536 / 2048 = 32, 2048 / 64 = 32
    (16, 32, 0, 32),          # 128 by registers, 64 by threads, capped at 32 blocks
    (32, 1024, 0, 2),         # the thread cap: 2048 / 1024
    (255, 256, 0, 1),         # 65280 registers: one block
    (255, 512, 0, 0),         # does not fit at all
    (32, 128, 48 * 1024, 4),  # shared memory: 228 KiB / 48 KiB = 4.75
    (32, 128, 100 * 1024, 2),
])
def test_blocks_per_sm(regs, threads, smem, want):
    assert ap.blocks_per_sm(regs, threads, smem) == want


def test_blocks_per_sm_is_the_smallest_limit():
    rng = np.random.default_rng(0)
    for _ in range(500):
        threads = int(rng.choice([32, 64, 128, 256, 512, 1024]))
        regs = int(rng.integers(1, 256))
        smem = int(rng.choice([0, 1024, 16384, 49152, 100000]))
        got = ap.blocks_per_sm(regs, threads, smem)
        # the definition, checked the long way: the largest b whose b blocks fit every resource
        fits = [b for b in range(0, 33) if b * regs * threads <= 65536 and b * threads <= 2048
                and b * smem <= 228 * 1024]
        assert got == max(fits)


def test_blocks_per_sm_rejects_nonsense():
    with pytest.raises(ValueError):
        ap.blocks_per_sm(0, 128)
    with pytest.raises(ValueError):
        ap.blocks_per_sm(32, 0)


# ------------------------------------------------------------------------------------ choose_splits
def _cost(pairs, length, bps, sms, tile, s):
    chunk, used = ap.split_chunk(length, s, tile)
    return math.ceil(pairs * used / (bps * sms)) * chunk, used


def test_split_chunk_covers_the_rows():
    for length in (1, 31, 32, 33, 1000, 32768):
        for s in (1, 2, 3, 7, 64, 5000):
            chunk, used = ap.split_chunk(length, s, 32)
            assert chunk % 32 == 0 and used <= s
            assert (used - 1) * chunk < length <= used * chunk  # every used split holds a row


def test_length_one_and_short_caches_do_not_split():
    for pairs in (1, 8, 1000):
        assert ap.choose_splits(pairs, 1, 3) == 1
        assert ap.choose_splits(pairs, 256, 3) == 1
        assert ap.choose_splits(pairs, 511, 3) == 1  # two splits would leave one under min_rows
    assert ap.choose_splits(8, 0, 3) == 1


def test_issue24_decode_shape_fills_one_wave():
    # B1 Hkv8 L32768, 165 registers x 128 threads: 3 blocks per SM, 396 slots. The split count fills the
    # wave (392 of 396 blocks) instead of spilling 1.29 waves.
    bps = ap.blocks_per_sm(165, 128)
    s = ap.choose_splits(8, 32768, bps)
    assert 8 * s <= 3 * 132 and 8 * s >= 0.95 * 3 * 132
    chunk, used = ap.split_chunk(32768, s)
    assert used == s and chunk >= 256


def test_pairs_at_least_one_wave():
    # exactly one wave unsplit: nothing to gain from splitting
    assert ap.choose_splits(396, 32768, 3) == 1
    assert ap.choose_splits(792, 4096, 3) == 1
    # one block over a wave: unsplit costs 2 waves of the whole cache; 2 splits cost 3 waves of half of it
    assert ap.choose_splits(397, 8192, 3) > 1
    c1, _ = _cost(397, 8192, 3, 132, 32, 1)
    s = ap.choose_splits(397, 8192, 3)
    assert _cost(397, 8192, 3, 132, 32, s)[0] < c1


def test_one_sm():
    # slots = blocks_per_sm: 8 pairs on 3 slots
    s = ap.choose_splits(8, 32768, 3, sms=1)
    assert s >= 1
    best = min(_cost(8, 32768, 3, 1, 32, k) for k in range(1, 32768 // 256 + 1))
    assert _cost(8, 32768, 3, 1, 32, s) == best
    assert ap.choose_splits(1, 32768, 1, sms=1) == 1  # one slot: splitting only adds waves


def test_choose_splits_is_the_cheapest_by_brute_force():
    rng = np.random.default_rng(1)
    for _ in range(300):
        pairs = int(rng.integers(1, 600))
        length = int(rng.integers(1, 70000))
        bps, sms = int(rng.integers(1, 9)), int(rng.choice([1, 2, 16, 132]))
        tile, min_rows = int(rng.choice([16, 32, 64])), int(rng.choice([64, 256, 512]))
        s = ap.choose_splits(pairs, length, bps, sms, tile, min_rows)
        cands = [_cost(pairs, length, bps, sms, tile, k) for k in range(1, max(1, length // min_rows) + 1)]
        assert (_cost(pairs, length, bps, sms, tile, s)) == min(cands)
        chunk, used = ap.split_chunk(length, s, tile)
        assert used == s
        assert s == 1 or chunk >= min_rows  # every split but the last has min_rows rows or more


def test_choose_splits_rejects_nonsense():
    with pytest.raises(ValueError):
        ap.choose_splits(8, 1024, 0)
    with pytest.raises(ValueError):
        ap.choose_splits(0, 1024, 3)


# ------------------------------------------------------------------------------- causal tile skipping
def test_causal_tiles_brute_force():
    rng = np.random.default_rng(2)
    (cases,) = ap.tile_skip_inputs((400,), np.dtype("float32"), rng)
    vis, tiles = ap.tile_skip_reference(cases)
    for r, (i0, br, j0, bc, S, T, kv, causal) in enumerate(cases):
        assert int(ap.causal_tile_visible(i0, br, j0, bc, S, T, kv, causal)) == vis[r]
        assert ap.causal_tiles(i0, br, bc, S, T, kv, causal) == tiles[r]
    assert 0 < vis.mean() < 1  # the cases hold both kinds of tile


def test_causal_tiles_match_chapter9_tile_model():
    # summed over query blocks, the tiles visited equal the count chapter 9's figures use
    S = T = 2048
    for br, bc in ((64, 32), (64, 48), (32, 64)):
        total = sum(ap.causal_tiles(i0, br, bc, S, T, T, 1) for i0 in range(0, S, br))
        full = sum(ap.causal_tiles(i0, br, bc, S, T, T, 0) for i0 in range(0, S, br))
        assert full == math.ceil(S / br) * math.ceil(T / bc)
        assert total < full


# ------------------------------------------------------------------------ exercise references agree
def test_split_plan_reference_matches_the_module():
    rng = np.random.default_rng(3)
    (cases,) = ap.split_plan_inputs((120,), np.dtype("float32"), rng)
    bps, splits = ap.split_plan_reference(cases)
    for r, (pairs, length, regs, threads, sms, min_rows, tile) in enumerate(cases):
        assert bps[r] == ap.blocks_per_sm(regs, threads)
        assert splits[r] == ap.choose_splits(pairs, length, bps[r], sms, tile, min_rows)


def _merge(a, b):
    m = max(a[0], b[0])
    if m == -np.inf:
        return np.array(a, copy=True)
    wa, wb = np.exp(a[0] - m), np.exp(b[0] - m)
    out = np.empty_like(a)
    out[0] = m
    out[1:] = wa * a[1:] + wb * b[1:]
    return out


def test_merge_order_reference_is_any_order_of_pairwise_merges():
    rng = np.random.default_rng(4)
    parts, order, mode = ap.merge_order_inputs((20, 7, 3), np.dtype("float64"), rng)
    (ref,) = ap.merge_order_reference(parts, order, mode)
    assert np.all(ref[0, 0] == -np.inf) and np.all(ref[0, 1:] == 0)  # row 0: every part empty
    for r in range(parts.shape[0]):
        for perm in (order[r], order[r][::-1], np.arange(parts.shape[1])):
            acc = np.array([-np.inf] + [0.0] * (parts.shape[2] - 1))
            for p in perm:
                acc = _merge(acc, parts[r, p])
            np.testing.assert_allclose(acc, ref[r], rtol=1e-12, atol=1e-12)
