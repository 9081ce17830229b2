"""Run untrusted student code in a child process: time limit, memory limit, capped output, its own directory,
and the confinement of :mod:`.confine` (another uid where possible, Landlock, no network).

The child runs the worker from a read-only *runtime copy* of the few course modules it needs
(:func:`runtime_dir`: the device selection, the compiler door, the simulator patches, the worker, the race
detector): the course's references, helpers, model, measurements, solutions and hidden tests are not in
it, and Landlock keeps the child from reading the real package. It starts in a fresh temporary directory
that holds only the student's code and the job; references, expected outputs and hidden tests stay in the
parent. Inputs that must not be seen before the code is ready (the hidden inputs of an *exec* run) arrive
over the child's stdin only after it has said, on a pipe of its own, that its functions are built.
It writes ``result.json`` (and ``outputs.npz``) back into that directory. On Linux the child is forked from a
warm server that has imported NumPy and Numba once (:mod:`.forkserver`), else started fresh. Whatever the child does (loops
forever, calls ``os._exit``, segfaults through ``ctypes``, prints megabytes, allocates without end, kills
itself), the parent gets a :class:`SandboxResult` with a plain-language ``message`` and never raises.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import forkserver

DEFAULT_TIMEOUT = float(os.environ.get("KERNELS_GRADING_TIMEOUT", "60"))  # seconds of wall clock per run
DEFAULT_MEMORY = int(os.environ.get("KERNELS_GRADING_MEMORY_MB", "3072")) << 20  # address space (numba maps ~0.8 GB)
OUTPUT_LIMIT = 32 << 20  # bytes per file written (RLIMIT_FSIZE): caps what student code can print
STDOUT_TAIL = 2000  # characters of the child's output kept for the report
_PASS_ENV = ("PATH", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "SYSTEMROOT",
             "NUMBA_CUDA_DRIVER", "NUMBA_CUDA_NVVM", "NUMBA_CUDA_LIBDEVICE")


CONFINE = os.environ.get("KERNELS_GRADING_CONFINE", "1") != "0"  # 0: no uid change, Landlock or netns
RUNTIME_FILES = ("target.py", "device.py", "simulator.py", "ptx.py", "compiler/__init__.py", "compiler/launch.py", "compiler/vec.py",
                 "compiler/cpubits.py", "compiler/cpusimd.py", "compiler/cpuint8.py", "compiler/inline_ptx.py",
                 "compiler/halfbits.py", "compiler/sysflags.py", "compiler/flagspeed.py",
                 "grading/__init__.py", "grading/spec.py", "grading/child.py", "grading/childio.py",
                 "grading/planrun.py", "grading/shortcuts.py", "grading/replay.py", "grading/worker.py",
                 "grading/racecheck.py",
                 "grading/sandbox.py", "grading/confine.py", "grading/kernelpack.py",
                 "grading/perfworker.py", "grading/forkserver.py")
RUNTIME_INIT = '''"""The grader's runtime copy of kernels_src: only what a sandboxed grading process needs (where kernels run,
the compiler door, the simulator, the worker). The course's references, helpers and model are not here."""
from . import device
from .device import ceil_div, cuda
'''
BOOT = '''import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:  # the job's extra import paths (see extra_sys_path) go first: the runtime package imports NumPy and Numba
    with open(sys.argv[1], encoding="utf-8") as _f:
        _extra = json.load(_f).get("sys_path") or []
except (OSError, ValueError, IndexError):
    _extra = []
for _i, _p in enumerate(_extra):
    sys.path.insert(1 + _i, _p)
from kernels_src.grading.child import main
main()
'''
SERVER_BOOT = '''import json, os, sys
_env0 = dict(os.environ)  # before any import changes it
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
for _i, _p in enumerate(json.loads(sys.argv[1])):  # the grader's extra import paths, as BOOT takes them from a job
    sys.path.insert(1 + _i, _p)
import numpy  # what every worker imports before the student's code: once, here
from kernels_src import device
device.cuda  # numba.cuda: the simulator or the PTX target, as KERNELS_DEVICE says
from kernels_src.grading.child import main
from kernels_src.grading.forkserver import serve
serve(int(sys.argv[2]), _env0, main)
'''
_runtime: str | None = None
_runtime_lock = threading.Lock()
_uid_counter = [0]


def runtime_dir() -> str:
    """A read-only copy of the modules a grading process needs, made once per grading process."""
    global _runtime
    with _runtime_lock:
        if _runtime and os.path.isdir(_runtime):
            return _runtime
        src = Path(__file__).resolve().parents[1]
        root = Path(tempfile.mkdtemp(prefix="kgrade-runtime-"))
        pkg = root / "kernels_src"
        for rel in RUNTIME_FILES:
            dst = pkg / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, dst)
        (pkg / "__init__.py").write_text(RUNTIME_INIT)
        (root / "boot.py").write_text(BOOT)
        (root / "serve.py").write_text(SERVER_BOOT)
        import compileall  # once here, so that no graded process compiles these modules again (they write no .pyc)

        compileall.compile_dir(str(pkg), quiet=1)
        for d, dirs, files in os.walk(root):
            os.chmod(d, 0o555)
            for f in files:
                os.chmod(os.path.join(d, f), 0o444)
        _runtime = str(root)
        import atexit

        atexit.register(_remove_runtime, _runtime)
        return _runtime


def _remove_runtime(path: str) -> None:
    for d, dirs, files in os.walk(path):
        try:
            os.chmod(d, 0o755)
        except OSError:
            pass
    shutil.rmtree(path, ignore_errors=True)


def extra_sys_path() -> list[str]:
    """Directories of ``PYTHONPATH`` that hold no copy of the course (``kernels_src``): the workers run ``python -I``,
    which ignores ``PYTHONPATH``, so a machine that puts its NumPy/Numba there (the GPU image's ``/tmp/site``)
    hands them to the worker this way; the course's own tree never goes."""
    out = []
    for p in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if p and os.path.isdir(p) and not os.path.exists(os.path.join(p, "kernels_src")):
            out.append(os.path.realpath(p))
    return out


def _next_uid() -> int:
    with _runtime_lock:
        _uid_counter[0] += 1
        return 200000 + (os.getpid() % 4096) * 256 + _uid_counter[0] % 256


@dataclass
class SandboxResult:
    status: str  # ok | error | timeout | exited | signal | output_limit | memory | no_result
    payload: dict = field(default_factory=dict)  # result.json written by the worker
    outputs: dict = field(default_factory=dict)  # arrays from outputs.npz
    returncode: int | None = None
    seconds: float = 0.0
    output_tail: str = ""
    message: str = ""
    progress: str = ""  # the last step the worker announced before it stopped
    confined: list | None = None  # what confinement the worker reported applying (see confine.weaknesses)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def apply_limits(limits: dict) -> None:
    """Called by the worker on itself, first thing, before any student code is imported."""
    import resource
    import threading

    # The simulator runs one Python thread per CUDA thread. With the default 8 MiB stacks, a block of
    # 256 threads reserves 2 GiB of address space and hits RLIMIT_AS ("can't start new thread").
    threading.stack_size(2 << 20)

    for name, val in limits.items():
        lim = getattr(resource, name)
        try:
            soft, hard = resource.getrlimit(lim)
            new = int(val) if hard == resource.RLIM_INFINITY else min(int(val), hard)
            resource.setrlimit(lim, (new, hard))
        except (ValueError, OSError):
            pass


def _describe_signal(sig: int) -> str:
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    why = {
        "SIGSEGV": "a segmentation fault: memory was accessed that does not exist (ctypes, or an index out of "
                   "bounds inside an @njit function, which does not check bounds)",
        "SIGBUS": "a bus error: a bad memory access (ctypes, or an index out of bounds in compiled code)",
        "SIGABRT": "the process aborted (an assertion inside a compiled library failed)",
        "SIGKILL": "the process was killed (usually: it used more memory than allowed)",
        "SIGXCPU": "it used more CPU time than allowed (an infinite loop?)",
        "SIGXFSZ": f"it printed more than {OUTPUT_LIMIT >> 20} MB of output",
        "SIGFPE": "an arithmetic fault (integer division by zero in compiled code)",
    }.get(name, "")
    return f"{name}" + (f", {why}" if why else "")


def run(job: dict, source: str, *, inputs: dict | None = None, device_mode: str = "sim",
        timeout: float | None = None, memory: int | None = None, keep: bool = False,
        files: dict | None = None, stream: dict | None = None) -> SandboxResult:
    """Run the worker on ``job`` with the student's ``source`` in a fresh directory.

    ``files``: {name.npz: arrays} written into the directory before the start (decoy inputs, a launch plan);
    ``stream``: arrays sent over stdin once the worker says it is ready (the hidden inputs)."""
    timeout = float(timeout or DEFAULT_TIMEOUT)
    memory = int(memory or DEFAULT_MEMORY)
    work = Path(tempfile.mkdtemp(prefix="kgrade-"))
    t0 = time.perf_counter()
    ready_r = ready_w = None
    try:
        (work / "submission.py").write_text(source, encoding="utf-8")
        limits = {"RLIMIT_AS": memory, "RLIMIT_FSIZE": OUTPUT_LIMIT, "RLIMIT_CORE": 0,
                  "RLIMIT_CPU": int(timeout * 2 + 10)}
        job = dict(job, limits=limits)
        runtime = runtime_dir()
        job["sys_path"] = extra_sys_path()
        if CONFINE:
            from .confine import skipped_from_env

            job["confine"] = {"read": [runtime] + job["sys_path"], "uid": _next_uid(), "net": True,
                              "skip": skipped_from_env()}
        if stream is not None:
            ready_r, ready_w = os.pipe()
        env = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
        env.update(HOME=str(work), TMPDIR=str(work), KERNELS_DEVICE=device_mode, PYTHONUNBUFFERED="1",
                   PYTHONDONTWRITEBYTECODE="1", NUMBA_CACHE_DIR=str(work / ".numba"), OMP_NUM_THREADS="1",
                   NUMBA_NUM_THREADS=os.environ.get("KERNELS_GRADING_NUMBA_THREADS", "2"),
                   MPLBACKEND="Agg", PYTHONFAULTHANDLER="1",
                   NUMBA_BOUNDSCHECK="1")  # @njit code raises IndexError instead of corrupting memory
        server = _fork_server(device_mode, runtime, job["sys_path"], env)
        if ready_w is not None:
            job["ready_fd"] = forkserver.READY_FD if server is not None else ready_w
        (work / "job.json").write_text(json.dumps(job), encoding="utf-8")
        if inputs:
            np.savez(work / "inputs.npz", **inputs)
        for name, arrays in (files or {}).items():
            np.savez(work / name, **arrays)
        argv = [os.path.join(runtime, "boot.py"), str(work / "job.json")]
        cmd = [sys.executable, "-I", *argv]
        with open(work / "output.txt", "wb") as out:
            p = None
            if server is not None:
                p = _start_forked(server, work, env, argv, out, ready_w, stream is not None)
                if p is None and ready_w is not None:  # the server failed this once: start a fresh process
                    job["ready_fd"] = ready_w
                    (work / "job.json").write_text(json.dumps(job), encoding="utf-8")
            try:
                if p is None:
                    p = subprocess.Popen(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.PIPE if stream is not None else subprocess.DEVNULL,
                                         start_new_session=True, pass_fds=(ready_w,) if ready_w is not None else ())
            except OSError as e:
                return SandboxResult("no_result", message=f"the grader could not start a process: {e}")
            if ready_w is not None:
                os.close(ready_w)
                ready_w = None
                threading.Thread(target=_send_when_ready, args=(p, ready_r, stream), daemon=True).start()
                ready_r = None
            timed_out = False
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    p.kill()
                rc = p.wait()
        seconds = time.perf_counter() - t0
        tail = _tail(work / "output.txt")
        progress = _read_text(work / "progress.txt")
        res = SandboxResult("ok", returncode=rc, seconds=seconds, output_tail=tail, progress=progress)
        payload = _read_json(work / "result.json")
        if payload is not None:
            res.payload = payload
            conf = payload.get("confined")
            res.confined = [str(x) for x in conf] if isinstance(conf, list) else None
        if not CONFINE:
            from .confine import NOT_CONFINED

            res.confined = [NOT_CONFINED]
        if (work / "outputs.npz").exists():
            try:
                with np.load(work / "outputs.npz", allow_pickle=False) as z:
                    res.outputs = {k: z[k] for k in z.files}
            except Exception:  # noqa: BLE001  (a truncated or forged file: treated as no outputs)
                res.outputs = {}
        where = f" (while {progress})" if progress else ""
        if timed_out:
            res.status = "timeout"
            res.message = (f"your code did not finish within {timeout:g} s{where}: an infinite loop, or a loop "
                           "whose condition never changes (a stride of 0, a `while` that never ends)?")
        elif rc is not None and rc < 0:
            res.status = "signal" if -rc != signal.SIGXFSZ else "output_limit"
            if -rc == signal.SIGKILL:
                res.status = "memory"
            res.message = f"the process running your code died{where}: {_describe_signal(-rc)}"
        elif payload is None:
            res.status = "exited"
            res.message = (f"the process running your code exited with status {rc} before the grader could "
                           f"collect a result{where}: does your code call os._exit(), sys.exit() or quit()?")
            if "MemoryError" in tail or "Cannot allocate memory" in tail:
                res.status = "memory"
                res.message = f"your code ran out of memory{where} (the limit is {memory >> 20} MB)"
        elif payload.get("status") != "ok":
            res.status = payload.get("status", "error")
            res.message = payload.get("message", "")
        return res
    finally:
        for fd in (ready_r, ready_w):
            if fd is not None:
                os.close(fd)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def _fork_server(device_mode: str, runtime: str, sys_path: list, env: dict):
    """The fork server (:mod:`.forkserver`) for workers of this device mode and environment, or None where a
    fresh interpreter must be started (a real GPU: CUDA must not be set up before a fork; not Linux; disabled
    with KERNELS_GRADING_FORKSERVER=0; the server could not start)."""
    if device_mode not in ("sim", "ptx"):
        return None
    per_job = ("HOME", "TMPDIR", "NUMBA_CACHE_DIR")
    const = tuple(sorted((k, v) for k, v in env.items() if k not in per_job))
    key = (device_mode, runtime, tuple(sys_path), const)
    home = _server_home()
    server_env = dict(const, HOME=home, TMPDIR=home, NUMBA_CACHE_DIR=os.path.join(home, ".numba"))
    return forkserver.server_for(key, [sys.executable, "-I", os.path.join(runtime, "serve.py"), json.dumps(sys_path)],
                                 server_env, home)


_server_dir: list = []


def _server_home() -> str:
    with _runtime_lock:
        if not _server_dir:
            _server_dir.append(tempfile.mkdtemp(prefix="kgrade-server-"))
            import atexit

            atexit.register(shutil.rmtree, _server_dir[0], True)
        return _server_dir[0]


def _start_forked(server, work: Path, env: dict, argv: list, out, ready_w: int | None, streamed: bool):
    """A worker forked by ``server`` (a :class:`.forkserver.ForkedWorker`), or None if the server failed."""
    in_r = in_w = None
    try:
        if streamed:
            in_r, in_w = os.pipe()
        else:
            in_r = os.open(os.devnull, os.O_RDONLY)
        fds = [out.fileno(), in_r] + ([ready_w] if ready_w is not None else [])
        pid = server.start(str(work), env, argv, fds)
    except OSError:
        for fd in (in_r, in_w):
            if fd is not None:
                os.close(fd)
        return None
    os.close(in_r)
    return forkserver.ForkedWorker(server, pid, in_w)


def _send_when_ready(p, ready_r: int, arrays: dict) -> None:
    """Wait for the worker's "ready" (its functions are built), then send the arrays over its stdin."""
    import io

    try:
        with os.fdopen(ready_r, "rb") as r:
            line = r.readline()
        if line.strip() != b"ready":
            return
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        p.stdin.write(buf.getvalue())
    except (OSError, ValueError):
        pass
    finally:
        try:
            p.stdin.close()
        except (OSError, ValueError):
            pass


def _tail(path: Path) -> str:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            f.seek(max(0, size - STDOUT_TAIL))
            data = f.read().decode("utf-8", errors="replace")
        return ("...\n" if size > STDOUT_TAIL else "") + data
    except OSError:
        return ""


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()[-300:]
    except OSError:
        return ""


def _read_json(path: Path):
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        return d if isinstance(d, dict) else None
    except (OSError, ValueError):
        return None
