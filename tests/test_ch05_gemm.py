"""Chapter 5 (GEMM): what the generic registry tests do not cover.

The generic tests (test_registry.py) check every rung at the op's small sizes. Here: GPU rungs on sizes
that span two or more tiles in every dimension and odd numbers of K tiles (double buffering), the CPU
register-blocked rungs across their K blocking and edge tiles, that the tolerance can fail, the traffic
model, the tile explorer's arithmetic, and the compiler facts chapter 5 is built on (PTX for sm_90).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import kernels_src
from kernels_src import parity
from kernels_src.figures import gemm as gemmfig
from kernels_src.ops import gemm
from kernels_src.registry import Variant, get_op

OP = get_op("gemm")


def _check(key, size):
    rep = parity.check_variant(kernels_src.get_variant(key), OP, size, seed=7)
    if rep.skipped:
        pytest.skip(rep.skipped)
    assert rep.ok, str(rep)


@pytest.mark.parametrize("key,size", [
    ("gemm/gpu/hinted", (129, 131, 17)),        # 2 x 2 blocks of 128 x 128, 3 K tiles
    ("gemm/gpu/dbuf", (129, 131, 17)),          # odd tile count: the last tile has no partner buffer
    ("gemm/gpu/dbuf", (5, 3, 16)),              # exactly 2 K tiles
    ("gemm/gpu/tuned", (130, 257, 9)),          # 2 x 2 blocks of 128 x 256
    ("gemm/gpu/blocktile1d", (65, 66, 9)),      # 2 x 2 blocks of 64 x 64
    ("gemm/gpu/vec", (128, 128, 16)),           # one full block, two full K tiles: the 16-byte path only
    ("gemm/gpu/warptile", (128, 132, 20)),      # a full block (16-byte path) + an edge block; a partial K tile
    ("gemm/gpu/warptile", (136, 128, 36)),      # edge rows below a full block; 3 K tiles (odd: dbuf's last)
])
def test_gpu_rungs_span_several_tiles(key, size, sim_race_checked):  # and race-free at these sizes
    _check(key, size)


@pytest.mark.parametrize("size", [(5, 6, 7), (4, 4, 1), (9, 13, 1030), (33, 1, 5)])
@pytest.mark.parametrize("name", ["regblock", "regblock_par", "blocked", "blocked_par"])
def test_cpu_blocked_rungs_edges(name, size):
    """M, N not multiples of the 4x4 register tile; K past one CPU_KC=1024 block."""
    _check(f"gemm/cpu/{name}", size)


def test_tolerance_catches_a_dropped_k():
    """A GEMM that forgets the last k fails the check: the K-dependent tolerance is not too loose."""
    def forgets_last_k(C, A, B):
        C[:] = A[:, :-1].astype(np.float32) @ B[:-1, :]

    rep = parity.check_variant(Variant("gemm", "cpu", "bug", forgets_last_k), OP, (33, 17, 300))
    assert not rep.ok


def test_tolerance_scale():
    rtol, atol = parity.resolve_tol(OP.tol, np.float32, (8, 8, 1024))
    eps = np.finfo(np.float32).eps
    assert atol == pytest.approx(4 * 1024 * eps + 1e-6)
    assert rtol == 1e-5


def test_tile_bytes_model():
    """A 128 x 128 tiling of 256^3 reads A twice, B twice and writes C once."""
    n = 256
    assert gemm.tile_bytes(128, 128)((n, n, n), 4) == (2 * n * n + 2 * n * n + n * n) * 4
    # the ceil: 129 columns need 2 column blocks, so A is read twice
    assert gemm.tile_bytes(128, 128)((128, 129, 8), 4) == (128 * 8 * 2 + 8 * 129 * 1 + 128 * 129) * 4


def test_tile_stats_counts():
    st = gemmfig.tile_stats(128, 128, 8, 8, 8, M=1024, N=1024, K=1024)
    assert st["threads"] == 256
    assert st["smem_bytes"] == 2 * (128 + 128) * 8 * 4
    assert st["blocks"] == 64
    assert st["flop_per_byte_global"] == pytest.approx(2 * 128 * 128 / (4 * 256))  # 32 FLOP/byte
    assert st["smem_loads_per_fma"] == pytest.approx(16 / 64)
    small = gemmfig.tile_stats(16, 16, 8, 1, 1)
    assert small["threads"] == 256 and small["smem_loads_per_fma"] == 2


def test_tuned_is_the_sweep_winner():
    """Rung 9 must be the fastest shape of the committed sweep (or the claim in its docstring is false)."""
    sweep = json.loads((gemmfig.DATA / "bench" / "gemm_sweep.json").read_text())
    best = max((r for r in sweep["rows"] if r["config"]), key=lambda r: r["gflops"])
    cfg = {k: v for k, v in best["config"].items()}
    want = {k: v for k, v in gemm.TUNED.items() if k != "pad"}
    assert {k: cfg.get(k) for k in want} == want


@pytest.mark.ptx
def test_ptx_hints_vectorize_shared_loads():
    """The chapter's central claim, recompiled: rung 5 has only scalar shared loads, rung 6 (same
    algorithm, plus `tid & (NT-1)` and `alignment=16`) has 16-byte ones, and neither spills."""
    code = ("import json; from kernels_src.ops import gemm; from kernels_src.tools import gemm as tools\n"
            "out = {n: tools.ptx_report(getattr(gemm, k))['counts'] for n, k in "
            "(('bt2d', '_bt2d'), ('hinted', '_hinted'))}\n"
            "print('@@' + json.dumps(out))")
    env = dict(os.environ, KERNELS_DEVICE="ptx", NUMBA_ENABLE_CUDASIM="0")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    counts = json.loads(p.stdout.split("@@", 1)[1])
    assert counts["bt2d"]["ld.shared.v4.f32"] == 0 and counts["bt2d"]["ld.shared.f32"] >= 16
    assert counts["hinted"]["ld.shared.v4.f32"] >= 4 and counts["hinted"]["ld.shared.f32"] == 0
    for c in counts.values():
        assert c["ld.local"] == 0 and c["st.local"] == 0


@pytest.mark.ptx
def test_vec_rungs_emit_16_byte_global_loads():
    """Rungs 10-11: kernels_src.vec.load4 gives ld.global.v4.f32 (and 16-byte stores of C), the 64
    accumulators stay in registers, and the launch bounds keep ptxas at <= 128 registers (2 blocks/SM)."""
    code = ("import json; from kernels_src.ops import gemm; from kernels_src.tools import gemm as tools\n"
            "out = {}\n"
            "for n in ('_vec', '_warptile'):\n"
            "    r = tools.ptx_report(getattr(gemm, n).kernel, gemm.SIG_VEC)\n"
            "    out[n] = dict(r['counts'], v4=r['ptx'].count('ld.global.v4.f32'), st4=r['ptx'].count('st.global.v4.f32'),"
            " registers=r.get('registers'))\n"
            "print('@@' + json.dumps(out))")
    env = dict(os.environ, KERNELS_DEVICE="ptx", NUMBA_ENABLE_CUDASIM="0")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    counts = json.loads(p.stdout.split("@@", 1)[1])
    for c in counts.values():
        assert c["v4"] >= 2 and c["st4"] >= 1 and c["ld.shared.v4.f32"] >= 4
        assert c["ld.local"] == 0 and c["st.local"] == 0
        assert c["registers"] is None or c["registers"] <= 128


def test_profile_data_has_every_profiled_rung():
    rows = gemmfig.load_ncu()
    for n in ("hinted", "conflictfree", "dbuf", "vec", "warptile"):
        d = gemmfig.ncu_derived(rows[n])
        assert 0 < d["ffma_share"] <= 100 and 0 < d["issue"] <= 100
    # the chapter's rung-7 claim: rung 6 had bank conflicts, rung 7 has (almost) none
    assert gemmfig.ncu_derived(rows["hinted"])["ld_conflicts_m"] > 100
    assert gemmfig.ncu_derived(rows["conflictfree"])["ld_conflicts_m"] < 1
