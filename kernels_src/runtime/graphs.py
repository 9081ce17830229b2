"""CUDA graphs over numba.cuda launches: a whole step captured once and replayed with one call.

A launch plan (:mod:`kernels_src.runtime.launch`) already skips numba's per-launch work, but it still makes
one driver call per kernel, each a few microseconds of host time, and the GPU waits whenever the host falls
behind. A CUDA graph records the step's kernels (grids, blocks, parameters, order) on the driver's side;
``cuGraphLaunch`` then submits all of them at once, and the GPU runs them back to back (about 1.3 µs apart
on the H100, GPU.md).

    runner = StepRunner(step, mode="auto")   # "eager", "plan" or "graph"; auto: graph where possible
    runner()                                  # first call: runs step() eagerly and records it
    runner()                                  # later calls: replay (the graph, or the plan)

Capture is done with the driver API of the pinned ``cuda-bindings`` (``cuStreamBeginCapture`` on a stream of
our own, the plan's launches, ``cuStreamEndCapture``, ``cuGraphInstantiate``). The stream is created with
default flags, so it is ordered with the legacy stream that numba's copies use: a host write before
``runner()`` and a read after it need no extra synchronisation.

A graph replays the *same* launches on the *same* buffers: every value that changes from one step to the
next (the token, the position, the cache length) must live in device memory that the step reads, and the
step must not allocate or copy. Where capture is impossible (no GPU, the CUDA simulator, no cuda-bindings),
``StepRunner`` runs the step eagerly and says so in one line (``runner.why``).
"""
from __future__ import annotations

import warnings

from . import launch as _plan


def available() -> tuple[bool, str]:
    """(True, "") when CUDA graphs can be captured here; else (False, why)."""
    if not _plan.AVAILABLE:
        return False, f"CUDA graphs {_plan.WHY}"
    try:
        from cuda.bindings import driver  # noqa: F401
    except ImportError as e:  # pragma: no cover
        return False, f"CUDA graphs need cuda-bindings ({e})"
    return True, ""


def _check(res, what):
    """cuda-bindings returns (err,) or (err, value): raise on an error, return the value."""
    from cuda.bindings import driver

    if res[0] != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {res[0]!r}")
    return res[1] if len(res) > 1 else None


def new_stream():
    """A stream with default flags (ordered with the legacy stream), as a CUstream."""
    from cuda.bindings import driver

    return _check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_DEFAULT.value), "cuStreamCreate")


def device_pointer(a) -> int:
    """The device address of a device array (anything with __cuda_array_interface__)."""
    return int(a.__cuda_array_interface__["data"][0])


class Pinned:
    """A page-locked host array: copies to and from it can run asynchronously and be captured in a graph
    (a copy from ordinary pageable memory cannot)."""

    def __init__(self, shape, dtype):
        import ctypes

        import numpy as np
        from cuda.bindings import driver

        dtype = np.dtype(dtype)
        n = int(np.prod(shape)) * dtype.itemsize
        self.ptr = _check(driver.cuMemHostAlloc(max(1, n), 0), "cuMemHostAlloc")
        buf = (ctypes.c_byte * max(1, n)).from_address(int(self.ptr))
        self.array = np.frombuffer(buf, dtype=np.uint8, count=n).view(dtype).reshape(shape)

    def __del__(self):  # pragma: no cover (GPU only)
        try:
            from cuda.bindings import driver

            driver.cuMemFreeHost(self.ptr)
        except Exception:
            pass


def copy_in(dev, host, stream):
    """host (pinned) -> dev, queued on stream."""
    from cuda.bindings import driver

    _check(driver.cuMemcpyHtoDAsync(device_pointer(dev), host.ctypes.data, host.nbytes, stream), "cuMemcpyHtoDAsync")


def copy_out(host, dev, stream):
    """dev -> host (pinned), queued on stream."""
    from cuda.bindings import driver

    _check(driver.cuMemcpyDtoHAsync(host.ctypes.data, device_pointer(dev), host.nbytes, stream), "cuMemcpyDtoHAsync")


class Graph:
    """An instantiated CUDA graph of a plan's launches. ``launch()`` replays it on its stream."""

    def __init__(self, plan: _plan.Plan, stream=None, before=None, after=None, updatable=()):
        """before(stream) / after(stream): extra work captured ahead of / after the plan's kernels
        (copies from and to pinned host buffers). updatable: indices of the plan's launches whose
        arguments may change from one replay to the next (``set_launch``); their graph nodes are kept."""
        from cuda.bindings import driver

        self.plan = plan
        self.stream = stream if stream is not None else new_stream()
        self.nodes: dict = {}
        self._node_params: dict = {}
        updatable = set(updatable)
        mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        _check(driver.cuStreamBeginCapture(self.stream, mode), "cuStreamBeginCapture")
        try:
            if before is not None:
                before(self.stream)
            for i, p in enumerate(plan.packed):
                p.launch(self.stream)
                if i in updatable:
                    self.nodes[i] = _last_node(self.stream)
            if after is not None:
                after(self.stream)
        finally:  # always leave capture mode, even when a launch failed
            graph = _check(driver.cuStreamEndCapture(self.stream), "cuStreamEndCapture")
        self.graph = graph
        self.exec = _check(driver.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        self.n_nodes = len(plan)

    def set_launch(self, i, packed):
        """Replace launch i's arguments (same kernel, grid and block) for the following replays: one
        ``cuGraphExecKernelNodeSetParams``, which copies the parameter values (a replay already queued keeps
        the old ones). This is how a value the host computes per step, such as AdamW's bias corrections from
        the step count and the learning rate, changes inside one graph that serves every step."""
        from cuda.bindings import driver

        if i not in self.nodes:
            raise KeyError(f"launch {i} was not captured as updatable")
        old = self.plan.packed[i]
        if packed.name != old.name or packed.griddim != old.griddim or packed.blockdim != old.blockdim:
            raise ValueError(f"launch {i}: {packed.name} {packed.griddim} does not match the captured "
                             f"{old.name} {old.griddim}")
        prm = self._node_params.get(i)
        if prm is None:  # the node's own parameters as captured (function, context, grid), read once
            res = driver.cuGraphKernelNodeGetParams(self.nodes[i])
            if res[0] == driver.CUresult.CUDA_SUCCESS:
                prm = res[1]
            else:  # pragma: no cover (older drivers): rebuild them from the launch
                prm = driver.CUDA_KERNEL_NODE_PARAMS()
                prm.func = packed.func
                prm.gridDimX, prm.gridDimY, prm.gridDimZ = packed.griddim
                prm.blockDimX, prm.blockDimY, prm.blockDimZ = packed.blockdim
                prm.sharedMemBytes = packed.sharedmem
            self._node_params[i] = prm
        prm.kernelParams = packed.params_address
        prm.extra = 0
        _check(driver.cuGraphExecKernelNodeSetParams(self.exec, self.nodes[i], prm),
               "cuGraphExecKernelNodeSetParams")
        self.plan.packed[i] = packed  # keeps the values alive; a plan replay uses them too

    def launch(self):
        from cuda.bindings import driver

        _check(driver.cuGraphLaunch(self.exec, self.stream), "cuGraphLaunch")

    def synchronize(self):
        from cuda.bindings import driver

        _check(driver.cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    def __del__(self):  # pragma: no cover (GPU only)
        try:
            from cuda.bindings import driver

            driver.cuGraphExecDestroy(self.exec)
            driver.cuGraphDestroy(self.graph)
        except Exception:
            pass


def _last_node(stream):
    """The graph node the last operation captured on ``stream`` became (the node the next one would depend
    on), from ``cuStreamGetCaptureInfo``; its result tuple differs between cuda-bindings 12 and 13, so the
    list of nodes is found by type."""
    from cuda.bindings import driver

    res = driver.cuStreamGetCaptureInfo(stream)
    if res[0] != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuStreamGetCaptureInfo failed: {res[0]!r}")
    for r in res[1:]:
        if isinstance(r, (list, tuple)) and len(r) == 1 and isinstance(r[0], driver.CUgraphNode):
            return r[0]
    raise RuntimeError(f"cuStreamGetCaptureInfo gave no single last node: {res!r}")


def capture(plan: _plan.Plan, stream=None, before=None, after=None, updatable=()) -> Graph:
    return Graph(plan, stream, before, after, updatable)


MODES = ("eager", "plan", "graph", "auto")


class StepRunner:
    """Runs ``step()`` eagerly the first time (recording its launches), then replays it.

    mode: "eager" (always the registered launchers), "plan" (packed launches), "graph" (one cuGraphLaunch),
    "auto" (graph where available, else eager, with the reason in ``self.why`` and one warning line).
    """

    def __init__(self, step, mode="auto", quiet=False, inputs=(), outputs=()):
        """inputs: [(device array, pinned host array)] copied in before each replay; outputs: [(pinned host
        array, device array)] copied out after it (both inside the graph). A replay then ends synchronised:
        the outputs are on the host when __call__ returns."""
        self.inputs, self.outputs = list(inputs), list(outputs)
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        self.step, self.requested = step, mode
        ok, why = available()
        self.why = ""
        if mode in ("plan", "graph", "auto") and not ok:
            if mode != "auto":
                raise RuntimeError(f"mode={mode!r}: {why}")
            self.why = why
            if not quiet:
                warnings.warn(f"{why}; running the step eagerly", RuntimeWarning, stacklevel=2)
            mode = "eager"
        self.mode = "graph" if mode == "auto" else mode
        self.plan: _plan.Plan | None = None
        self.graph: Graph | None = None

    def __call__(self):
        if self.mode == "eager":
            return self.step()
        if self.plan is None:
            self.plan, out = _plan.Plan.record(self.step)
            if self.mode == "graph":
                self.graph = capture(self.plan, before=self._copy_in, after=self._copy_out)
            return out
        if self.graph is not None:
            self.graph.launch()
            if self.outputs:
                self.graph.synchronize()
        else:
            from cuda.bindings import driver

            s = driver.CUstream(0)
            self._copy_in(s)
            self.plan.run(s)
            self._copy_out(s)
            if self.outputs:
                _check(driver.cuStreamSynchronize(s), "cuStreamSynchronize")
        return None

    def _copy_in(self, stream):
        for dev, host in self.inputs:
            copy_in(dev, host, stream)

    def _copy_out(self, stream):
        for host, dev in self.outputs:
            copy_out(host, dev, stream)

    def describe(self) -> str:
        if self.mode == "eager":
            return "eager" + (f" ({self.why})" if self.why else "")
        n = len(self.plan) if self.plan is not None else "?"
        return f"{self.mode} of {n} launches"
