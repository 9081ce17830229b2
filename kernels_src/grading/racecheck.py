"""A shared-memory race detector for the CUDA simulator.

The simulator runs each thread of a block as a Python thread, in an order that changes from run to run,
so a missing ``cuda.syncthreads()`` gives right answers most of the time. This module makes it an
error every time. While :func:`instrumented` is active:

- every ``cuda.shared.array`` is handed out wrapped in a proxy that logs each element read, written
  or updated atomically, with the thread and the source line;
- accesses are grouped by *barrier interval* (the stretch of execution between two
  ``cuda.syncthreads()`` of the block); two accesses to the same element by different threads of the
  block in the same interval, at least one of them a write, are a race: read-after-write (RAW),
  write-after-read (WAR) or write-after-write (WAW). Atomics do not race with each other. The verdict
  does not depend on the order the threads happened to run in: whichever access of a conflicting pair
  comes second finds the first one recorded;
- each barrier checks that every thread of the block reached it: a thread that returned early (``if
  i >= n: return`` before the barrier) or skipped it in a branch is reported, as are threads waiting at
  different ``syncthreads()`` calls;
- every kernel launch is recorded (kernel, module, grid, block, argument types), which the grader
  uses to check that the student's own kernel ran and to compile it to PTX with the types it ran with;
- device arrays handed to :meth:`_Session.watch` (the grader's output arrays) get a per-element record of
  who wrote them: an element stored by a simulated GPU thread (a plain store or an atomic) counts as written
  by the kernel; one that changed outside a launch (a copy from the host, ``out[:] = ...`` in the launcher)
  counts as written by the host, and stays so until a kernel thread stores into it again
  (:class:`WriteRecord`).

Usage::

    from kernels_src.grading.racecheck import racecheck
    report = racecheck(kernel, blocks, threads, out, x)   # runs the kernel once, instrumented
    assert report.ok, str(report)

Limits: global memory is not tracked (two blocks writing one output element are not reported); a shared
array viewed through a slice is tracked element by element, but whole-array NumPy operations on it are
not. It needs the simulator (``KERNELS_DEVICE=sim``, the default with no GPU).
"""
from __future__ import annotations

import contextlib
import linecache
import os
import re
import sys
import threading
from dataclasses import dataclass, field

import numpy as np

from .. import device

_alloc_lock = threading.Lock()
MAX_REPORTED = 5  # distinct races (by array, kind and source lines) kept per launch


@dataclass
class Access:
    thread: tuple  # threadIdx (x, y, z)
    line: int
    file: str
    kind: str  # "R", "W" or "A" (atomic)

    def where(self) -> str:
        return f"line {self.line}"


@dataclass
class Race:
    kind: str  # RAW | WAR | WAW | ATOMIC
    array: str
    index: tuple
    block: tuple
    first: Access
    second: Access
    count: int = 1

    VERB = {"R": "read", "W": "wrote", "A": "atomically updated"}

    def describe(self, where=None) -> str:
        where = where or (lambda a: f"line {a.line}: {_line_text(a.file, a.line)}")
        kinds = {"RAW": "read-after-write", "WAR": "write-after-read", "WAW": "write-after-write",
                 "ATOMIC": "atomic mixed with a plain access"}
        idx = self.index[0] if len(self.index) == 1 else self.index
        more = f" ({self.count} such conflicts)" if self.count > 1 else ""
        return (f"{kinds[self.kind]} race on shared array `{self.array}[{idx}]` in block {self.block}{more}:\n"
                f"    thread {self.first.thread} {self.VERB[self.first.kind]} it at {where(self.first)}\n"
                f"    thread {self.second.thread} {self.VERB[self.second.kind]} it at {where(self.second)}\n"
                f"    with no cuda.syncthreads() between the two")

    def __str__(self) -> str:
        return self.describe()


@dataclass
class BarrierProblem:
    block: tuple
    lines: list  # [(file, line)] of the syncthreads() calls the waiting threads were at
    reached: int
    total: int
    missing: list  # threadIdx of threads that had finished without reaching it
    kind: str = "divergent"  # divergent | mismatched

    def describe(self, where=None) -> str:
        where = where or (lambda f, ln: f"line {ln}: {_line_text(f, ln)}")
        if self.kind == "mismatched":
            sites = "; ".join(where(f, ln) for f, ln in self.lines)
            return (f"threads of block {self.block} were waiting at different cuda.syncthreads() calls ({sites}). "
                    "Every thread of a block must reach the same barrier: do not put syncthreads() inside a "
                    "branch that some threads skip.")
        shown = ", ".join(str(t) for t in self.missing[:4]) + (" ..." if len(self.missing) > 4 else "")
        f, ln = self.lines[0]
        return (f"cuda.syncthreads() at {where(f, ln)} was reached by only {self.reached} of the {self.total} "
                f"threads of block {self.block}; threads {shown} had already finished (an early `return`, or "
                "a barrier inside an `if`). Every thread of a block must reach every barrier: keep the threads "
                "that have no element alive (guard the loads and stores, not the whole kernel).")

    def __str__(self) -> str:
        return self.describe()


@dataclass
class Launch:
    kernel: str
    module: str
    grid: tuple
    block: tuple
    argtypes: list  # numba type strings, e.g. "float32[::1]"
    races: list = field(default_factory=list)
    barrier_problems: list = field(default_factory=list)
    n_races: int = 0
    error: str = ""


@dataclass
class RaceReport:
    launches: list = field(default_factory=list)

    @property
    def races(self) -> list:
        return [r for la in self.launches for r in la.races]

    @property
    def barrier_problems(self) -> list:
        return [b for la in self.launches for b in la.barrier_problems]

    @property
    def ok(self) -> bool:
        return not self.races and not self.barrier_problems

    def __str__(self) -> str:
        if self.ok:
            return f"no shared-memory races in {len(self.launches)} launch(es)"
        return "\n".join([str(r) for r in self.races] + [str(b) for b in self.barrier_problems])


def _line_text(file: str, line: int) -> str:
    return linecache.getline(file, line).strip()


# --------------------------------------------------------------------------------------- tracking
_sim_dir = None
_HERE = os.path.abspath(__file__)


_OUR_SIMULATOR = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "simulator.py")  # the greenlet engine


def _skip_file(fn: str) -> bool:
    return fn == _HERE or fn == _OUR_SIMULATOR or (_sim_dir is not None and fn.startswith(_sim_dir))


def _caller(depth: int = 2):
    f = sys._getframe(depth)
    while f is not None and _skip_file(f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return "?", 0
    return f.f_code.co_filename, f.f_lineno


_tls = threading.local()
# the simulated CUDA thread running now: an OS thread of the simulator's own loop, or a greenlet's stand-in
# while instrumented(engine="greenlets") is active (the simulator's kernel API asks the same function)
_current_thread = threading.current_thread


class _Tracker:
    """State of one launch: per shared element, who touched it in the current barrier interval."""

    def __init__(self, launch: Launch):
        self.launch = launch
        self.lock = threading.Lock()
        self.state: dict = {}
        self.block = (0, 0, 0)
        self.seen: dict = {}  # (array, kind, first line, second line) -> Race

    def new_interval(self):
        self.state.clear()

    def access(self, key, name, shape, kind):
        t = _current_thread()
        tid = getattr(t, "_rc_tid", None)
        if tid is None:
            idx = getattr(t, "threadIdx", None)
            if idx is None:  # not a simulated GPU thread (host code touching the array)
                return
            tid = t._rc_tid = (idx.x, idx.y, idx.z)
        if getattr(_tls, "atomic", False):
            kind = "A"
        file, line = _caller(3)
        me = Access(tid, line, file, kind)
        with self.lock:
            st = self.state.get(key)
            if st is None:
                st = self.state[key] = ([], [], [])  # writers, readers, atomics (at most 2 distinct threads each)
            writers, readers, atomics = st
            other, rkind = None, None
            if kind == "R":
                other = _other(writers, tid)
                rkind = "RAW"
                if other is None:
                    other, rkind = _other(atomics, tid), "ATOMIC"
                _add(readers, me)
            elif kind == "W":
                other, rkind = _other(writers, tid), "WAW"
                if other is None:
                    other, rkind = _other(readers, tid), "WAR"
                if other is None:
                    other, rkind = _other(atomics, tid), "ATOMIC"
                _add(writers, me)
            else:
                other, rkind = _other(writers, tid), "ATOMIC"
                if other is None:
                    other = _other(readers, tid)
                _add(atomics, me)
            if other is not None:
                self._report(rkind, name, key, shape, other, me)

    def _report(self, kind, name, key, shape, first, second):
        self.launch.n_races += 1
        sig = (name, kind, first.line, second.line)
        race = self.seen.get(sig)
        if race is not None:
            race.count += 1
            return
        if len(self.seen) >= MAX_REPORTED:
            return
        _, flat, itemsize = key
        index = tuple(int(i) for i in np.unravel_index(flat // itemsize, shape)) if shape else (flat // itemsize,)
        race = Race(kind, name, index, self.block, first, second)
        self.seen[sig] = race
        self.launch.races.append(race)


def _other(lst, tid):
    for a in lst:
        if a.thread != tid:
            return a
    return None


def _add(lst, acc):
    if len(lst) < 2 and all(a.thread != acc.thread for a in lst):
        lst.append(acc)


class TrackedArray:
    """A shared array as the kernel sees it while race checking: indexing logs each element access."""

    __slots__ = ("_a", "_ids", "_name", "_tracker", "_base")

    def __init__(self, a, ids, name, tracker, base):
        self._a, self._ids, self._name, self._tracker, self._base = a, ids, name, tracker, base

    def __getitem__(self, idx):
        ids = self._ids[idx]
        if isinstance(ids, np.ndarray):
            return TrackedArray(self._a[idx], ids, self._name, self._tracker, self._base)
        self._tracker.access((self._base, int(ids), self._a.itemsize), self._name, self._base_shape(), "R")
        return self._a[idx]

    def __setitem__(self, idx, value):
        ids = self._ids[idx]
        shape = self._base_shape()
        if isinstance(ids, np.ndarray):
            for i in ids.ravel():
                self._tracker.access((self._base, int(i), self._a.itemsize), self._name, shape, "W")
        else:
            self._tracker.access((self._base, int(ids), self._a.itemsize), self._name, shape, "W")
        self._a[idx] = value

    def _base_shape(self):
        return _BASE_SHAPES.get(self._base, ())

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        for i in range(len(self._a)):
            yield self[i]

    def __array__(self, dtype=None, copy=None):
        for i in self._ids.ravel():
            self._tracker.access((self._base, int(i), self._a.itemsize), self._name, self._base_shape(), "R")
        return np.asarray(self._a, dtype=dtype)

    @property
    def shape(self):
        return self._a.shape

    @property
    def size(self):
        return self._a.size

    @property
    def ndim(self):
        return self._a.ndim

    @property
    def dtype(self):
        return self._a.dtype

    def __getattr__(self, name):
        return getattr(self._a, name)

    def __repr__(self):
        return f"<shared array {self._name} {self._a.shape} {self._a.dtype}>"


_BASE_SHAPES: dict = {}
_NAME_RE = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?::[^=]*)?=\s*[\w.]*shared\.array")


def _bits(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` as unsigned integers of its item size: compares NaN payloads and -0.0 exactly."""
    c = np.array(a, copy=True, order="C")
    return c.view(f"u{c.itemsize}") if c.itemsize in (1, 2, 4, 8) else c.view(np.uint8)


@dataclass
class WriteRecord:
    """Who wrote each element of one watched output array."""

    shape: tuple
    size: int
    kernel: np.ndarray  # bool: the element's current value was stored by a kernel thread
    host: np.ndarray  # bool: the element's current value was changed outside a kernel launch

    @property
    def n_kernel(self) -> int:
        return int(self.kernel.sum())

    @property
    def n_host(self) -> int:
        return int(self.host.sum())


class _Watched:
    def __init__(self, dev):
        a = dev._ary
        self.dev = dev
        self.addr = a.__array_interface__["data"][0]
        self.nbytes = a.nbytes
        self.itemsize = a.itemsize
        self.shape = a.shape
        self.ids = np.arange(a.size, dtype=np.int64)
        self.kernel = np.zeros(a.size, bool)
        self.host = np.zeros(a.size, bool)
        self.last = _bits(a).reshape(-1)

    def owns(self, view: np.ndarray) -> bool:
        addr = view.__array_interface__["data"][0]
        return self.addr <= addr < self.addr + self.nbytes

    def mark_kernel(self, view: np.ndarray, idx) -> None:
        from numpy.lib.stride_tricks import as_strided

        start = (view.__array_interface__["data"][0] - self.addr) // self.itemsize
        ids = as_strided(self.ids[start:], shape=view.shape,
                         strides=tuple(st // self.itemsize * self.ids.itemsize for st in view.strides))
        sel = np.asarray(ids[idx]).reshape(-1)
        self.kernel[sel] = True
        self.host[sel] = False

    def sync(self, during_launch: bool) -> None:
        """Compare with the last snapshot: what changed during a launch was written by the kernel (on top of
        the stores seen one by one, which also count a store of an unchanged value), the rest by the host."""
        try:
            now = _bits(self.dev._ary).reshape(-1)
            changed = now != self.last
        except Exception:  # noqa: BLE001  (the array was replaced by something else: the host did it)
            self.host[:], self.kernel[:] = True, False
            return
        if changed.any():
            self.host[changed] = not during_launch
            self.kernel[changed] = during_launch
        self.last = now

    def record(self) -> WriteRecord:
        return WriteRecord(self.shape, int(self.ids.size), self.kernel.reshape(self.shape).copy(),
                           self.host.reshape(self.shape).copy())


class _Session:
    def __init__(self, track_races: bool):
        self.track_races = track_races
        self.launches: list[Launch] = []
        self.current: _Tracker | None = None
        self.watched: list[_Watched] = []

    def report(self) -> RaceReport:
        return RaceReport(list(self.launches))

    def watch(self, arrays) -> None:
        """Record who writes each element of these (simulator) device arrays from now on."""
        self.watched += [_Watched(d) for d in arrays]

    def writes(self) -> list[WriteRecord]:
        """Per watched array, in the order given to :meth:`watch`: who wrote each element, as of now."""
        for w in self.watched:
            w.sync(during_launch=False)
        return [w.record() for w in self.watched]

    def _kernel_store(self, view, idx) -> None:
        for w in self.watched:
            if w.owns(view):
                try:
                    w.mark_kernel(view, idx)
                except Exception:  # noqa: BLE001  (an index we cannot map: the launch's snapshot still counts it)
                    pass
                return


_active: _Session | None = None


def _numba_type(a) -> str:
    """A numba signature fragment for a kernel argument: ``float32[::1]``, ``float32[:, ::1]``, ``int64``."""
    from numba import typeof

    host = getattr(a, "_ary", a)  # the simulator's device arrays wrap a NumPy array in ._ary
    try:
        if isinstance(host, np.ndarray):
            if host.ndim == 0:
                return str(typeof(host[()]))
            if host.flags.c_contiguous:
                dims = [":"] * (host.ndim - 1) + ["::1"]
            elif host.flags.f_contiguous and host.ndim > 1:
                dims = ["::1"] + [":"] * (host.ndim - 1)
            else:
                dims = [":"] * host.ndim
            return f"{host.dtype}[{', '.join(dims)}]"
        return str(typeof(a))
    except Exception:  # noqa: BLE001
        return "?"


@contextlib.contextmanager
def instrumented(track_races: bool = True, engine: str = "threads"):
    """Patch the simulator for the duration of the block. Yields a session with ``.report()``.

    ``engine``: how each block's threads run. ``"threads"`` (the grader's): the simulator's own loop, one OS
    thread per CUDA thread. ``"greenlets"``: :func:`kernels_src.simulator.threads_as_greenlets`, each thread in
    turn up to its next barrier, many times faster. The detector's verdict does not depend on the order the
    threads ran in (see the module's docstring), so both find the same races and barrier problems; the tests
    run the same faulty kernels through both (tests/test_grading_race.py). The grader keeps OS threads, whose
    interleavings are also what a student's unsynchronised kernel meets."""
    global _active, _sim_dir, _current_thread
    if engine not in ("threads", "greenlets"):
        raise ValueError(f"engine must be 'threads' or 'greenlets', not {engine!r}")
    if not device.SIMULATED:
        raise RuntimeError("race checking needs the CUDA simulator (KERNELS_DEVICE=sim); numba.cuda is "
                           f"the real GPU target here ({device.REASON})")
    if _active is not None:
        raise RuntimeError("racecheck.instrumented() does not nest")
    from numba.cuda.simulator import kernel as skernel
    from numba.cuda.simulator import kernelapi

    _sim_dir = os.path.dirname(os.path.abspath(skernel.__file__))
    session = _Session(track_races)
    saved = {
        "call": skernel.FakeCUDAKernel.__call__,
        "bm_run": skernel.BlockManager.run,
        "sync": skernel.BlockThread.syncthreads,
        "shared": kernelapi.FakeCUDAShared.array,
        "atomic": {n: getattr(kernelapi.FakeCUDAAtomic, n) for n in dir(kernelapi.FakeCUDAAtomic)
                   if not n.startswith("_") and callable(getattr(kernelapi.FakeCUDAAtomic, n))},
    }
    orig_call, orig_sync = saved["call"], saved["sync"]
    from numba.cuda.simulator.cudadrv import devicearray as sdevicearray

    saved["setitem"] = sdevicearray.FakeCUDAArray.__setitem__
    orig_setitem = saved["setitem"]

    def call(self, *args):
        if self._device or skernel._kernel_context:
            return orig_call(self, *args)
        grid, block = tuple(self.grid_dim or ()), tuple(self.block_dim or ())
        launch = Launch(getattr(self.fn, "__qualname__", "?"), getattr(self.fn, "__module__", "?"),
                        grid, block, [_numba_type(a) for a in args])
        session.launches.append(launch)
        session.current = _Tracker(launch)
        for w in session.watched:
            w.sync(during_launch=False)
        profile = sys.getprofile()  # the shortcut detector watches the launcher, not the simulator's threads
        thread_profile = threading.getprofile() if hasattr(threading, "getprofile") else threading._profile_hook
        tracer = sys.gettrace()
        sys.setprofile(None)
        sys.settrace(None)
        threading.setprofile(None)
        try:
            return orig_call(self, *args)
        except BaseException as e:
            launch.error = f"{type(e).__name__}: {e}"
            raise
        finally:
            sys.setprofile(profile)
            sys.settrace(tracer)
            threading.setprofile(thread_profile)
            session.current = None
            for w in session.watched:
                w.sync(during_launch=True)

    def setitem(self, idx, val):
        if session.watched and getattr(_current_thread(), "threadIdx", None) is not None:
            session._kernel_store(self._ary, idx)
        return orig_setitem(self, idx, val)

    def syncthreads(self):
        self._rc_barrier = _caller(2)
        return orig_sync(self)

    def shared_array(self, shape, dtype, alignment=None):
        if alignment is not None:
            raise RuntimeError("Array alignment is not supported in cudasim")
        from ..simulator import as_numpy_dtype  # numba-cuda's types or numba's built-in ones (macOS)

        dtype = np.dtype(as_numpy_dtype(dtype))
        file, line = _caller(2)
        allocs = self.__dict__.setdefault("_rc_allocations", {})
        if shape == 0:
            count = self._dynshared_size // dtype.itemsize
            key, raw = ("dynamic", dtype.str), np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
            name, base = "dynamic shared memory", ("dyn", id(self))
        else:
            key = (file, line)
            with _alloc_lock:  # threads of a block race to create the array: one must win for all
                raw = self._allocations.get(key)
                if raw is None:
                    raw = self._allocations[key] = np.empty(shape, dtype)
            m = _NAME_RE.match(_line_text(file, line))
            name, base = (m.group(1) if m else f"shared array of line {line}"), ("static", id(raw))
        tracker = session.current
        if tracker is None or not session.track_races:
            return raw
        with _alloc_lock:
            proxy = allocs.get(key)
            if proxy is None:
                ids = (np.arange(raw.size, dtype=np.int64) * raw.itemsize).reshape(raw.shape)
                _BASE_SHAPES[base] = raw.shape
                proxy = allocs[key] = TrackedArray(raw, ids, name, tracker, base)
        return proxy

    def make_atomic(fn):
        def wrapped(self, *a, **k):
            _tls.atomic = True
            try:
                return fn(self, *a, **k)
            finally:
                _tls.atomic = False

        return wrapped

    def bm_run(self, grid_point, *args):
        tracker = session.current
        if tracker is not None:
            tracker.block = tuple(int(g) for g in grid_point)
            tracker.new_interval()
        threads, livethreads, blockedthreads = set(), set(), set()
        for block_point in np.ndindex(*self._block_dim):
            def target():
                self._f(*args)

            t = skernel.BlockThread(target, self, grid_point, block_point, self._debug)
            t.start()
            threads.add(t)
            livethreads.add(t)
        while livethreads:
            for t in livethreads:
                if t.syncthreads_blocked:
                    blockedthreads.add(t)
                elif t.exception:
                    for t_other in threads:
                        t_other.abort = True
                        t_other.syncthreads_blocked = False
                        t_other.syncthreads_event.set()
                    raise t.exception[0].with_traceback(t.exception[1])
            if livethreads == blockedthreads:
                # a thread that ended with an exception is not a divergent barrier: report the exception
                for t in threads:
                    if t.exception:
                        for t_other in threads:
                            t_other.abort = True
                            t_other.syncthreads_blocked = False
                            t_other.syncthreads_event.set()
                        raise t.exception[0].with_traceback(t.exception[1])
                if tracker is not None:
                    _check_barrier(tracker, grid_point, threads, blockedthreads)
                    tracker.new_interval()
                for t in blockedthreads:
                    t.syncthreads_blocked = False
                    t.syncthreads_event.set()
                blockedthreads = set()
            livethreads = set(t for t in livethreads if t.is_alive())
        for t in threads:
            if t.exception:
                raise t.exception[0].with_traceback(t.exception[1])

    def on_block(grid_point):
        tracker = session.current
        if tracker is not None:
            tracker.block = tuple(int(g) for g in grid_point)
            tracker.new_interval()

    def on_barrier(grid_point, threads, blocked):
        tracker = session.current
        if tracker is not None:
            _check_barrier(tracker, grid_point, threads, blocked)
            tracker.new_interval()

    green = None
    if engine == "greenlets":
        from ..simulator import _GreenThread, threads_as_greenlets

        class _RcGreenThread(_GreenThread):
            def syncthreads(self):
                self._rc_barrier = _caller(2)
                return super().syncthreads()

        green = threads_as_greenlets(thread_class=_RcGreenThread, on_block=on_block, on_barrier=on_barrier)

    skernel.FakeCUDAKernel.__call__ = call
    sdevicearray.FakeCUDAArray.__setitem__ = setitem
    skernel.BlockThread.syncthreads = syncthreads
    kernelapi.FakeCUDAShared.array = shared_array
    for n, fn in saved["atomic"].items():
        setattr(kernelapi.FakeCUDAAtomic, n, make_atomic(fn))
    if green is None:
        skernel.BlockManager.run = bm_run
    else:
        green.__enter__()  # replaces BlockManager.run and the kernel API's threading module
        _current_thread = kernelapi.threading.current_thread
    _active = session
    try:
        yield session
    finally:
        if green is not None:
            _current_thread = threading.current_thread
            green.__exit__(None, None, None)
        skernel.FakeCUDAKernel.__call__ = saved["call"]
        sdevicearray.FakeCUDAArray.__setitem__ = saved["setitem"]
        skernel.BlockManager.run = saved["bm_run"]
        skernel.BlockThread.syncthreads = saved["sync"]
        kernelapi.FakeCUDAShared.array = saved["shared"]
        for n, fn in saved["atomic"].items():
            setattr(kernelapi.FakeCUDAAtomic, n, fn)
        _active = None


def _check_barrier(tracker: _Tracker, grid_point, threads, blocked) -> None:
    launch = tracker.launch
    if len(launch.barrier_problems) >= MAX_REPORTED:
        return
    block = tuple(int(g) for g in grid_point)
    sites = sorted({getattr(t, "_rc_barrier", ("?", 0)) for t in blocked})
    if len(blocked) < len(threads):
        missing = sorted(tuple(t.threadIdx) for t in threads if t not in blocked)
        if not any(p.kind == "divergent" and p.lines == sites[:1] for p in launch.barrier_problems):
            launch.barrier_problems.append(BarrierProblem(block, sites[:1], len(blocked), len(threads), missing))
    elif len(sites) > 1:
        if not any(p.kind == "mismatched" for p in launch.barrier_problems):
            launch.barrier_problems.append(BarrierProblem(block, sites, len(blocked), len(threads), [],
                                                          kind="mismatched"))


def racecheck(kernel, griddim, blockdim, *args, engine: str = "threads") -> RaceReport:
    """Launch ``kernel[griddim, blockdim](*args)`` once in the instrumented simulator; return the report.
    ``engine``: as :func:`instrumented` takes it."""
    with instrumented(engine=engine) as s:
        with device.simulator_speedup():
            kernel[griddim, blockdim](*args)
    return s.report()
