"""The all-reduce bus-bandwidth sweep across GPUs: ``python -m kernels_src collectives sweep``.

For each message size (8 B to 1 GiB on powers of two by default) and each engine (NCCL through torch.distributed,
the course's ring, the course's one-shot), on ``--ranks`` GPUs (one process each, :func:`kernels_src.dist.gpu.launch`):

1. **check** one call against NumPy: every rank's input is :func:`kernels_src.dist.gpu.test_values` (written on the
   device by ``fill_kernel``), the expected result their float64 sum, compared with the tolerance of
   :func:`kernels_src.dist.schedule.sum_tolerance` (all elements up to 4 Mi; above that, the chunk boundaries,
   both ends and random windows). A wrong result stops the sweep with the rank and the first bad element;
2. **time** it on the device: ``iters`` calls captured in one CUDA graph (numba launches through
   ``cuStreamBeginCapture`` on a numba stream; NCCL through ``torch.cuda.graph``), so the launch cost of the
   host (tens of microseconds for a numba launch) stays out; each repeat is a device-side barrier (a one-element
   one-shot all-reduce, or a one-element NCCL all-reduce), a CUDA event, the graph, a CUDA event. The time of a
   repeat is the slower rank's, divided by ``iters``; the row holds the median and the 10th/90th percentiles over
   the repeats, and ``algbw``/``busbw`` of the median (:func:`kernels_src.dist.schedule.busbw`, nccl-tests'
   definitions);
3. **fit** ``t = alpha + bytes / beta`` per engine (:func:`kernels_src.dist.schedule.fit_alpha_beta`).

The yardstick is the NVLink limit per direction: the link count and per-link speed read from
``nvidia-smi nvlink -s`` on the machine (NVIDIA's datasheets give 900 GB/s of NVLink for the H100 SXM and the
H200, both directions together: 450 GB/s per direction; ``book/references.md``).

The file follows the schema the chapter reads (``book/data/bench/<gpu>x2/collectives_allreduce.json``).
"""
from __future__ import annotations

import datetime as _dt
import json
import re
import subprocess
import sys

import numpy as np

from ..usage import UsageError
from . import schedule

IMPLS = ("nccl", "ring", "oneshot")
DEFAULT_SIZES = "8B..1GiB"
UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9,
         "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "": 1}
MAX_BYTES = 1 << 34
CHECK_LENGTHS = (1, 2, 3, 5, 7, 1000, 4099, 65537, 262147, 1048573, 4194305)  # elements; checked before the sweep
SWEEP_SPIN_LIMIT = 1 << 23  # polls before a kernel gives up (about a second): a hung peer costs the sweep seconds
DATASHEET_GBPS_PER_DIRECTION = {"H100": 450.0, "H200": 450.0}  # 900 GB/s NVLink, both directions (datasheets)


# ============================================================================================ command line
def parse_bytes(text: str) -> int:
    """``"8B"`` -> 8, ``"256KiB"`` -> 262144, ``"1GiB"`` -> 2**30, ``"4096"`` -> 4096 (K/M/G alone are binary)."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text or "")
    if not m or m.group(2).lower() not in UNITS:
        raise UsageError(f"cannot read the size {text!r}; write e.g. 8B, 4096, 256KiB, 64MiB or 1GiB")
    return int(m.group(1)) * UNITS[m.group(2).lower()]


def parse_sizes(text: str | None) -> list[int]:
    """Sizes in bytes: a comma-separated list of sizes and ranges ``LO..HI`` (LO, 2 LO, 4 LO, ... up to HI:
    log steps). Each size is a whole number of float32 elements (a multiple of 4 bytes), at least 4 bytes."""
    text = DEFAULT_SIZES if text is None else text
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if ".." in part:
            lo_t, hi_t = part.split("..", 1)
            lo, hi = parse_bytes(lo_t), parse_bytes(hi_t)
            if lo < 4 or hi < lo:
                raise UsageError(f"range {part!r}: need 4 B <= LO <= HI")
            s = lo
            while s <= hi:
                out.append(s)
                s *= 2
        else:
            out.append(parse_bytes(part))
    if not out:
        raise UsageError(f"no size in {text!r}; write e.g. 8B..1GiB or 8B,256KiB,256MiB")
    for s in out:
        if s < 4 or s % 4:
            raise UsageError(f"size {s} B is not a whole number of float32 elements (a multiple of 4 B, >= 4 B)")
        if s > MAX_BYTES:
            raise UsageError(f"size {s} B is above the sweep's limit of {MAX_BYTES} B (16 GiB)")
    return sorted(set(out))


def parse_impls(text: str | None) -> list[str]:
    names = [n.strip() for n in (text or ",".join(IMPLS)).split(",") if n.strip()]
    if not names:
        raise UsageError(f"--impl: name one or more of {', '.join(IMPLS)}")
    for n in names:
        if n not in IMPLS:
            raise UsageError(f"--impl: unknown implementation {n!r}; known: {', '.join(IMPLS)}")
    return list(dict.fromkeys(names))


def human(nbytes: int) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= f and nbytes % f == 0:
            return f"{nbytes // f}{unit}"
    return f"{nbytes}B"


# ================================================================================================ results
def summarize(impl: str, nbytes: int, times_s, nranks: int) -> dict:
    """One row of the JSON from the per-repeat times (seconds per call)."""
    t = np.asarray(times_s, dtype=np.float64)
    if t.size == 0 or not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError(f"{impl} at {nbytes} B: times must be finite and positive, got {times_s!r}")
    med = float(np.median(t))
    return {"impl": impl, "bytes": int(nbytes), "median_us": med * 1e6,
            "p10_us": float(np.percentile(t, 10)) * 1e6, "p90_us": float(np.percentile(t, 90)) * 1e6,
            "algbw_GBps": schedule.algbw(nbytes, med), "busbw_GBps": schedule.busbw(nbytes, med, nranks)}


def fits(rows) -> dict:
    """``{impl: {"alpha_us", "beta_GBps"}}`` from the rows' medians (schedule.fit_alpha_beta)."""
    out = {}
    for impl in dict.fromkeys(r["impl"] for r in rows):
        mine = [r for r in rows if r["impl"] == impl]
        if len({r["bytes"] for r in mine}) < 2:
            continue
        a, b = schedule.fit_alpha_beta([r["bytes"] for r in mine], [r["median_us"] * 1e-6 for r in mine])
        out[impl] = {"alpha_us": a * 1e6, "beta_GBps": b / 1e9}
    return out


def nvlink_info(smi_text: str | None = None, device: str = "") -> tuple[str, float, str]:
    """(link description, GB/s per direction, source) from ``nvidia-smi nvlink -s`` of GPU 0."""
    if smi_text is None:
        try:
            smi_text = subprocess.run(["nvidia-smi", "nvlink", "-s"], capture_output=True, text=True,
                                      timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            smi_text = ""
    first = re.split(r"\nGPU 1:", smi_text or "", maxsplit=1)[0]
    speeds = [float(x) for x in re.findall(r"Link \d+: ([\d.]+) GB/s", first)]
    sheet = next((v for k, v in DATASHEET_GBPS_PER_DIRECTION.items() if k in device), None)
    sheet_txt = (f"; NVIDIA's {device.replace('NVIDIA ', '')} datasheet: 900 GB/s NVLink in both directions "
                 f"together, {sheet:g} GB/s per direction (book/references.md)") if sheet else ""
    if speeds:
        total = float(sum(speeds))
        link = f"NVLink, {len(speeds)} links x {speeds[0]:g} GB/s"
        return link, total, f"nvidia-smi nvlink -s on the machine: {len(speeds)} links x {speeds[0]:g} GB/s " \
                            f"per direction = {total:.1f} GB/s{sheet_txt}"
    if sheet:
        return "NVLink (nvidia-smi gave no link speeds)", float(sheet), f"datasheet only{sheet_txt}"
    return "unknown", float("nan"), "nvidia-smi nvlink -s gave no link speeds"


def document(rows, meta: dict) -> dict:
    """The JSON: meta, rows (sorted by impl then size), fit."""
    rows = sorted(rows, key=lambda r: (IMPLS.index(r["impl"]) if r["impl"] in IMPLS else 9, r["bytes"]))
    return {"meta": meta, "rows": rows, "fit": fits(rows)}


def progress_line(nbytes: int, rows_here) -> str:
    parts = [f"{r['impl']} {r['median_us']:9.1f} us {r['busbw_GBps']:7.1f} GB/s" for r in rows_here]
    return f"{human(nbytes):>7}  " + "  |  ".join(parts)


def sweep_with(timer, sizes, impls, nranks: int, progress=print) -> list[dict]:
    """The rows, timing with ``timer(impl, nbytes) -> list of seconds`` (one per repeat, or None where the
    implementation failed its check: no row); a line per size."""
    rows = []
    for nbytes in sizes:
        here, failed = [], []
        for impl in impls:
            times = timer(impl, nbytes)
            if times is None:
                failed.append(impl)
            else:
                here.append(summarize(impl, nbytes, times, nranks))
        rows += here
        if progress:
            progress(progress_line(nbytes, here) + "".join(f"  |  {f} FAILED" for f in failed))
    return rows


# ================================================================================================== ranks
def _iters_for(nbytes: int) -> int:
    est = 10e-6 + nbytes / 250e9
    return int(min(100, max(3, round(2e-3 / est))))


def _sample_indices(L: int, nranks: int, rng) -> np.ndarray:
    if L <= (1 << 22):
        return np.arange(L)
    idx = [np.arange(4096), np.arange(L - 4096, L)]
    for c in range(nranks):
        lo, hi = schedule.chunk_bounds(L, nranks, c)
        idx += [np.arange(max(0, lo - 2048), min(L, lo + 2048)), np.arange(max(0, hi - 2048), min(L, hi + 2048))]
    for s in rng.integers(0, L - 4096, 16):
        idx.append(np.arange(s, s + 4096))
    return np.unique(np.concatenate(idx))


def _rank_main(host, sizes, impls, repeats, spin_limit, log_path):
    """One rank of the sweep (runs in its own process, GPU = rank)."""
    import time

    from ..compiler import cuda
    from . import gpu

    n, rank = host.size, host.rank
    cap = max(sizes) // 4
    comm = gpu.GpuComm(host, cap, spin_limit=spin_limit)
    torch = dist = None
    if "nccl" in impls:
        import torch
        import torch.distributed as dist

        from . import nccl

        nccl.init(rank, n)
    stream = cuda.stream()
    x = cuda.device_array(cap, np.float32)
    zeros = cuda.to_device(np.zeros(cap, np.float32))
    bar = cuda.device_array(1, np.float32)
    rng = np.random.default_rng(1234)
    from cuda.bindings import driver as drv

    def ck(res, what):
        if res[0] != drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{what}: {res[0]!r}")
        return res[1] if len(res) > 1 else None

    cu_stream = drv.CUstream(gpu.stream_handle(stream))
    failures: list[str] = []
    broken: set = set()

    def target(impl, L):
        return comm.buffer(L) if impl == "ring" else x[:L]

    def call(impl, L):
        if impl == "nccl":
            nccl.all_reduce(x[:L], stream=stream)
        elif impl == "ring":
            comm._launch_ring(L, stream)
        else:
            comm._launch_oneshot(x[:L], L, stream)

    def check(impl, L):
        for k in range(2):  # two calls back to back: the second reuses the flags and buffers, no host sync between
            check_once(impl, L, k)

    def check_once(impl, L, k):
        arr = target(impl, L)
        gpu.fill_kernel[min(1024, -(-L // 256)), 256, stream](arr, L, rank + n * k)
        call(impl, L)
        stream.synchronize()
        comm.check_status()
        idx = _sample_indices(L, n, rng)
        if idx.size == L:
            got = arr.copy_to_host()
        else:
            got = np.empty(idx.size, np.float32)  # copy only the windows
            # contiguous runs of idx
            breaks = np.flatnonzero(np.diff(idx) != 1) + 1
            pos = 0
            for run in np.split(idx, breaks):
                got[pos:pos + run.size] = arr[int(run[0]):int(run[-1]) + 1].copy_to_host()
                pos += run.size
        stream.synchronize()
        ins = [gpu.test_values(idx, q + n * k).astype(np.float64) for q in range(n)]
        ref = np.sum(ins, axis=0)
        abs_sum = np.sum(np.abs(ins), axis=0)
        good = schedule.allclose_sum(got, ref, abs_sum, n, np.float32)
        if not good.all():
            j = int(np.flatnonzero(~good)[0])
            raise AssertionError(f"{impl} at {L} elements, call {k} on rank {rank}: element {int(idx[j])} is "
                                 f"{got[j]!r}, expected {ref[j]!r} (sum of the ranks' inputs); "
                                 f"{int((~good).sum())} of {idx.size} checked elements wrong")

    def device_barrier():
        if torch is not None:
            nccl.barrier_on_device(stream)
        else:
            comm._launch_oneshot(bar, 1, stream)

    def time_numba(impl, L, iters):
        ck(drv.cuStreamBeginCapture(cu_stream, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
           "cuStreamBeginCapture")
        try:
            for _ in range(iters):
                call(impl, L)
        finally:
            graph = ck(drv.cuStreamEndCapture(cu_stream), "cuStreamEndCapture")
        exe = ck(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")

        def replay():
            ck(drv.cuGraphLaunch(exe, cu_stream), "cuGraphLaunch")

        try:
            return run_repeats(replay, iters)
        finally:
            drv.cuGraphExecDestroy(exe)
            drv.cuGraphDestroy(graph)

    nccl_graph = {"ok": None}

    def time_nccl(L, iters):
        t = torch.as_tensor(x[:L], device="cuda")
        ts = torch.cuda.ExternalStream(gpu.stream_handle(stream))
        g = None
        if nccl_graph["ok"] is not False:
            try:
                g = torch.cuda.CUDAGraph()
                side = torch.cuda.Stream()
                side.wait_stream(ts)
                with torch.cuda.graph(g, stream=side, capture_error_mode="thread_local"):
                    for _ in range(iters):
                        dist.all_reduce(t)
                ts.wait_stream(side)
                nccl_graph["ok"] = True
            except Exception as e:  # noqa: BLE001  (eager fallback, stated in the file)
                nccl_graph["ok"] = False
                nccl_graph["why"] = f"{type(e).__name__}: {e}"[:300]
                g = None
        if g is not None:
            def replay():
                with torch.cuda.stream(ts):
                    g.replay()
        else:
            def replay():
                with torch.cuda.stream(ts):
                    for _ in range(iters):
                        dist.all_reduce(t)
        return run_repeats(replay, iters)

    def run_repeats(replay, iters):
        replay()  # warm
        device_barrier()
        evs = [(cuda.event(), cuda.event()) for _ in range(repeats)]
        for e0, e1 in evs:
            device_barrier()
            e0.record(stream)
            replay()
            e1.record(stream)
        stream.synchronize()
        comm.check_status()
        return [cuda.event_elapsed_time(e0, e1) * 1e-3 / iters for e0, e1 in evs]

    def checked(impl, L) -> bool:
        """check() on every rank; a failure is recorded (and a timed-out implementation dropped)."""
        why = ""
        try:
            check(impl, L)
        except (AssertionError, gpu.GpuLaunchError) as e:  # recorded; the sweep goes on with the others
            why = f"rank {rank}: {e}"
        whys = [w for w in host.exchange(why) if w]
        if whys:
            failures.append(f"{impl} at {L} elements: " + " / ".join(whys))
            if any("waited for it in vain" in w for w in whys):
                broken.add(impl)  # its flags are out of step now: no further call of it can be trusted
        return not whys

    def timer(impl, nbytes):
        L = nbytes // 4
        if impl in broken:
            return None
        host.barrier()
        if not checked(impl, L):
            return None
        target(impl, L).copy_to_device(zeros[:L], stream=stream)
        stream.synchronize()
        host.barrier()
        iters = _iters_for(nbytes)
        mine = time_nccl(L, iters) if impl == "nccl" else time_numba(impl, L, iters)
        every = host.exchange(mine)
        return list(np.max(np.asarray(every, dtype=np.float64), axis=0))  # the slower rank, repeat by repeat

    def say(line):
        if rank == 0:
            print(line, flush=True)
            if log_path:
                with open(log_path, "a") as f:
                    f.write(line + "\n")

    t0 = time.perf_counter()
    for impl in impls:  # awkward lengths first (not multiples of n or of 4, primes, one element), twice each
        bad = [L for L in CHECK_LENGTHS if L <= cap and not checked(impl, L)]
        say(f"check {impl}: {len([L for L in CHECK_LENGTHS if L <= cap])} lengths x 2 calls against NumPy: "
            + (f"FAILED at {bad}" if bad else "all pass"))
    rows = sweep_with(timer, sizes, impls, n, progress=say)
    info = {"device": cuda.get_current_device().name.decode() if isinstance(cuda.get_current_device().name, bytes)
            else str(cuda.get_current_device().name), "seconds": time.perf_counter() - t0,
            "nccl_graph": nccl_graph, "failures": failures, "checked_lengths": [L for L in CHECK_LENGTHS if L <= cap]}
    if torch is not None:
        info["torch"] = torch.__version__
        info["nccl"] = nccl.version()
        dist.barrier()
        nccl.close()
    return rows, info


def run(sizes, impls, nranks=2, repeats=15, timeout=900.0, spin_limit=None, log_path=None) -> dict:
    """The whole sweep on ``nranks`` GPUs; returns the JSON document."""
    from . import gpu

    spin = SWEEP_SPIN_LIMIT if spin_limit is None else spin_limit
    results = gpu.launch(_rank_main, nranks, sizes, impls, repeats, spin, log_path, timeout=timeout)
    rows, info = results[0]
    link, per_dir, source = nvlink_info(device=info["device"])
    meta = {"device": info["device"], "ngpus": nranks, "nccl": info.get("nccl", "not run"),
            "torch": info.get("torch", "not run"), "link": link, "nvlink_GBps_per_direction": per_dir,
            "nvlink_source": source, "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python -m kernels_src " + " ".join(sys.argv[1:]) if sys.argv and "collectives" in sys.argv
            else "python -m kernels_src collectives sweep",
            "timing": "CUDA events around a CUDA graph of `iters` back-to-back calls, after a device-side barrier; "
                      "per repeat the slower rank's time / iters; median, p10, p90 over repeats",
            "repeats": repeats, "nccl_graph": info.get("nccl_graph", {}).get("ok"),
            "buffers": "ring: in place on the registered (IPC-shared) buffer; oneshot: input copied into the "
                       "registered buffer inside the kernel, sum written back; nccl: in place (torch.distributed)",
            "sweep_seconds": info["seconds"]}
    meta["checked_lengths"] = info.get("checked_lengths", [])
    if info.get("failures"):
        meta["failures"] = info["failures"]
    if info.get("nccl_graph", {}).get("why"):
        meta["nccl_graph_error"] = info["nccl_graph"]["why"]
    return document(rows, meta)


def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


# ================================================================================================ the CLI
def add_parser(sub):
    from ..usage import positive_int

    s = sub.add_parser("collectives", help="all-reduce across GPUs: the course's ring and one-shot beside NCCL")
    ss = s.add_subparsers(dest="collectives_cmd", required=True, metavar="SUBCOMMAND")
    w = ss.add_parser("sweep", help="bus bandwidth from 8 B to 1 GiB, checked against NumPy, fitted (alpha, beta)")
    w.add_argument("--sizes", help=f"bytes: sizes and LO..HI ranges on powers of two (default {DEFAULT_SIZES})")
    w.add_argument("--impl", help=f"comma-separated, of {', '.join(IMPLS)} (default: all)")
    w.add_argument("--ranks", type=positive_int, default=2, help="GPUs, one process each (default 2)")
    w.add_argument("--repeat", type=positive_int, default=15, help="timed repeats per size (default 15)")
    w.add_argument("--timeout", type=positive_int, default=900, help="seconds before the ranks are stopped")
    w.add_argument("--json", help="write the results here (a file in a directory that exists)")
    w.set_defaults(func=cmd_sweep)


def cmd_sweep(args) -> int:
    from ..usage import output_file

    sizes = parse_sizes(args.sizes)
    impls = parse_impls(args.impl)
    out = output_file(args.json)
    if args.ranks < 2:
        raise UsageError(f"--ranks {args.ranks}: an all-reduce across GPUs needs 2 or more")
    have = gpu_count()
    if have < args.ranks:
        raise UsageError(f"the sweep needs {args.ranks} GPUs; this machine has {have} (nvidia-smi -L)")
    doc = run(sizes, impls, nranks=args.ranks, repeats=args.repeat, timeout=float(args.timeout))
    for impl, f in doc["fit"].items():
        print(f"fit {impl}: alpha {f['alpha_us']:.2f} us, beta {f['beta_GBps']:.1f} GB/s")
    print(f"NVLink per direction: {doc['meta']['nvlink_GBps_per_direction']:.1f} GB/s ({doc['meta']['link']})")
    if out:
        out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {out}")
    for f in doc["meta"].get("failures", []):
        print(f"FAILED check: {f}", file=sys.stderr)
    return 1 if doc["meta"].get("failures") else 0
