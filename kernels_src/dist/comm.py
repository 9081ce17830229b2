"""CPU ranks: ``n`` processes on one machine, exchanging data through shared memory (chapter 21).

    from kernels_src.dist.comm import launch, Comm, CollectiveError

    def work(comm, length):                       # a module-level function: spawn pickles it by name
        x = np.full(length, comm.rank + 1.0)
        return comm.all_reduce(x)                 # every rank gets 1 + 2 + ... + n

    results = launch(work, 3, 10)                 # [x of rank 0, x of rank 1, x of rank 2]

How it works. ``launch`` starts one process per rank ("spawn": a fresh interpreter each, as on every OS) with the
environment of :func:`kernels_src.dist.env.rank_env`. Each rank owns one shared-memory buffer that every other
rank maps; a "message" from rank ``r - 1`` to rank ``r`` is ``r`` reading ``r - 1``'s buffer once ``r - 1``
has said the data is there. The ring's steps follow :func:`kernels_src.dist.schedule.ring_steps`: at each step a
rank waits only for its left neighbour (a semaphore that the neighbour posts when it has finished its previous
step), reads one chunk from the neighbour's buffer and adds it into its own with a small Numba kernel
(:func:`reduce_into`). The one-shot algorithm waits for everybody once (a barrier) and then reads all ``n``
buffers, adding them in rank order. Ring or one-shot, the answer is the same up to the order of the additions
(:func:`kernels_src.dist.schedule.sum_tolerance`).

Every collective starts with a handshake: each rank writes what it is about to do (collective, length, dtype,
op, root) into a shared control block, and after a barrier every rank compares all the entries. Ranks that
disagree all raise :class:`CollectiveError`, with every rank's shape in the message, instead of reading past the
end of a buffer or waiting forever.

Failures end the launch, never hang it. A rank that raises sends its traceback to the parent; a rank that
dies is seen by the parent at once (its exit code); a rank that stops answering makes its peers' waits time out
after ``timeout`` seconds, and the parent also gives up when no rank has entered a collective or returned for
``timeout`` seconds. The parent then stops every rank, frees the shared memory and raises
:class:`CollectiveError` naming the rank. ``timeout`` is therefore the longest a rank may compute between two
collectives, and the longest it may wait for a peer.
"""
from __future__ import annotations

import os
import socket
import time
import traceback

import numpy as np

from ..compiler import njit
from .env import rank_env, stop_processes
from .schedule import chunk_bounds

__all__ = ["launch", "Comm", "CollectiveError", "reduce_into", "demo_all_reduce"]

ALGORITHMS = ("ring", "oneshot")
OPS = {"sum": 0, "max": 1}
DTYPES = {np.dtype(np.float32): 1, np.dtype(np.float64): 2}
DTYPE_NAMES = {0: "unsupported", 1: "float32", 2: "float64"}
KINDS = ["barrier", "all_reduce", "reduce_scatter", "all_gather", "broadcast"]
# control block, one int64 row per rank
SEQ, STATE, GEN, ARRIVED, CAP, ALIVE = range(6)
# what the rank is about to do (kind, length, dtype, op, root, algorithm, extra), in one of two slots by the
# parity of the collective's number: a fast rank may write its next entry while a slow one still reads this
# one, but it cannot get two collectives ahead (that needs everybody at the next handshake)
HEADER = (6, 13)
HEADER_LEN = 7
NFIELDS = 6 + 2 * HEADER_LEN
STARTUP_S = 120.0  # how long the ranks may take to start (import NumPy and Numba)
IN_USER, IN_COLLECTIVE, FINISHED = 0, 1, 2
STATE_NAMES = {IN_USER: "in its own code", IN_COLLECTIVE: "in a collective", FINISHED: "finished"}


class CollectiveError(RuntimeError):
    """A collective could not complete: a rank raised, died, stopped answering, or the ranks disagreed."""


class _PeerTimeout(CollectiveError):
    """Raised inside a rank that waited ``timeout`` seconds for peers (``missing``: the ranks it waited for)."""

    def __init__(self, msg, missing):
        super().__init__(msg)
        self.missing = list(missing)


# ------------------------------------------------------------------------------------------ the kernel
@njit(cache=True)
def reduce_into(dst, src, op):
    """dst[i] = dst[i] + src[i] (op 0) or max(dst[i], src[i]) (op 1), NaN-propagating, in place.

    One pass over two buffers: each element is independent, so the loop vectorizes without reassociating
    anything (no fastmath needed). ``max`` keeps a NaN from either side: ``s > d`` is false for a NaN ``s``,
    hence the explicit ``s != s``."""
    if op == 0:
        for i in range(dst.size):
            dst[i] += src[i]
    else:
        for i in range(dst.size):
            s = src[i]
            if s > dst[i] or s != s:
                dst[i] = s


# ------------------------------------------------------------------------------------------ shared memory
class _Untracked:
    """Keep shared-memory segments out of Python's resource tracker (Python < 3.13 has no ``track=False``):
    the ranks of a launch share one tracker, which would count each name once however many ranks open it and
    complain when the second one lets go. The parent of the launch frees every segment by name instead, however
    the launch ends."""

    def __enter__(self):
        from multiprocessing import resource_tracker

        self._rt = resource_tracker
        self._saved = resource_tracker.register, resource_tracker.unregister
        resource_tracker.register = resource_tracker.unregister = lambda *a, **k: None

    def __exit__(self, *exc):
        self._rt.register, self._rt.unregister = self._saved


def _attach(name, create_size=0):
    """Open (or create, with ``create_size`` bytes) a shared-memory segment."""
    from multiprocessing import shared_memory

    with _Untracked():
        if create_size:
            return shared_memory.SharedMemory(name=name, create=True, size=create_size)
        return shared_memory.SharedMemory(name=name)


def _unlink(name):
    try:
        shm = _attach(name)
    except FileNotFoundError:
        return
    shm.close()
    with _Untracked():
        try:
            shm.unlink()
        except FileNotFoundError:
            pass


def _buffer_name(base, rank, gen):
    return f"{base}r{rank}g{gen}"


# ------------------------------------------------------------------------------------------ the rank's view
class Comm:
    """One rank's end of a launch: ``rank``, ``size`` and the collectives (every rank must call the same ones
    in the same order, with the same length and dtype).

    - ``all_reduce(x, op="sum", algorithm="ring")``: in place on a contiguous float32/float64 array; returns x;
    - ``reduce_scatter(x, op="sum", algorithm="ring")``: returns this rank's chunk of the reduction (a new array,
      ``chunk_bounds(len(x), size, rank)``);
    - ``all_gather(chunk, length, algorithm="ring")``: every rank passes its own chunk of a ``length`` vector;
      returns the whole vector (a new array);
    - ``broadcast(x, root=0, algorithm="ring")``: in place, x becomes root's x; returns x;
    - ``barrier()``.
    """

    def __init__(self, rank, size, base, barrier, ready, timeout):
        self.rank, self.size = int(rank), int(size)
        self.timeout = float(timeout)
        self._base = base
        self._barrier = barrier
        self._ready = ready  # ready[r]: posted by rank r each time it finishes a ring step
        self._ctl_shm = _attach(base + "ctl")
        self.ctl = np.ndarray((size, NFIELDS), dtype=np.int64, buffer=self._ctl_shm.buf)
        self._own = None  # (gen, shm) of this rank's buffer
        self._peers = {}  # rank -> (gen, shm)
        self._seq = 0
        self._arrived = 0
        # everybody is up (imports done) before any collective's clock starts: starting n interpreters on a
        # busy 2-core machine takes seconds, which must not count against a peer
        self._row()[ALIVE] = 1
        try:
            barrier.wait(max(STARTUP_S, self.timeout))
        except Exception:  # noqa: BLE001
            missing = [r for r in range(size) if self.ctl[r, ALIVE] == 0]
            raise _PeerTimeout(f"rank {self.rank} waited for rank(s) {missing} to start", missing) from None

    # ------------------------------------------------------------------ plumbing
    def _row(self):
        return self.ctl[self.rank]

    def _wait_all(self, where):
        """A barrier that says, when it gives up, which ranks never came."""
        self._arrived += 1
        self._row()[ARRIVED] = self._arrived
        try:
            self._barrier.wait(self.timeout)
        except Exception:  # noqa: BLE001  (threading.BrokenBarrierError: a peer timed out or we did)
            missing = [r for r in range(self.size) if self.ctl[r, ARRIVED] < self._arrived]
            raise _PeerTimeout(f"rank {self.rank} waited {self.timeout:g} s at {where} for rank(s) "
                               f"{', '.join(map(str, missing)) or '?'}", missing) from None

    def _wait_left(self, where):
        left = (self.rank - 1) % self.size
        if not self._ready[left].acquire(timeout=self.timeout):
            raise _PeerTimeout(f"rank {self.rank} waited {self.timeout:g} s at {where} for rank {left}", [left])

    def _buffer(self, rank, dtype, length):
        """This rank's shared buffer (grown when needed), or a peer's (re-opened when the peer grew it)."""
        gen = int(self.ctl[rank, GEN])
        cache = self._own if rank == self.rank else self._peers.get(rank)
        if cache is None or cache[0] != gen:
            if cache is not None:
                cache[1].close()
            shm = _attach(_buffer_name(self._base, rank, gen))
            cache = (gen, shm)
            if rank == self.rank:
                self._own = cache
            else:
                self._peers[rank] = cache
        return np.ndarray((length,), dtype=dtype, buffer=cache[1].buf)

    def _grow(self, nbytes):
        row = self._row()
        if nbytes <= row[CAP]:
            return
        old = int(row[GEN])
        cap = max(int(nbytes), 2 * int(row[CAP]), 4096)
        gen = old + 1
        _attach(_buffer_name(self._base, self.rank, gen), create_size=cap).close()
        row[GEN], row[CAP] = gen, cap
        if self._own is not None:
            self._own[1].close()
            self._own = None
        if old > 0:
            _unlink(_buffer_name(self._base, self.rank, old))  # peers that still map it keep their mapping

    def _handshake(self, kind, length, dtype_code, op=0, root=0, algo=0, extra=0):
        """Publish what this rank is about to do, wait for everybody, and check that all agree."""
        self._seq += 1
        row = self._row()
        h = HEADER[self._seq % 2]
        row[h:h + HEADER_LEN] = (KINDS.index(kind), length, dtype_code, op, root, algo, extra)
        row[SEQ], row[STATE] = self._seq, IN_COLLECTIVE
        self._wait_all(f"the start of {kind} #{self._seq}")
        rows = self.ctl[:, h:h + HEADER_LEN].copy()
        bad_dtype = [r for r in range(self.size) if kind != "barrier" and rows[r, 2] == 0]
        if bad_dtype or (rows != rows[0]).any():
            def say(r):
                k, n_, d, o, rt, a, e = (int(v) for v in rows[r])
                s = f"rank {r}: {KINDS[k]} of {DTYPE_NAMES.get(d, d)} ({n_},)"
                if KINDS[k] in ("all_reduce", "reduce_scatter"):
                    s += f" op={list(OPS)[o]}"
                if KINDS[k] == "broadcast":
                    s += f" root={rt}"
                if KINDS[k] == "all_gather" and e:
                    clo, chi = chunk_bounds(n_, self.size, r)
                    s += f" from a chunk ({e - 1},) where chunk {r} has ({chi - clo},)"
                return s + f" algorithm={ALGORITHMS[a]}"
            why = ("only contiguous float32 and float64 arrays can take part" if bad_dtype
                   else "the ranks disagree on what to do")
            self._done()
            raise CollectiveError(f"{kind} #{self._seq}: {why}: " + "; ".join(say(r) for r in range(self.size)))

    def _done(self):
        self._row()[STATE] = IN_USER

    def _ring(self, nsteps, step, where):
        """``nsteps`` ring steps: before step s >= 1 wait for the left neighbour to finish its step s - 1,
        after every step but the last tell the right neighbour. (Step 0 follows a barrier.)"""
        for s in range(nsteps):
            if s:
                self._wait_left(f"step {s} of {where}")
            step(s)
            if s < nsteps - 1:
                self._ready[self.rank].release()

    @staticmethod
    def _code(x, what):
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{what} takes a NumPy array, got {type(x).__name__}")
        return DTYPES.get(x.dtype, 0) if x.flags.c_contiguous else 0

    @staticmethod
    def _algo(algorithm):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        return ALGORITHMS.index(algorithm)

    @staticmethod
    def _op(op):
        if op not in OPS:
            raise ValueError(f"op must be one of {tuple(OPS)}, got {op!r}")
        return OPS[op]

    # ------------------------------------------------------------------ the collectives
    def barrier(self):
        """Wait until every rank has called barrier()."""
        self._handshake("barrier", 0, 0)
        self._done()

    def _stage(self, x):
        """Copy x into this rank's shared buffer and wait until every rank has done the same."""
        self._grow(x.nbytes)
        mine = self._buffer(self.rank, x.dtype, x.size)
        mine[:] = x.ravel()
        self._wait_all(f"the exchange of {KINDS[int(self._row()[HEADER[self._seq % 2]])]} #{self._seq}")
        return mine

    def _reduce_ring(self, x, op, owned_offset):
        """The ring's reduce-scatter phase on this rank's buffer. At step s the rank adds chunk
        (r - s - 1 + owned_offset) % n from its left neighbour into its own copy; afterwards it holds the
        complete chunk (r + 1 + owned_offset) % n. owned_offset 0 is ring_steps' schedule (all-reduce);
        -1 starts one chunk earlier so that rank r ends with chunk r (reduce-scatter)."""
        n, r, L = self.size, self.rank, x.size
        mine = self._stage(x)
        left = self._buffer((r - 1) % n, x.dtype, L)

        def step(s):
            lo, hi = chunk_bounds(L, n, (r - s - 1 + owned_offset) % n)
            reduce_into(mine[lo:hi], left[lo:hi], op)
        self._ring(n - 1, step, f"the reduce-scatter of #{self._seq}")
        return mine, left

    def all_reduce(self, x, op="sum", algorithm="ring"):
        """Reduce x over all ranks, in place (every rank gets the same result); returns x."""
        code, o, a = self._code(x, "all_reduce"), self._op(op), self._algo(algorithm)
        self._handshake("all_reduce", x.size, code, op=o, algo=a)
        n, r, L = self.size, self.rank, x.size
        flat = x.reshape(-1)
        if n == 1:
            self._done()
            return x
        if algorithm == "oneshot":
            self._stage(x)
            flat[:] = self._buffer(0, x.dtype, L)
            for k in range(1, n):  # rank order: the same order on every rank
                reduce_into(flat, self._buffer(k, x.dtype, L), o)
            self._done()
            return x
        # ring: n - 1 reduce-scatter steps, then n - 1 all-gather steps, one semaphore chain
        mine = self._stage(x)
        left = self._buffer((r - 1) % n, x.dtype, L)

        def step(s):
            if s < n - 1:  # reduce-scatter: add the left neighbour's partial sum of one chunk
                lo, hi = chunk_bounds(L, n, (r - s - 1) % n)
                reduce_into(mine[lo:hi], left[lo:hi], o)
            else:  # all-gather: copy the left neighbour's complete chunk
                lo, hi = chunk_bounds(L, n, (r - (s - n + 1)) % n)
                mine[lo:hi] = left[lo:hi]
        self._ring(2 * (n - 1), step, f"all_reduce #{self._seq}")
        flat[:] = mine
        self._done()
        return x

    def reduce_scatter(self, x, op="sum", algorithm="ring"):
        """Reduce x over all ranks; return this rank's chunk ``chunk_bounds(x.size, size, rank)`` (new array)."""
        code, o, a = self._code(x, "reduce_scatter"), self._op(op), self._algo(algorithm)
        self._handshake("reduce_scatter", x.size, code, op=o, algo=a)
        n, r, L = self.size, self.rank, x.size
        lo, hi = chunk_bounds(L, n, r)
        if n == 1:
            self._done()
            return x.reshape(-1)[lo:hi].copy()
        if algorithm == "oneshot":
            self._stage(x)
            out = self._buffer(0, x.dtype, L)[lo:hi].copy()
            for k in range(1, n):
                reduce_into(out, self._buffer(k, x.dtype, L)[lo:hi], o)
        else:
            mine, _ = self._reduce_ring(x, o, -1)
            out = mine[lo:hi].copy()
        self._done()
        return out

    def all_gather(self, chunk, length, algorithm="ring"):
        """Every rank passes its chunk ``chunk_bounds(length, size, rank)``; every rank gets the whole vector."""
        code, a = self._code(chunk, "all_gather"), self._algo(algorithm)
        n, r, L = self.size, self.rank, int(length)
        lo, hi = chunk_bounds(L, n, r) if L >= 0 else (0, 0)
        # EXTRA: 0 when the chunk has the right size, else its size + 1 (every rank then sees who is wrong)
        extra = 0 if chunk.size == hi - lo else chunk.size + 1
        self._handshake("all_gather", L, code, algo=a, extra=extra)
        full = np.empty(L, dtype=chunk.dtype)
        full[lo:hi] = chunk.reshape(-1)
        if n == 1:
            self._done()
            return full
        mine = self._stage(full)
        if algorithm == "oneshot":
            for k in range(n):
                klo, khi = chunk_bounds(L, n, k)
                full[klo:khi] = self._buffer(k, chunk.dtype, L)[klo:khi]
        else:
            left = self._buffer((r - 1) % n, chunk.dtype, L)

            def step(s):  # rank r starts with chunk r; at step s it receives chunk (r - s - 1) % n
                clo, chi = chunk_bounds(L, n, (r - s - 1) % n)
                mine[clo:chi] = left[clo:chi]
            self._ring(n - 1, step, f"all_gather #{self._seq}")
            full[:] = mine
        self._done()
        return full

    def broadcast(self, x, root=0, algorithm="ring"):
        """x becomes root's x on every rank, in place; returns x. The ring is a pipelined chain: the rank at
        distance d from the root copies chunk c from its left neighbour at step c + d - 1."""
        code, a = self._code(x, "broadcast"), self._algo(algorithm)
        if not 0 <= int(root) < self.size:
            raise ValueError(f"root {root} is outside 0..{self.size - 1}")
        self._handshake("broadcast", x.size, code, root=int(root), algo=a)
        n, r, L = self.size, self.rank, x.size
        flat = x.reshape(-1)
        if n == 1:
            self._done()
            return x
        mine = self._stage(x)
        if algorithm == "oneshot":
            flat[:] = self._buffer(root, x.dtype, L)
        else:
            left = self._buffer((r - 1) % n, x.dtype, L)
            d = (r - root) % n

            def step(s):
                c = s - d + 1
                if d and 0 <= c < n:
                    lo, hi = chunk_bounds(L, n, c)
                    mine[lo:hi] = left[lo:hi]
            self._ring(2 * n - 2, step, f"broadcast #{self._seq}")
            flat[:] = mine
        self._done()
        return x

    def close(self):
        for _, shm in list(self._peers.values()) + ([self._own] if self._own else []):
            shm.close()
        self._peers, self._own = {}, None
        self.ctl = None
        self._ctl_shm.close()


# ------------------------------------------------------------------------------------------ the launcher
def _child(rank, size, base, barrier, ready, timeout, env, conn, fn, args):
    os.environ.update(env)
    comm = None
    try:
        comm = Comm(rank, size, base, barrier, ready, timeout)
        value = fn(comm, *args)
        comm._row()[STATE] = FINISHED
        conn.send(("ok", value))
    except BaseException as e:  # noqa: BLE001  (everything goes back to the parent as text)
        if comm is not None and comm.ctl is not None:
            comm._row()[STATE] = FINISHED
        missing = getattr(e, "missing", None)
        try:
            conn.send(("error", type(e).__name__, traceback.format_exc(), missing))
        except Exception:  # noqa: BLE001
            pass
    finally:
        conn.close()
        if comm is not None:
            try:
                comm.close()
            except Exception:  # noqa: BLE001
                pass


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(fn, nranks, *args, timeout=60.0):
    """Run ``fn(comm, *args)`` on ``nranks`` CPU ranks (one process each); return their values in rank order.

    ``fn`` must be a module-level function (spawn imports it by name in each rank), its arguments and return
    values picklable. A rank that raises, dies, or stops answering for ``timeout`` seconds ends the launch with
    :class:`CollectiveError` naming it; every rank is stopped and the shared memory freed before it is raised.
    """
    import multiprocessing as mp
    from multiprocessing.connection import wait

    nranks = int(nranks)
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks}")
    timeout = float(timeout)
    ctx = mp.get_context("spawn")
    base = f"kc{os.getpid()}_{time.monotonic_ns() % 10**9}"
    ctl_shm = _attach(base + "ctl", create_size=nranks * NFIELDS * 8)
    ctl = np.ndarray((nranks, NFIELDS), dtype=np.int64, buffer=ctl_shm.buf)
    ctl[:] = 0
    barrier = ctx.Barrier(nranks)
    ready = [ctx.Semaphore(0) for _ in range(nranks)]
    port = _free_port()
    procs, conns = [], []
    results, done = {}, set()
    try:
        for r in range(nranks):
            env = rank_env(r, nranks, port)
            parent_end, child_end = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_child, name=f"rank{r}",
                            args=(r, nranks, base, barrier, ready, timeout, env, child_end, fn, args))
            saved = dict(os.environ)
            try:  # the rank's interpreter starts with its own environment (rank_env), not only after import
                os.environ.clear()
                os.environ.update(env)
                p.start()
            finally:
                os.environ.clear()
                os.environ.update(saved)
            child_end.close()
            procs.append(p)
            conns.append(parent_end)
        last = ctl.copy()
        t_start = last_change = time.monotonic()
        while len(done) < nranks:
            live = [c for r, c in enumerate(conns) if r not in done]
            sentinels = [p.sentinel for r, p in enumerate(procs) if r not in done]
            wait(live + sentinels, timeout=0.05)
            for r in range(nranks):
                if r in done:
                    continue
                msg = None
                if conns[r].poll():
                    try:
                        msg = conns[r].recv()
                    except EOFError:
                        msg = None
                if msg is not None:
                    done.add(r)
                    last_change = time.monotonic()
                    if msg[0] == "ok":
                        results[r] = msg[1]
                        continue
                    _, name, text, missing = msg
                    if missing is not None:
                        raise CollectiveError(_timeout_message(r, text, missing, ctl, timeout))
                    summary = text.strip().splitlines()[-1] if text.strip() else name
                    raise CollectiveError(f"rank {r} raised {summary}\n{text}")
                if procs[r].exitcode is not None:
                    code = procs[r].exitcode
                    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                    raise CollectiveError(f"rank {r} died: it {how} without returning")
            now = time.monotonic()
            if not ctl[:, ALIVE].all() and now - t_start < STARTUP_S + timeout:
                last_change = now  # the clock starts when every rank is up
            elif not np.array_equal(ctl, last):
                last, last_change = ctl.copy(), now
            elif now - last_change > timeout + 1.0:
                stuck = [r for r in range(nranks) if r not in done and ctl[r, STATE] != IN_COLLECTIVE]
                stuck = stuck or [r for r in range(nranks) if r not in done]
                raise CollectiveError(
                    f"rank {', '.join(map(str, stuck))} did not answer within {timeout:g} s ("
                    + "; ".join(f"rank {r} {STATE_NAMES[int(ctl[r, STATE])]}, {int(ctl[r, SEQ])} collectives"
                                for r in range(nranks)) + ")")
        return [results[r] for r in range(nranks)]
    finally:
        stop_processes(procs, 2.0)
        for c in conns:
            c.close()
        gens = ctl[:, GEN].copy()
        del ctl
        ctl_shm.close()
        with _Untracked():
            ctl_shm.unlink()
        for r in range(nranks):
            for g in range(1, int(gens[r]) + 1):
                _unlink(_buffer_name(base, r, g))


def _timeout_message(r, text, missing, ctl, timeout):
    who = ", ".join(map(str, missing)) or "?"
    states = "; ".join(f"rank {k} {STATE_NAMES[int(ctl[k, STATE])]} after {int(ctl[k, SEQ])} collectives"
                       for k in missing)
    last = text.strip().splitlines()[-1].split(": ", 1)[-1] if text.strip() else ""
    return f"rank {who} did not answer within {timeout:g} s ({states}; {last})"


# ------------------------------------------------------------------------------------------ a demo
def demo_all_reduce(comm, length, algorithm="ring", dtype="float32", seed=0):
    """Each rank all-reduces its own random vector; returns (result, exact sum in float64, sum of |x|), so a
    notebook can compare the two with ``schedule.sum_tolerance``. (Every rank can rebuild every rank's input
    from the seed: that is how it knows the exact answer.)"""
    xs = [np.random.default_rng(seed + k).standard_normal(length).astype(dtype) for k in range(comm.size)]
    x = xs[comm.rank].copy()
    comm.all_reduce(x, algorithm=algorithm)
    stack = np.stack(xs).astype(np.float64)
    return x, stack.sum(0), np.abs(stack).sum(0)
