"""The CPU path's tools: the scoreboard's arithmetic (kernels cpuboard), the instruction counter (kernels asm),
the torch-on-the-CPU requirement, and the per-machine folder the book reads."""
import json

import numpy as np
import pytest

from kernels_src import bench
from kernels_src.tools import asm, cpuboard


def _row(variant, s, baseline=False, size=(64,), rung=1):
    return {"variant": variant, "rung": rung, "baseline": baseline, "size": list(size),
            "size_label": "x".join(map(str, size)), "median_s": s, "q1_s": s, "q3_s": s, "gbps": 1.0,
            "gflops": 1.0, "frac_copy_bw": 0.5}


def test_summary_takes_the_fastest_course_rung_at_the_largest_size():
    res = {"op": "axpy", "kind": "memory", "rows": [
        _row("loop", 1.0, size=(8,)), _row("prange", 9.0), _row("loop", 4.0), _row("numpy", 2.0, True),
        _row("torch", 8.0, True), _row("numpy", 0.1, True, size=(8,))]}
    s = cpuboard.summarize(res)
    assert s["best"] == "loop" and s["size"] == [64]  # not the faster row at the smaller size
    assert s["vs_numpy"] == pytest.approx(0.5) and s["vs_torch"] == pytest.approx(2.0)


def test_summary_says_why_a_yardstick_is_missing():
    res = {"op": "axpy", "kind": "memory", "rows": [
        _row("loop", 1.0), {"variant": "torch", "size": [64], "size_label": "64", "skipped": "torch is not installed"}]}
    s = cpuboard.summarize(res)
    assert s["vs_torch"] is None and s["torch_why"] == "torch is not installed"
    assert s["numpy_why"] == "no such baseline registered"


def test_board_runs_end_to_end_and_a_partial_run_keeps_other_rows(tmp_path):
    board = cpuboard.run(["axpy"], tmp_path, again=True, progress=False)
    (r,) = board["rows"]
    assert r["op"] == "axpy" and r["best_s"] > 0 and r["best_s_run2"] > 0 and "run_spread" in r
    assert (tmp_path / "axpy_cpu.json").exists()
    cpuboard.run(["copy"], tmp_path, progress=False, largest=True)  # --largest: the scored size only
    ops = [x["op"] for x in json.loads((tmp_path / "cpuboard.json").read_text())["rows"]]
    assert ops == ["axpy", "copy"]
    sizes = {op: {tuple(r["size"]) for r in json.loads((tmp_path / f"{op}_cpu.json").read_text())["rows"]}
             for op in ops}
    assert len(sizes["axpy"]) > 1 and len(sizes["copy"]) == 1
    assert "axpy" in cpuboard.format_board(board)
    with pytest.raises(KeyError):
        cpuboard.board_ops(["no_such_op"])


def test_classify_counts_by_kind_and_width():
    text = """
\tvfmadd231ps\t%ymm1, %ymm2, %ymm3
\tvfmadd231ps\t%zmm1, %zmm2, %zmm3
\tvaddps\t%xmm1, %xmm2, %xmm3
\tvmulss\t%xmm0, %xmm1, %xmm1
\tvmovups\t(%rax), %ymm0
\tvpmaddwd\t%ymm1, %ymm2, %ymm3
\taddq\t$8, %rax
"""
    ir = "  %5 = call float @llvm.exp.f32(float %4)\n  %9 = call <8 x float> @llvm.exp.v8f32(<8 x float> %8)\n"
    c = asm.classify(text, ir)
    assert c["packed_fp"] == {"128bit": 1, "256bit": 1, "512bit": 1} and c["widest_fp_bits"] == 512
    assert c["scalar_fp"] == 1 and c["packed_int_total"] == 1  # moves are not arithmetic
    assert c["calls"] == {"llvm.exp.f32": 1, "llvm.exp.v8f32": 1}


def test_asm_of_a_registered_rung():
    r = asm.variant_asm("axpy", "prange", size=(1000,))
    assert r["functions"] and r["total"]["packed_fp_total"] + r["total"]["scalar_fp"] > 0


def test_torch_rows_are_skipped_with_a_reason_when_torch_is_missing(monkeypatch):
    import builtins

    from kernels_src.ops import cpu_baselines

    real = builtins.__import__

    def no_torch(name, *a, **k):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("No module named 'torch'")
        return real(name, *a, **k)

    import importlib.util
    import sys

    real_find = importlib.util.find_spec
    monkeypatch.setattr(builtins, "__import__", no_torch)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real_find(name, *a))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(cpu_baselines, "_state", {})
    ok, why = cpu_baselines.torch_cpu()
    assert not ok and "pip install torch" in why


def test_cpu_results_are_filed_by_machine():
    assert bench.cpu_slug("AMD EPYC 7B13 64-Core Processor", 2) == "amd-epyc-7b13-64-core-processor-2c"
    assert bench.cpu_slug("Intel(R) Xeon(R) Processor", 2) == "intel-xeon-processor-2c"
    env = bench.environment()
    assert env["cpu_model"] and env["cpu_count"] >= 1 and isinstance(env["simd"], list)


def test_the_book_reads_the_cpu_machine_folder_first(tmp_path, monkeypatch):
    from kernels_src import plots

    machine = tmp_path / "cpu" / "m-2c"
    machine.mkdir(parents=True)
    res = {"op": "axpy", "simulated": False, "rows": [], "meta": {"tag": "machine"}}
    (machine / "axpy_cpu.json").write_text(json.dumps(res))
    (tmp_path / "axpy_cpu.json").write_text(json.dumps({**res, "meta": {"tag": "root"}}))
    monkeypatch.setattr(plots, "DATA", tmp_path)
    monkeypatch.setattr(plots, "CPU_BENCH_DATA", machine)
    assert plots.load_bench("axpy_cpu")["meta"]["tag"] == "machine"
    (machine / "axpy_cpu.json").unlink()
    assert plots.load_bench("axpy_cpu")["meta"]["tag"] == "root"


def test_scoreboard_figure_and_table():
    from kernels_src.figures import cpu as cpufig

    board = {"meta": {"cpu_model": "X", "cpu_count": 2, "simd": []}, "peaks": {"copy_gbps": 10.0}, "rows": [
        {"op": "axpy", "kind": "memory", "size_label": "64", "best": "prange", "best_s": 1e-3, "vs_numpy": 1.5,
         "vs_torch": 0.5, "frac_copy": 0.8, "run_spread": 0.02},
        {"op": "gemm", "kind": "compute", "size_label": "8x8x8", "best": "packed", "best_s": 2e-3, "vs_numpy": 0.9,
         "vs_torch": None, "frac_copy": None}]}
    g = cpufig.goals(board)
    assert (g["beat_torch"], g["with_torch"], g["beat_numpy"], g["with_numpy"]) == (0, 1, 1, 2)
    assert g["copy70"] == 1 and g["behind_torch"] == ["axpy"]
    table = cpufig.board_table(board)
    assert "**1.50×**" in table and "0.50×" in table and "80 %" in table
    import matplotlib

    matplotlib.use("Agg")
    assert cpufig.board_plot(board) is not None


def test_cpuboard_asm_counts_each_best_rung_and_its_bytes(tmp_path):
    rows = [{"op": "axpy", "kind": "memory", "size": [1000], "size_label": "1000", "best": "loop"},
            {"op": "relu", "kind": "memory", "size": [1000], "size_label": "1000", "best": "loop"}]
    board = {"meta": {"cpu_model": "the board's CPU"}, "peaks": {}, "rows": rows}
    with pytest.raises(FileNotFoundError, match="kernels cpuboard"):
        cpuboard.asm_run(tmp_path, progress=False)  # no board there yet
    (tmp_path / "cpuboard.json").write_text(json.dumps(board))
    with pytest.raises(KeyError, match="gemm"):
        cpuboard.asm_run(tmp_path, ["gemm"], progress=False)  # not on this board
    cpuboard.asm_run(tmp_path, ["axpy", "relu"], progress=False, fma=False)
    saved = json.loads((tmp_path / "cpuboard_asm.json").read_text())
    got = {r["op"]: r for r in saved["rows"]}
    assert saved["board"]["cpu_model"] == "the board's CPU" and set(got) == {"axpy", "relu"}
    ax = got["axpy"]
    assert ax["variant"] == "loop" and "error" not in ax
    assert ax["io"]["written"] == 4000 and ax["io"]["read"] == 8000  # out = a x + y: two streams in, one out
    assert got["relu"]["io"]["read"] == got["relu"]["io"]["written"] == 4000
    h = ax["total"]["hot_loop"]
    assert h["stores"] >= 1 and h["packed_fp"] >= 1 and h["scalar_fp"] == 0 and h["per_element"] < 2
    assert "axpy" in cpuboard.format_asm(saved)
    copy = saved["copy_yardstick"]  # the copy's own stores, read from its machine code (or its memcpy call)
    assert copy["memcpy"] or copy["stores"] >= 1


def test_hot_loop_is_the_innermost_loop_with_the_most_vector_work():
    text = """
.LBB0_1:
\tvmulss\t%xmm0, %xmm1, %xmm1
\tjne\t.LBB0_1
.LBB0_2:
\tvbroadcastss\t(%rax), %ymm2
\tvmovups\t(%rsi,%rcx,4), %ymm0
\tvmovups\t64(%rsp), %ymm1
\tvfmadd213ps\t%ymm2, %ymm1, %ymm0
\tvdivps\t%ymm0, %ymm1, %ymm3
\tvmovups\t%ymm3, (%rdi,%rcx,4)
\taddq\t$8, %rcx
\tjne\t.LBB0_2
"""
    h = asm.hot_loop(text)
    assert (h["fma"], h["broadcasts"], h["loads"], h["stores"], h["div_sqrt"]) == (1, 1, 1, 1, 1)
    assert h["bits"] == 256 and h["elements"] == 8 and h["insns"] == 8 and h["vector_alu"] == 2
    assert h["spill_loads"] == 1  # a register reloaded from the stack is not data
    assert asm.hot_loop("\tret\n") is None


def test_misses_table_models_and_evidence():
    from kernels_src.figures import cpu as cpufig

    board = {"meta": {"cpu_model": "X", "cpu_threads": 2}, "rows": [
        {"op": "gelu", "kind": "memory", "best": "simd_exp2", "best_s": 4e-3, "gbps": 33.5, "gflops": 1.0,
         "frac_copy": 0.5, "vs_torch": 0.95, "vs_numpy": 20.0, "run_spread": 0.09},
        {"op": "axpy", "kind": "memory", "best": "prange", "best_s": 1e-3, "gbps": 60.0, "gflops": 1.0,
         "frac_copy": 0.9, "vs_torch": 1.2},
        {"op": "adam", "kind": "memory", "best": "prange", "best_s": 1e-3, "gbps": 20.0, "gflops": 1.0,
         "frac_copy": 0.3}]}
    n = 1 << 24
    hot = {"insns": 40, "vector_alu": 26, "packed_fp": 25, "fma": 14, "loads": 1, "stores": 1, "broadcasts": 0,
           "div_sqrt": 1, "convert": 1, "scalar_fp": 0, "calls": 0, "bits": 512, "elements": 16, "per_element": 2.5}
    asm_res = {"meta": {"cpu_model": "Y"}, "fma_peak_all": {"threads": 2, "fma_per_s": 1.3e10, "gflops": 416.0},
               "rows": [{"op": "gelu", "variant": "simd_exp2", "io": {"read": 4 * n, "written": 4 * n},
                         "total": {"hot_loop": hot, "calls": {}, "packed_fp_total": 30, "scalar_fp": 0}}]}
    ms = cpufig.misses(board, asm_res)
    assert [(m["op"], m["goal"]) for m in ms] == [("gelu", "≥ 1.0× torch"), ("gelu", "≥ 70 % of copy"),
                                                  ("adam", "≥ 70 % of copy")]  # by chapter: 6, then 12
    g = next(m for m in ms if m["op"] == "gelu" and "copy" in m["goal"])
    assert g["measured"].startswith("50 %") and g["asm"].startswith("zmm: 14 FMA") and "no math call" in g["asm"]
    assert "allows 100 % of copy" in g["why"] and "write-allocate" in g["why"]  # r = w: as the copy
    assert "26 vector-unit instructions per 16" in g["why"]
    assert "2.5 instructions per element, 5.2 G instructions/s on each of 2 threads" in g["why"]  # 2.5 x 2^24 / 4 ms / 2
    # vector units: 26/16 instructions per element x 2^24 elements at 13 G/s = 2.1 ms
    assert cpufig.port_model(board["rows"][0], asm_res["rows"][0], asm_res["fma_peak_all"],
                             asm_res["rows"][0]["io"])["t_port"] == pytest.approx(26 / 16 * n / 1.3e10)
    assert cpufig.memory_model(board["rows"][1], {"read": 8, "written": 4})["allowed"] == pytest.approx(1.125)
    io = {"read": 4, "written": 4}  # non-temporal stores: the op's w moves once; a streaming copy moves 2 per 2
    assert cpufig.memory_model(board["rows"][0], io, nt=True)["allowed"] == pytest.approx(1.5)
    assert cpufig.memory_model(board["rows"][0], io, copy_nt=True)["allowed"] == pytest.approx(8 / 12)
    assert "See chapter" in next(m for m in ms if m["op"] == "adam")["why"]
    assert "Control" not in g["why"]  # no other stream counted yet
    relu_hot = {**hot, "vector_alu": 1, "fma": 0, "div_sqrt": 0, "per_element": 0.2}
    board["rows"] += [{"op": "relu", "kind": "memory", "best": "prange", "best_s": 1e-3, "gbps": 40.0,
                       "gflops": 1.0, "frac_copy": 0.84},
                      {"op": "embedding", "kind": "memory", "best": "prange", "best_s": 1e-3, "gbps": 90.0,
                       "gflops": 1.0, "frac_copy": 1.7}]  # over 110 % of copy: its bytes are not all DRAM's
    asm_res["rows"].append({"op": "relu", "variant": "prange", "io": {"read": 4 * n, "written": 4 * n},
                            "total": {"hot_loop": relu_hot, "calls": {}, "packed_fp_total": 1, "scalar_fp": 0}})
    asm_res["rows"].append({**asm_res["rows"][-1], "op": "embedding"})
    ctl = cpufig.control(board["rows"][0], board, asm_res)
    assert ctl["op"] == "relu" and ctl["frac_copy"] == 0.84  # same bytes in and out, next to no arithmetic
    assert "Control: relu (prange)" in cpufig.misses(board, asm_res)[1]["why"]
    table = cpufig.misses_table(board, asm_res)
    assert "| gelu (simd_exp2) |" in table and "compiled on Y" in table
    assert "within the two runs' spread (±9 %)" in ms[0]["why"]  # 0.95x against a 9 % spread
    assert "cpuboard --asm" in cpufig.misses_table(board, None)  # no counts: the table says how to make them
