"""The CPU rungs added for issue 36, beyond what the registry's generic tests check (every variant against its float64
reference, edge inputs included): the properties their docstrings claim.

- clipped AdamW's prange rung gives the same bits on 1 and 2 threads (its norm is summed in fixed chunks);
- the embedding backward sorted by token gives the same bits as a serial scatter-add in position order;
- ``pow2f`` is 2**n exactly over the whole normal range (``exp_f32`` is built on it);
- the first-update and GELU-backward rungs compile without libm calls, the latter to fewer packed instructions.
"""
import platform

import numpy as np
import pytest

import kernels_src.ops  # noqa: F401  (registers every op)
from kernels_src.registry import get_op, get_variant


def _run(name, variant, size, threads=None):
    from numba import get_num_threads, set_num_threads  # test-side only: the thread count of Numba's pool

    op = get_op(name)
    inputs = op.make_inputs(size, np.dtype("float32"), np.random.default_rng(3))
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    ref = op.reference(*inputs)
    ref = ref if isinstance(ref, tuple) else (ref,)
    outs = [np.full(np.shape(r), np.nan, np.float32) for r in ref]  # poisoned
    old = get_num_threads()
    try:
        if threads is not None:
            set_num_threads(min(threads, old))
        get_variant(f"{name}/cpu/{variant}").fn(*outs, *inputs)
    finally:
        set_num_threads(old)
    return outs, inputs


def test_adamw_clip_prange_same_bits_on_any_thread_count():
    one, _ = _run("adamw_clip", "prange", (100_003,), threads=1)
    two, _ = _run("adamw_clip", "prange", (100_003,), threads=2)
    for a, b in zip(one, two):
        assert not np.isnan(a).any()
        assert np.array_equal(a.view(np.int32), b.view(np.int32))


@pytest.mark.parametrize("variant", ["sorted", "dealt"])
def test_embedding_bwd_sorted_sums_in_position_order(variant):
    (dtable,), (ids, dx, V) = _run("embedding_bwd", variant, (4099, 197, 33))  # V > 64 chunks: rows dealt twice+
    serial = np.zeros((V, dx.shape[1]), np.float32)
    for m in range(ids.shape[0]):  # float32 adds in position order, as the serial loop does
        serial[ids[m]] += dx[m]
    assert np.array_equal(dtable.view(np.int32), serial.view(np.int32))


def test_transpose_regs16_any_placement_of_the_rows():
    """Rung 3 starts its 16 x 16 register blocks where the rows start a 64-byte line; the columns and rows before
    and after are moved one float at a time. Every placement of X and Y in a line, shapes with and without whole
    blocks: exactly X.T, every element written (Y poisoned with NaN)."""
    from kernels_src.ops import embedding as E

    def placed(shape, off):
        n = int(np.prod(shape))
        buf = np.empty(n + 64, np.float32)
        s = (-(buf.ctypes.data // 4)) % 16 + off
        return buf[s:s + n].reshape(shape)

    rng = np.random.default_rng(16)
    for shape in [(80, 96), (96, 80), (64, 64), (48, 17), (16, 16), (33, 32), (1, 16)]:
        for ox in range(0, 16, 3):
            for oy in range(0, 16, 5):
                X = placed(shape, ox)
                X[:] = rng.standard_normal(shape)
                Y = placed(shape[::-1], oy)
                Y[:] = np.nan
                E.transpose_regs16(Y, X)
                assert np.array_equal(Y, X.T), (shape, ox, oy)


def test_pow2f_is_exact_over_the_normal_range():
    from kernels_src.compiler import njit
    from kernels_src.ops.cpumath import pow2f

    @njit
    def all_pow2(out, n):
        for i in range(n.size):
            out[i] = pow2f(n[i])

    n = np.arange(-126, 128, dtype=np.float32)
    out = np.full_like(n, np.nan)
    all_pow2(out, n)
    assert np.array_equal(out, np.ldexp(np.float32(1.0), n.astype(np.int32)).astype(np.float32))


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="counts x86-64 SIMD instructions")
def test_new_rungs_compile_without_libm_calls():
    from kernels_src.tools.asm import variant_asm

    first = variant_asm("adam_first_update", "prange")["total"]
    assert first["packed_fp_total"] > 0 and not first["calls"], first
    old = variant_asm("gelu_bwd", "simd")["total"]
    new = variant_asm("gelu_bwd", "simd_as")["total"]
    assert not new["calls"], new["calls"]
    assert new["packed_fp_total"] < old["packed_fp_total"], (old, new)


def test_chapter_table_reads_the_board_and_names_missing_ops(tmp_path, monkeypatch):
    import json

    from kernels_src.figures import cpu as cpufig

    board = {"meta": {}, "peaks": {"copy_gbps": 10.0},
             "rows": [{"op": "adam", "kind": "memory", "size_label": "8", "best": "prange", "best_s": 1e-3,
                       "frac_copy": 0.8, "vs_numpy": None, "vs_torch": None}]}
    (tmp_path / "cpuboard.json").write_text(json.dumps(board))
    monkeypatch.setattr(cpufig, "CPU_BENCH_DATA", tmp_path)
    text = cpufig.ops_table(["adam", "no_such_op"])
    assert "| 12 | adam | 8 | prange |" in text and "80 %" in text
    assert "Not on the committed board yet: no_such_op" in text
    (tmp_path / "cpuboard.json").unlink()
    assert "not been measured" in cpufig.ops_table(["adam"])
