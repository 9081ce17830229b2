"""A simulated kernel's exception reaches the launcher with its own type and message (kernels_src/simulator.py),
and the race detector blames a barrier only when one really diverged (kernels_src/grading/racecheck.py).

The simulator rebuilds a thread's exception as ``type(e)(msg)``; for an exception whose constructor wants
other arguments the rebuild failed, the error was lost and the feedback blamed a ``syncthreads()`` that the
dead thread never reached."""
import numpy as np
import pytest

from kernels_src import device
from kernels_src.grading.racecheck import instrumented

cuda = device.cuda
pytestmark = pytest.mark.skipif(not device.SIMULATED, reason="the CUDA simulator's behaviour")


class TwoArgError(Exception):
    def __init__(self, code, detail):
        super().__init__(f"code {code}: {detail}")
        self.code, self.detail = code, detail


class NoArgError(Exception):
    def __init__(self):
        super().__init__("no-argument error")


class FormattedError(Exception):
    """A __str__ that needs an attribute the one-argument constructor does not set."""

    def __init__(self, n, unit="B"):
        super().__init__(n)
        self.n, self.unit = n, unit

    def __str__(self):
        return f"needs {self.n} {self.unit}"


def _raise(kind):
    if kind == "numpy_memory":
        np.ones(1 << 42, dtype=np.float64)  # NumPy's _ArrayMemoryError(shape, dtype)
    if kind == "two_args":
        raise TwoArgError(7, "bad tile")
    if kind == "no_args":
        raise NoArgError()
    if kind == "formatted":
        raise FormattedError(12)
    if kind == "unicode":
        b"\xff".decode("utf-8")
    if kind == "system_exit":
        raise SystemExit(4)
    if kind == "value":
        raise ValueError("plain value error")


WANT = {  # kind -> (exception class, text in its message)
    "numpy_memory": (MemoryError, "Unable to allocate"),
    "two_args": (TwoArgError, "code 7: bad tile"),
    "no_args": (NoArgError, "no-argument error"),
    "formatted": (FormattedError, "needs 12 B"),
    "unicode": (UnicodeDecodeError, "can't decode byte 0xff"),
    "system_exit": (SystemExit, "4"),
    "value": (ValueError, "plain value error"),
}

KIND = {"k": ""}


@cuda.jit
def _one_thread_fails_before_barrier(out):
    s = cuda.shared.array(8, dtype=np.float32)
    t = cuda.threadIdx.x
    if t == 3:
        _raise(KIND["k"])
    s[t] = t
    cuda.syncthreads()
    out[t] = s[7 - t]


@pytest.mark.parametrize("kind", sorted(WANT))
@pytest.mark.parametrize("instrument", [False, True], ids=["plain", "racecheck"])
def test_thread_exception_keeps_type_and_message(kind, instrument):
    KIND["k"] = kind
    out = np.zeros(8, np.float32)
    cls, text = WANT[kind]
    if instrument:
        with instrumented() as session:
            with pytest.raises(cls) as info:
                _one_thread_fails_before_barrier[1, 8](out)
        report = session.report()
        assert not report.barrier_problems, [str(b) for b in report.barrier_problems]
    else:
        with pytest.raises(cls) as info:
            _one_thread_fails_before_barrier[1, 8](out)
    assert text in str(info.value)
    assert "syncthreads" not in str(info.value) and "abort flag" not in str(info.value)
    if kind == "value":  # the rebuild works: the thread and block are in the message, as before
        assert "tid=[3, 0, 0]" in str(info.value)
    else:
        assert "tid=[3, 0, 0]" in (str(info.value) + " ".join(getattr(info.value, "__notes__", [])))


@cuda.jit
def _early_return_before_barrier(out):
    s = cuda.shared.array(8, dtype=np.float32)
    t = cuda.threadIdx.x
    if t >= 6:
        return
    s[t] = t
    cuda.syncthreads()
    out[t] = s[t]


def test_a_real_divergent_barrier_is_still_reported():
    out = np.zeros(8, np.float32)
    with instrumented() as session:
        _early_return_before_barrier[1, 8](out)
    problems = session.report().barrier_problems
    assert problems and "reached by only 6 of the 8" in str(problems[0])
