"""The multi-GPU collectives (kernels_src.dist.gpu, .nccl, .sweep) without a GPU, and on two GPUs where there are.

Without a GPU: the launcher gives every rank the safe environment and ends a launch naming the rank that raised,
died or hung; the sweep's size parser and its bad input; the JSON it writes, from a fake timing function; the
ring and one-shot kernels' per-rank arithmetic in the CUDA simulator (virtual ranks run step by step, since the
simulator runs one kernel at a time), and that their waits hold a rank back until its peer has done its part;
and every kernel compiled to PTX for sm_90. Tests marked ``gpu`` need two GPUs (the two-GPU machine).
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kernels_src import device
from kernels_src.dist import gpu, schedule, sweep
from kernels_src.dist.env import SAFE_ENV
from kernels_src.usage import UsageError

ROOT = Path(__file__).resolve().parents[1]


# ================================================================================================= launcher
def _report_env(host, names):
    host.barrier()
    return host.rank, host.exchange(host.rank * 10), os.getpid(), {k: os.environ.get(k) for k in names}


def _raise_on_1(host):
    if host.rank == 1:
        raise ValueError("rank one fails on purpose")
    host.barrier()


def _die_on_2(host):
    if host.rank == 2:
        os._exit(7)
    host.barrier()


def _hang_on_0(host, pidfile):
    Path(f"{pidfile}.{host.rank}").write_text(str(os.getpid()))
    if host.rank == 0:
        time.sleep(600)
    return host.rank


def test_every_rank_gets_the_safe_environment(monkeypatch):
    for k in SAFE_ENV:
        monkeypatch.setenv(k, "bad")  # the caller's environment asks for multicast: the ranks must not get it
    names = list(SAFE_ENV) + ["RANK", "WORLD_SIZE", "MASTER_PORT"]
    out = gpu.launch(_report_env, 3, names, timeout=120)
    assert [o[0] for o in out] == [0, 1, 2]
    assert all(o[1] == [0, 10, 20] for o in out)  # exchange: every rank's object, in rank order
    for r, (_, _, pid, env) in enumerate(out):
        assert pid != os.getpid()
        assert {k: env[k] for k in SAFE_ENV} == SAFE_ENV
        assert env["RANK"] == str(r) and env["WORLD_SIZE"] == "3"
    assert len({o[3]["MASTER_PORT"] for o in out}) == 1


def test_the_env_dicts_keep_multicast_off_whatever_the_base_says():
    base = {k: "1" for k in SAFE_ENV} | {"PATH": "/bin"}
    envs = gpu.env_for_ranks(2, port=12345, base=base)
    assert [e["RANK"] for e in envs] == ["0", "1"]
    for e in envs:
        assert all(e[k] == v for k, v in SAFE_ENV.items()) and e["PATH"] == "/bin" and e["MASTER_PORT"] == "12345"


def test_a_rank_that_raises_is_named_with_its_traceback():
    with pytest.raises(gpu.GpuLaunchError) as e:
        gpu.launch(_raise_on_1, 2, timeout=120)
    assert e.value.rank == 1 and "rank one fails on purpose" in str(e.value) and "Traceback" in str(e.value)


def test_a_rank_that_dies_is_named_with_its_exit_code():
    with pytest.raises(gpu.GpuLaunchError) as e:
        gpu.launch(_die_on_2, 3, timeout=120)
    assert e.value.rank == 2 and "exit code 7" in str(e.value)


def test_a_rank_that_hangs_ends_the_launch_at_the_timeout_and_is_killed(tmp_path):
    pidfile = tmp_path / "pid"
    t0 = time.monotonic()
    with pytest.raises(gpu.GpuLaunchError) as e:
        gpu.launch(_hang_on_0, 2, str(pidfile), timeout=8)
    assert time.monotonic() - t0 < 50
    assert e.value.rank == 0 and "did not answer within 8 s" in str(e.value)
    for r in range(2):
        f = Path(f"{pidfile}.{r}")
        if f.exists():  # a rank that started: terminated and reaped, nothing left spinning
            with pytest.raises(ProcessLookupError):
                os.kill(int(f.read_text()), 0)


# ============================================================================================ sweep: input
def test_the_default_sizes_are_8B_to_1GiB_on_powers_of_two():
    s = sweep.parse_sizes(None)
    assert s[0] == 8 and s[-1] == 1 << 30 and len(s) == 28
    assert all(b == 2 * a for a, b in zip(s, s[1:]))
    assert 256 << 10 in s and 256 << 20 in s


@pytest.mark.parametrize("text,want", [("8B", [8]), ("4096", [4096]), ("256KiB", [262144]), ("1GiB", [1 << 30]),
                                       ("1KiB..4KiB", [1024, 2048, 4096]), ("12B,8B,12B", [8, 12]),
                                       ("4B..20B", [4, 8, 16]), ("2MB", [2_000_000])])
def test_sizes_parse(text, want):
    assert sweep.parse_sizes(text) == want


@pytest.mark.parametrize("text", ["3B", "10B", "0", "8XB", "abc", "", "1GiB..8B", "2B..8B", "32GiB", "-8"])
def test_bad_sizes_are_refused(text):
    with pytest.raises(UsageError):
        sweep.parse_sizes(text)


def test_impls_parse_and_refuse_unknown_ones():
    assert sweep.parse_impls(None) == ["nccl", "ring", "oneshot"]
    assert sweep.parse_impls("ring,ring,nccl") == ["ring", "nccl"]
    with pytest.raises(UsageError):
        sweep.parse_impls("ring,tree")


@pytest.mark.parametrize("args", [["--sizes", "7B"], ["--impl", "tree"], ["--json", "/no/such/dir/x.json"],
                                  ["--ranks", "1"], ["--repeat", "0"], ["--sizes", "8B..4B"]])
def test_the_command_refuses_bad_input_with_one_line_and_status_2(args, capsys):
    from kernels_src.cli import main

    try:
        rc = main(["collectives", "sweep", *args])
    except SystemExit as e:  # argparse's own usage errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0], err


def test_the_command_line_runs_as_a_module():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "kernels_src", "collectives", "sweep", "--sizes", "3B"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "multiple of 4 B" in p.stderr


# =========================================================================================== sweep: output
def test_the_json_follows_the_schema_on_a_fake_timer():
    alpha = {"nccl": 12e-6, "ring": 20e-6, "oneshot": 6e-6}
    beta = {"nccl": 350e9, "ring": 300e9, "oneshot": 100e9}
    rng = np.random.default_rng(0)

    def timer(impl, nbytes):  # t = alpha + bytes / beta, with 1 % noise, 9 repeats
        return list((alpha[impl] + nbytes / beta[impl]) * (1 + 0.01 * rng.standard_normal(9)))

    sizes = sweep.parse_sizes("8B..64MiB")
    lines = []
    rows = sweep.sweep_with(timer, sizes, list(sweep.IMPLS), 2, progress=lines.append)
    assert len(lines) == len(sizes) and all(len(line.splitlines()) == 1 for line in lines)
    meta = {"device": "NVIDIA H200", "ngpus": 2, "nccl": "2.28.9", "torch": "2.11", "link": "NVLink",
            "nvlink_GBps_per_direction": 478.1, "nvlink_source": "nvidia-smi", "date": "2026-11-26",
            "command": "python -m kernels_src collectives sweep"}
    doc = json.loads(json.dumps(sweep.document(rows, meta)))
    assert set(doc) == {"meta", "rows", "fit"}
    types = {"device": str, "ngpus": int, "nccl": str, "torch": str, "link": str, "nvlink_GBps_per_direction": float,
             "nvlink_source": str, "date": str, "command": str}
    for k, t in types.items():
        assert isinstance(doc["meta"][k], t), k
    assert len(doc["rows"]) == 3 * len(sizes)
    for r in doc["rows"]:
        assert set(r) == {"impl", "bytes", "median_us", "p10_us", "p90_us", "algbw_GBps", "busbw_GBps"}
        assert r["impl"] in sweep.IMPLS and isinstance(r["bytes"], int)
        assert r["p10_us"] <= r["median_us"] <= r["p90_us"]
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / (r["median_us"] * 1e-6) / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])  # 2 (n - 1) / n = 1 for two ranks
        model = alpha[r["impl"]] + r["bytes"] / beta[r["impl"]]
        assert r["median_us"] * 1e-6 == pytest.approx(model, rel=0.05)
    assert set(doc["fit"]) == set(sweep.IMPLS)
    for impl, f in doc["fit"].items():
        assert set(f) == {"alpha_us", "beta_GBps"}
        assert f["alpha_us"] == pytest.approx(alpha[impl] * 1e6, rel=0.05)
        assert f["beta_GBps"] == pytest.approx(beta[impl] / 1e9, rel=0.05)


def test_summarize_refuses_a_nan_time():
    with pytest.raises(ValueError):
        sweep.summarize("ring", 8, [1e-5, float("nan")], 2)


PROBE_SMI = "GPU 0: NVIDIA H200 (UUID: x)\n" + "".join(f"\t Link {i}: 26.562 GB/s\n" for i in range(18)) + \
            "GPU 1: NVIDIA H200 (UUID: y)\n" + "".join(f"\t Link {i}: 26.562 GB/s\n" for i in range(18))


def test_the_nvlink_limit_is_read_from_nvidia_smi():
    link, per_dir, source = sweep.nvlink_info(PROBE_SMI, device="NVIDIA H200")
    assert per_dir == pytest.approx(18 * 26.562)  # GPU 0's links only, not both GPUs'
    assert "18 links" in link and "nvidia-smi" in source and "450" in source


# ============================================================================== kernels in the simulator
sim_only = pytest.mark.skipif(not device.SIMULATED, reason="virtual ranks step by step: the CUDA simulator")


class VirtualRanks:
    """n ranks' buffers, flags and epochs on one (simulated) device; the kernels run rank by rank, step by step."""

    def __init__(self, n, L, spin=2000):
        from kernels_src.compiler import cuda

        self.cuda, self.n, self.L, self.spin = cuda, n, L, spin
        self.bufs = tuple(cuda.to_device(np.full(L + 5, np.nan, np.float32)) for _ in range(n))  # poisoned
        self.slot = L + 3
        self.osbufs = tuple(cuda.to_device(np.full(2 * self.slot, np.nan, np.float32)) for _ in range(n))
        self.rflags = tuple(cuda.to_device(np.zeros(2 * gpu.MAX_BLOCKS, np.int32)) for _ in range(n))
        self.oflags = tuple(cuda.to_device(np.zeros(n * gpu.MAX_BLOCKS, np.int32)) for _ in range(n))
        self.rep = [cuda.to_device(np.zeros(gpu.MAX_BLOCKS, np.int32)) for _ in range(n)]
        self.oep = [cuda.to_device(np.zeros(2, np.int32)) for _ in range(n)]
        self.status = [cuda.to_device(np.zeros(4, np.int32)) for _ in range(n)]

    def ring_step(self, r, t0, t1, grid=2, block=32):
        gpu.ring_kernel[grid, block](self.bufs, self.rflags, self.L, r, self.n, self.rep[r], self.status[r],
                                     self.spin, t0, t1)

    def ring(self, xs):
        for r in range(self.n):
            b = self.bufs[r].copy_to_host()
            b[: self.L] = xs[r]
            self.bufs[r].copy_to_device(b)
        for u in range(2 * self.n):  # arrival, the schedule's steps, the final wait; every rank at each part
            for r in range(self.n):
                self.ring_step(r, u, u + 1)
        return [self.bufs[r].copy_to_host() for r in range(self.n)]

    def oneshot_phase(self, r, dx, p, grid=2, block=32):
        gpu.oneshot_kernel[grid, block](dx, self.osbufs, self.slot, self.oflags, self.L, r, self.n, self.oep[r],
                                        self.status[r], self.spin, p, p + 1)

    def oneshot(self, xs):
        dx = [self.cuda.to_device(x) for x in xs]
        for p in range(2):
            for r in range(self.n):
                self.oneshot_phase(r, dx[r], p)
        return [d.copy_to_host() for d in dx]

    def timed_out(self):
        return [int(s.copy_to_host()[gpu.WAIT_TIMEOUT]) for s in self.status]


def _inputs(n, L, call):
    rng = np.random.default_rng(100 * n + L + call)
    return [(rng.standard_normal(L) * 10 ** rng.uniform(-3, 3, L)).astype(np.float32) for _ in range(n)]


def _assert_sum(got, xs):
    n = len(xs)
    ref = np.sum([x.astype(np.float64) for x in xs], axis=0)
    abs_sum = np.sum([np.abs(x.astype(np.float64)) for x in xs], axis=0)
    ok = schedule.allclose_sum(got, ref, abs_sum, n, np.float32)
    assert ok.all(), (np.flatnonzero(~ok)[:5], got[~ok][:5], ref[~ok][:5])


@sim_only
@pytest.mark.parametrize("n,L", [(1, 5), (2, 1), (2, 7), (2, 300), (3, 2), (3, 37), (4, 131)])
def test_the_ring_kernel_sums_every_rank_in_place_twice(n, L):
    v = VirtualRanks(n, L)
    for call in range(2):  # the second call reuses the flags (epochs) without a reset
        xs = _inputs(n, L, call)
        out = v.ring(xs)
        assert v.timed_out() == [0] * n
        for r in range(n):
            _assert_sum(out[r][:L], xs)
            assert np.isnan(out[r][L:]).all()  # nothing written past the message
    assert all(int(e.copy_to_host()[0]) == 2 for e in v.rep)  # every block (grid 2) finished two calls


@sim_only
@pytest.mark.parametrize("n,L", [(1, 5), (2, 1), (2, 7), (3, 37), (4, 130)])
def test_the_oneshot_kernel_sums_every_rank_three_times_identically(n, L):
    v = VirtualRanks(n, L)
    for call in range(3):  # slots 0, 1, 0: the third call reuses the first one's slot with no reset
        xs = _inputs(n, L, call)
        out = v.oneshot(xs)
        assert v.timed_out() == [0] * n
        for r in range(n):
            _assert_sum(out[r], xs)
            assert np.array_equal(out[r], out[0])  # the same order (ranks 0..n-1) on every rank: same bits
        assert all(list(e.copy_to_host()) == [call + 1, 0] for e in v.oep)  # calls counted, block count reset


@sim_only
def test_nan_propagates_through_both_kernels():
    n, L = 3, 11
    xs = _inputs(n, L, 0)
    xs[1][4] = np.nan
    for algo in ("ring", "oneshot"):
        v = VirtualRanks(n, L)
        out = v.ring(xs) if algo == "ring" else v.oneshot(xs)
        for r in range(n):
            assert np.isnan(out[r][4]), algo
            assert np.isfinite(out[r][:4]).all() and np.isfinite(out[r][5:L]).all(), algo


@sim_only
def test_a_ring_step_waits_for_its_left_neighbour_to_arrive():
    """Rank 0's first step reads rank 1's input: before rank 1 has arrived (its input may still be on its way),
    rank 0 must give up waiting, naming rank 1, rather than read it."""
    v = VirtualRanks(2, 8, spin=50)
    v.ring_step(0, 0, 1)  # rank 0 arrives
    v.ring_step(0, 1, 2)  # and tries its step 0 before rank 1 has arrived
    st = v.status[0].copy_to_host()
    assert st[gpu.WAIT_TIMEOUT] == 1 and st[gpu.WAIT_PEER] == 1 and st[gpu.WAIT_STEP] == 0


@sim_only
def test_a_ring_step_waits_for_its_left_neighbours_previous_step():
    """Rank 0's step 1 (the all-gather, n = 2) copies what rank 1 reduced at step 0: run before it, it must give
    up waiting (naming rank 1) rather than copy a partial sum."""
    v = VirtualRanks(2, 8, spin=50)
    for r in range(2):
        v.bufs[r].copy_to_device(np.ones(13, np.float32))
    v.ring_step(0, 0, 1)
    v.ring_step(1, 0, 1)  # both arrived
    v.ring_step(0, 1, 2)  # rank 0's step 0
    v.ring_step(0, 2, 3)  # rank 0's step 1 before rank 1's step 0
    st = v.status[0].copy_to_host()
    assert v.timed_out() == [1, 0]
    assert st[gpu.WAIT_PEER] == 1 and st[gpu.WAIT_STEP] == 1


@sim_only
def test_a_oneshot_rank_waits_for_every_peers_data():
    v = VirtualRanks(3, 8, spin=50)
    dx = v.cuda.to_device(np.ones(8, np.float32))
    v.oneshot_phase(0, dx, 0)
    v.oneshot_phase(2, v.cuda.to_device(np.ones(8, np.float32)), 0)
    v.oneshot_phase(0, dx, 1)  # rank 1 has not published its data
    st = v.status[0].copy_to_host()
    assert st[gpu.WAIT_TIMEOUT] == 1 and st[gpu.WAIT_PEER] == 1


def test_test_values_are_exact_float32_multiples_of_a_2048th():
    v = gpu.test_values(np.arange(1 << 16), 1)
    assert v.dtype == np.float32 and v.min() >= -1 and v.max() < 1
    assert np.array_equal(v * 2048, np.round(v * 2048))
    assert not np.array_equal(v, gpu.test_values(np.arange(1 << 16), 0))
    assert len(np.unique(v)) > 4000


@sim_only
def test_fill_kernel_writes_the_test_values():
    from kernels_src.compiler import cuda

    d = cuda.to_device(np.full(300, np.nan, np.float32))
    gpu.fill_kernel[2, 32](d, 300, 2)
    assert np.array_equal(d.copy_to_host(), gpu.test_values(np.arange(300), 2))


# ======================================================================================================= PTX
def test_every_kernel_compiles_to_ptx_with_system_scope_flags():
    code = ("import json; from kernels_src import ptx; from kernels_src.dist import gpu\n"
            "out = {}\n"
            "for n in (2, 3):\n"
            "    for k, sig in gpu.ptx_kernels(n):\n"
            "        out[f'{ptx.py_func(k).__name__}/{n}'] = ptx.compile_one(k, sig)\n"
            "print('@@' + json.dumps(out))")
    env = dict(os.environ, KERNELS_DEVICE="ptx", NUMBA_ENABLE_CUDASIM="0", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if p.returncode != 0 and "NVVM" in p.stderr:
        pytest.skip(f"no NVVM: {p.stderr.strip().splitlines()[-1]}")
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.split("@@", 1)[1])
    assert set(out) == {f"{k}/{n}" for k in ("ring_kernel", "oneshot_kernel", "fill_kernel") for n in (2, 3)}
    for name, text in out.items():
        if name.startswith(("ring", "oneshot")):
            assert "ld.relaxed.sys.global.u32" in text and "st.relaxed.sys.global.u32" in text, name
            assert "membar.sys" in text or "fence.sc.sys" in text, name
    assert "st.v4.f32" in out["ring_kernel/2"] or "st.global.v4.f32" in out["ring_kernel/2"]


# ========================================================================================== two real GPUs
def _two_gpus():
    return device.MODE == "gpu" and sweep.gpu_count() >= 2


two_gpus = pytest.mark.skipif(not _two_gpus(), reason="needs two GPUs")


def _gpu_checks(host):
    from kernels_src.compiler import cuda
    from kernels_src.dist import nccl

    n, r = host.size, host.rank
    comm = gpu.GpuComm(host, 1 << 20)
    nccl.init(r, n)
    report = []
    for L in (1, 3, 4, 5, 1000, 4099, 262147, 1 << 20):
        idx = np.arange(L)
        xs = [gpu.test_values(idx, q) for q in range(n)]
        for algo in ("ring", "oneshot", "nccl"):
            for call in range(2):
                if algo == "ring" and call == 0:
                    d = comm.buffer(L)  # registered: in place, no copy
                    d.copy_to_device(xs[r])
                else:
                    d = cuda.to_device(xs[r])  # any array: copied in and out
                if algo == "nccl":
                    nccl.all_reduce(d)
                else:
                    comm.all_reduce(d, algo)
                cuda.synchronize()
                comm.check_status()
                got = d.copy_to_host()
                ref = np.sum([x.astype(np.float64) for x in xs], axis=0)
                ab = np.sum([np.abs(x.astype(np.float64)) for x in xs], axis=0)
                report.append((algo, L, call, bool(schedule.allclose_sum(got, ref, ab, n, np.float32).all())))
    # NCCL's reduce-scatter, all-gather and broadcast on the course's uneven chunks
    L = 1001
    xs = [gpu.test_values(np.arange(L), q) for q in range(n)]
    ref = np.sum([x.astype(np.float64) for x in xs], axis=0)
    lo, hi = schedule.chunk_bounds(L, n, r)
    part = nccl.reduce_scatter(cuda.to_device(xs[r])).copy_to_host()
    report.append(("nccl_reduce_scatter", L, 0, bool(np.allclose(part, ref[lo:hi], rtol=1e-6, atol=1e-6))))
    full = nccl.all_gather(cuda.to_device(xs[r][lo:hi]), L).copy_to_host()
    want = np.concatenate([xs[q][slice(*schedule.chunk_bounds(L, n, q))] for q in range(n)])
    report.append(("nccl_all_gather", L, 0, bool(np.array_equal(full, want))))
    b = cuda.to_device(xs[r])
    nccl.broadcast(b, root=0)
    report.append(("nccl_broadcast", L, 0, bool(np.array_equal(b.copy_to_host(), xs[0]))))
    nccl.close()
    return report


@pytest.mark.gpu
@two_gpus
def test_ring_oneshot_and_nccl_agree_with_numpy_on_two_gpus():
    reports = gpu.launch(_gpu_checks, 2, timeout=300)
    bad = [x for rep in reports for x in rep if not x[3]]
    assert not bad, bad
    assert len(reports[0]) == 8 * 3 * 2 + 3


def _lonely(host):
    """Rank 1 never calls: rank 0's kernel must give up and say it waited for rank 1."""
    from kernels_src.compiler import cuda

    comm = gpu.GpuComm(host, 1024, spin_limit=200_000)
    if host.rank == 0:
        d = comm.buffer(1024)
        comm.all_reduce(d, "ring")
        cuda.synchronize()
        comm.check_status()
    host.barrier()


@pytest.mark.gpu
@two_gpus
def test_a_rank_that_never_calls_ends_the_kernel_with_an_error_naming_it():
    with pytest.raises(gpu.GpuLaunchError) as e:
        gpu.launch(_lonely, 2, timeout=120)
    assert "rank 1" in str(e.value) and "waited for it in vain" in str(e.value)
