"""Data parallelism for the capstone GPT (chapter 21): n ranks, one model replica each, gradients averaged by
all-reduce in buckets while the backward pass is still running.

    python -m kernels_src train-dp --ranks 2 --device cpu --steps 5
    python -m kernels_src train-dp --ranks 2 --device gpu --config bench --steps 30 --compare --json OUT.json

**The algorithm.** Every rank holds the same parameters (rank 0's, broadcast at the start) and takes its own
slice of the global batch: rows ``[r B, (r + 1) B)`` of ``n B`` sequences. Each rank's loss is the mean over its
``B T`` tokens, so the gradient of the global mean loss is the *average* of the ranks' gradients. The model
scales its loss gradient by ``1/n`` (``GPT.grad_scale``), so the all-reduced *sum* is that average, with no
extra pass over the gradients. After the all-reduce every rank holds the same gradient, runs the same AdamW
step, and the replicas stay identical, bit for bit.

**Buckets and overlap.** ``GPT.backward`` calls ``on_grads_ready(layer, ranges)`` as soon as a block's
gradients are final; blocks finish in reverse order (the last block first). The flat gradient buffer puts the
matrices first (``wte``, then block 0's, block 1's, ...) and all the norm gains after them, so a block's
matrices are one contiguous range and make a bucket; the gains of every block (a few KB) wait for the end and
go in one bucket with ``gf``, and ``wte`` (the head's gradient plus the embedding's, which comes last) is the
last bucket. ``plan_buckets`` writes the plan; its buckets tile ``gflat`` exactly. A bucket's all-reduce is
started the moment its block is done, so it runs while the earlier blocks are still in backward; AdamW waits
for every bucket.

**Engines.** ``course``: CPU ranks, one process each, ``kernels_src.dist.comm`` (the course's ring all-reduce
on shared memory); its calls are synchronous, so on the CPU a bucket's all-reduce runs in order inside the
backward pass (no overlap: one core per rank). ``nccl``: one GPU per rank, torch.distributed's NCCL on the
numba device arrays wrapped zero-copy (``torch.as_tensor`` reads ``__cuda_array_interface__``). Stream order,
made explicit (see ``NcclEngine``): the course's kernels run on the legacy default stream (numba's stream 0,
which is torch's default stream too); a bucket records a *ready* event there, a side stream waits on it and
issues the all-reduce (``async_op=True``; NCCL's own stream waits on the side stream, and ``work.wait()``
makes the side stream wait for NCCL), and before AdamW the default stream waits for the side stream.

**How close to the one-process run (the tolerance, derived).** The n-rank run computes the same float64
trajectory as one process on the concatenated batch, in float32, with the sums over token rows done in another
order (per rank, then across ranks), so the two are not bitwise equal. Chapter 13 states and tests that the
course model's float32 loss stays within ``TRAJ_RTOL = 1e-4`` (relative) of the float64 reference over ten
AdamW steps, and each gradient within ``GRAD_RTOL = 1e-4`` of the tensor's largest reference entry
(tests/test_ch13_capstone.py). Both runs are such float32 computations of the same float64 trajectory, so by
the triangle inequality they are within ``2 * TRAJ_RTOL`` of each other (``loss_tolerance``); the tests check
each run against the float64 reference and the pair against each other. (A tighter bound from first
principles does not exist in a useful form: AdamW divides by the gradient's own running size, so a rounding
difference in a gradient entry near zero moves that parameter by up to ``lr``.) One consequence, which the
tests show: a rank that *sums* instead of averaging leaves the loss trajectory almost unchanged (AdamW is
invariant to a constant gradient scale, up to its epsilon); the gradient check catches it.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import numpy as np

from .gpt import GPT, backend
from .configs import TRAIN_CONFIGS
from .reference import Config, init_params

TRAJ_RTOL = 1e-4  # chapter 13's float32-vs-float64 trajectory tolerance (relative), per run
GRAD_RTOL = 1e-4  # chapter 13's gradient tolerance, relative to the tensor's largest reference entry

CONFIGS = {  # name -> (config, batch per rank, sequence length); bench and large are model/configs.py's
    "tiny": (dict(vocab=29, ctx=16, width=32, heads=2, layers=2), 2, 8),
    "small": (dict(vocab=96, ctx=64, width=64, heads=2, layers=2), 4, 32),
    **{name: (dict(cfg), batch, seq) for name, (cfg, batch, seq) in TRAIN_CONFIGS.items()},
}
FAULTS = (None, "sum", "skip_last_bucket")  # deliberate bugs, so the tests can show that they catch them


def loss_tolerance(loss_ref: float) -> float:
    """How far the n-rank loss may be from the one-process loss at a step (see the module docstring)."""
    return 2 * TRAJ_RTOL * abs(loss_ref)


# ------------------------------------------------------------------------------------------- buckets
@dataclass(frozen=True)
class Bucket:
    index: int       # issue order (the same on every rank: collectives must be called in the same order)
    lo: int          # gflat[lo:hi]
    hi: int
    after: int | None  # started when this block's backward is done (None: at the end of backward)
    what: str


def plan_buckets(model: GPT, bucket_bytes: int = 0) -> list[Bucket]:
    """The buckets of ``model.gflat`` in issue order. Block matrices, last block first, merged while a bucket
    is under ``bucket_bytes`` (0: one bucket per block, the most overlap); then ``wte`` and the gains."""
    k, item = model.n_matrix, 4
    out, run, first = [], None, None
    for i in reversed(range(model.cfg.layers)):
        mats = [(lo, min(hi, k)) for lo, hi in model.grad_ranges[i] if lo < k]
        if len(mats) != 1:
            raise ValueError(f"block {i}'s matrices are not one contiguous range of gflat: {mats}")
        lo, hi = mats[0]
        if run is not None and hi != run[0]:
            raise ValueError(f"block {i}'s matrices end at {hi}, not where block {i + 1}'s begin ({run[0]})")
        run, first = ((lo, run[1]) if run else (lo, hi)), (first if run else i)
        if (run[1] - run[0]) * item >= bucket_bytes or i == 0:
            what = f"block {i} matrices" if first == i else f"blocks {i}-{first} matrices"
            out.append(Bucket(len(out), run[0], run[1], i, what))
            run = None
    for lo, hi in model.grad_ranges[None]:
        if lo < k:
            out.append(Bucket(len(out), lo, min(hi, k), None, "wte (head + embedding)"))
    out.append(Bucket(len(out), k, model.n_params, None, "norm gains (every block, gf)"))
    tiles = sorted((b.lo, b.hi) for b in out)
    if tiles[0][0] != 0 or tiles[-1][1] != model.n_params or any(a[1] != b[0] for a, b in zip(tiles, tiles[1:])):
        raise AssertionError(f"buckets do not tile gflat [0, {model.n_params}): {tiles}")
    return out


# ------------------------------------------------------------------------------------------- engines
class CourseEngine:
    """CPU ranks through kernels_src.dist.comm. Synchronous: a bucket is reduced when it is started. Times are
    host perf_counter seconds (exact, since nothing runs asynchronously)."""

    name = "course"
    clock = "host perf_counter (the CPU engine is synchronous)"

    def __init__(self, model: GPT, comm):
        self.comm, self.g = comm, model.gflat
        self.rank, self.size = comm.rank, comm.size

    def broadcast(self, flat):
        self.comm.broadcast(flat, root=0)

    def now(self):
        return time.perf_counter()

    def begin(self):
        self.t_begin, self.marks, self.ars = self.now(), [], []
        self.t_resume = self.t_begin

    def mark(self, layer):  # a backward segment: from where backward resumed to now
        self.marks.append((layer, self.t_resume, self.now()))

    def resume(self):  # backward goes on after the (synchronous) all-reduces just started
        self.t_resume = self.now()

    def start(self, b: Bucket):
        t0 = self.now()
        self.comm.all_reduce(self.g[b.lo:b.hi])
        self.ars.append((b.index, t0, self.now()))

    def finish(self):
        pass

    def mean(self, x: float) -> float:
        a = np.array([x], np.float64)
        self.comm.all_reduce(a)
        return float(a[0]) / self.size

    def elapsed_ms(self, t0, t1):
        return 1e3 * (t1 - t0)

    def same_everywhere(self, digest: str) -> bool:
        """True on every rank when every rank passed the same digest (used for the replicas' checksum)."""
        a = np.frombuffer(bytes.fromhex(digest), np.uint8).astype(np.float64)
        hi, neg_lo = a.copy(), -a  # max and -min over the ranks: equal everywhere iff max == min
        self.comm.all_reduce(hi, op="max")
        self.comm.all_reduce(neg_lo, op="max")
        return bool(np.array_equal(hi, -neg_lo))


class NcclEngine:
    """One GPU per rank, NCCL through torch.distributed on the numba device arrays (zero-copy). Times are CUDA
    events: backward marks and AdamW on the default stream, all-reduces on the side stream."""

    name = "nccl"
    clock = ("CUDA events; backward marks on the compute (default) stream; an all-reduce spans from "
             "max(its bucket ready, the previous all-reduce done) to done (NCCL runs a group's collectives "
             "in order on one stream); ms from each rank's own start-of-backward event; the ranks start a "
             "timeline step together after a barrier and a device sync")

    def __init__(self, model: GPT, size: int):
        import torch

        self.torch = torch
        self.size = size
        self.rank = 0
        if size > 1:
            import torch.distributed as dist

            self.dist = dist
            self.rank = dist.get_rank()
        self.g = torch.as_tensor(model.gflat, device="cuda")
        if self.g.data_ptr() != model.gflat.device_ctypes_pointer.value:
            raise RuntimeError("torch.as_tensor copied the gradient buffer; it must wrap it")
        # The course's kernels launch on numba's stream 0, the legacy default stream; so does torch's default
        # stream. Checked, since the ordering below depends on it.
        self.compute = torch.cuda.current_stream()
        if self.compute.cuda_stream != 0:
            raise RuntimeError(f"torch's current stream is {self.compute.cuda_stream:#x}, not the legacy "
                               "default stream the numba kernels use")
        self.side = torch.cuda.Stream()  # non-blocking: does not wait for the default stream implicitly

    def broadcast(self, flat):
        if self.size > 1:
            self.dist.broadcast(self.torch.as_tensor(flat, device="cuda"), src=0)
            self.torch.cuda.synchronize()

    def now(self):
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record(self.compute)
        return ev

    def begin(self):
        self.t_begin, self.marks, self.ars, self.works = self.now(), [], [], []
        self.t_resume = self.t_begin

    def mark(self, layer):
        self.marks.append((layer, self.t_resume, self.now()))

    def resume(self):  # the compute stream does not wait for the all-reduces: backward goes on at once
        self.t_resume = self.marks[-1][2]

    def start(self, b: Bucket):
        if self.size == 1:
            return
        torch = self.torch
        ready = self.now()                      # the bucket's gradients are final here, on the compute stream
        with torch.cuda.stream(self.side):
            self.side.wait_event(ready)         # the side stream waits for them ...
            work = self.dist.all_reduce(self.g[b.lo:b.hi], async_op=True)  # ... NCCL's stream waits for it
            work.wait()                         # the side stream waits for NCCL (the host does not)
            done = torch.cuda.Event(enable_timing=True)
            done.record(self.side)
        self.works.append(work)
        self.ars.append((b.index, ready, done))

    def finish(self):
        self.compute.wait_stream(self.side)  # AdamW's kernels (stream 0) come after every bucket's all-reduce

    def mean(self, x: float) -> float:
        if self.size == 1:
            return float(x)
        t = self.torch.tensor([x], dtype=self.torch.float64, device="cuda")
        self.dist.all_reduce(t)
        return float(t.item()) / self.size  # .item() syncs: every event of the step has completed

    def elapsed_ms(self, t0, t1):
        return float(t0.elapsed_time(t1))

    def same_everywhere(self, digest: str) -> bool:
        if self.size == 1:
            return True
        got = [None] * self.size
        self.dist.all_gather_object(got, digest)
        return all(d == got[0] for d in got)


# ------------------------------------------------------------------------------------------- the trainer
class DataParallel:
    """One rank's replica: ``train_step(ids, targets, lr)`` on this rank's slice, returning the global mean loss.
    After each step ``last`` holds {"allreduce_ms", "exposed_ms", "timeline"} of that step."""

    def __init__(self, model: GPT, engine, bucket_bytes: int = 0, fault=None, overlap=True):
        if model.cfg.experts:
            raise ValueError("data parallelism is not built for the MoE model (its auxiliary losses are per rank)")
        if fault not in FAULTS:
            raise ValueError(f"fault {fault!r} is not one of {FAULTS}")
        self.model, self.engine, self.fault = model, engine, fault
        self.buckets = plan_buckets(model, bucket_bytes)
        self.set_overlap(overlap)
        model.grad_scale = 1.0 if fault == "sum" else 1.0 / engine.size
        model.on_grads_ready = self._ready
        engine.broadcast(model.flat)  # every replica starts from rank 0's parameters
        self.last: dict = {}

    def set_overlap(self, overlap: bool):
        """overlap=False: every bucket waits for the end of backward (the comparison)."""
        self.overlap = overlap
        self.by_layer = {}
        for b in self.buckets:
            self.by_layer.setdefault(b.after if overlap else None, []).append(b)
        if self.fault == "skip_last_bucket":
            self.by_layer[None] = self.by_layer[None][:-1]

    def _ready(self, layer, ranges):
        self.engine.mark(layer)
        for b in self.by_layer.get(layer, ()):
            self.engine.start(b)
        self.engine.resume()

    def train_step(self, ids, targets, lr, **hyper):
        e, m = self.engine, self.model
        h0 = time.perf_counter()
        _, loss = m.forward(ids, targets)  # ends with the loss on the host: a device sync
        h1 = time.perf_counter()
        e.begin()
        m.backward()
        h2 = time.perf_counter()
        e.finish()
        t_opt = e.now()
        m.adamw(lr, **hyper)
        t_end = e.now()
        loss = e.mean(loss)  # the global loss; on the GPU this waits for the whole step
        h3 = time.perf_counter()
        self.last = self._summary(t_opt, t_end)
        self.last["host_ms"] = {"forward": 1e3 * (h1 - h0), "backward_launch": 1e3 * (h2 - h1),
                                "rest": 1e3 * (h3 - h2)}  # host clock: the backward's launches, not its run
        return loss

    def _summary(self, t_opt, t_end):
        e = self.engine
        ms = lambda t: e.elapsed_ms(e.t_begin, t)  # noqa: E731
        tl = []
        for layer, t0, t1 in e.marks:
            tl.append({"rank": e.rank, "kind": "backward", "bucket": None, "layer": layer,
                       "t0_ms": ms(t0), "t1_ms": ms(t1)})
        busy, prev_done = 0.0, 0.0
        for idx, t0, t1 in e.ars:
            a, b = max(ms(t0), prev_done), ms(t1)
            tl.append({"rank": e.rank, "kind": "allreduce", "bucket": idx, "t0_ms": a, "t1_ms": b})
            busy += b - a
            prev_done = b
        end_bwd = ms(e.marks[-1][2]) if e.marks else 0.0
        tl.append({"rank": e.rank, "kind": "optimizer", "bucket": None, "t0_ms": ms(t_opt), "t1_ms": ms(t_end)})
        return {"allreduce_ms": busy, "exposed_ms": max(0.0, prev_done - end_bwd), "timeline": tl}


# ------------------------------------------------------------------------------------------- data
def global_batch(spec: dict, step: int, tokens=None):
    """The global batch of a step, (n B, T) ids and targets, identical on every rank (same seed)."""
    nB, T, vocab = spec["ranks"] * spec["batch_per_rank"], spec["seq"], spec["config"]["vocab"]
    if tokens is None:
        rng = np.random.default_rng(spec["seed"] * 1000 + step)
        return rng.integers(0, vocab, (nB, T)), rng.integers(0, vocab, (nB, T))
    rng = np.random.default_rng(spec["seed"] * 1000 + step)
    start = rng.integers(0, len(tokens) - T - 1, nB)
    idx = start[:, None] + np.arange(T)[None, :]
    return tokens[idx], tokens[idx + 1]


def rank_rows(spec: dict, rank: int) -> slice:
    B = spec["batch_per_rank"]
    return slice(rank * B, (rank + 1) * B)


def lr_at(spec: dict, step: int) -> float:
    return spec["lr"] * min(1.0, (step + 1) / spec.get("warmup_lr", 1))


def _tokens(spec):
    if spec.get("data") != "prose":
        return None
    from . import data

    return data.encode(data.corpus())


def _params(spec):
    cfg = Config(**spec["config"])
    p = init_params(cfg, spec["seed"])
    if spec.get("spread"):  # GPT-2 init plus noise: logits far from uniform, every gradient non-trivial
        rng = np.random.default_rng(spec["seed"] + 100)
        p = {k: v + spec["spread"] * rng.standard_normal(v.shape) for k, v in p.items()}
    return cfg, p


def make_spec(config="tiny", ranks=2, steps=5, batch_per_rank=None, seq=None, lr=None, seed=0, bucket_mb=0.0,
              data=None, spread=0.0, fault=None, record=False, warmup=None, timeline_step=None,
              overlap=True) -> dict:
    """Everything a rank needs to run (a JSON-able dict)."""
    cfg, B, T = CONFIGS[config]
    spec = {"config_name": config, "config": dict(cfg), "ranks": ranks, "steps": steps,
            "batch_per_rank": batch_per_rank or B, "seq": seq or T,
            "lr": lr if lr is not None else (1e-2 if config == "tiny" else 1e-3), "seed": seed,
            "bucket_bytes": int(bucket_mb * 2**20), "data": data or ("random" if config == "tiny" else "prose"),
            "spread": spread, "fault": fault, "record": record, "overlap": overlap,
            "warmup": warmup if warmup is not None else min(3, max(steps - 1, 0)),
            "warmup_lr": 1 if config == "tiny" else 10}
    spec["timeline_step"] = steps - 1 if timeline_step is None else timeline_step
    return spec


# ------------------------------------------------------------------------------------------- one rank
def run_rank(engine_factory, spec: dict, be, quiet=False) -> dict:
    """One rank's run: the model, the data-parallel wrapper, the steps. Returns losses, step times, the
    per-step all-reduce times, the timeline of one step, and (spec["record"]) each step's parameter digest."""
    cfg, p = _params(spec)
    model = GPT(cfg, p, be)
    engine = engine_factory(model)
    dp = DataParallel(model, engine, spec["bucket_bytes"], spec.get("fault"), spec.get("overlap", True))
    tokens = _tokens(spec)
    rows = rank_rows(spec, engine.rank)
    n = engine.size
    out = {"rank": engine.rank, "loss": [], "step_s": [], "allreduce_ms": [], "exposed_ms": [], "digests": [],
           "buckets": [asdict(b) for b in dp.buckets]}
    ab = spec.get("ab_block", 0)  # > 0: alternate blocks of ab_block steps with and without the overlap
    if ab:
        out["overlap"], out["timelines"] = [], {}
    for s in range(spec["steps"]):
        ids, tg = global_batch(spec, s, tokens)
        if ab:
            dp.set_overlap((s // ab) % 2 == 0)
            out["overlap"].append(dp.overlap)
        if s == spec["timeline_step"] and hasattr(engine, "dist"):  # start the recorded step together
            engine.dist.barrier()
            engine.torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = dp.train_step(ids[rows], tg[rows], lr_at(spec, s))
        dt = time.perf_counter() - t0
        out["loss"].append(loss)
        out["step_s"].append(dt)
        out["allreduce_ms"].append(dp.last["allreduce_ms"])
        out["exposed_ms"].append(dp.last["exposed_ms"])
        out.setdefault("host_ms", []).append(dp.last["host_ms"])
        if ab:
            out["timelines"]["overlap" if dp.overlap else "no_overlap"] = dp.last["timeline"]
        if s == spec["timeline_step"]:
            out["timeline"] = dp.last["timeline"]
        if spec.get("record"):
            out["digests"].append(hashlib.sha256(model.be.host(model.flat).tobytes()).hexdigest())
        if spec.get("record") and s == 0:
            out["grads0"] = model.be.host(model.gflat).tolist()
        if engine.rank == 0 and not quiet:
            tok_s = n * ids[rows].size / dt
            print(f"step {s + 1:4d}/{spec['steps']}  loss {loss:.4f}  tokens/s {tok_s:10.0f}  "
                  f"all-reduce {dp.last['allreduce_ms']:7.3f} ms (exposed {dp.last['exposed_ms']:.3f} ms)",
                  flush=True)
    digest = hashlib.sha256(model.be.host(model.flat).tobytes()).hexdigest()
    out["final_digest"] = digest
    out["replicas_identical"] = engine.same_everywhere(digest)
    return out


def one_process(spec: dict, be="cpu", batch_rows=None, quiet=True) -> dict:
    """The same training on one process, no communication: the batch is the concatenation of every rank's
    slice (batch_rows=None) or only rows batch_rows of it (the one-GPU run at the same batch per GPU)."""
    cfg, p = _params(spec)
    model = GPT(cfg, p, be)
    tokens = _tokens(spec)
    out = {"loss": [], "step_s": []}
    for s in range(spec["steps"]):
        ids, tg = global_batch(spec, s, tokens)
        if batch_rows is not None:
            ids, tg = ids[batch_rows], tg[batch_rows]
        t0 = time.perf_counter()
        out["loss"].append(model.train_step(ids, tg, lr_at(spec, s)))
        model.be.sync()
        out["step_s"].append(time.perf_counter() - t0)
        if s == 0 and spec.get("record"):
            out["grads0"] = model.be.host(model.gflat).tolist()
        if not quiet:
            print(f"one process: step {s + 1:4d}/{spec['steps']}  loss {out['loss'][-1]:.4f}  "
                  f"tokens/s {ids.size / out['step_s'][-1]:10.0f}", flush=True)
    out["tokens_per_step"] = int(ids.size)
    return out


# ------------------------------------------------------------------------------------------- CPU ranks
def _cpu_rank(comm, specs):
    return [run_rank(lambda model: CourseEngine(model, comm), s, "cpu", quiet=s.get("quiet", False)) for s in specs]


def run_cpu(spec, timeout: float = 120.0) -> list:
    """Every rank's result (rank order), CPU ranks through kernels_src.dist.comm. ``spec`` may be a list of specs
    with the same number of ranks, run one after the other in the same processes (one start-up, one compilation):
    then the result is a list (one per spec) of lists (one per rank)."""
    from ..dist.comm import launch

    specs = spec if isinstance(spec, list) else [spec]
    if len({s["ranks"] for s in specs}) != 1:
        raise ValueError("every spec of one launch must have the same number of ranks")
    per_rank = launch(_cpu_rank, specs[0]["ranks"], specs, timeout=timeout)
    out = [[per_rank[r][i] for r in range(len(per_rank))] for i in range(len(specs))]
    return out if isinstance(spec, list) else out[0]


# ------------------------------------------------------------------------------------------- GPU ranks
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_rank_envs(nranks: int, port: int, base=None) -> list:
    """The environment of each GPU rank: kernels_src.dist.env.rank_env (NVLink multicast off), the GPU kind."""
    from ..dist.env import rank_env

    envs = []
    for r in range(nranks):
        env = rank_env(r, nranks, port, base)
        env.setdefault("KERNELS_DEVICE", "gpu")
        envs.append(env)
    return envs


def run_gpu(spec: dict, timeout: float = 540.0) -> list:
    """Start one process per GPU (``python -m kernels_src.model.dp --rank R SPEC OUTDIR``), wait for all; a rank
    that fails or a run past ``timeout`` stops every rank and raises RuntimeError naming the rank."""
    import signal

    n = spec["ranks"]
    if hasattr(signal, "SIGTERM"):  # `timeout` sends SIGTERM: unwind, so that the finally below stops the ranks
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="dp_") as tmp:
        spec_path = os.path.join(tmp, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        procs, errs = [], []
        for r, env in enumerate(gpu_rank_envs(n, _free_port())):
            err = open(os.path.join(tmp, f"err{r}.txt"), "w")
            errs.append(err)
            procs.append(subprocess.Popen([sys.executable, "-m", "kernels_src.model.dp", "--rank", str(r),
                                           spec_path, tmp], env=env, stderr=err))
        t_end, failed = time.monotonic() + timeout, None
        try:
            while any(p.poll() is None for p in procs):
                bad = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
                if bad:
                    failed = (bad[0], f"exit status {procs[bad[0]].returncode}")
                    break
                if time.monotonic() > t_end:
                    failed = (next(r for r, p in enumerate(procs) if p.poll() is None),
                              f"did not finish within {timeout:.0f} s")
                    break
                time.sleep(0.2)
            bad = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed is None and bad:
                failed = (bad[0], f"exit status {procs[bad[0]].returncode}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for e in errs:
                e.close()
        if failed:
            r, why = failed
            with open(os.path.join(tmp, f"err{r}.txt")) as f:
                tail = f.read()[-3000:]
            raise RuntimeError(f"GPU rank {r}: {why}\n{tail}")
        out = []
        for r in range(n):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                out.append(json.load(f))
        return out


def _gpu_rank_main(rank: int, spec_path: str, outdir: str) -> None:
    import torch
    import torch.distributed as dist

    with open(spec_path) as f:
        spec = json.load(f)
    n = spec["ranks"]
    torch.cuda.set_device(rank)
    from ..compiler import cuda

    cuda.select_device(rank)  # numba and torch share this GPU's primary context
    if n > 1:
        dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    res = run_rank(lambda model: NcclEngine(model, n), spec, "gpu")
    if spec.get("compare") and n > 1:
        if rank == 0:  # the one-GPU runs, alone on GPU 0 (rank 1 waits at the barrier)
            res["single_same_batch"] = one_process(spec, "gpu", rank_rows(spec, 0))
            res["single_concat"] = one_process(spec, "gpu")
        dist.barrier()
    res["device"] = torch.cuda.get_device_name(rank)
    res["torch"] = torch.__version__
    res["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    if n > 1:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------- the command
def summarize(spec: dict, results: list, single=None, concat=None, device_name="cpu", extra=None) -> dict:
    """The run in the interfaces' dp_capstone.json schema (plus a few extra keys)."""
    n, w = spec["ranks"], spec["warmup"]
    r0 = results[0]
    tok = n * spec["batch_per_rank"] * spec["seq"]
    step = float(np.median(r0["step_s"][w:]))
    runs = [{"ranks": n, "tokens_per_s": tok / step, "step_ms_median": 1e3 * step, "steps": spec["steps"] - w,
             "allreduce_ms_median": float(np.median(r0["allreduce_ms"][w:])),
             "exposed_allreduce_ms_median": float(np.median(r0["exposed_ms"][w:]))}]
    loss = {str(n): r0["loss"]}
    out = {"meta": {"device": device_name, "ngpus": n, "engine": "nccl" if device_name != "cpu" else "course",
                    "config": spec["config"], "config_name": spec["config_name"],
                    "batch_per_gpu": spec["batch_per_rank"], "seq": spec["seq"], "lr": spec["lr"],
                    "warmup_steps_excluded": w, "data": spec["data"], "overlap": spec["overlap"],
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "command": "python -m kernels_src " + " ".join(sys.argv[1:]) if extra is None else extra,
                    "buckets": r0["buckets"], "timeline_step": spec["timeline_step"] + 1,
                    "timeline_clock": r0.get("clock", ""),
                    "loss_definition": f"loss['{n}']: the {n}-rank run's global mean loss per step; loss['1']: one "
                                       "process on the concatenation of the ranks' batches (same data, same "
                                       "initial parameters)"},
           "runs": runs, "speedup": None, "loss": loss,
           "timeline": [e for r in results for e in r.get("timeline", [])],
           "replicas_identical": all(r["replicas_identical"] for r in results)
           and len({r["final_digest"] for r in results}) == 1}
    for r in results:  # host time per step, per rank: a launch-bound rank shows here (median after warm-up)
        hm = r.get("host_ms", [])[w:]
        if hm:
            out.setdefault("host_ms_median", {})[str(r["rank"])] = {k: float(np.median([h[k] for h in hm]))
                                                                    for k in hm[0]}
    if "overlap" in r0:  # the A/B run: blocks of steps with and without the overlap, in the same processes
        ab = {}
        for mode, flag in (("overlap", True), ("no_overlap", False)):
            idx = [i for i in range(w, len(r0["step_s"])) if r0["overlap"][i] == flag]
            ab[mode] = {"steps": len(idx), "step_ms_median": 1e3 * float(np.median([r0["step_s"][i] for i in idx])),
                        "exposed_allreduce_ms_median": float(np.median([r0["exposed_ms"][i] for i in idx])),
                        "host_ms_median": {str(r["rank"]): {k: float(np.median([r["host_ms"][i][k] for i in idx]))
                                                            for k in r["host_ms"][0]} for r in results},
                        "timeline": [e for r in results for e in r["timelines"].get(mode, [])]}
        out["ab_overlap"] = ab
        out["meta"]["ab_block"] = spec["ab_block"]
    if single is not None:
        s1 = float(np.median(single["step_s"][w:]))
        one = {"ranks": 1, "tokens_per_s": single["tokens_per_step"] / s1, "step_ms_median": 1e3 * s1,
               "steps": spec["steps"] - w}
        out["speedup"] = runs[0]["tokens_per_s"] / one["tokens_per_s"]  # n ranks over one, same batch per rank
        out["runs"].insert(0, one)
    if concat is not None:
        out["loss"]["1"] = concat["loss"]
        d = [abs(a - b) for a, b in zip(r0["loss"], concat["loss"])]
        out["loss_max_abs_diff"] = max(d)
        out["loss_within_tolerance"] = all(x <= loss_tolerance(b) for x, b in zip(d, concat["loss"]))
        out["loss_tolerance"] = "2 * TRAJ_RTOL * |loss| with TRAJ_RTOL = 1e-4 (kernels_src/model/dp.py)"
    return out


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--rank":
        _gpu_rank_main(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        sys.exit("usage: python -m kernels_src.model.dp --rank R SPEC.json OUTDIR (started by run_gpu)")
