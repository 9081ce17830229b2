"""A worker forked by the fork server (kernels_src/grading/forkserver.py) is the worker a fresh interpreter would be.

The grader starts each graded step by forking a warm process instead of starting Python and importing Numba again
(about half a CPU second each time). The student's code must not be able to tell: the same current directory, the
same environment (the job's own HOME, TMPDIR and Numba cache, not the server's), the same descriptors (0, 1, 2 and
nothing of the server's), its own session, the same limits and confinement report, and the same outcomes when it
hangs, exits or is killed. Each check below runs the same submission both ways (KERNELS_GRADING_FORKSERVER=0 starts a
fresh interpreter) and compares; the corpus and hostile tests then grade through the server, which is the default.
"""
import json
import os
import sys

import pytest

from kernels_src.grading import forkserver, sandbox

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux-only")

PROBE = r'''
import json, os, resource, sys
fds = sorted(int(x) for x in os.listdir("/proc/self/fd"))
print("@@PROBE@@" + json.dumps({
    "cwd": os.getcwd(), "env": dict(os.environ), "fds": fds, "own_session": os.getsid(0) == os.getpid(),
    "pgrp_is_pid": os.getpgrp() == os.getpid(), "argv": sys.argv,
    "cpu_limit": resource.getrlimit(resource.RLIMIT_CPU)[0], "as_limit": resource.getrlimit(resource.RLIMIT_AS)[0],
    "tmp": __import__("tempfile").gettempdir(), "home": os.path.expanduser("~"),
    "numba_cache": __import__("numba").core.config.CACHE_DIR}))
'''


def _probe(monkeypatch, forked: bool, device_mode="sim"):
    monkeypatch.setenv("KERNELS_GRADING_FORKSERVER", "1" if forked else "0")
    res = sandbox.run({"mode": "plan", "cases": []}, PROBE, device_mode=device_mode, timeout=120)
    line = [ln for ln in res.output_tail.splitlines() if ln.startswith("@@PROBE@@")]
    assert line, (res.status, res.message, res.output_tail)
    return json.loads(line[0].removeprefix("@@PROBE@@")), res


def _normal(p):
    """What must be equal between the two ways to start: paths relative to the job's directory."""
    work = p["cwd"]
    env = {k: v.replace(work, "<work>") for k, v in p["env"].items()}
    return dict(p, cwd="<work>", env=env, tmp=p["tmp"].replace(work, "<work>"),
                home=p["home"].replace(work, "<work>"), numba_cache=p["numba_cache"].replace(work, "<work>"),
                argv=[a.replace(work, "<work>") for a in p["argv"]])


@pytest.mark.parametrize("device_mode", ["sim", "ptx"])
def test_a_forked_worker_sees_what_a_fresh_one_sees(monkeypatch, device_mode):
    if device_mode == "ptx":
        from kernels_src import ptx

        if ptx.unavailable():
            pytest.skip(ptx.unavailable())
    fresh, fresh_res = _probe(monkeypatch, False, device_mode)
    forked, res = _probe(monkeypatch, True, device_mode)
    assert any(isinstance(k, tuple) and k[0] == device_mode for k in forkserver._servers), \
        "the grader did not use a fork server"
    a, b = _normal(fresh), _normal(forked)
    assert a["fds"] == b["fds"] and set(b["fds"]) <= {0, 1, 2, 3}, (a["fds"], b["fds"])  # 3: listdir's own
    assert b["own_session"] and b["pgrp_is_pid"]
    assert b["env"] == a["env"], set(a["env"].items()) ^ set(b["env"].items())
    for k in ("cwd", "tmp", "home", "numba_cache", "argv", "cpu_limit", "as_limit"):
        assert a[k] == b[k], (k, a[k], b[k])
    assert b["tmp"] == b["home"] == "<work>" and b["numba_cache"] == "<work>/.numba"
    assert (res.status, res.returncode) == (fresh_res.status, fresh_res.returncode)


@pytest.mark.parametrize("source,status", [
    ("while True:\n    pass\n", "timeout"),
    ("import os\nos._exit(3)\n", "exited"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", "signal"),
])
def test_hangs_exits_and_signals_end_the_same_way(monkeypatch, source, status):
    got = {}
    for forked in (False, True):
        monkeypatch.setenv("KERNELS_GRADING_FORKSERVER", "1" if forked else "0")
        res = sandbox.run({"mode": "plan", "cases": []}, source, timeout=2 if status == "timeout" else 120)
        got[forked] = (res.status, res.returncode if status != "timeout" else None)
    assert got[True] == got[False] and got[True][0] == status, got


def test_the_hidden_inputs_reach_a_forked_exec_worker_only_after_ready(monkeypatch, tmp_path):
    """An exec job gets its inputs over stdin once it says "ready" on the pipe numbered in job.json; in a forked
    worker that pipe is forkserver.READY_FD. The solution of chapter 1 graded through the server scores full marks
    (tests/test_grading_exercises.py grades every chapter this way); here chapter 1 alone."""
    from _grading_support import autograder
    from kernels_src.grading import corpus
    from kernels_src.grading.submission import grade_submission

    monkeypatch.setenv("KERNELS_GRADING_FORKSERVER", "1")
    nb = corpus.write_ipynb(corpus.solution_submission("ch01_axpy"), tmp_path / "ch01_axpy.ipynb")
    rec = grade_submission(nb, autograder("ch01_axpy"), jobs=1, run_otter=False)
    assert rec.possible > 0 and rec.score == rec.possible, [t.get("output", "")[:400] for t in rec.results["tests"]]


def test_a_dead_server_is_replaced_and_its_worker_still_reported(monkeypatch):
    """A worker that kills the server (possible only where the sandbox cannot change the uid) loses nothing: its
    own result is still collected, and the next job gets a new server."""
    monkeypatch.setenv("KERNELS_GRADING_FORKSERVER", "1")
    monkeypatch.setenv("KERNELS_GRADING_CONFINE_SKIP", "uid,landlock")
    kill_parent = ("import os, signal\n"  # the server only: never the grader (here, the test runner)
                   "if b'serve.py' in open(f'/proc/{os.getppid()}/cmdline', 'rb').read():\n"
                   "    os.kill(os.getppid(), signal.SIGKILL)\n")
    sandbox.run({"mode": "plan", "cases": []}, kill_parent, timeout=20)
    probe, res = _probe(monkeypatch, True)
    assert set(probe["fds"]) <= {0, 1, 2, 3} and res.output_tail


def test_a_server_that_does_not_answer_is_given_up_and_runs_nothing_late(monkeypatch):
    """A server too slow to answer (stopped here with SIGSTOP) is given up on: the job runs in a fresh process, and
    the worker that server forks for the job afterwards runs nothing (it exits NOT_STARTED), so a job never runs
    twice in its directory; the next job gets a new server."""
    import signal
    import time

    monkeypatch.setenv("KERNELS_GRADING_FORKSERVER", "1")
    sandbox.run({"mode": "plan", "cases": []}, "x = 1\n", timeout=120)  # a warm server for this mode
    key, server = next((k, s) for k, s in forkserver._servers.items() if k[0] == "sim")
    monkeypatch.setattr(forkserver._Server, "REPLY_TIMEOUT", 0.5)
    # Instead of dying when given up on, the stalled server wakes up, forks the job's worker and reports it: late.
    monkeypatch.setattr(server.proc, "kill", lambda: os.kill(server.proc.pid, signal.SIGCONT))
    os.kill(server.proc.pid, signal.SIGSTOP)
    res = sandbox.run({"mode": "plan", "cases": []}, "print('@@ran@@')\n", timeout=120)
    assert res.output_tail.count("@@ran@@") == 1, (res.status, res.message, res.output_tail)
    assert not server.alive
    codes, deadline = [], time.monotonic() + 30
    while not codes and time.monotonic() < deadline:  # the late worker's end, as the server reports it
        codes = [os.waitstatus_to_exitcode(s[1]) for s in list(server._exits.values()) if s[1] is not None]
        time.sleep(0.05)
    assert codes == [forkserver.NOT_STARTED], codes
    sandbox.run({"mode": "plan", "cases": []}, "x = 1\n", timeout=120)
    assert forkserver._servers[key] is not server and forkserver._servers[key].alive, "no new server replaced it"


def test_the_servers_end_with_the_grader(monkeypatch):
    """When grading ends (the grader's exit runs forkserver.shutdown), each server sees its connection close and
    exits at once: a close alone would leave the grader's reader thread blocked in recv, the server waiting, and
    every `kernels grade` 10 s late at its exit."""
    import time

    monkeypatch.setenv("KERNELS_GRADING_FORKSERVER", "1")
    sandbox.run({"mode": "plan", "cases": []}, "x = 1\n", timeout=120)
    procs = [s.proc for s in forkserver._servers.values()]
    assert procs
    t0 = time.monotonic()
    forkserver.shutdown()
    assert all(p.poll() is not None for p in procs) and time.monotonic() - t0 < 5, time.monotonic() - t0
