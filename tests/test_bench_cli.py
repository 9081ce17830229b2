"""Benchmark harness, plots from JSON, the command line, doctor and the PTX check (tiny sizes)."""
import json

import numpy as np
import pytest

from kernels_src import bench, plots
from kernels_src.cli import main
from kernels_src.usage import UsageError, parse_sizes


@pytest.fixture(scope="module")
def cpu_result():
    return bench.bench("axpy", "cpu", sizes=[(64,), (1000,)], repeat=3, progress=False)


def test_cpu_bench_rows_are_consistent(cpu_result):
    rows = [r for r in cpu_result["rows"] if "median_s" in r]
    names = {r["variant"] for r in rows}
    assert {"numpy", "loop", "prange"} <= names
    for r in rows:
        assert r["median_s"] > 0
        assert r["gflops"] == pytest.approx(2 * r["size"][0] / r["median_s"] / 1e9)
        assert r["gbps"] == pytest.approx(r["bytes"] / r["median_s"] / 1e9)
        assert "vs_baseline" in r and r["baseline_name"] == "numpy"
        assert r["frac_copy_bw"] == pytest.approx(r["gbps"] / cpu_result["peaks"]["copy_gbps"])
    meta = cpu_result["meta"]
    assert {"date", "device", "versions"} <= meta.keys() and "numba" in meta["versions"]


def test_time_cpu_excludes_compilation():
    calls = []

    def fn():
        calls.append(1)

    times = bench.time_cpu(fn, (), warmup=2, min_time=0, min_repeat=5, warmup_time=0)
    assert len(calls) == 2 + len(times) and len(times) >= 5
    calls.clear()  # with a time-based warm-up, at least the two warm-up calls and none of them timed
    times = bench.time_cpu(fn, (), warmup=2, min_time=0, min_repeat=5, warmup_time=0.01)
    assert len(calls) >= 2 + len(times) and len(times) >= 5


def test_json_round_trip_and_table(cpu_result, tmp_path):
    path = bench.save_json(cpu_result, tmp_path / "sub" / "axpy_cpu.json")
    assert not list(path.parent.glob("*.tmp"))
    again = json.loads(path.read_text())
    assert again["rows"] == json.loads(json.dumps(cpu_result["rows"]))
    table = bench.format_table(again)
    assert "prange" in table and "GB/s" in table
    md = plots.bench_table(again)
    assert md.count("\n") >= 6 and "`loop`" in md


def test_plots_refuse_simulated_results(tmp_path, monkeypatch):
    sim = bench.bench("axpy", "gpu", sizes=[(64,)], repeat=2, progress=False)
    assert sim["simulated"] is True and sim["peaks"] == {}
    bench.save_json(sim, tmp_path / "axpy_sim.json")
    monkeypatch.setattr(plots, "DATA", tmp_path)
    with pytest.raises(ValueError, match="simulated"):
        plots.load_bench("axpy_sim")
    with pytest.raises(FileNotFoundError, match="kernels_src bench"):
        plots.load_bench("missing")


def test_roofline_and_scaling_plots_draw(cpu_result):
    import matplotlib

    matplotlib.use("Agg")
    ax = plots.roofline(cpu_result)
    assert len(ax.lines) >= 4
    ax = plots.scaling(cpu_result)
    assert len(ax.lines) >= 3


def test_committed_results_load_and_are_not_simulated():
    benches = 0
    for path in [*plots.DATA.glob("*.json"), *plots.CPU_BENCH_DATA.glob("*.json")]:
        res = json.loads(path.read_text())
        if isinstance(res, dict) and "rows" in res and "op" in res:  # a `kernels bench` result
            benches += 1
            assert not res.get("simulated"), f"{path} holds simulated timings"
            assert res["meta"]["device"]["name"] and res["meta"]["date"]
    assert benches >= 2


def test_parse_sizes():
    assert parse_sizes("1,7,2**4") == [(1,), (7,), (16,)]
    assert parse_sizes("3x5x7") == [(3, 5, 7)]
    assert parse_sizes(None) is None
    with pytest.raises(UsageError):
        parse_sizes("abc")


def test_cli_list_check_bench(capsys, tmp_path):
    assert main(["list"]) == 0
    assert "axpy" in capsys.readouterr().out
    assert main(["check", "axpy", "--sizes", "1,13", "-q"]) == 0
    assert "checks passed" in capsys.readouterr().out
    out = tmp_path / "b.json"
    assert main(["bench", "axpy", "--sizes", "128", "--repeat", "3", "-q", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["op"] == "axpy"
    assert main(["check", "no_such_op"]) == 2
    assert main(["bench", "axpy", "--variants", "nope", "-q"]) == 2


def test_cli_check_fails_on_a_broken_variant(capsys, monkeypatch):
    from kernels_src.registry import get_op

    op = get_op("axpy")
    v = next(v for v in op.variants if v.name == "loop")

    def broken(out, a, x, y):
        out[:] = a * x  # forgot + y

    monkeypatch.setattr(v, "fn", broken)
    assert main(["check", "axpy", "--variant", "loop", "--sizes", "5", "-q"]) == 1
    assert "FAIL axpy/cpu/loop" in capsys.readouterr().out


def test_doctor_runs(run_python):
    r = run_python("from kernels_src.doctor import doctor; raise SystemExit(doctor())")
    assert "numba-cuda" in r.stdout and "PTX (sm_90)" in r.stdout
    assert r.returncode == 0, r.stdout + r.stderr


# Every GPU kernel of the registry, in PTX_PARTS groups of ops (one child process each), so that pytest-xdist's
# workers share the work instead of one worker compiling all of it; the groups together hold every op. Four: each
# child pays ~2 CPU s to start, and with work stealing and the longest tests first (tests/conftest.py) four parts
# of ~45 s balance the two workers as well as eight did.
PTX_PARTS = 4


@pytest.mark.ptx
@pytest.mark.parametrize("part", range(PTX_PARTS), ids=lambda i: f"part{i + 1}of{PTX_PARTS}")
def test_every_gpu_kernel_compiles_to_ptx(part):
    from kernels_src.ptx import compile_registry_subprocess, registry_chunks

    chunks = registry_chunks(PTX_PARTS)
    if part >= len(chunks):
        pytest.skip("fewer ops than parts")
    results = compile_registry_subprocess(chunks[part])
    bad = [str(r) for r in results if not r.ok]
    assert results and not bad, "\n".join(bad)


def test_the_ptx_parts_hold_every_gpu_op_once():
    from kernels_src.ptx import registry_chunks
    from kernels_src.registry import variants

    chunks = registry_chunks(PTX_PARTS)
    ops = [op for c in chunks for op in c]
    assert len(ops) == len(set(ops))
    assert set(ops) == {v.op for v in variants(None, "gpu") if not v.baseline}


@pytest.mark.ptx
def test_ptx_check_catches_a_typing_error(run_python, tmp_path):
    """The simulator happily runs this kernel; NVVM must refuse it."""
    mod = tmp_path / "badkernel.py"
    mod.write_text("from kernels_src.device import cuda\n\n@cuda.jit\ndef k(out, x):\n"
                   "    i = cuda.grid(1)\n    out[i] = x[i] + 'a string'\n")
    code = ("import sys; sys.path.insert(0, %r)\nfrom kernels_src import ptx\nimport badkernel\n"
            "try:\n    ptx.compile_one(badkernel.k, 'void(float32[::1], float32[::1])')\n    print('compiled')\n"
            "except Exception as e:\n    print('refused', type(e).__name__)\n") % str(tmp_path)
    r = run_python(code, {"KERNELS_DEVICE": "ptx"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("refused"), r.stdout


@pytest.mark.gpu
def test_gpu_bench_uses_events_and_reports_peaks():
    res = bench.bench("axpy", "gpu", sizes=[(1 << 20,)], repeat=5, progress=False)
    assert not res["simulated"] and res["peaks"]["copy_gbps"] > 100
    assert all(np.isfinite(r["gbps"]) for r in res["rows"] if "median_s" in r)
