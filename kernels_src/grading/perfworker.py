"""The sandboxed side of a speed question (``mode: perf`` of :mod:`.worker`): run the student's rebuilt function
when the grader says so, and nothing else.

The grader (:mod:`.perf`) owns the clock, the inputs, the references and the statistics. This process only:

1. rebuilds the graded function from its ``def`` text (:func:`kernelpack.build`: no other statement of the
   notebook runs here, so nothing the notebook did while loading, such as patching ``time`` or starting a
   thread, exists in this process), then says ``R`` (ready) on its control pipe;
2. receives, once it is ready, a shared-memory region from the grader (a ``memfd`` passed over a Unix socket:
   it did not exist while this process started, and nothing but the grader's arrays is ever in it);
3. for each run: reads a small header from stdin (where the run's fresh inputs and poisoned outputs lie in the
   region, the scalar inputs' values, a pad), copies them into *fresh* arrays (after a pad of the size the grader
   chose, so no two runs see the same addresses; a GPU answer: fresh device arrays), flushes the caches
   (a sweep of a buffer larger than the last-level cache on a CPU, of twice the L2 on a GPU), says ``A``
   (armed), waits for ``G`` (go), calls the function (a GPU answer: the recorded launches, replayed), waits
   for the device to finish everything it was given (``cuda.synchronize()``: every stream of the context),
   says ``D`` (done), then copies the outputs into the region and says ``O`` for the grader to check them.

The student's function only ever sees the fresh copies, never the region; and the grader writes the next run's
inputs into the region only after this run's ``D`` and ``O``, when nothing of the student's runs any more.

The grader starts its clock when it writes ``G`` and stops it when it reads ``D``; the student's compiled code
cannot write to either pipe, so it can neither see nor move the clock.
"""
from __future__ import annotations

import json
import os
import struct
import sys
import time

_HDR = struct.Struct("<cQ")
_SWEEP = """
def _sweep(buf, v, out):
    i = cuda.grid(1)
    if i < buf.size and buf[i] == v:  # never true (buf holds zeros, v < 0): the reads cannot be dropped
        out[0] = v


def _spin(n):  # one thread asleep for about n microseconds: the launches queued next wait behind it
    for _ in range(n):
        cuda.nanosleep(1000)
"""


def _recv(f) -> tuple[bytes, bytes]:
    head = f.read(_HDR.size)
    if len(head) < _HDR.size:
        return b"Q", b""
    tag, n = _HDR.unpack(head)
    data = f.read(n) if n else b""
    return tag, data


def _send(fd: int, tag: bytes, data: bytes = b"") -> None:
    msg = _HDR.pack(tag, len(data)) + data
    view = memoryview(msg)
    while view:
        k = os.write(fd, view)
        view = view[k:]


def _receive_region(sock_fd: int):
    """The grader's shared-memory region (a memfd, passed over the socket once this process said ready), mapped."""
    import mmap
    import socket

    sock = socket.socket(fileno=sock_fd)
    try:
        msg, fds, _, _ = socket.recv_fds(sock, 16, 1)
    finally:
        sock.close()
    if msg != b"M" or not fds:
        return None
    try:
        return mmap.mmap(fds[0], os.fstat(fds[0]).st_size)
    finally:
        os.close(fds[0])


def _view(region, lay):
    """An array in the shared region: ``lay`` is [offset, shape, dtype]."""
    import numpy as np

    off, shape, dt = lay
    return np.ndarray(tuple(shape), np.dtype(dt), buffer=region, offset=int(off))


def perf_job(job, where, result) -> None:
    import numpy as np

    from .. import device
    from . import kernelpack
    from .worker import _exc_info, _progress, compiled_problems, precompile

    ctl = int(job["ctl_fd"])
    _progress("rebuilding your functions from their source")
    made = kernelpack.build(os.path.abspath("submission.py"), job["pack"])
    plan_arrays = {}
    if os.path.exists("plan.npz"):
        with np.load("plan.npz", allow_pickle=False) as z:
            plan_arrays = {k: z[k] for k in z.files}
    backend = job["backend"]
    fn = made.get(job["function"]) if backend == "cpu" else None
    gpu = backend == "gpu"  # a real GPU, or (the harness's own tests) the simulator
    cuda = device.cuda if backend == "gpu" else None
    if gpu:
        flush_buf = cuda.device_array(max(int(job.get("flush_bytes", 256 << 20)), 1024) // 4, dtype=np.float32)
        flush_out = cuda.device_array(1, dtype=np.float32)

        glb = {"cuda": cuda}  # a global, not a closure: the simulator swaps a kernel's global `cuda`
        exec(_SWEEP, glb)
        _sweep = cuda.jit(glb["_sweep"])
        # a real GPU: the runs' device time from CUDA events around the replayed launches (the start event
        # recorded behind a spinning kernel, so the host's time to queue the launches is not counted)
        events = not device.SIMULATED
        if events:
            _spin = cuda.jit(glb["_spin"])
            _spin[1, 1](1)
            ev0, ev1 = cuda.event(), cuda.event()
        _sweep[device.ceil_div(flush_buf.size, 256), 256](flush_buf, np.float32(-1.0), flush_out)
        cuda.synchronize()
    else:
        flush_cpu = np.zeros(int(job.get("flush_bytes", 64 << 20)) // 8)
    stdin = sys.stdin.buffer
    _send(ctl, b"R")
    region = _receive_region(int(job["shm_sock"]))
    checked = False
    host_us = 200.0  # the host's time to queue the replay, from the previous run
    cache: dict = {}
    alive: list = []  # the previous run's arrays stay allocated while the next ones are made: fresh addresses
    n = 0
    while True:
        tag, data = _recv(stdin)
        if tag == b"Q":
            break
        if tag == b"P":  # a ping: the cost of the round trip, which the grader subtracts
            _send(ctl, b"D")
            continue
        if tag != b"I" or region is None:
            break
        head = json.loads(data)
        del data
        pad = np.empty(int(head["pad"]), dtype=np.uint8)  # moves every allocation that follows
        shared_in = [None if sc is not None else _view(region, lay) for lay, sc in zip(head["inputs"], head["scalars"])]
        shared_out = [_view(region, lay) for lay in head["outputs"]]
        scalars = [None if sc is None else np.dtype(sc["dtype"]).type(sc["value"]) for sc in head["scalars"]]
        ins, outs = [], []
        if gpu:
            d_pad = cuda.device_array(int(head["pad"]) + 1, dtype=np.uint8)
            d_in = [cuda.to_device(a) if a is not None else sc for a, sc in zip(shared_in, scalars)]
            d_out = [cuda.to_device(o) for o in shared_out]  # the poison, written by the grader
            real = {("out", k): d for k, d in enumerate(d_out)}
            real.update({("in", k): d for k, d in enumerate(d_in) if hasattr(d, "copy_to_host")})
            real.update({("scalar", k): sc for k, sc in enumerate(scalars) if sc is not None})
            _sweep[device.ceil_div(flush_buf.size, 256), 256](flush_buf, np.float32(-1.0 - n), flush_out)
            cuda.synchronize()
            alive = [d_pad, d_in, d_out]
        else:
            for a, sc in zip(shared_in, scalars):
                if a is None:
                    ins.append(sc)
                else:
                    fresh = np.empty_like(a)
                    fresh[...] = a
                    ins.append(fresh)
            for o in shared_out:
                fresh = np.empty_like(o)
                fresh[...] = o  # the poison, written by the grader
                outs.append(fresh)
        err = None
        if backend == "cpu" and not checked:
            try:
                precompile(fn, outs + ins)
                bad = compiled_problems(fn, job.get("allow", ()))
            except BaseException as e:  # noqa: BLE001
                bad = None
                err = _exc_info(e, where)
            if bad:
                _send(ctl, b"E", json.dumps({"type": "Shortcut", "message": "; ".join(bad)}).encode())
                break
            checked = True
        if err is not None:
            _send(ctl, b"E", json.dumps(err).encode())
            break
        if not gpu:
            flush_cpu += 1.0  # evicts the inputs that were just written from every cache level
            alive = [pad, ins, outs]
        n += 1
        _progress(f"timed run {n}")
        _send(ctl, b"A")
        tag, _ = _recv(stdin)
        if tag != b"G":
            break
        timing = {}
        try:
            if gpu:
                if events:
                    _spin[1, 1](int(min(1.5 * host_us + 50, 50_000)))
                    ev0.record()
                h0 = time.perf_counter()
                _replay_gpu(made, job["plan"], real, plan_arrays, cache)
                host_us = (time.perf_counter() - h0) * 1e6
                if events:
                    ev1.record()
                cuda.synchronize()  # every stream of the context: work left running counts, or fails
                if events:
                    timing["device_s"] = cuda.event_elapsed_time(ev0, ev1) / 1e3
                timing["queue_s"] = host_us / 1e6
            else:
                fn(*outs, *ins)
            _send(ctl, b"D", json.dumps(timing).encode())
        except BaseException as e:  # noqa: BLE001
            info = _exc_info(e, where)
            _send(ctl, b"E", json.dumps(info).encode())
            break
        for k, dst in enumerate(shared_out):
            if gpu:
                d_out[k].copy_to_host(dst)
            else:
                dst[...] = outs[k]
        del shared_in, shared_out
        _send(ctl, b"O")
    del alive
    result["runs"] = n


def _replay_gpu(made, plan, real, plan_arrays, cache) -> None:
    """The recorded launches on a real GPU, on this run's fresh device arrays, through the exec run's own builder
    (:func:`.replay.replay_launches`): arrays the launcher made (scratch, given constants) copied to the device
    once (again when the host changed them between launches), scalar inputs with this run's fresh values, no views.
    Host writes to the device arrays go through a host copy."""
    from .. import device
    from .replay import host_writes, replay_launches, write_flat

    def apply_writes(writes):
        for d, idx, val in host_writes(writes, real, plan_arrays):
            h = d.copy_to_host()
            write_flat(h.reshape(-1), idx, val)
            d.copy_to_device(h)

    replay_launches(made, plan, real, plan_arrays, cache, device.cuda.to_device, apply_writes, scalars=real,
                    views=False)
