"""Speed questions: a score from the fraction of the roofline a student's kernel reaches, in a harness that
cannot be gamed (``kernels grade --perf``; see ``book/how_grading_works.md``, "How speed is graded").

A speed question is declared in the exercise's solution master, in a line of its own (inside a ```` ```text ````
block the students see)::

    perf: {"question": "q1", "function": "gemv_rows", "kind": "cpu", "op": "gemv", "size": [2048, 2048], "full": 0.5, "zero": 0.1}

Keys: ``kind`` "cpu" (an ``@njit`` function) or "gpu" (a launcher and its ``kernels``), ``op`` (a registered
op: inputs, reference, tolerance, bytes and FLOPs), ``size`` (the op's size), ``full``/``zero`` (the fraction
for full credit and the fraction at or below which there is none; linear between), ``gpu_size`` (the size
on a GPU, default ``size``), ``points`` (default 1), ``args``, ``kernels``, ``allow``.

**What is measured.** The fraction is *ideal time / the student's time*, where the ideal is measured in the
same run, on the same machine:

- a GPU question (memory-bound): the op's bytes over the copy bandwidth measured in this run
  (:func:`kernels_src.bench.measure_copy`: the fastest of the course's copies, CUDA events, L2 flushed);
- a CPU question: NumPy doing the same op on the same inputs (its BLAS for products), timed in the same
  way as the student's function, so a score means the same thing on a laptop and on the grading machine.
  The bytes over the measured copy bandwidth is reported next to it, for information.

**The harness.** The grader's process owns everything that decides the score; the student's function runs
in a sandboxed worker (:mod:`.perfworker`) rebuilt from its ``def`` text, and only on the grader's word:

- fresh inputs for every timed run, drawn from a seed taken from the operating system's random source
  (never shown to the worker), copied into freshly allocated arrays after a pad of random size;
- outputs poisoned before every run, and every run's outputs compared with the float64 reference at the
  op's tolerance, warm-up runs included: a wrong, stale or unfinished output in any run means no speed credit;
- caches flushed before every run (a sweep larger than the last-level cache on a CPU, twice the L2 on a GPU);
- the clock is the grader's: it starts when the grader sends "go" and stops when the worker says "done",
  which the worker's own code says only after the function returned and (GPU) ``cuda.synchronize()``
  waited for every stream of the context; the cost of that exchange is measured (pings) and subtracted.
  On a real GPU the time scored is the device's: CUDA events that the worker's runtime records around the
  replayed launches (behind a spinning kernel, as the course's benchmarks do). No Python of the student's
  runs in that process (the launches are replayed from the plan run), only the student's kernels, on the
  GPU, which can reach neither the events nor the pipes; and an event time outside the grader's own wall
  clock for the run is refused. (The wall clock alone carried ~0.7 ms of wake-ups and launch overhead on an
  H100, 5x a 32 M-element axpy's 0.15 ms.);
- a physical floor: a time below bytes / (measured copy bandwidth x margin), or below bytes / the
  datasheet bandwidth (GPU), or below FLOPs / the cores' peak (CPU), is rejected;
- precision: the inputs are checked, once per question, to be such that the op computed from inputs
  rounded to float16 or bfloat16 fails the tolerance, so a kernel computing in lower precision fails.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .. import parity
from .spec import CheckSpec, GraderError

_HDR = struct.Struct("<cQ")
WARMUP = 2  # untimed runs first (compilation, first touch): still checked
CPU_FLOOR_MARGIN = 8.0  # a CPU's caches and cores: a time below bytes / (8 x the fastest measured copy) is impossible
CPU_PEAK_FLOP_PER_CYCLE = 64  # fp32 FLOPs per core and cycle: two 16-lane FMA units (AVX-512), more than any CPU here
CPU_PEAK_GHZ = 6.0
GPU_FLOOR_MARGIN = 1.25
COMPUTE_FLOOR_MARGIN = 4.0
QUIET_S = 0.05  # seconds of quiet before each timed run (the other party's spinning threads go to sleep)
PERF_LINE = re.compile(r"^perf:\s*(\{.*\})\s*$")
SIM_LINE = ("no speed score in the simulator: GPU speed questions are graded on a GPU "
            "(`kernels grade --perf` on a machine with one)")
NO_TORCH_LINE = ("no speed score here: this question's yardstick is cuBLAS (through PyTorch) in the same run, "
                 "and PyTorch is not installed")


@dataclass(frozen=True)
class PerfSpec:
    question: str
    function: str
    kind: str
    op: str
    size: tuple
    full: float
    zero: float
    gpu_size: tuple | None = None
    points: float = 1.0
    kernels: tuple = ()
    args: tuple = ()
    allow: tuple = ()
    dtype: str = "float32"
    runs: int = 5
    ideal: str = "copy"  # GPU: "copy" (bytes over the measured copy bandwidth) or "cublas" (cuBLAS's time, same run)

    @classmethod
    def from_dict(cls, d: dict) -> "PerfSpec":
        d = dict(d)
        for k in ("size", "gpu_size", "kernels", "args", "allow"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        known = set(cls.__dataclass_fields__)
        extra = set(d) - known
        if extra:
            raise GraderError(f"perf question: unknown keys {sorted(extra)}")
        spec = cls(**d)
        if not 0 <= spec.zero < spec.full:
            raise GraderError(f"perf question {spec.question}: needs 0 <= zero < full")
        if spec.ideal not in ("copy", "cublas") or (spec.ideal == "cublas" and (spec.kind, spec.op) != ("gpu", "gemm")):
            raise GraderError(f"perf question {spec.question}: ideal must be 'copy', or 'cublas' for a GPU gemm")
        return spec

    @property
    def title(self) -> str:
        return f"`{self.function}` speed ({self.question}, {self.kind.upper()})"


@dataclass
class PerfVerdict:
    question: str
    title: str
    status: str  # scored | fail (no speed credit) | skipped (simulator) | error (the grader's fault)
    score: float = 0.0
    points: float = 1.0
    fraction: float | None = None  # ideal time / the student's time
    roofline: float | None = None  # bytes / measured copy bandwidth / the student's time (memory-bound)
    seconds: float | None = None  # the student's median time
    baseline_seconds: float | None = None
    ideal_seconds: float | None = None
    yardstick: str = ""
    size: tuple = ()
    runs: int = 0
    seed: int = 0
    device: str = ""
    feedback: str = ""
    details: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def credit(fraction: float, zero: float, full: float) -> float:
    """Linear partial credit: 0 at or below ``zero``, 1 at or above ``full``."""
    if fraction is None or not np.isfinite(fraction):
        return 0.0
    return float(min(1.0, max(0.0, (fraction - zero) / (full - zero))))


def physical_floor(nbytes: float, flops: float, *, copy_gbps: float | None, margin: float,
                   datasheet_gbps: float | None = None, flops_rate: float | None = None,
                   peak_flops: float | None = None) -> tuple[float, str]:
    """The shortest time the machine allows for the op (seconds) and what sets it."""
    floors = []
    if copy_gbps:
        floors.append((nbytes / (copy_gbps * 1e9 * margin), f"{nbytes / 1e6:.3g} MB at {margin:g} x the measured "
                       f"copy bandwidth ({copy_gbps:.0f} GB/s)"))
    if datasheet_gbps:
        floors.append((nbytes / (datasheet_gbps * 1e9), f"{nbytes / 1e6:.3g} MB at the datasheet bandwidth "
                       f"({datasheet_gbps:.0f} GB/s)"))
    if flops_rate:
        floors.append((flops / (flops_rate * COMPUTE_FLOOR_MARGIN), f"{flops / 1e9:.3g} GFLOP at "
                       f"{COMPUTE_FLOOR_MARGIN:g} x the baseline's rate ({flops_rate / 1e9:.0f} GFLOP/s)"))
    if peak_flops:
        floors.append((flops / peak_flops, f"{flops / 1e9:.3g} GFLOP at the cores' peak ({peak_flops / 1e9:.0f} GFLOP/s)"))
    if not floors:
        return 0.0, "no floor"
    return max(floors, key=lambda f: f[0])


# --------------------------------------------------------------------------------------- declarations
def specs_from_master(path) -> list[PerfSpec]:
    """The speed questions declared in a solution master (``perf: {...}`` lines)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        m = PERF_LINE.match(line.strip())
        if m:
            out.append(PerfSpec.from_dict(json.loads(m.group(1))))
    return out


def all_specs() -> dict[str, list[PerfSpec]]:
    from . import exercises

    return {p.stem: s for p in exercises.masters() if (s := specs_from_master(p))}


# ----------------------------------------------------------------------------------------- baselines
def _np_softmax(y, x):
    np.subtract(x, x.max(axis=-1, keepdims=True), out=y)
    np.exp(y, out=y)
    y /= y.sum(axis=-1, keepdims=True)


def _np_axpy(out, a, x, y):
    np.multiply(x, a, out=out)
    out += y


# What a user of NumPy would write for the op (outputs first, like the students' functions).
NUMPY_BASELINES = {
    "gemv": lambda y, x, W: np.dot(x, W, out=y),
    "gemm": lambda C, A, B: np.matmul(A, B, out=C),
    "softmax": _np_softmax,
    "axpy": _np_axpy,
}


# ----------------------------------------------------------------------------------------- timing
class _Worker:
    """The sandboxed perf worker, driven frame by frame over two pipes."""

    def __init__(self, job: dict, source: str, device_mode: str, files: dict, timeout: float, memory: int):
        from . import sandbox

        self.work = Path(tempfile.mkdtemp(prefix="kgrade-perf-"))
        self.timeout = timeout
        (self.work / "submission.py").write_text(source, encoding="utf-8")
        for name, arrays in (files or {}).items():
            np.savez(self.work / name, **arrays)
        ctl_r, ctl_w = os.pipe()
        # the socket that hands the worker its shared-memory region once it is ready (see share())
        self.sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.region = None
        limits = {"RLIMIT_AS": memory, "RLIMIT_FSIZE": sandbox.OUTPUT_LIMIT, "RLIMIT_CORE": 0,
                  "RLIMIT_CPU": int(timeout * 4 + 30)}
        if device_mode == "gpu":  # a CUDA context reserves far more address space than it uses: no RLIMIT_AS
            del limits["RLIMIT_AS"]
        job = dict(job, limits=limits, ctl_fd=ctl_w, shm_sock=child_sock.fileno(), mode="perf",
                   sys_path=sandbox.extra_sys_path())
        runtime = sandbox.runtime_dir()
        if sandbox.CONFINE:
            job["confine"] = {"read": [runtime] + job["sys_path"], "uid": sandbox._next_uid(), "net": True}
            if device_mode == "gpu":  # the driver's device files and what CUDA reads about the machine
                import glob

                job["confine"]["devices"] = sorted(glob.glob("/dev/nvidia*"))
                job["confine"]["read"] += ["/sys", "/dev/shm", "/run/nvidia-persistenced"]
        (self.work / "job.json").write_text(json.dumps(job), encoding="utf-8")
        env = {k: os.environ[k] for k in sandbox._PASS_ENV if k in os.environ}
        env.update(HOME=str(self.work), TMPDIR=str(self.work), KERNELS_DEVICE=device_mode, PYTHONUNBUFFERED="1",
                   PYTHONDONTWRITEBYTECODE="1", NUMBA_CACHE_DIR=str(self.work / ".numba"), OMP_NUM_THREADS="1",
                   OMP_WAIT_POLICY="PASSIVE",
                   NUMBA_NUM_THREADS=os.environ.get("KERNELS_GRADING_NUMBA_THREADS", str(os.cpu_count() or 2)))
        cmd = [sys.executable, "-I", os.path.join(runtime, "boot.py"), str(self.work / "job.json")]
        self.out = open(self.work / "output.txt", "wb")
        self.p = subprocess.Popen(cmd, cwd=self.work, env=env, stdout=self.out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.PIPE, start_new_session=True,
                                  pass_fds=(ctl_w, child_sock.fileno()))
        os.close(ctl_w)
        child_sock.close()
        self.ctl = ctl_r
        self.stdin = self.p.stdin.fileno()

    def send(self, tag: bytes, data: bytes = b"") -> None:
        msg = memoryview(_HDR.pack(tag, len(data)) + data)
        while msg:
            msg = msg[os.write(self.stdin, msg):]

    def share(self, nbytes: int):
        """Create the shared-memory region of the runs (an anonymous memfd: no name another process could open)
        and hand it to the worker. Called after the worker said ready: the region does not exist while the
        worker loads. The grader writes each run's inputs and poisoned outputs into it, the worker copies them
        into fresh arrays (or fresh device arrays), and writes its outputs back after "done"."""
        import mmap

        size = max(int(nbytes), mmap.PAGESIZE)
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("kgrade-perf", os.MFD_CLOEXEC)
        else:  # macOS: an unlinked temporary file
            f = tempfile.TemporaryFile(dir=self.work)
            fd = os.dup(f.fileno())
            f.close()
        try:
            os.ftruncate(fd, size)
            self.region = mmap.mmap(fd, size)
            socket.send_fds(self.sock, [b"M"], [fd])
        finally:
            os.close(fd)
        self.sock.close()
        return self.region

    def _read(self, n: int, deadline: float) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.ctl], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(self.ctl, n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return bytes(buf)

    def recv(self, timeout: float | None = None) -> tuple[bytes, bytes]:
        deadline = time.monotonic() + (timeout or self.timeout)
        tag, n = _HDR.unpack(self._read(_HDR.size, deadline))
        return tag, (self._read(n, deadline) if n else b"")

    def tail(self) -> str:
        try:
            self.out.flush()
            try:
                self.p.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
            text = (self.work / "output.txt").read_text(errors="replace")[-1500:]
            res = self.work / "result.json"
            if res.exists():
                msg = json.loads(res.read_text()).get("message", "")
                text = (text + "\n" + msg).strip()
            return text
        except OSError:
            return ""

    def close(self) -> None:
        try:
            self.send(b"Q")
        except OSError:
            pass
        try:
            self.p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.p.wait()
        os.close(self.ctl)
        try:
            self.sock.close()
        except OSError:
            pass
        self.out.close()
        import shutil

        shutil.rmtree(self.work, ignore_errors=True)


def _layout(inputs: tuple, outputs: list) -> tuple[list, list, int]:
    """Where each array input and output lies in the shared region: ([offset, shape, dtype] or None for a
    scalar, per input), [[offset, shape, dtype] per output], the region's size. 64-byte aligned."""
    off, ins, outs = 0, [], []
    for a in inputs:
        if isinstance(a, np.ndarray) and a.ndim:
            ins.append([off, list(a.shape), a.dtype.str])
            off += -(-a.nbytes // 64) * 64
        else:
            ins.append(None)
    for o in outputs:
        outs.append([off, list(o.shape), o.dtype.str])
        off += -(-o.nbytes // 64) * 64
    return ins, outs, off


def _region_view(region, lay) -> np.ndarray:
    off, shape, dt = lay
    return np.ndarray(tuple(shape), np.dtype(dt), buffer=region, offset=int(off))


def _put(region, ins_lay, outs_lay, inputs, outputs, pad: int) -> bytes:
    """Write a run's inputs and poisoned outputs into the region; the header the worker reads (small JSON)."""
    scalars = []
    for lay, a in zip(ins_lay, inputs):
        if lay is None:
            v = np.asarray(a)
            scalars.append({"dtype": v.dtype.str, "value": v.item()})
        else:
            _region_view(region, lay)[...] = a
            scalars.append(None)
    for lay, o in zip(outs_lay, outputs):
        _region_view(region, lay)[...] = o
    return json.dumps({"inputs": ins_lay, "outputs": outs_lay, "scalars": scalars, "pad": pad}).encode()


def _l2_bytes() -> int:
    from .. import bench

    return max(bench._l2_bytes(), 128 << 20)


def _flush_cpu(state={}):  # noqa: B006  (one buffer per grading process)
    if "buf" not in state:
        state["buf"] = np.zeros((64 << 20) // 8)
    state["buf"] += 1.0


def _blas_set_threads():
    """OpenBLAS's ``set_num_threads`` of NumPy's own BLAS, or None (another BLAS: its threads stay as they are)."""
    import ctypes
    import glob

    if "fn" in _BLAS:
        return _BLAS["fn"]
    _BLAS["fn"] = None
    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "*openblas*"))
    for lib in libs:
        try:
            dll = ctypes.CDLL(lib)
        except OSError:
            continue
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
                     "openblas_set_num_threads"):
            if hasattr(dll, name):
                _BLAS["fn"] = getattr(dll, name)
                return _BLAS["fn"]
    return None


_BLAS: dict = {}


def time_baseline(fn, outs, ins, repeat: int) -> float:
    """NumPy's best time: the fastest of ``repeat`` calls with its BLAS's own threads and ``repeat`` with one
    thread (on a machine that other programs share, a threaded BLAS can lose 10-50x waiting for a preempted
    thread: the strongest NumPy a user could run is the yardstick)."""
    best = min(_time_numpy(fn, outs, ins) for _ in range(repeat))
    setter = _blas_set_threads()
    if setter is not None:
        try:
            setter(1)
            best = min(best, min(_time_numpy(fn, outs, ins) for _ in range(repeat)))
        finally:
            setter(os.cpu_count() or 1)
    return best


def _time_numpy(fn, outs, ins) -> float:
    _flush_cpu()
    time.sleep(QUIET_S)
    t0 = time.perf_counter()
    fn(*outs, *ins)
    return time.perf_counter() - t0


def _cpu_copy_gbps(nbytes: int, runs: int, state={}) -> float:  # noqa: B006  (the copy's arrays, kept)
    n = max(nbytes // 8, 1 << 20)  # float32 elements: copy n*4 bytes, read + written
    if state.get("n") != n:
        state.update(n=n, src=np.random.default_rng(0).random(n, dtype=np.float32), dst=np.empty(n, np.float32))
    src, dst = state["src"], state["dst"]
    ts = []
    for _ in range(max(runs, 5)):
        _flush_cpu()
        t0 = time.perf_counter()
        np.copyto(dst, src)
        ts.append(time.perf_counter() - t0)
    return 2 * n * 4 / float(np.min(ts)) / 1e9  # the fastest copy: the floor must never reject an honest kernel


def measure_copy() -> dict:
    """The GPU's copy bandwidth, measured now (the yardstick of a GPU question; replaced in the harness's tests)."""
    from .. import bench

    return bench.measure_copy(n=64 << 20, repeat=10)


def have_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def measure_cublas(size, repeat: int = 10) -> dict:
    """cuBLAS SGEMM (through torch, TF32 off) on ``size`` = (M, N, K), timed as the student's kernel is: CUDA
    events around the call, recorded behind a spinning kernel, the L2 flushed before each call, the median.
    (Replaced in the harness's simulator tests.)"""
    import torch

    from .. import bench

    M, N, K = size
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        a = torch.randn(M, K, device="cuda", dtype=torch.float32)
        b = torch.randn(K, N, device="cuda", dtype=torch.float32)
        c = torch.empty(M, N, device="cuda", dtype=torch.float32)
        ts = bench.time_gpu(lambda: torch.matmul(a, b, out=c), [()], warmup=3, repeat=repeat, flush=True)
        t = float(np.median(ts))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return {"seconds": t, "what": f"cuBLAS SGEMM via torch {torch.__version__} (TF32 off), {M}x{N}x{K}, "
            f"median of {repeat}, L2 flushed, CUDA events, as yours"}


def _other_scalar(v):
    """Another value of the same type as the scalar input ``v`` (for the second decoy draw)."""
    if isinstance(v, (bool, np.bool_)):
        return type(v)(not v)
    if isinstance(v, (int, np.integer)):
        return type(v)(int(v) + 3)
    return type(v)(float(v) * 1.5 + 0.25)


def _same_number(rec, v) -> bool:
    try:
        a, b = float(rec), float(np.asarray(v))
    except (TypeError, ValueError):
        return False
    return a == b


def scalar_sources(pair: list, decoys: list) -> None:
    """Mark each scalar kernel argument that *is* a scalar input (axpy's ``a``) with ``"input": k``, so that the
    replay passes each timed run's fresh value instead of the plan run's.

    The plan run calls the launcher on two decoy draws whose scalar inputs differ (set 1: the real values,
    set 2: others): an argument whose recorded value is input k's in both draws came from input k. Those
    arguments are made equal in the second plan, so that the plan check (:func:`checks._plan_problems`)
    accepts them; a scalar argument that differs between the draws and is no input (``2 * a``, a sum of an
    array computed on the host) still differs there, and is refused: the replay could not recompute it."""
    p0, p1 = pair
    d0, d1 = decoys[0][0], decoys[1][0]
    cands = [k for k, v in enumerate(d0) if not (isinstance(v, np.ndarray) and v.ndim)]
    if not cands or len(p0.get("launches", [])) != len(p1.get("launches", [])):
        return
    for la0, la1 in zip(p0["launches"], p1["launches"]):
        if len(la0["args"]) != len(la1["args"]):
            continue
        for x, y in zip(la0["args"], la1["args"]):
            if x["kind"] != "scalar" or y["kind"] != "scalar" or x["value"] == y["value"]:
                continue
            src = [k for k in cands if _same_number(x["value"], d0[k]) and _same_number(y["value"], d1[k])]
            if src:
                x["input"] = y["input"] = src[0]
                y["value"] = x["value"]


def precision_probe(op, inputs, refs, rtol, atol) -> list[str]:
    """The reduced precisions these inputs can tell from float32: those whose rounded inputs fail the tolerance."""
    told = []
    for name, rnd in (("float16", lambda a: a.astype(np.float16).astype(np.float64)),
                      ("bfloat16", lambda a: (a.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000))
                       .view(np.float32).astype(np.float64))):
        low = tuple(rnd(a) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in inputs)
        try:
            lows = parity.reference_outputs(op, low)
        except Exception:  # noqa: BLE001
            continue
        if any(not compare_output("p", lo.astype(np.float32), r, rtol, atol).ok for lo, r in zip(lows, refs)):
            told.append(name)
    return told


def _say(t0: float, what: str) -> None:
    """A progress line on stderr (``KERNELS_PERF_PROGRESS=1``): where the time of a grading goes."""
    if os.environ.get("KERNELS_PERF_PROGRESS"):
        print(f"  [perf {time.perf_counter() - t0:6.1f} s] {what}", file=sys.stderr, flush=True)


def grade_perf(spec: PerfSpec, bundle, *, seed: int | None = None, device_mode: str | None = None,
               timeout: float = 120.0) -> PerfVerdict:
    """Grade one speed question of ``bundle`` (the student's notebook). Never raises for the student's code."""
    t_start = time.perf_counter()
    from .. import device
    from . import checks, exercise_ops, kernelpack, sandbox

    mode = device_mode or device.MODE
    seed = secrets.randbits(63) if seed is None else int(seed)
    v = PerfVerdict(spec.question, spec.title, "fail", points=spec.points, seed=seed)
    if spec.kind == "gpu" and mode != "gpu":
        v.status, v.feedback = "skipped", f"{spec.title}: {SIM_LINE}"
        return v
    if spec.ideal == "cublas" and not have_torch():
        v.status, v.feedback = "skipped", f"{spec.title}: {NO_TORCH_LINE}"
        return v
    op = exercise_ops.find_op(spec.op)
    size = tuple(spec.gpu_size or spec.size) if spec.kind == "gpu" else tuple(spec.size)
    v.size = size
    dtype = np.dtype(spec.dtype)
    rng = np.random.default_rng(seed)
    rtol, atol = parity.resolve_tol(op.tol, dtype, size)
    nbytes = float(op.bytes(size, dtype.itemsize))
    flops = float(op.flops(size))

    def fail(lines, status="fail"):
        v.status = status
        v.score = 0.0
        v.feedback = "\n".join([f"{spec.title}: no speed credit"] + ["  " + ln for ln in lines])
        return v

    # the plan run (the notebook's code, decoy inputs) and the functions to grade, checked against the text
    first = parity.as_tuple(op.make_inputs(size, dtype, rng))
    refs = parity.reference_outputs(op, first)
    told = precision_probe(op, first, refs, rtol, atol)
    if "float16" not in told:
        raise GraderError(f"perf question {spec.question}: inputs of {spec.op} at {size} cannot tell a float16 "
                          "computation from a float32 one at the op's tolerance")
    _say(t_start, f"{spec.title}: inputs, reference and precision probe ready, size {size}")
    cspec = CheckSpec(spec.kind, spec.function, spec.op, spec.kernels, (size,), args=spec.args, allow=spec.allow,
                      dtype=spec.dtype)
    case = (op.describe_size(size), size, first, refs)
    job, arrays = checks._make_job(cspec, bundle, [case])
    files = {}
    memory = max(sandbox.DEFAULT_MEMORY, int(12 * nbytes) + (3 << 30))
    if spec.kind == "gpu":
        decoys = checks._decoy_cases(cspec, op, [case], seed + 1)
        # the second draw's scalar inputs differ from the first's: the plan tells an input's value from a constant
        decoys[1][0] = [_other_scalar(d) if not (isinstance(d, np.ndarray) and d.ndim) else d for d in decoys[1][0]]
        files = {"decoys.npz": checks._decoy_arrays(job, arrays, decoys)}
    res = sandbox.run(dict(job, mode="plan"), bundle.source, files=files, device_mode="sim", timeout=timeout,
                      memory=memory)
    _say(t_start, "plan run done")
    lines = checks._sandbox_failure(res)
    if lines is not None:
        return fail(lines)
    payload = res.payload
    if payload.get("status", "ok") != "ok":
        return fail(payload.get("message", "your code could not be loaded").splitlines())
    plan, plan_files = None, {}
    if spec.kind == "gpu":
        plans = payload.get("plans") or []
        if not plans:
            return fail(["the grader received no launch plan from your launcher"])
        scalar_sources(plans[0], decoys)
        problems = checks._plan_problems(cspec, plans[0], res.outputs, job["n_outputs"], {})
        if problems:
            return fail(problems)
        plan = plans[0][0]
        plan_files = {"plan.npz": {k: a for k, a in res.outputs.items() if k.startswith("c0s0_")}}
    roots = {spec.function: "cpu"} if spec.kind == "cpu" else \
        {k: "gpu" for k in sorted(set(spec.kernels) | checks._launched_kernels(payload))}
    problems, pack = kernelpack.validate(bundle.source, payload.get("described") or {}, roots, allow=spec.allow,
                                         line_of=lambda ln: checks._bundle_where(bundle, ln))
    if problems:
        return fail(problems)

    _say(t_start, "functions validated")
    # the yardsticks, measured now, on this machine
    sheet = None
    if spec.kind == "gpu":
        from .. import bench

        copy = measure_copy()
        copy_gbps, v.yardstick = copy["copy_gbps"], copy["copy_what"]
        sheet = bench.datasheet() if mode == "gpu" else None
        v.device = device.describe().get("name", "GPU")
        if spec.ideal == "cublas":
            cub = measure_cublas(size)
            v.baseline_seconds, v.yardstick = cub["seconds"], cub["what"]
    else:
        from .. import bench

        copy_gbps = _cpu_copy_gbps(int(nbytes), spec.runs)
        v.device = bench.cpu_model()

    # the timed runs
    wjob = {"backend": spec.kind, "function": spec.function, "pack": pack, "plan": plan, "allow": list(spec.allow),
            "line_map": bundle.line_map,
            "flush_bytes": (2 * _l2_bytes() if mode == "gpu" else 4096) if spec.kind == "gpu" else 64 << 20}
    wmode = os.environ.get("KERNELS_PERF_WORKER_DEVICE") or mode  # "sim": the harness's own test of the GPU path
    w = _Worker(wjob, bundle.source, wmode if spec.kind == "gpu" else "sim", plan_files, timeout, memory)
    times, walls, base_times, problems = [], [], [], []
    baseline = NUMPY_BASELINES.get(spec.op) if spec.kind == "cpu" else None
    if spec.kind == "cpu" and baseline is None:
        w.close()
        raise GraderError(f"perf question {spec.question}: no NumPy baseline for op {spec.op!r}")
    try:
        _say(t_start, f"yardstick measured ({copy_gbps:.0f} GB/s copy); worker starting")
        tag, _ = w.recv()
        _say(t_start, "worker ready")
        if tag != b"R":
            return fail([f"the process running your code stopped before it was ready: {w.tail()}"])
        # the region is made now, after "ready": the worker had none while it loaded
        ins_lay, outs_lay, nb = _layout(first, parity.empty_outputs(refs, spec.dtype))
        region = w.share(nb)
        pings = []
        for _ in range(10):
            t0 = time.perf_counter()
            w.send(b"P")
            w.recv()
            pings.append(time.perf_counter() - t0)
        overhead = float(np.median(pings))
        total = WARMUP + spec.runs
        for r in range(total):
            t_begin = time.perf_counter()
            inputs = first if r == 0 else parity.as_tuple(op.make_inputs(size, dtype, rng))
            refs_r = refs if r == 0 else parity.reference_outputs(op, inputs)
            outs = parity.empty_outputs(refs_r, spec.dtype)
            if _layout(inputs, outs)[:2] != (ins_lay, outs_lay):
                raise GraderError(f"perf question {spec.question}: op {spec.op} drew inputs of another shape")
            pad = int(rng.integers(64, 1 << 16)) * 64 + int(rng.integers(0, 64)) * 4
            t_put = time.perf_counter()
            w.send(b"I", _put(region, ins_lay, outs_lay, inputs, outs, pad))
            tag, data = w.recv()
            if tag == b"E":
                info = json.loads(data)
                return fail([f"run {r + 1}: {info.get('type')}: {info.get('message')}"
                             + (f" at {info['where']}" if info.get("where") else "")])
            if tag != b"A":
                return fail([f"run {r + 1}: the process running your code stopped: {w.tail()}"])
            time.sleep(QUIET_S)  # threads that spin after their work (BLAS, OpenMP) go quiet before the clock starts
            t0 = time.perf_counter()
            w.send(b"G")
            tag, data = w.recv()
            t1 = time.perf_counter()
            if tag == b"E":
                info = json.loads(data)
                return fail([f"run {r + 1}: your code raised {info.get('type')}: {info.get('message')}"
                             + (f" at {info['where']}" if info.get("where") else "")])
            if tag != b"D":
                return fail([f"run {r + 1}: the process running your code stopped: {w.tail()}"])
            wall = max(t1 - t0 - overhead, 1e-9)
            dev = (json.loads(data) if data else {}).get("device_s")
            if dev is not None and not 0 < dev <= wall + 2 * overhead + 20e-6:
                return fail([f"run {r + 1}: the device time ({dev * 1e6:.1f} us) is not inside the grader's wall "
                             f"clock ({wall * 1e6:.1f} us): the grader's fault, tell your instructor"], status="error")
            t_run = wall if dev is None else dev
            tag, data = w.recv()
            if tag != b"O":
                return fail([f"run {r + 1}: no outputs came back"])
            got = [np.array(_region_view(region, lay)) for lay in outs_lay]  # copied out: checked as they were
            t_check = time.perf_counter()
            for k, (g, ref) in enumerate(zip(got, refs_r)):
                rep = compare_output(op.output_names[k] if k < len(op.output_names) else f"out{k}", g, ref,
                                     rtol, atol)
                if not rep.ok:
                    unwritten = int(parity.is_poison(g, avoid=ref).sum()) if g.shape == ref.shape else 0
                    why = (f"{unwritten} elements never written (still the poison)" if unwritten else
                           f"{rep.n_bad} of {rep.n_total} elements wrong, max rel err {rep.max_rel:.3g} "
                           f"(allowed: {rtol:g} relative; computing in float16 or bfloat16 is outside it too)")
                    problems.append(f"run {r + 1} of {total} (fresh inputs): {rep.name}: {why}")
            if problems:
                return fail(problems + ["every timed run's outputs are checked, on new inputs each time: an output "
                                        "that is right only once (reused, cached, or finished later) earns nothing"])
            _say(t_start, f"run {r + 1} of {total}: {t_run * 1e6:.1f} us ({'device' if dev is not None else 'wall'}"
                          f"; wall {wall * 1e6:.1f} us), checked (host: inputs and "
                          f"reference before {t_put - t_begin:.2f} s, to the worker and armed {t0 - t_put:.2f} s, "
                          f"outputs back {t_check - t1:.2f} s, check {time.perf_counter() - t_check:.2f} s)")
            if r >= WARMUP:
                times.append(t_run)
                walls.append(wall)
            if baseline is not None:
                bouts = parity.empty_outputs(refs_r, spec.dtype)
                # NumPy's best (each call after a cache flush): an ideal that is too slow would over-credit
                bt = time_baseline(baseline, bouts, inputs, 2)
                if r >= WARMUP:
                    base_times.append(bt)
                # the copy again, after every run: on a shared machine one measurement can be slowed 10x by
                # other jobs, and a floor from a slow copy would reject an honest kernel (the fastest one counts)
                copy_gbps = max(copy_gbps, _cpu_copy_gbps(int(nbytes), 1))
    except (TimeoutError, EOFError, BrokenPipeError, OSError) as e:
        return fail([f"the process running your code stopped answering ({type(e).__name__}): {w.tail()}"])
    finally:
        w.close()

    # GPU: the median run. CPU: the fastest run of each (the student's and NumPy's): on a CPU that other
    # processes share, noise only ever adds time, and NumPy's threaded BLAS suffers most from it
    stat = np.median if spec.kind == "gpu" else np.min
    t = float(stat(times))
    v.seconds, v.runs = t, len(times)
    ideal_copy = nbytes / (copy_gbps * 1e9)
    v.roofline = ideal_copy / t
    if spec.kind == "gpu" and spec.ideal == "cublas":
        tb = v.baseline_seconds
        v.ideal_seconds = tb
        v.fraction = tb / t  # the same FLOPs: (FLOPs / your time) / (FLOPs / cuBLAS's time)
        peak = (sheet or {}).get("fp32_tflops")
        floor, why = physical_floor(nbytes, flops, copy_gbps=None, margin=GPU_FLOOR_MARGIN,
                                    datasheet_gbps=(sheet or {}).get("hbm_gbps"), flops_rate=flops / tb,
                                    peak_flops=peak * 1e12 if peak else None)
        what = (f"cuBLAS's time for the same GEMM, measured in this run ({tb * 1e3:.4g} ms, "
                f"{flops / tb / 1e9:.0f} GFLOP/s; yours {flops / t / 1e9:.0f} GFLOP/s)")
    elif spec.kind == "gpu":
        v.ideal_seconds = ideal_copy
        v.fraction = v.roofline
        floor, why = physical_floor(nbytes, flops, copy_gbps=copy_gbps, margin=GPU_FLOOR_MARGIN,
                                    datasheet_gbps=(sheet or {}).get("hbm_gbps"))
        what = f"{nbytes / 1e6:.3g} MB / {copy_gbps:.0f} GB/s (copy bandwidth measured in this run)"
    else:
        tb = float(stat(base_times))
        v.baseline_seconds = v.ideal_seconds = tb
        v.fraction = tb / t
        # the compute floor is the cores' peak, not NumPy's rate: on a busy machine NumPy's measured rate can be
        # far below what the cores allow, and a floor from it would reject honest kernels
        peak = (os.cpu_count() or 1) * CPU_PEAK_FLOP_PER_CYCLE * CPU_PEAK_GHZ * 1e9
        floor, why = physical_floor(nbytes, flops, copy_gbps=copy_gbps, margin=CPU_FLOOR_MARGIN, peak_flops=peak)
        what = f"NumPy's time for the same op and inputs, measured in this run ({tb * 1e3:.3g} ms)"
    v.details = {"copy_gbps": copy_gbps, "floor_s": floor, "floor": why, "overhead_s": overhead,
                 "times_s": times, "wall_s": walls,
                 "clock": "device (CUDA events)" if walls and times != walls else "wall (the grader's)", "baseline_times_s": base_times, "bytes": nbytes, "flops": flops,
                 "precisions_rejected": told}
    if t < floor:
        v.fraction = None
        return fail([f"your time {t * 1e6:.3g} us is below what the machine allows ({floor * 1e6:.3g} us: {why}): "
                     "rejected as impossible"])
    v.status = "scored"
    c = credit(v.fraction, spec.zero, spec.full)
    v.score = round(c * spec.points, 4)
    v.feedback = "\n".join([
        f"{spec.title}: {v.fraction:.0%} of the ideal -> {v.score:g} / {spec.points:g} "
        f"(full credit at {spec.full:.0%}, none at or below {spec.zero:.0%})",
        f"  your {'median' if spec.kind == 'gpu' else 'fastest'} time {t * 1e3:.4g} ms over {len(times)} timed runs "
        f"({WARMUP} warm-up), size {size}, "
        f"on {v.device}",
        f"  ideal: {what}",
        f"  roofline: {v.roofline:.0%} of {nbytes / 1e6:.3g} MB at the copy bandwidth ({copy_gbps:.0f} GB/s)",
        "  every run: fresh inputs, poisoned outputs checked, caches flushed, timed by the grader"
        + (f" (device time: CUDA events around your launches, inside the grader's wall clock, median "
           f"{float(np.median(walls)) * 1e3:.4g} ms)" if v.details["clock"].startswith("device") else ""),
    ])
    return v


def grade_notebook(path, questions=None, *, seed=None, slug: str | None = None) -> list[PerfVerdict]:
    """Grade the speed questions of the notebook at ``path`` (its exercise from ``slug`` or its file name)."""
    from . import bundle as bundle_mod
    from . import exercises

    nb = bundle_mod.read_notebook(path)
    b = bundle_mod.from_notebook(nb)
    slug = slug or Path(path).stem
    masters = {p.stem: p for p in exercises.masters()}
    if slug not in masters:
        raise GraderError(f"no exercise named {slug}")
    specs = [s for s in specs_from_master(masters[slug]) if not questions or s.question in questions]
    return [grade_perf(s, b, seed=seed) for s in specs]


def compare_output(name: str, got: np.ndarray, ref: np.ndarray, rtol: float, atol: float):
    """:func:`parity.compare` of one output, in chunks on threads for large outputs (NumPy releases the GIL; the
    test is elementwise, so the chunks' verdicts add up to the whole one's): ``ok``, ``n_bad``, ``n_total``,
    ``max_rel``. A 32 M-element output: ~10 s in one piece on a busy 2-core machine."""
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    chunk = 1 << 20
    if got.shape != ref.shape or ref.size <= 2 * chunk:
        rep = parity.compare(name, got, ref, rtol, atol)
        return SimpleNamespace(name=name, ok=rep.ok, n_bad=rep.n_bad or (0 if rep.ok else ref.size),
                               n_total=rep.n_total or ref.size, max_rel=rep.max_rel)
    g, r = got.reshape(-1), ref.reshape(-1)
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as ex:
        parts = list(ex.map(lambda i: parity.compare(name, g[i:i + chunk], r[i:i + chunk], rtol, atol, max_shown=0),
                            range(0, r.size, chunk)))
    n_bad = sum(p.n_bad for p in parts)
    return SimpleNamespace(name=name, ok=n_bad == 0, n_bad=n_bad, n_total=int(r.size),
                           max_rel=max(p.max_rel for p in parts))
