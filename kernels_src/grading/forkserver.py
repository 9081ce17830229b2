"""Start graded processes by forking a warm one: Python, NumPy and Numba are imported once per grading run.

Every graded step (a plan, an exec, a PTX compile) runs in a process of its own, and starting one used to cost
about half a CPU second before the student's first line: the interpreter, NumPy, Numba and the CUDA target
(simulated or real) imported again each time. A grading of one notebook starts a dozen such processes, so that
start was about half of all the CPU time a grading took.

Here a *fork server* per device mode ("sim", "ptx") is started once, from the same read-only runtime copy and
with the same environment as a worker. It imports those modules and then only waits. For each job it forks a
copy of itself that becomes the worker: a new session, the job's directory as its current directory, the job's
own environment, stdout and stderr into the job's ``output.txt``, stdin and the "ready" pipe from the parent,
every other descriptor closed. Then it runs exactly what a freshly started worker runs
(:func:`kernels_src.grading.child.main`): confinement, limits, then the student's code. What the worker can see
and do is the same as before: the server never runs student code and never sees hidden inputs (they arrive
over the worker's stdin from the grader); it holds no descriptor but its own socket, which the worker closes.

The grader (:func:`kernels_src.grading.sandbox.run`) falls back to starting a fresh interpreter whenever a server
cannot be used (not Linux, a real GPU, the server failed to start or died), so the server only ever saves time.

Protocol: one ``AF_UNIX`` ``SOCK_SEQPACKET`` pair, JSON messages, descriptors passed with ``SCM_RIGHTS``.
The grader sends ``{"op": "run", "id", "work", "env", "argv"}`` with the descriptors (output, stdin, go[, ready]);
the server answers ``{"id", "pid"}`` (or ``{"id", "error"}``) and, when the worker ends, ``{"exit": pid,
"status": <wait status>}``. ``{"op": "kill", "pid"}`` kills a worker's process group. A worker runs nothing until
the grader, having its pid, writes one byte on the "go" pipe: a server that answers too late (the grader has
already given up on it and run the job in a fresh process) forks a worker that finds the pipe closed and exits
with NOT_STARTED, so that no job ever runs twice.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading

READY_FD = 3  # the worker's "ready" pipe, at the same number in every forked worker
NOT_STARTED = 75  # a worker's exit status when the grader gave up on its server before letting it start
_MAX_MSG = 1 << 16


# ------------------------------------------------------------------------------ the server (runtime side)
def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def serve(fd: int, env0: dict, main) -> None:
    """The server's loop (runs in the runtime copy; see SERVER_BOOT in sandbox.py, which imports what every worker
    imports before reading the student's code, then calls this). ``env0``: the environment the server started
    with, before any import; ``main``: the worker's entry point (:func:`kernels_src.grading.child.main`)."""
    import selectors

    sock = socket.socket(fileno=fd)
    # what the imports wrote into the environment (NUMBA_ENABLE_CUDASIM: kernels_src/target.py), as a fresh
    # worker's own imports would: each worker gets its job's environment plus these
    made = {k: v for k, v in os.environ.items() if env0.get(k) != v}
    why = None
    if _threads() != 1:  # forking a process with other threads could copy a held lock: refuse to serve
        why = f"{_threads()} threads after the imports"
    try:  # each worker is watched through a pidfd (Linux 5.3 and later)
        os.close(os.pidfd_open(os.getpid()))
    except OSError as e:
        why = f"no pidfd_open ({e})"
    if why:
        sock.send(json.dumps({"hello": False, "why": why}).encode())
        return
    sock.send(json.dumps({"hello": True}).encode())
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, None)
    while True:
        for key, _ in sel.select():
            if key.data is None:
                try:
                    msg, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MSG, 5)
                except OSError:
                    return
                if not msg:
                    return  # the grader has gone: the workers run on to their own limits
                req = json.loads(msg)
                if req.get("op") == "kill":
                    try:
                        os.killpg(int(req["pid"]), signal.SIGKILL)
                    except OSError:
                        pass
                    continue
                try:
                    pid = _fork_worker(sock, sel, req, fds, made, main)
                except OSError as e:
                    sock.send(json.dumps({"id": req.get("id"), "error": str(e)}).encode())
                    continue
                finally:
                    for f in fds:
                        os.close(f)
                pidfd = os.pidfd_open(pid)
                sel.register(pidfd, selectors.EVENT_READ, pid)
                sock.send(json.dumps({"id": req["id"], "pid": pid}).encode())
            else:
                pid = key.data
                sel.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                try:
                    sock.send(json.dumps({"exit": pid, "status": status}).encode())
                except OSError:
                    return


def _fork_worker(sock, sel, req, fds, made, main) -> int:
    out_fd, in_fd, go_fd = fds[0], fds[1], fds[2]
    ready_fd = fds[3] if len(fds) > 3 else None
    pid = os.fork()
    if pid:
        return pid
    # the worker: nothing of the server's may survive but the modules it imported
    try:
        sel.close()  # first: their descriptors' numbers may be reused by the dup2 calls below
        sock.close()
        if os.read(go_fd, 1) != b"g":  # the grader has given up on this server: run nothing
            os._exit(NOT_STARTED)
        os.setsid()
        high = [os.dup(f) for f in (out_fd, in_fd) + ((ready_fd,) if ready_fd is not None else ())]
        os.dup2(high[1], 0)
        os.dup2(high[0], 1)
        os.dup2(high[0], 2)
        keep = 3
        if ready_fd is not None:
            os.dup2(high[2], READY_FD)
            keep = READY_FD + 1
        os.closerange(keep, 1 << 16)  # the socket, the workers' pidfds, the passed descriptors' copies
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.chdir(req["work"])
        os.environ.clear()
        os.environ.update(req["env"])
        os.environ.update(made)
        import tempfile

        tempfile.tempdir = None  # TMPDIR is the job's now
        try:
            from numba.core import config

            config.CACHE_DIR = os.environ.get("NUMBA_CACHE_DIR", config.CACHE_DIR)
        except Exception:  # noqa: BLE001
            pass
        sys.argv = list(req["argv"])
        main(sys.argv[1:])  # ends with os._exit(0) once result.json is written
    except BaseException:  # noqa: BLE001
        import traceback

        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(70)


# ------------------------------------------------------------------------------ the client (grader side)
class _Server:
    """One running fork server and the grader's end of its socket."""

    REPLY_TIMEOUT = 60.0  # seconds to wait for a forked worker's pid before the server is given up on

    def __init__(self, cmd: list[str], env: dict, cwd: str):
        import subprocess

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        self.proc = subprocess.Popen(cmd + [str(theirs.fileno())], env=env, cwd=cwd, pass_fds=(theirs.fileno(),),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.sock.settimeout(120)
        hello = json.loads(self.sock.recv(_MAX_MSG) or b"{}")
        self.sock.settimeout(None)
        if not hello.get("hello"):
            self.close()
            raise OSError(hello.get("why", "the fork server did not start"))
        self.alive = True
        self._lock = threading.Lock()  # one request at a time on the socket
        self._ids = 0
        self._replies: dict = {}  # id -> [event, reply]
        self._exits: dict = {}  # pid -> [event, status]
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            while True:
                msg = self.sock.recv(_MAX_MSG)
                if not msg:
                    break
                m = json.loads(msg)
                if "exit" in m:
                    slot = _slot(self._exits, m["exit"])
                    slot[1] = m["status"]
                    slot[0].set()
                else:
                    slot = _slot(self._replies, m.get("id"))
                    slot[1] = m
                    slot[0].set()
        except (OSError, ValueError):
            pass
        self.alive = False
        for slot in list(self._replies.values()) + list(self._exits.values()):
            slot[0].set()

    def start(self, work: str, env: dict, argv: list[str], fds: list[int]) -> int:
        """Have the server fork a worker for this job (``fds``: output, stdin[, ready]) and let it run; its pid.

        OSError if the server refuses or does not answer within REPLY_TIMEOUT: the caller then runs the job in a
        fresh process, and this server is given up on (killed), and a worker it forks late runs nothing, because
        its "go" pipe is closed without the byte."""
        go_r, go_w = os.pipe()
        try:
            with self._lock:
                self._ids += 1
                rid = self._ids
                slot = _slot(self._replies, rid)
                socket.send_fds(self.sock, [json.dumps({"op": "run", "id": rid, "work": work, "env": env,
                                                        "argv": argv}).encode()], fds[:2] + [go_r] + fds[2:])
            os.close(go_r)
            go_r = None
            if not slot[0].wait(self.REPLY_TIMEOUT):
                self._replies.pop(rid, None)
                self.alive = False
                self.proc.kill()
                raise OSError(f"the fork server did not answer within {self.REPLY_TIMEOUT:g} s")
            reply = self._replies.pop(rid)[1]
            if not reply or "pid" not in reply:
                raise OSError((reply or {}).get("error", "the fork server did not answer"))
            pid = int(reply["pid"])
            _slot(self._exits, pid)
            os.write(go_w, b"g")
            return pid
        finally:
            for fd in (go_r, go_w):
                if fd is not None:
                    os.close(fd)

    def wait(self, pid: int, timeout: float | None) -> int | None:
        """The worker's return code (negative: killed by that signal), or None if ``timeout`` passed first."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        slot = self._exits[pid]
        if not slot[0].wait(timeout):
            return None
        if slot[1] is None:  # the server died: the worker is an orphan now, with no status; wait until it ends
            while not _ended(pid):
                if deadline is not None and time.monotonic() > deadline:
                    return None
                time.sleep(0.05)
            self._exits.pop(pid, None)
            return 0
        self._exits.pop(pid, None)
        return os.waitstatus_to_exitcode(slot[1])

    def kill(self, pid: int) -> None:
        if _killpg(pid):
            return
        try:
            with self._lock:
                self.sock.send(json.dumps({"op": "kill", "pid": pid}).encode())
        except OSError:
            pass

    def close(self) -> None:
        try:  # shutdown first: a close alone does not end the reader thread's blocked recv, so the server would
            self.sock.shutdown(socket.SHUT_RDWR)  # never see the end of the connection
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001
            self.proc.kill()


def _slot(table: dict, key) -> list:
    """``table[key]``, an [event, value] pair made on first use by whichever side (reader or waiter) comes first."""
    return table.setdefault(key, [threading.Event(), None])


def _killpg(pid: int) -> bool:
    """Kill a worker and everything it started (each worker leads its own session); False if it could not be."""
    try:
        os.killpg(pid, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _ended(pid: int) -> bool:
    """Whether an orphaned worker has ended: gone, or a zombie nobody reaps (a container's first process may not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


class ForkedWorker:
    """What :func:`kernels_src.grading.sandbox.run` needs of a worker process (a ``Popen`` look-alike)."""

    def __init__(self, server: _Server, pid: int, stdin_w: int | None):
        self._server = server
        self.pid = pid
        self.stdin = os.fdopen(stdin_w, "wb") if stdin_w is not None else None
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        import subprocess

        rc = self._server.wait(self.pid, timeout)
        if rc is None:
            raise subprocess.TimeoutExpired("forked worker", timeout)
        self.returncode = rc
        return rc

    def kill(self) -> None:
        self._server.kill(self.pid)


_servers: dict = {}
_failed: dict = {}
_servers_lock = threading.Lock()


def server_for(key, cmd: list[str], env: dict, cwd: str):
    """The running server for ``key`` (started on first use), or None where none can run here."""
    if not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open") or not hasattr(socket, "send_fds"):
        return None
    if os.environ.get("KERNELS_GRADING_FORKSERVER", "1") == "0":
        return None
    with _servers_lock:
        s = _servers.get(key)
        if s is not None and s.alive:
            return s
        if key in _failed:
            return None
        if s is not None:  # it died or was given up on: reap it before its successor starts
            s.close()
        try:
            s = _Server(cmd, env, cwd)
        except (OSError, ValueError) as e:
            _failed[key] = str(e)
            return None
        if not _servers:  # the first server: close them all when the grader exits
            import atexit

            atexit.register(shutdown)
        _servers[key] = s
        return s


def shutdown() -> None:
    for k, s in list(_servers.items()):
        s.close()
        _servers.pop(k, None)
