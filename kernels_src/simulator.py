"""Fixes to numba's CUDA simulator, so that simulated kernels behave like kernels on a GPU.

The simulator runs each CUDA thread as a Python thread, calling the kernel's own Python code. Things in
that differ from a GPU in ways that fail correct code, or misreport a wrong one, are fixed here, once, for every user of the
simulator (the course's tests, ``kernels check``, the notebooks and the autograder):

1. **Math follows CUDA's rules, not Python's.** Python's ``math`` raises where CUDA's math library returns
   an IEEE value: ``math.exp(710.0)`` raises OverflowError (CUDA: ``inf``), ``math.log(0.0)`` raises
   ValueError (CUDA: ``-inf``), ``math.sqrt(-1.0)`` raises (CUDA: ``nan``), ``math.cos(inf)`` raises (CUDA:
   ``nan``). A kernel such as ``x / (1 + exp(-2u))`` is right on the GPU for every ``u``, yet fails in the
   simulator for ``u < -354``. While a simulated kernel (or device function) runs, its module's ``math``
   (and any function imported from ``math`` by name) is replaced by :data:`CUDA_MATH`, which computes the
   same thing and, where Python would raise, returns what CUDA returns: ``±inf``, ``0`` or ``nan``.
2. **Shared arrays are created atomically.** ``cuda.shared.array`` looks the array up by call site and creates
   it if missing, without a lock: two threads of a block arriving together could each create their own array
   and never see each other's writes (rare garbage sums). Same lookup, made atomic.

3. **A thread's exception keeps its type and message.** The simulator rebuilds a thread's exception as
   ``type(e)(msg)``, which fails for exceptions whose constructor wants other arguments (NumPy's memory
   error, custom classes): the error was lost and a barrier the dead thread never reached was blamed
   instead. See :func:`_keep_thread_exceptions`.

4. **The fake ``cuda`` module stays in place while any thread of a block uses it.** numba's built-in simulator
   (numba.cuda without the numba-cuda package, as on macOS) swaps a module's ``cuda`` for its fake one per thread,
   with no count, so one thread's exit can pull it from under another; see :func:`_thread_safe_cuda_swap`.

Both simulators are served: numba-cuda's and numba's built-in one (they differ in where numba keeps its types,
:func:`as_numpy_dtype`, and in item 4).

:func:`install` applies all four; :mod:`kernels_src.device` calls it when it chooses the simulator.

What is still not like a GPU: plain Python arithmetic on two Python floats (``1.0 / 0.0`` raises
ZeroDivisionError), though values read from arrays are NumPy scalars, which follow IEEE rules; and the
precision (the simulator computes in float64 where a float32 kernel rounds every step).
"""
from __future__ import annotations

import contextlib
import functools
import math
import sys
import threading
import types

import numpy as np

_PY_ERRORS = (OverflowError, ValueError, ZeroDivisionError)


def _tgamma(x):
    """CUDA's tgamma: +-inf at +-0, nan at negative integers and -inf, +inf on overflow."""
    x = float(x)
    if x == 0.0:
        return math.copysign(math.inf, x)
    if math.isnan(x) or x == -math.inf or (x < 0 and x == math.floor(x)):
        return math.nan
    return math.inf  # the only other way math.gamma raises is overflow (x > 171.6...)


def _lgamma(x):
    """CUDA's lgamma: +inf at the poles (0 and the negative integers) and at +-inf."""
    x = float(x)
    return math.nan if math.isnan(x) else math.inf


def _log(x, base=None):
    with np.errstate(all="ignore"):
        return float(np.log(x)) if base is None else float(np.log(x) / np.log(base))


# Python math function -> what CUDA's math library returns where Python raises (same values otherwise).
_IEEE = {
    "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": _log, "log2": np.log2, "log10": np.log10,
    "log1p": np.log1p, "sqrt": np.sqrt, "pow": np.power, "cosh": np.cosh, "sinh": np.sinh, "tanh": np.tanh,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "atan2": np.arctan2, "hypot": np.hypot,
    "fmod": np.fmod, "remainder": lambda x, y: float("nan") if y == 0 or math.isinf(x) else math.remainder(x, y),
    "ldexp": lambda x, i: float(np.ldexp(np.float64(x), int(i))), "cbrt": np.cbrt,
    "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "gamma": _tgamma, "lgamma": _lgamma,
}


def _cuda_rules(name: str, py_fn, ieee_fn):
    @functools.wraps(py_fn)
    def fn(*args):
        try:
            return py_fn(*args)
        except _PY_ERRORS:
            with np.errstate(all="ignore"):
                return float(ieee_fn(*args))

    fn.__qualname__ = fn.__name__ = name
    fn.__doc__ = f"math.{name}, returning CUDA's IEEE result (inf, 0 or nan) where Python's would raise."
    fn.python_math = py_fn
    return fn


def _make_cuda_math() -> types.ModuleType:
    mod = types.ModuleType("math", "Python's math module with CUDA's answers where Python would raise "
                                   "(kernels_src.simulator).")
    mod.__dict__.update({k: v for k, v in vars(math).items() if not k.startswith("__")})
    for name, ieee in _IEEE.items():
        if hasattr(math, name):
            setattr(mod, name, _cuda_rules(name, getattr(math, name), ieee))
    mod.is_cuda_math = True
    return mod


CUDA_MATH = _make_cuda_math()
_MATH_FUNCS = {id(getattr(math, n)): n for n in _IEEE if hasattr(math, n)}

# Several threads of a block enter a device function at once, and a device function may live in another
# module than its kernel: swap a module's globals on the first entry, restore them on the last exit.
_swap_lock = threading.Lock()
_swap_depth: dict = {}  # id(globals dict) -> [depth, {name: original}]


def _math_replacements(globs: dict) -> dict:
    repl = {}
    for k, v in globs.items():
        if v is math:
            repl[k] = CUDA_MATH
        elif callable(v) and _MATH_FUNCS.get(id(v)) is not None and getattr(math, _MATH_FUNCS[id(v)]) is v:
            repl[k] = getattr(CUDA_MATH, _MATH_FUNCS[id(v)])
    return repl


@contextlib.contextmanager
def cuda_math_for(fn):
    """While the block runs, ``fn``'s module sees :data:`CUDA_MATH` wherever it used ``math``."""
    globs = getattr(fn, "__globals__", None)
    if globs is None:
        yield
        return
    key = id(globs)
    with _swap_lock:
        entry = _swap_depth.get(key)
        if entry is None:
            repl = _math_replacements(globs)
            entry = _swap_depth[key] = [0, {k: globs[k] for k in repl}]
            globs.update(repl)
        entry[0] += 1
    try:
        yield
    finally:
        with _swap_lock:
            entry[0] -= 1
            if entry[0] == 0:
                globs.update(entry[1])
                del _swap_depth[key]


def _thread_safe_cuda_swap() -> None:
    """Give numba's built-in simulator the thread-safe module swap that numba-cuda's has (item 4).

    Around every simulated kernel and device-function call, the simulator points the function's module-level
    ``cuda`` at its fake CUDA module, and points it back on exit. numba's built-in version (numba.cuda without
    the numba-cuda package, as on macOS) does this per thread with no count: when the threads of a block call a
    device function of the same module at once, the first to return restores the real ``numba.cuda`` while the
    others still run, and they fail with ``module 'numba.cuda' has no attribute 'threadIdx'`` (now and then:
    it is a race). numba-cuda counts entries per module under a lock and restores on the last exit; the same
    is done here when the installed simulator does not already."""
    from numba.cuda.simulator import kernel, kernelapi

    if hasattr(kernelapi, "_swap_refcount") or getattr(kernelapi, "_kernels_counted_swap", False):
        return  # numba-cuda's simulator (already counted), or done before
    lock = threading.Lock()
    counts: dict = {}  # id(globals dict) -> [entries, {name: the real numba.cuda}]

    @contextlib.contextmanager
    def swapped_cuda_module(fn, fake_cuda_module):
        from numba import cuda

        globs = fn.__globals__
        key = id(globs)
        with lock:
            entry = counts.get(key)
            if entry is None:
                orig = {k: v for k, v in globs.items() if v is cuda}
                entry = counts[key] = [0, orig]
                globs.update({k: fake_cuda_module for k in orig})
            entry[0] += 1
        try:
            yield
        finally:
            with lock:
                entry[0] -= 1
                if entry[0] == 0:
                    globs.update(entry[1])
                    del counts[key]

    kernelapi._kernels_counted_swap = True
    swapped_cuda_module.simulator_original = kernel.swapped_cuda_module
    kernel.swapped_cuda_module = swapped_cuda_module
    kernelapi.swapped_cuda_module = swapped_cuda_module


def _follow_cuda_math() -> None:
    """Wrap the simulator's ``swapped_cuda_module`` (entered around every simulated kernel and device
    function call) so that it also swaps ``math`` for :data:`CUDA_MATH`."""
    from numba.cuda.simulator import kernel, kernelapi

    original = kernel.swapped_cuda_module
    if getattr(original, "cuda_math", False):
        return

    @contextlib.contextmanager
    def swapped_cuda_module(fn, fake_cuda_module):
        with cuda_math_for(fn), original(fn, fake_cuda_module):
            yield

    swapped_cuda_module.cuda_math = True
    swapped_cuda_module.simulator_original = original
    kernel.swapped_cuda_module = swapped_cuda_module
    kernelapi.swapped_cuda_module = swapped_cuda_module


# Where numba keeps its type classes and their NumPy conversion: numba-cuda has its own (numba.cuda.types,
# numba.cuda.np); numba's built-in numba.cuda (macOS, where numba-cuda cannot be installed) uses numba's core.
_TYPE_SYSTEMS = (("numba.cuda.types", "numba.cuda.np.numpy_support"), ("numba.core.types", "numba.np.numpy_support"))


def as_numpy_dtype(dtype):
    """``dtype`` as NumPy understands it: a numba scalar type (``float32`` from the compiler door, of either type
    system) becomes its NumPy dtype; anything else is returned as it is."""
    import importlib

    for types_mod, support_mod in _TYPE_SYSTEMS:
        try:
            base = importlib.import_module(types_mod).Type
            support = importlib.import_module(support_mod)
        except (ImportError, AttributeError):
            continue
        if isinstance(dtype, base):
            return support.as_dtype(dtype)
    return dtype


def _make_simulated_shared_arrays_thread_safe() -> None:
    """The shared-array fix (see the module docstring, item 2)."""
    from numba.cuda.simulator import kernelapi

    if getattr(kernelapi.FakeCUDAShared.array, "_atomic", False):
        return
    simulator_array = kernelapi.FakeCUDAShared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0:  # dynamic shared memory: one buffer, no lookup to race on
            # (numba's built-in simulator takes no alignment argument)
            return simulator_array(self, shape, dtype, *(() if alignment is None else (alignment,)))
        if alignment is not None:
            raise RuntimeError("Array alignment is not supported in cudasim")
        dtype = as_numpy_dtype(dtype)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            res = self._allocations.get(key)
            if res is None:
                res = self._allocations[key] = np.empty(shape, dtype)
        return res

    array._atomic = True
    array.simulator_original = simulator_array
    kernelapi.FakeCUDAShared.array = array


def _rebuilt(e: BaseException, msg: str):
    """``type(e)(msg)`` when that gives back an exception of the same type whose text is ``msg``; else None."""
    try:
        new = type(e)(msg)
    except Exception:  # noqa: BLE001  (a constructor that wants other arguments)
        return None
    try:
        return new if type(new) is type(e) and str(new) == msg else None
    except Exception:  # noqa: BLE001  (a __str__ that needs attributes the constructor did not set)
        return None


def _keep_thread_exceptions() -> None:
    """A simulated thread's exception reaches the launcher with its own type and message.

    The simulator's ``BlockThread.run`` catches a thread's exception and rebuilds it as ``type(e)(msg)`` to add
    the thread and block indices. That fails for exceptions whose constructor does not take one message
    (NumPy's memory error, ``UnicodeDecodeError``, many custom classes): the rebuild raises inside ``run``,
    the original is lost, the thread ends as if it had returned, and the block's other threads are then
    reported as waiting at a barrier it never reached. It also never catches a ``BaseException`` that is not
    an ``Exception`` (``SystemExit``), which ends the thread just as silently. Here the rebuild is kept where
    it works; otherwise the original exception is kept, with the thread and block added as a note."""
    from numba.cuda.simulator import kernel

    if getattr(kernel.BlockThread.run, "_keeps_exceptions", False):
        return
    simulator_run = kernel.BlockThread.run

    def run(self):
        try:
            threading.Thread.run(self)
        except BaseException as e:  # noqa: BLE001  (whatever a kernel raises is the launch's error)
            where = f"tid={list(self.threadIdx)} ctaid={list(self.blockIdx)}"
            try:
                text = str(e)
            except Exception:  # noqa: BLE001
                text = ""
            msg = f"{where}: {text}" if text else where
            tb = sys.exc_info()[2]
            new = _rebuilt(e, msg) if isinstance(e, Exception) else None
            if new is None:
                new = e
                try:
                    e.add_note(f"raised in the simulated CUDA thread {where}")
                except Exception:  # noqa: BLE001
                    pass
                new.simulated_thread = where
            self.exception = (new, tb)

    run._keeps_exceptions = True
    run.simulator_original = simulator_run
    kernel.BlockThread.run = run


def install() -> None:
    """Apply every fix; idempotent. Call only when numba.cuda is the simulator."""
    _make_simulated_shared_arrays_thread_safe()
    _thread_safe_cuda_swap()  # before _follow_cuda_math, which wraps the swap
    _follow_cuda_math()
    _keep_thread_exceptions()


# ------------------------------------------------------------------------------- one OS thread per block
class _GreenThread:
    """What the simulator's kernel API asks of "the current thread" (its indices, its block, a barrier), for a
    CUDA thread run as a greenlet."""

    def __init__(self, manager, block_point, thread_point, parent):
        from numba.cuda.simulator.kernel import BlockThread, Dim3

        self._manager = manager
        self.blockIdx = Dim3(*block_point)
        self.threadIdx = Dim3(*thread_point)
        bd = Dim3(*manager._block_dim)
        self.thread_id = self.threadIdx.x + bd.x * (self.threadIdx.y + bd.y * self.threadIdx.z)
        self._parent = parent
        self._api = BlockThread  # syncthreads_count/and/or are written against syncthreads and _manager

    def syncthreads(self):
        self._parent.switch(_BLOCK)  # back to the block's loop, which resumes every thread once all are here

    def syncthreads_count(self, value):
        return self._api.syncthreads_count(self, value)

    def syncthreads_and(self, value):
        return self._api.syncthreads_and(self, value)

    def syncthreads_or(self, value):
        return self._api.syncthreads_or(self, value)

    def __str__(self):
        return f"Thread <<<{self.blockIdx}, {self.threadIdx}>>>"


class _GreenBarrier:
    """``threading.Barrier`` for greenlet threads (the simulated ``mma.sync`` gathers a warp at one): waiting
    returns to the block's loop, which resumes the waiters once ``parties`` of them are here."""

    def __init__(self, parties, current, timeout=None):
        self.parties = parties
        self._current = current

    def wait(self, timeout=None):
        self._current[0]._parent.switch(self)


_BLOCK = "syncthreads"


_FOR_GOOD = contextlib.ExitStack()


def greenlets_for_good() -> bool:
    """Run every simulated block's threads as greenlets (:func:`threads_as_greenlets`) from now until this process
    ends. :mod:`kernels_src.device` calls it once, for ``KERNELS_SIM_THREADS=greenlets``: the site's build sets it,
    because the pages show results of race-free kernels, which do not depend on the schedule (every GPU variant is
    checked race-free by the race detector, tests/test_registry.py). JupyterLab and the grader keep the simulator's
    OS threads. False (and nothing changes) where greenlet is not installed."""
    try:
        _FOR_GOOD.enter_context(threads_as_greenlets())
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def threads_as_greenlets(thread_class=None, on_block=None, on_barrier=None):
    """Run each simulated block's threads as greenlets in the calling thread instead of one OS thread each.

    The simulator's own block loop starts an OS thread per CUDA thread and polls them all until each has
    reached ``syncthreads()`` or ended; starting and scheduling those threads is nearly all of a small
    kernel's simulated time (1 500 thread starts for a 389-element check take seconds on a loaded 2-core
    machine). Here every thread of a block runs, in thread order, until it reaches a barrier or ends. When every
    live thread waits at ``syncthreads()``, all go on; when all the parties of a warp's barrier (the simulated
    ``mma.sync``, :mod:`kernels_src.compiler.inline_ptx`) are there, those go on. That is a schedule a GPU may
    run, and the results of a kernel without a data race do not depend on the schedule: 10-40x faster (wall
    time) on the course's kernels. Threads that wait at different barriers with none complete raise (a GPU
    would hang).

    Not for everything: threads that wait on each other any other way (a spin on a flag) hang here, and the
    race detector and the grader keep the simulator's own loop, whose interleavings can expose a race. Tests
    that need a race-free kernel's results (the seed sweep, the registry against the reference) use this.

    Hooks for the race detector (:func:`kernels_src.grading.racecheck.instrumented` with ``engine="greenlets"``):
    ``thread_class`` (a :class:`_GreenThread` subclass) stands for each CUDA thread; ``on_block(grid_point)`` is
    called before a block's threads start; ``on_barrier(grid_point, threads, waiting)`` when every live thread of
    the block waits at ``syncthreads()``, before they go on (``threads``: all of the block's, ``waiting``: those
    at the barrier; fewer than all when some ended without reaching it).
    """
    import greenlet
    from numba.cuda.simulator import kernel, kernelapi

    current = [None]
    real_threading = kernelapi.threading
    shim = types.ModuleType("threading")
    shim.__dict__.update(real_threading.__dict__)
    shim.current_thread = lambda: current[0] if current[0] is not None else real_threading.current_thread()
    shim.Barrier = lambda parties, *a, **k: (_GreenBarrier(parties, current) if current[0] is not None
                                             else real_threading.Barrier(parties, *a, **k))

    make_thread = thread_class or _GreenThread

    def run(self, grid_point, *args):
        main = greenlet.getcurrent()
        if on_block is not None:
            on_block(grid_point)
        live = []
        for block_point in np.ndindex(*self._block_dim):
            t = make_thread(self, grid_point, block_point, main)
            live.append((t, greenlet.greenlet(lambda: self._f(*args), parent=main)))
        threads = [t for t, _ in live]
        runnable = live
        waits: dict = {}  # thread -> what it waits at (_BLOCK or a _GreenBarrier)
        try:
            while live:
                for t, g in runnable:  # each runs to a barrier or to its end
                    current[0] = t
                    try:
                        waits[t] = g.switch()
                    except BaseException as e:
                        e.add_note(f"in simulated thread tid={list(t.threadIdx)} ctaid={list(t.blockIdx)}")
                        raise
                    finally:
                        current[0] = None
                live = [(t, g) for t, g in live if not g.dead]
                groups: dict = {}
                for t, g in live:
                    groups.setdefault(id(waits[t]), []).append((t, g))
                full = [grp for grp in groups.values()
                        if waits[grp[0][0]] is not _BLOCK and len(grp) >= waits[grp[0][0]].parties]
                if full:
                    runnable = [tg for grp in full for tg in grp]
                elif len(groups) == 1 and waits[live[0][0]] is _BLOCK:
                    if on_barrier is not None:
                        on_barrier(grid_point, threads, [t for t, _ in live])
                    runnable = live
                elif live:
                    raise RuntimeError("simulated threads wait at different barriers and none is complete (a warp "
                                       "barrier some lanes never reach, as an mma.sync under a bounds guard): "
                                       "a GPU would hang")
        finally:
            for t, g in live:  # after an error: unwind the others (their `with` blocks exit in order)
                if not g.dead:
                    current[0] = t
                    try:
                        g.throw()
                    except BaseException:  # noqa: BLE001  (the first error is the one that propagates)
                        pass
                    finally:
                        current[0] = None

    inline_ptx = sys.modules.get("kernels_src.compiler.inline_ptx")
    saved = kernel.BlockManager.run
    kernel.BlockManager.run = run
    kernelapi.threading = shim
    if getattr(inline_ptx, "_threading", None) is real_threading:
        inline_ptx._threading = shim
    try:
        yield
    finally:
        kernel.BlockManager.run = saved
        kernelapi.threading = real_threading
        if inline_ptx is not None and getattr(inline_ptx, "_threading", None) is shim:
            inline_ptx._threading = real_threading
