"""The course's all-reduce across real GPUs: one process per GPU, the peers' buffers opened through CUDA IPC and
read over NVLink, two kernels (the ring, and a one-shot for small messages), and the launcher that starts the
ranks.

**The launcher.** :func:`launch` starts ``nranks`` processes (``multiprocessing``, "spawn": a fresh interpreter
each, since a CUDA context does not survive a fork), gives each the environment :func:`kernels_src.dist.env.rank_env`
builds (NVLink multicast off, whatever the caller's environment says), runs ``fn(host, *args)`` in each and
returns the results in rank order. ``host`` (:class:`Host`) is the ranks' host-side channel through the parent:
``host.exchange(obj)`` hands every rank the list of all ranks' objects (how the IPC handles travel) and
``host.barrier()``. A rank that raises, dies or does not answer within ``timeout`` seconds ends the launch with
:class:`GpuLaunchError` naming the rank (its traceback, its exit code, or the timeout); the other ranks are
killed, never left spinning.

**The buffers.** :class:`GpuComm` (built inside a rank) selects GPU ``rank``, allocates its *registered*
buffer (``capacity`` float32 elements) and its flag words, exports them with numba's ``get_ipc_handle()``,
exchanges the handles and opens the peers' (``IpcArrayHandle.open()``: with peer access between the two GPUs,
which NVLink gives, the peer's memory is mapped into this process and a kernel reads it directly; the probe on
the two-H200 machine found this works across devices, so the course needs no driver calls for IPC). A kernel
here gets the ranks' buffers as a tuple of device arrays, its own among them. The all-reduce works in place on
the registered buffer (``comm.buffer(n)``); :meth:`GpuComm.all_reduce` on any other device array copies it in
and out (two local copies, which a framework avoids by registering its gradient buckets).

**The ring** (:func:`ring_kernel`) follows :func:`kernels_src.dist.schedule.ring_steps`: ``2 (n - 1)`` steps, at
step ``t`` rank ``r`` reads chunk ``recv`` of its left neighbour's buffer over NVLink and adds it into (or, in
the all-gather phase, copies it over) its own chunk. The rank *pulls*: the schedule's "r - 1 sends chunk c to r"
is "r reads chunk c from r - 1". A read needs promises from the neighbours, kept with flag words:

- *arrival*: before its first step, rank ``r`` reads its left neighbour's *input*; so every rank first announces
  "arrived" (the kernel has started, so whatever its stream wrote into the buffer before it, a copy or a fill, is
  done), and rank ``r`` waits for its left neighbour's arrival. (The first two-GPU run had no arrival flag: a rank
  whose neighbour was still copying its input in read the old contents, and the ring failed its check at some
  lengths. The simulator cannot see such a race, since it runs the virtual ranks one after another.)
- *read after write*: before step ``t`` the left neighbour has finished its steps ``0 .. t - 1`` (the chunk
  it holds is the partial sum the schedule says);
- *write after read*: before rank ``r`` overwrites a chunk, its right neighbour (the only rank that reads ``r``'s
  buffer) has finished the step in which it read that chunk: in the all-gather step ``s`` rank ``r`` overwrites
  chunk ``(r - s) % n``, which the right neighbour read in reduce-scatter step ``s``; at the start of a call, the
  right neighbour must have finished the previous call. At the end of a call rank ``r`` waits until its right
  neighbour has finished reading, so that when the kernel ends on ``r``'s stream, nobody reads ``r``'s buffer
  and the caller may write into it.

Every block keeps its own flags: block ``b`` handles the same slice of every chunk on every rank (the mapping
depends only on the chunk, its block and thread), so block ``b`` of rank ``r`` waits only for block ``b`` of
its neighbours. Slices of different blocks pipeline freely: a block that finished its reduce-scatter slice
starts its all-gather slice while others still add, which keeps both directions of the link busy without a
separate chunking loop. The grid is at most two blocks per SM, so all blocks are resident at once and a
spinning block can never keep a block it waits for (on the other GPU) from being scheduled.

**The one-shot** (:func:`oneshot_kernel`): each rank copies its input into its registered one-shot buffer,
announces it, waits until every peer has announced, and sums all ``n`` buffers (rank order ``0 .. n-1``, the
same order on every rank, so all ranks get bit-identical results) into its output. One kernel, one flag round,
one trip over the link: the latency floor for small messages, at the price of reading ``(n - 1)`` times the
message per rank (the ring reads ``2 (n - 1) / n``). The buffer has two slots, used by alternate calls: a rank
overwrites a slot two calls later, when every peer has provably finished reading it (the kernel's docstring
says why), so no "done reading" flag and no wait at the start are needed.

**Flags, fences, epochs.** A rank announces by *storing into the peer's memory* (``flag_store`` on the peer's
flag array: a posted write over NVLink) and waits by *spinning on its own memory* (``flag_load`` on its local
array: no round trip over the link per poll). Both are strong at system scope (:mod:`kernels_src.compiler.sysflags`).
The two fences make the flag mean something:

- the writer: the block's data writes, ``syncthreads``, then thread 0 issues ``cuda.threadfence_system()``
  (``fence.sc.sys``) and stores the flag. Without the fence the flag (one store) could reach the peer before the
  data (many stores to other addresses, possibly still in flight through L2), and the peer would read old data.
  One fence by thread 0 covers the whole block: ``bar.sync`` orders the other threads' writes before it and the
  fence is cumulative (the pattern of cooperative groups' grid barrier);
- the reader: thread 0 spins until the flag has the value, then ``cuda.threadfence_system()``, then
  ``syncthreads`` releases the block to read. Without the fence the block's reads of the peer's data could be
  served before the flag read (a load may be reordered before an earlier load to another address) or from a
  line cached before the peer wrote it.

The flag values never go back: in call ``e`` block ``b`` of the ring waits for ``e (T + 1) + 1 + t`` (``T = 2 (n - 1)``
steps, plus the arrival), where ``e`` is that block's count of finished calls (``epochs[b]``, advanced by the
kernel itself); the one-shot waits for ``e + 1``, ``e`` the call count (``epoch[0]``, advanced by the last block
to finish). So the buffers and flags are reused call after call with no
reset, and a launch captured in a CUDA graph stays valid on replay (a kernel argument would be frozen in the
graph; device memory is not).

A block that spins longer than ``spin_limit`` polls gives up: it writes what it waited for into
``status`` (the host raises ``GpuLaunchError`` naming the rank it waited for) and the kernel ends, rather than
hanging the process.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
import traceback
from multiprocessing.connection import wait as _wait

import numpy as np

from ..compiler import cuda, flag_load, flag_store, float32, int32, int64, load4, store4  # noqa: F401
from .env import rank_env, stop_processes

BLOCK = 512          # threads per block of both all-reduce kernels
MAX_BLOCKS = 1024    # flag slots per rank (the grid never has more blocks than this)
SPIN_LIMIT = 1 << 26  # polls of one flag before a block gives up (tens of seconds on an H100)
WAIT_TIMEOUT, WAIT_PEER, WAIT_STEP, WAIT_EPOCH = 0, 1, 2, 3  # fields of status[]


class GpuLaunchError(RuntimeError):
    """A rank of a multi-GPU launch failed, died, or did not answer in time; ``.rank`` says which."""

    def __init__(self, rank, message):
        super().__init__(f"rank {rank}: {message}")
        self.rank = rank


# ================================================================================================== kernels
@cuda.jit(device=True, inline=True)
def _bounds(length, n, c):
    """chunk_bounds(length, n, c) on the device (schedule.chunk_bounds is the definition)."""
    q = length // n
    extra = length - q * n
    lo = c * q + min(c, extra)
    hi = lo + q
    if c < extra:
        hi += 1
    return lo, hi


@cuda.jit(device=True, inline=True)
def _wait_geq(flags, idx, want, spin_limit, status, peer, step, epoch):
    """Spin until flags[idx] >= want (one thread). Returns False after spin_limit polls (status filled)."""
    k = 0
    while flag_load(flags, idx) < want:
        k += 1
        if k > spin_limit:
            status[WAIT_TIMEOUT] = 1
            status[WAIT_PEER] = peer
            status[WAIT_STEP] = step
            status[WAIT_EPOCH] = epoch
            return False
    return True


@cuda.jit(device=True, inline=True)
def _chunk_op(mine, src, lo, hi, add, b, nb, tid):
    """mine[lo:hi] (+)= src[lo:hi] for block b of nb: 16-byte loads over the aligned middle, the <= 3 elements
    before and after it by block 0. The elements a thread handles depend only on (lo, hi, b, tid)."""
    lo4 = (lo + 3) // 4
    hi4 = hi // 4
    if lo4 >= hi4:  # too short to hold an aligned group of four: elementwise, block 0
        if b == 0:
            i = lo + tid
            while i < hi:
                if add:
                    mine[i] = mine[i] + src[i]
                else:
                    mine[i] = src[i]
                i += cuda.blockDim.x
        return
    if b == 0:
        i = lo + tid
        if i < 4 * lo4:
            if add:
                mine[i] = mine[i] + src[i]
            else:
                mine[i] = src[i]
        j = 4 * hi4 + tid
        if j < hi:
            if add:
                mine[j] = mine[j] + src[j]
            else:
                mine[j] = src[j]
    g = lo4 + b * cuda.blockDim.x + tid
    stride = nb * cuda.blockDim.x
    while g < hi4:
        s0, s1, s2, s3 = load4(src, g)
        if add:
            m0, m1, m2, m3 = load4(mine, g)
            store4(mine, g, m0 + s0, m1 + s1, m2 + s2, m3 + s3)
        else:
            store4(mine, g, s0, s1, s2, s3)
        g += stride


@cuda.jit
def ring_kernel(bufs, flags, length, rank, nranks, epochs, status, spin_limit, u0, u1):
    """In-place ring all-reduce (sum) of ``bufs[rank][:length]``; ``bufs``/``flags``: every rank's buffer and flag
    array (tuples, this rank's at index ``rank``). ``flags[r][b]`` is the progress of ``r``'s left neighbour's block
    ``b``, ``flags[r][MAX_BLOCKS + b]`` that of its right neighbour. See the module docstring for why each wait and
    fence is there.

    A call has ``T + 2`` parts (``T = 2 (n - 1)`` schedule steps): part 0 announces "arrived" (this rank's input is
    in its buffer: whatever the stream did before the kernel is done), parts ``1 .. T`` are the schedule's steps
    ``t = part - 1``, part ``T + 1`` is the final wait for the right neighbour and advances the epoch. Each block's
    progress counter goes up by ``T + 1`` per call: ``base + 1`` arrived, ``base + 2 + t`` step t done. The kernel
    runs parts ``u0 .. u1 - 1``; a call is one launch with ``(0, T + 2)``; the CUDA simulator, which runs one
    kernel at a time, runs the virtual ranks part by part instead, with the same code."""
    b = cuda.blockIdx.x
    nb = cuda.gridDim.x
    tid = cuda.threadIdx.x
    n = nranks
    left = (rank + n - 1) % n
    right = (rank + 1) % n
    mine = bufs[rank]
    src = bufs[left]
    myflags = flags[rank]
    ok = cuda.shared.array(1, int32)
    T = 2 * (n - 1)
    e = epochs[b]
    base = e * (T + 1)
    if u0 == 0 and tid == 0 and n > 1:
        # arrived: the input was written by earlier work on this stream (finished before the kernel began); the
        # fence orders those writes before the flag for the neighbours that read it
        cuda.threadfence_system()
        flag_store(flags[right], b, base + 1)
        flag_store(flags[left], MAX_BLOCKS + b, base + 1)
    for u in range(max(u0, 1), min(u1, T + 1)):
        t = u - 1
        if t < n - 1:  # reduce-scatter step t: add chunk (r - t - 1) of the left neighbour
            recv = (rank - t - 1 + 2 * n) % n
            add = True
            need_right = base  # the right neighbour has finished the previous call (read all it needed of mine)
        else:  # all-gather step s: copy chunk (r - s), which the right neighbour read in reduce-scatter step s
            s = t - (n - 1)
            recv = (rank - s + 2 * n) % n
            add = False
            need_right = base + 2 + s
        if tid == 0:
            # read after write: the left neighbour has arrived (t = 0) or finished step t - 1
            good = _wait_geq(myflags, b, base + 1 + t, spin_limit, status, left, t, e)
            if good:  # write after read
                good = _wait_geq(myflags, MAX_BLOCKS + b, need_right, spin_limit, status, right, t, e)
            cuda.threadfence_system()  # acquire: no read of the peer's chunk moves before the flag read
            ok[0] = 1 if good else 0
        cuda.syncthreads()
        if ok[0] == 0:
            return
        lo, hi = _bounds(length, n, recv)
        _chunk_op(mine, src, lo, hi, add, b, nb, tid)
        cuda.syncthreads()  # the block's writes happen before thread 0's fence (bar.sync, then a cumulative fence)
        if tid == 0:
            cuda.threadfence_system()  # release: the block's writes reach memory before the flag is stored
            flag_store(flags[right], b, base + 2 + t)  # to the right neighbour: "my step t is done"
            flag_store(flags[left], MAX_BLOCKS + b, base + 2 + t)  # to the left neighbour: the same
    if u1 > T + 1 and tid == 0:  # leave only when the right neighbour has finished reading this buffer
        if n == 1 or _wait_geq(myflags, MAX_BLOCKS + b, base + 1 + T, spin_limit, status, right, T, e):
            epochs[b] = e + 1


@cuda.jit
def oneshot_kernel(x, bufs, slot, flags, length, rank, nranks, epoch, status, spin_limit, p0, p1):
    """One-shot all-reduce (sum): ``x[:length]`` (this rank's input, any device array) becomes the sum over ranks
    of their inputs. ``bufs`` (tuple, every rank's) are the registered one-shot buffers, two slots of ``slot``
    elements each: call ``e`` uses slot ``e % 2``. ``flags[r][p * MAX_BLOCKS + b] = e + 1`` says that rank ``p``'s block
    ``b`` has put its part of call ``e``'s input in its slot. ``epoch[0]`` counts the calls (``epoch[1]``: blocks of
    this call that have finished; the last one advances ``epoch[0]``).

    Why two slots and no "done reading" flag: a rank overwrites slot ``e % 2`` at call ``e + 2``; by then it has
    finished call ``e + 1``, which needed every peer's call-``e + 1`` flag, and a peer starts call ``e + 1`` only after
    its call ``e`` (the one that read the slot) has ended on its stream. So the slot is free, with no extra wait.
    Phase 0: copy x into my slot, announce. Phase 1: wait for the peers, sum, count the block out. A call is one
    launch of phases ``p0 .. p1 - 1 = 0 .. 1``; the simulator runs the virtual ranks phase by phase."""
    b = cuda.blockIdx.x
    nb = cuda.gridDim.x
    tid = cuda.threadIdx.x
    n = nranks
    mine = bufs[rank]
    myflags = flags[rank]
    ok = cuda.shared.array(1, int32)
    e = epoch[0]
    off = (e % 2) * slot
    stride = nb * cuda.blockDim.x
    if p0 == 0:
        i = b * cuda.blockDim.x + tid
        while i < length:
            mine[off + i] = x[i]
            i += stride
        cuda.syncthreads()  # the block's copies happen before thread 0's fence
        if tid == 0:
            cuda.threadfence_system()  # release: the copies reach memory before any peer sees the flag
            for p in range(n):
                if p != rank:
                    flag_store(flags[p], rank * MAX_BLOCKS + b, e + 1)
    if p1 < 2:
        return
    if tid == 0:
        good = True
        for p in range(n):
            if p != rank and good:
                good = _wait_geq(myflags, p * MAX_BLOCKS + b, e + 1, spin_limit, status, p, 1, e)
        cuda.threadfence_system()  # acquire: no read of a peer's slot moves before its flag
        ok[0] = 1 if good else 0
    cuda.syncthreads()
    if ok[0] == 0:
        return
    # the sum, in rank order 0..n-1 on every rank (the same bits everywhere)
    i = b * cuda.blockDim.x + tid
    while i < length:
        acc = bufs[0][off + i]
        for p in range(1, n):
            acc += bufs[p][off + i]
        x[i] = acc
        i += stride
    cuda.syncthreads()
    if tid == 0:
        if cuda.atomic.add(epoch, 1, 1) == nb - 1:  # the last block of this call to finish
            epoch[1] = 0
            epoch[0] = e + 1


@cuda.jit
def fill_kernel(x, length, rank):
    """x[i] = the course's test value of element i on rank ``rank`` (see :func:`test_values`)."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < length:
        h = (int64(i) * int64(2654435761) + int64(rank + 1) * int64(40503)) & int64(0xFFFFFFFF)
        x[i] = float32((h >> 7) & 4095) / float32(2048.0) - float32(1.0)
        i += stride


def test_values(idx, rank) -> np.ndarray:
    """The value ``fill_kernel`` writes at indices ``idx`` on ``rank``, in NumPy (float32): multiples of 1/2048 in
    [-1, 1), a multiplicative hash of the index, so every rank's input differs and any size can be checked
    without copying the inputs around."""
    i = np.asarray(idx, dtype=np.uint64)
    h = (i * np.uint64(2654435761) + np.uint64((rank + 1) * 40503)) & np.uint64(0xFFFFFFFF)
    return (((h >> np.uint64(7)) & np.uint64(4095)).astype(np.float32) / np.float32(2048.0)
            - np.float32(1.0)).astype(np.float32)


def ptx_kernels(nranks: int = 2):
    """Every kernel of this module with its signature for the PTX check."""
    arr = "float32[::1]"
    flg = "int32[::1]"
    tup = f"UniTuple({arr}, {nranks})"
    ftup = f"UniTuple({flg}, {nranks})"
    return [
        (ring_kernel, f"void({tup}, {ftup}, int64, int64, int64, {flg}, {flg}, int64, int64, int64)"),
        (oneshot_kernel, f"void({arr}, {tup}, int64, {ftup}, int64, int64, int64, {flg}, {flg}, int64, int64, "
                         "int64)"),
        (fill_kernel, f"void({arr}, int64, int64)"),
    ]


def grid_for(length: int, nranks: int, sms: int, algorithm: str) -> int:
    """Blocks for one call: enough for the work, at most two per SM (all resident) and MAX_BLOCKS."""
    per_block = BLOCK * 4 if algorithm == "ring" else BLOCK  # the ring moves 4 elements per thread per loop
    work = -(-length // nranks) if algorithm == "ring" else length
    return int(max(1, min(2 * sms, MAX_BLOCKS, -(-work // per_block))))


def stream_handle(stream) -> int:
    """The CUstream handle of a numba stream as an integer (0: the legacy default stream)."""
    if stream is None or isinstance(stream, int):
        return int(stream or 0)
    h = stream.handle
    if hasattr(h, "value"):  # a ctypes pointer
        return int(h.value or 0)
    return int(h)  # a cuda-bindings CUstream


# ================================================================================================ launcher
class Host:
    """A rank's host-side channel to the others, through the launching process."""

    def __init__(self, rank, size, conn):
        self.rank, self.size, self._conn, self._seq = rank, size, conn, 0

    def exchange(self, obj):
        """Every rank's ``obj`` (picklable), as a list in rank order; every rank must call it."""
        self._seq += 1
        self._conn.send(("x", self._seq, obj))
        tag, seq, objs = self._conn.recv()
        assert tag == "x" and seq == self._seq, (tag, seq, self._seq)
        return objs

    def barrier(self):
        self.exchange(None)


def _child(rank, nranks, env, conn, fn, args):
    os.environ.clear()
    os.environ.update(env)  # before anything reads it (NCCL, torch, numba read theirs at first use)
    try:
        out = fn(Host(rank, nranks, conn), *args)
        conn.send(("ok", rank, out))
    except BaseException:  # noqa: BLE001  (the parent reports it, naming the rank)
        conn.send(("err", rank, traceback.format_exc()))
    finally:
        conn.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for_ranks(nranks: int, port: int | None = None, base=None) -> list[dict]:
    """The environment each rank of a launch gets (``rank_env``: the rendezvous variables and SAFE_ENV)."""
    port = free_port() if port is None else port
    return [rank_env(r, nranks, port, base) for r in range(nranks)]


def launch(fn, nranks: int, *args, timeout: float = 300.0, port: int | None = None) -> list:
    """Run ``fn(host, *args)`` in ``nranks`` fresh processes (``fn`` module-level); their results in rank order.

    Raises :class:`GpuLaunchError` naming the rank when one raises (its traceback), exits without answering (its
    exit code) or when the launch is not done within ``timeout`` seconds (the ranks still running); the
    children are then terminated, so nothing keeps spinning on a GPU."""
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks}")
    ctx = mp.get_context("spawn")
    envs = env_for_ranks(nranks, port)
    pipes = [ctx.Pipe() for _ in range(nranks)]
    procs = [ctx.Process(target=_child, args=(r, nranks, envs[r], pipes[r][1], fn, args), daemon=True)
             for r in range(nranks)]
    results, done = [None] * nranks, [False] * nranks
    pending: dict = {}
    try:
        for p in procs:
            p.start()
        for _, child_end in pipes:
            child_end.close()
        conns = {pipes[r][0]: r for r in range(nranks)}
        sentinels = {procs[r].sentinel: r for r in range(nranks)}
        deadline = time.monotonic() + timeout
        while not all(done):
            left = deadline - time.monotonic()
            if left <= 0:
                late = [r for r in range(nranks) if not done[r]]
                raise GpuLaunchError(late[0], f"did not answer within {timeout:g} s "
                                              f"(ranks still running: {late})")
            ready = _wait(list(conns) + list(sentinels), timeout=left)
            for obj in ready:
                if obj in conns:
                    r = conns[obj]
                    try:
                        msg = obj.recv()
                    except EOFError:
                        del conns[obj]
                        continue
                    if msg[0] == "ok":
                        results[r], done[r] = msg[2], True
                    elif msg[0] == "err":
                        raise GpuLaunchError(r, f"raised:\n{msg[2]}")
                    elif msg[0] == "x":
                        pending.setdefault(msg[1], {})[r] = msg[2]
                        if len(pending[msg[1]]) == nranks:
                            objs = [pending[msg[1]][q] for q in range(nranks)]
                            for c, q in conns.items():
                                c.send(("x", msg[1], objs))
                            del pending[msg[1]]
                elif obj in sentinels:
                    r = sentinels.pop(obj)
                    procs[r].join(0.5)
                    c = pipes[r][0]
                    while not done[r] and c in conns and c.poll(0.5):  # its last words may still be queued
                        try:
                            msg = c.recv()
                        except EOFError:
                            break
                        if msg[0] == "ok":
                            results[r], done[r] = msg[2], True
                        elif msg[0] == "err":
                            raise GpuLaunchError(r, f"raised:\n{msg[2]}")
                    if not done[r]:
                        raise GpuLaunchError(r, f"died with exit code {procs[r].exitcode} before answering")
        for p in procs:
            p.join(30)
        return results
    finally:
        stop_processes(procs, 5.0)


# ================================================================================================ the comm
class GpuComm:
    """This rank's view of the GPUs: its registered buffer, the peers' (opened through CUDA IPC), the flags."""

    def __init__(self, host: Host, capacity: int, device: int | None = None, spin_limit: int = SPIN_LIMIT):
        self.host, self.rank, self.size = host, host.rank, host.size
        ngpu = len(cuda.gpus)
        cuda.select_device(self.rank % ngpu if device is None else device)
        self.capacity = int(max(capacity, 4))
        self.spin_limit = int(spin_limit)
        self.sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
        self.buf = cuda.device_array(self.capacity, np.float32)
        self.osbuf = cuda.device_array(2 * self.capacity, np.float32)  # the one-shot's two slots
        self.ring_flags = cuda.to_device(np.zeros(2 * MAX_BLOCKS, np.int32))
        self.os_flags = cuda.to_device(np.zeros(self.size * MAX_BLOCKS, np.int32))
        self.ring_epochs = cuda.to_device(np.zeros(MAX_BLOCKS, np.int32))
        self.os_epoch = cuda.to_device(np.zeros(2, np.int32))
        self.status = cuda.to_device(np.zeros(4, np.int32))
        cuda.synchronize()  # zeros in place before any peer can see the handles
        mine = (self.buf.get_ipc_handle(), self.ring_flags.get_ipc_handle(), self.os_flags.get_ipc_handle(),
                self.osbuf.get_ipc_handle())
        handles = host.exchange(mine)
        self._opened = []
        bufs, rflags, oflags, osbufs = [], [], [], []
        for r, hs in enumerate(handles):
            if r == self.rank:
                bufs.append(self.buf), rflags.append(self.ring_flags), oflags.append(self.os_flags)
                osbufs.append(self.osbuf)
                continue
            opened = [h.open() for h in hs]
            self._opened.append(hs)
            bufs.append(opened[0]), rflags.append(opened[1]), oflags.append(opened[2]), osbufs.append(opened[3])
        self.bufs, self.rflags, self.oflags, self.osbufs = tuple(bufs), tuple(rflags), tuple(oflags), tuple(osbufs)
        host.barrier()

    def buffer(self, length: int):
        """The first ``length`` elements of the registered buffer: all-reduce it in place with no copy."""
        if length > self.capacity:
            raise ValueError(f"{length} elements do not fit the registered buffer ({self.capacity})")
        return self.buf[:length]

    def _launch_ring(self, length, stream=0):
        g = grid_for(length, self.size, self.sms, "ring")
        ring_kernel[g, BLOCK, stream](self.bufs, self.rflags, length, self.rank, self.size, self.ring_epochs,
                                       self.status, self.spin_limit, 0, 2 * self.size)

    def _launch_oneshot(self, x, length, stream=0):
        if length > self.capacity:
            raise ValueError(f"{length} elements do not fit the registered buffer ({self.capacity})")
        g = grid_for(length, self.size, self.sms, "oneshot")
        oneshot_kernel[g, BLOCK, stream](x, self.osbufs, self.capacity, self.oflags, length, self.rank, self.size,
                                          self.os_epoch, self.status, self.spin_limit, 0, 2)

    def all_reduce(self, x, algorithm: str = "ring", stream=0):
        """Sum ``x`` (a 1-D float32 device array) over the ranks, in place; returns x. Every rank must call it
        with the same length and algorithm. ``x`` may be ``comm.buffer(n)`` (no copy) or any device array."""
        length = int(x.shape[0])
        if x.dtype != np.float32 or x.ndim != 1:
            raise TypeError(f"the GPU all-reduce takes a 1-D float32 device array, not {x.dtype} {x.shape}")
        if algorithm == "oneshot":
            self._launch_oneshot(x, length, stream)
        elif algorithm == "ring":
            reg = self.buffer(length)
            same = reg.__cuda_array_interface__["data"][0] == x.__cuda_array_interface__["data"][0]
            if not same:
                reg.copy_to_device(x, stream=stream)
            self._launch_ring(length, stream)
            if not same:
                x.copy_to_device(reg, stream=stream)
        else:
            raise ValueError(f"unknown algorithm {algorithm!r}; ring or oneshot")
        return x

    def check_status(self):
        """Raise GpuLaunchError if a kernel of this rank gave up waiting for a peer (after a synchronize)."""
        st = self.status.copy_to_host()
        if st[WAIT_TIMEOUT]:
            raise GpuLaunchError(int(st[WAIT_PEER]), f"rank {self.rank} waited for it in vain (step {st[WAIT_STEP]}, "
                                                     f"call {st[WAIT_EPOCH]}): spin limit {self.spin_limit} polls")
