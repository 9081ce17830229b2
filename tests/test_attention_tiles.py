"""The flash-attention forward's tile from the runtime's autotune table (chapter 9, rungs 6-7; issue 24):
the decision for a set of shapes from a test table, the documented default without one, the error for a
table that names a tile the kernel cannot build, and the kernel launching the table's tile (simulator)."""
import json

import numpy as np
import pytest

import kernels_src
from kernels_src import device, parity
from kernels_src.ops import attention as A
from kernels_src.ops import attention_flash2 as f
from kernels_src.runtime.tiles import TileTableError, choose_tile, tile_text


def _entry(rung, d, causal, tile):
    br, bc, tm, tn = tile[:4]
    return {"kind": "attention", "variant": f"attention/gpu/{rung}", "D": d, "causal": causal,
            "best": dict(BR=br, BC=bc, TM=tm, TN=tn, minblocks=tile[4] if len(tile) > 4 else 0)}


TABLE = {"schema": 1, "thresholds": {}, "entries": [], "tiles": [
    _entry("flash_shfl", 64, 0, (64, 64, 8, 8, 3)),
    _entry("flash_shfl", 64, 1, (64, 32, 4, 4)),
    _entry("flash_shfl", 128, 0, (16, 32, 4, 4, 2)),
    _entry("flash_vec", 64, 1, (32, 64, 8, 8, 3)),
    {"kind": "gemm_tile", "variant": "attention/gpu/flash_shfl", "D": 64, "causal": 1,  # another kind: ignored
     "best": dict(BR=1, BC=1, TM=1, TN=1)},
]}


@pytest.mark.parametrize("d,causal,shuffle,want", [
    (64, 0, True, (64, 64, 8, 8, 3)),   # the table's entries, each key exactly
    (64, 1, True, (64, 32, 4, 4, 0)),
    (128, 0, True, (16, 32, 4, 4, 2)),
    (64, 1, False, (32, 64, 8, 8, 3)),
    (128, 1, True, None),               # no entry for this key: the default
    (64, 0, False, None),
    (32, 0, True, None),
])
def test_decision_from_a_table(d, causal, shuffle, want):
    tile, source = f.flash2_tile(d, causal, shuffle, table=TABLE)
    if want is None:
        assert tile == dict(f.flash2_config(d, shuffle), minblocks=0)
        assert source.startswith("default")
    else:
        assert tuple(tile[k] for k in ("BR", "BC", "TM", "TN", "minblocks")) == want
        assert source.startswith("table")


def test_the_table_tiles_are_ones_the_kernel_can_build():
    for e in TABLE["tiles"][:4]:
        assert e["best"] in f.flash2_tiles(e["D"], e["variant"].endswith("shfl"), f.TILE_MINBLOCKS)


@pytest.mark.parametrize("d", [16, 32, 64, 128])
@pytest.mark.parametrize("shuffle", [False, True])
def test_default_without_a_table(d, shuffle, monkeypatch):
    """No table (the simulator, a CPU, KERNELS_DISPATCH_TABLE=none): flash2_config, which is also a tile the
    kernel lists (so a table may name it)."""
    monkeypatch.setenv("KERNELS_DISPATCH_TABLE", "none")
    for dev in ("gpu", "sim"):
        tile, source = f.flash2_tile(d, 1, shuffle, dev=dev)
        assert tile == dict(f.flash2_config(d, shuffle), minblocks=0)
        assert source.startswith("default")
    assert dict(f.flash2_config(d, shuffle), minblocks=0) in f.flash2_tiles(d, shuffle, f.TILE_MINBLOCKS)


def test_tiles_listed_are_exactly_those_without_an_error():
    for d in (16, 64, 128):
        for shuffle in (False, True):
            listed = f.flash2_tiles(d, shuffle, (0,))
            for t in listed:
                assert f.tile_error(d, shuffle, t["BR"], t["BC"], t["TM"], t["TN"]) is None
            # a few that cannot be built, each for its own reason
            assert f.tile_error(d, shuffle, 128, 64, 8, 8) is not None  # shared memory (and accumulators)
            assert f.tile_error(d, shuffle, 64, 64, 8, 6) is not None  # TN not a multiple of 4
            assert f.tile_error(d, shuffle, 48, 32, 8, 4) is not None  # BR/4 not a power of two
            assert dict(BR=128, BC=64, TM=8, TN=8, minblocks=0) not in listed


@pytest.mark.parametrize("best,why", [
    (dict(BR=128, BC=64, TM=8, TN=8, minblocks=0), "cannot build"),  # 96 KiB of shared memory at D = 64
    (dict(BR=64, BC=64, TM=8, TN=6, minblocks=0), "cannot build"),
    (dict(BR=64, BC=64, TM=8, TN=8, minblocks=5), "cannot build"),  # 5 blocks x 64 threads: not a tried bound
    (dict(BR=64, BC=64, TM=8), "is a JSON object with"),  # malformed
    ("64x64x8x8", "is a JSON object with"),
])
def test_a_table_naming_a_tile_that_does_not_exist_is_refused(best, why):
    bad = {"tiles": [{"kind": "attention", "variant": "attention/gpu/flash_shfl", "D": 64, "causal": 0,
                      "best": best}]}
    with pytest.raises(TileTableError, match=why) as e:
        f.flash2_tile(64, 0, True, table=bad)
    if why == "cannot build":
        assert "tiles that exist" in str(e.value) and "64x64x8x4/0" in str(e.value)
    # another key of the same table is not affected by the bad entry
    assert f.flash2_tile(64, 1, True, table=bad)[1].startswith("default")


def test_a_bad_table_file_is_refused(tmp_path):
    p = tmp_path / "t.json"
    p.write_text("{not json")
    with pytest.raises(TileTableError, match="not valid JSON"):
        choose_tile("attention", {"D": 64}, {}, [], table=p)
    with pytest.raises(TileTableError, match="does not exist"):
        choose_tile("attention", {"D": 64}, {}, [], table=tmp_path / "missing.json")


def test_tile_text_round_trip():
    from kernels_src.tools.autotune_attention import SHORTLIST, _parse, candidates

    t = dict(BR=64, BC=32, TM=8, TN=4, minblocks=3)
    assert _parse(tile_text(t)) == t
    for (d, shuffle), names in SHORTLIST.items():  # every shortlisted tile exists (none silently dropped)
        assert len(candidates(d, shuffle)) == len(names)
        assert tile_text(dict(f.flash2_config(d, shuffle), minblocks=0)) in names  # the default is timed too


@pytest.mark.skipif(not device.SIMULATED and device.MODE != "gpu", reason="needs the simulator or a GPU")
def test_the_kernel_launches_the_tables_tile(tmp_path, monkeypatch, sim_greenlets):
    """Rung 6 (simulator) reads the table named by KERNELS_DISPATCH_TABLE at launch, builds that tile and still
    matches the float64 reference; a bad tile there fails the call."""
    size = (1, 2, 1, 19, 23, 16, 1)  # GQA, S != T, causal, nothing a multiple of a tile
    want_tile = dict(BR=32, BC=16, TM=4, TN=4, minblocks=2)
    assert want_tile != dict(f.flash2_config(16, False), minblocks=0)
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"schema": 1, "tiles": [
        {"kind": "attention", "variant": "attention/gpu/flash_vec", "D": 16, "causal": 1, "best": want_tile}]}))
    monkeypatch.setenv("KERNELS_DISPATCH_TABLE", str(table))
    built = []
    real = f.flash2

    def spy(D, shuffle, **cfg):
        built.append(dict(cfg))
        return real(D, shuffle, **cfg)

    monkeypatch.setattr(f, "flash2", spy)
    v = kernels_src.get_variant("attention/gpu/flash_vec")
    inputs = A.make_inputs(size, np.float32, np.random.default_rng(3))
    o_ref, l_ref = A.reference(*parity.to_float64(inputs))
    outs = [np.full(o_ref.shape, np.nan, np.float32), np.full(l_ref.shape, np.nan, np.float32)]
    with device.simulator_speedup():
        o, lse = parity.run_variant(v, inputs, outs)
    assert built and built[-1] == want_tile
    rtol, atol = A.tol(size, np.float32)
    np.testing.assert_allclose(o, o_ref, rtol=rtol, atol=atol)
    np.testing.assert_allclose(lse, l_ref, rtol=rtol, atol=atol)
    table.write_text(json.dumps({"schema": 1, "tiles": [
        {"kind": "attention", "variant": "attention/gpu/flash_vec", "D": 16, "causal": 1,
         "best": dict(BR=16, BC=16, TM=4, TN=4, minblocks=0)}]}))  # 16 threads: not a tile rung 6 builds
    with pytest.raises(TileTableError, match="cannot build"):
        parity.run_variant(v, inputs, [np.full(o_ref.shape, np.nan, np.float32),
                                       np.full(l_ref.shape, np.nan, np.float32)])


def test_the_committed_tables_name_only_tiles_that_exist():
    """Every attention tile entry of a committed device table is one the rung can build (what the rung would
    raise at its first launch on that GPU is caught here, on any machine)."""
    from kernels_src.runtime import dispatch as D

    for path in sorted(D.TABLES.glob("*.json")):
        for e in json.loads(path.read_text()).get("tiles") or []:
            if e.get("kind") != "attention":
                continue
            shuffle = e["variant"].endswith("flash_shfl")
            assert e["variant"] in ("attention/gpu/flash_shfl", "attention/gpu/flash_vec"), (path, e["variant"])
            tile, source = f.flash2_tile(e["D"], e["causal"], shuffle, table=path)
            assert source.startswith("table") and tile == e["best"] | {"minblocks": e["best"].get("minblocks", 0)}
