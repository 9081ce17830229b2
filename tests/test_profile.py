"""The Nsight Compute driver (kernels_src/tools/profile.py), without ncu: a fake runner plays ncu's part.

What ncu itself reports can only be seen on a GPU machine; here we check what the course does with it:
the command it runs, the CSV it parses, how a call's kernels add up, and how rejected metrics are retried."""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from kernels_src.tools import profile as P

M = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
     "launch__registers_per_thread")


def fake_csv(kernels):
    """ncu's --csv --page raw layout: a header, a units row (empty ID), one row per kernel."""
    head = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", *M]
    units = ["", "", "", "", "", "", "", "nsecond", "byte", "%", "register/thread"]
    rows = [head, units] + [[str(i), "1", "python3", "h", name, "1", "7", *map(str, vals)]
                            for i, (name, vals) in enumerate(kernels)]
    return "==PROF== Connected to process 1\n" + "\n".join(",".join(f'"{c}"' for c in r) for r in rows) + "\n"


def test_parse_and_aggregate():
    text = fake_csv([("partials", (1000, "4,096", 50.0, 32)), ("finish", (3000, 1024, 90.0, 64))])
    ks = P.parse_csv(text, M)
    assert [k["name"] for k in ks] == ["partials", "finish"]
    assert ks[0]["dram__bytes_read.sum"] == 4096  # thousands separators are read
    t = P.aggregate(ks, M)
    assert t["kernels"] == 2
    assert t["gpu__time_duration.sum"] == 4000 and t["dram__bytes_read.sum"] == 5120
    assert t["dram__throughput.avg.pct_of_peak_sustained_elapsed"] == pytest.approx((50 * 1000 + 90 * 3000) / 4000)
    assert t["launch__registers_per_thread"] == 64  # from the longest kernel, not summed


def test_command_profiles_one_call_only():
    cmd = P.ncu_command("/x/ncu", M, ["softmax", "regs", "16x8", "float32"], python="py")
    i = cmd.index("--profile-from-start")
    assert cmd[i + 1] == "off" and "--clock-control" in cmd and cmd[cmd.index("--metrics") + 1] == ",".join(M)
    assert cmd[-8:] == ["py", "-m", "kernels_src.tools.profile", "--child", "softmax", "regs", "16x8", "float32"]


def _runner(replies):
    calls = []

    def run(cmd):
        calls.append(cmd)
        rc, out = replies[min(len(calls), len(replies)) - 1]
        return SimpleNamespace(returncode=rc, stdout=out, stderr="")
    return run, calls


def test_rejected_metric_is_dropped_and_retried():
    bad = "==ERROR== Failed to find metric dram__bytes_read.sum\n"
    run, calls = _runner([(1, bad), (0, fake_csv([("k", (10, 1, 2.0, 8))]))])
    ks, dropped = P.profile_variant("axpy", "grid_stride", (100,), metrics=M, ncu="ncu", runner=run)
    assert dropped == ["dram__bytes_read.sum"] and len(calls) == 2
    assert "dram__bytes_read.sum" not in calls[1][calls[1].index("--metrics") + 1]
    assert ks[0]["name"] == "k"


@pytest.mark.parametrize("reply", [(1, "==ERROR== the application returned an error code (1)\nTraceback"),
                                   (0, "no CSV at all\n")])
def test_failures_say_what_happened(reply):
    run, _ = _runner([reply])
    with pytest.raises(P.ProfileError, match="axpy/grid_stride"):
        P.profile_variant("axpy", "grid_stride", (100,), metrics=M, ncu="ncu", runner=run)


def test_profile_summary_and_table():
    from kernels_src.registry import get_op

    name = next(v.name for v in get_op("axpy").variants if v.backend == "gpu")
    run, _ = _runner([(0, fake_csv([("k", (2000, 8 << 20, 80.0, 16))]))])
    res = P.profile("axpy", [name], (1 << 20,), metric_set="memory", extra_metrics=("my__metric.sum",), ncu="ncu",
                    runner=run, progress=False, log=None)
    assert "my__metric.sum" in res["metrics"]
    assert res["variants"][name]["total"]["dram__bytes_read.sum"] == 8 << 20
    md = P.table(res, ["dram__bytes_read.sum"], scale={"dram__bytes_read.sum": (2 ** 20, "DRAM read (MiB)")})
    assert "DRAM read (MiB)" in md and f"| {name} | 8 |" in md
    with pytest.raises(KeyError, match="no variant"):
        P.profile("axpy", ["no_such_rung"], (8,), ncu="ncu", runner=run, progress=False, log=None)


def test_child_runs_one_call_in_the_simulator():
    """The child ncu starts: it must run a variant end to end (here in the simulator, where the profiler
    start/stop calls do not exist and are skipped)."""
    from kernels_src.registry import get_op

    name = next(v.name for v in get_op("axpy").variants if v.backend == "gpu" and v.available()[0])
    proc = subprocess.run([sys.executable, "-m", "kernels_src.tools.profile", "--child", "axpy", name, "37",
                           "float32"], capture_output=True, text=True, env={**os.environ, "KERNELS_DEVICE": "sim"},
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_cli_refuses_without_a_gpu(capsys):
    from kernels_src import cli, device

    if not device.SIMULATED:
        pytest.skip("a real GPU is present")
    assert cli.main(["profile", "axpy"]) == 2
    assert "needs a real NVIDIA GPU" in capsys.readouterr().err
