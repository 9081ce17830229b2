"""Benchmarking: time every registered variant of an op the same way, and compare with a peak.

CPU timing: call once to JIT-compile (and once more to warm caches), then repeat until at least
``min_time`` has passed, and take the median of the individual call times.

GPU timing: CUDA events around each launch; before each timed launch a buffer of twice the L2 cache
(at least 256 MiB) is read so no run starts with a warm L2 (or with dirty lines to write back), then a spinning kernel holds the GPU
while the host queues the events and the launch (the events time the GPU's work, not the host's launch
overhead); inputs rotate between several copies; the median over repeats is reported.

Every row carries GFLOP/s and GB/s (from the op's FLOP and byte counts) and the fraction of a peak
measured in the same run: device copy bandwidth for memory-bound ops, and for compute-bound ops the
vendor library (numpy.matmul / cuBLAS) when a baseline variant is registered.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np

from . import device
from .parity import as_tuple, empty_outputs, reference_outputs


def _median(xs) -> float:
    return float(np.median(np.asarray(xs)))


def time_cpu(fn, args, *, warmup: int = 2, min_time: float = 0.2, min_repeat: int = 5,
             max_repeat: int = 200, warmup_time: float = 0.3) -> list[float]:
    """Seconds per call for ``fn(*args)``. Not timed: the first ``warmup`` calls (JIT compile), and further
    calls until ``warmup_time`` seconds have passed (at most 100; none when ``warmup`` is 0): torch's CPU kernels take several calls
    to settle (oneDNN compiles code for a new shape, thread pools wake; its SDPA's first ~10 calls were
    measured 40-200x slower than the rest), and every contender gets the same treatment."""
    start = time.perf_counter()
    done = 0
    while done < warmup or (warmup and time.perf_counter() - start < warmup_time and done < 100):
        fn(*args)
        done += 1
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_repeat or (time.perf_counter() - start < min_time and len(times) < max_repeat):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return times


_flush_state: dict = {}


def _l2_bytes() -> int:
    dev = device.cuda.get_current_device()
    return int(getattr(dev, "L2_CACHE_SIZE", 0) or 64 << 20)


FLUSH_MIN_BYTES = 256 << 20  # as Triton's do_bench: writing it takes ~85 us on an H100


def flush_l2() -> None:
    """Read a buffer of 2x the L2 size (at least 256 MiB) so the next kernel starts with a cold cache.

    It reads rather than writes: a written buffer would leave the L2 full of dirty lines, and the timed kernel
    would then pay for writing them back to DRAM as its own reads evict them (~50 MB on an H100, comparable to
    a whole GEMV's traffic). Read lines are clean; whatever the previous call left dirty is written back here,
    before the timing starts. (Nsight Compute's cache control flushes the same way: written back, then invalid.)"""
    if device.MODE != "gpu":
        return
    cuda = device.cuda
    if "kernel" not in _flush_state:
        @cuda.jit
        def _sweep(buf, v, out):
            i = cuda.grid(1)
            if i < buf.size and buf[i] == v:  # never true (buf holds zeros, v >= 1): the read cannot be dropped
                out[0] = v

        _flush_state["kernel"] = _sweep
        _flush_state["buf"] = cuda.to_device(np.zeros(max(2 * _l2_bytes(), FLUSH_MIN_BYTES) // 4, dtype=np.float32))
        _flush_state["out"] = cuda.device_array(1, dtype=np.float32)
        _flush_state["n"] = 0
    buf = _flush_state["buf"]
    _flush_state["n"] += 1
    _flush_state["kernel"][device.ceil_div(buf.size, 256), 256](buf, np.float32(_flush_state["n"]), _flush_state["out"])


_spin_state: dict = {}


def spin_gpu(us: float) -> None:
    """Keep the GPU busy for about ``us`` microseconds (one thread in ``nanosleep``), so that what the host
    queues next waits behind it instead of starting on an idle GPU."""
    if device.MODE != "gpu" or us <= 0:
        return
    if "kernel" not in _spin_state:
        cuda = device.cuda

        @cuda.jit
        def _spin(n):
            for _ in range(n):
                cuda.nanosleep(1000)

        _spin_state["kernel"] = _spin
    _spin_state["kernel"][1, 1](int(min(us, 50_000)))


def time_gpu(fn, arg_sets, *, warmup: int = 2, repeat: int = 20, flush: bool = True) -> list[float]:
    """Seconds per launch of ``fn(*args)`` (CUDA events), rotating through ``arg_sets``.

    What is timed is the GPU's work, not the host's: a numba launch costs ~50 us of Python (two launches twice
    that, see chapter 14), longer than many kernels, and a start event recorded on an idle GPU would count it.
    So the L2 flush and then a spinning kernel, sized from the host time of one call, hold the GPU until the
    start event, the call and the end event are all queued."""
    cuda = device.cuda
    for i in range(warmup):
        fn(*arg_sets[i % len(arg_sets)])
    device.synchronize()
    if device.SIMULATED:  # no events worth having: wall clock, clearly labelled as simulated by the caller
        return time_cpu(fn, arg_sets[0], warmup=0, min_time=0.0, min_repeat=min(repeat, 3), max_repeat=3)
    t0 = time.perf_counter()
    fn(*arg_sets[0])  # the host's time to queue one call (no synchronisation inside the timed span)
    host_us = (time.perf_counter() - t0) * 1e6
    device.synchronize()
    times = []
    start, end = cuda.event(), cuda.event()
    for i in range(repeat):
        if flush:
            flush_l2()
        spin_gpu(1.5 * host_us + 50)
        start.record()
        fn(*arg_sets[i % len(arg_sets)])
        end.record()
        end.synchronize()
        times.append(cuda.event_elapsed_time(start, end) / 1e3)
    return times


# ----------------------------------------------------------------------------------------- peaks
def measure_peaks(backend: str, *, compute_size: int = 1024, tensor_cores: bool = False) -> dict:
    """Measured yardsticks for this run: copy bandwidth, and the vendor GEMM rate where available."""
    if backend == "cpu":
        n = 16 << 20  # 64 MiB of float32: well past the caches
        src = np.random.default_rng(0).random(n, dtype=np.float32)
        dst = np.empty_like(src)
        # numpy.copyto is one thread; a prange copy uses every core. The faster of the two is the yardstick.
        t_np = _median(time_cpu(np.copyto, (dst, src), min_time=0.3))
        t_par = _median(time_cpu(_parallel_copy(), (dst, src), min_time=0.3))
        t = min(t_np, t_par)
        what = "numpy.copyto" if t_np <= t_par else f"a prange copy on {os.cpu_count()} cores"
        a = np.random.default_rng(1).random((compute_size, compute_size), dtype=np.float32)
        tm = _median(time_cpu(np.matmul, (a, a), min_time=0.3))
        return {"copy_gbps": 2 * src.nbytes / t / 1e9, "copy_what": f"{what}, 64 MiB float32 (read + write)",
                "copy_numpy_gbps": 2 * src.nbytes / t_np / 1e9, "copy_prange_gbps": 2 * src.nbytes / t_par / 1e9,
                "compute_gflops": 2 * compute_size**3 / tm / 1e9,
                "compute_what": f"numpy.matmul float32 {compute_size}^3 ({_blas_name()})"}
    if device.MODE != "gpu":
        return {"copy_gbps": None, "copy_what": "simulated: no GPU peak", "compute_gflops": None,
                "compute_what": "simulated"}
    peaks = measure_copy()
    peaks.update(_cublas_rate(4096, tensor_cores=tensor_cores))
    peaks["datasheet"] = datasheet()
    return peaks


# The fastest copy measured in the same run is the yardstick; these are its candidates (kernels_src/ops/copy.py).
COPY_CANDIDATES = {"memcpy": "cudaMemcpy device-to-device", "torch": "torch's copy kernel (Tensor.copy_)",
                   "stride_v4": "the course's copy kernel (16-byte loads, grid stride)"}


def measure_copy(n: int = 256 << 20, repeat: int = 20) -> dict:
    """GB/s of each copy in :data:`COPY_CANDIDATES` on ``n`` float32 (1 GiB), timed alike (CUDA events,
    L2 flushed, median), and the fastest as ``copy_gbps``. Every memory-bound result is a fraction of it."""
    from .registry import get_variant

    cuda = device.cuda
    src = cuda.to_device(np.random.default_rng(0).random(n, dtype=np.float32))
    dst = cuda.device_array(n, dtype=np.float32)
    each = {}
    for name, what in COPY_CANDIDATES.items():
        v = get_variant(f"copy/gpu/{name}")
        ok, why = v.available()
        if not ok:
            each[name] = {"what": what, "skipped": why}
            continue
        t = _median(time_gpu(v.fn, [(dst, src)], repeat=repeat))
        each[name] = {"what": what, "gbps": 2 * n * 4 / t / 1e9, "median_s": t}
    best = max((k for k in each if "gbps" in each[k]), key=lambda k: each[k]["gbps"])
    del src, dst
    return {"copy_gbps": each[best]["gbps"],
            "copy_what": f"fastest of {len([k for k in each if 'gbps' in each[k]])} copies, 1 GiB float32 "
                         f"(read + write): {each[best]['what']}",
            "copy_each": each}


# Datasheet figures, shown beside the measured ones and labelled as such (never used as a yardstick).
DATASHEETS = {
    "H100": {"name": "NVIDIA H100 SXM5 (datasheet)", "hbm_gbps": 3350, "fp32_tflops": 67, "tf32_tflops": 495,
             "bf16_tflops": 989, "l2_mb": 50, "smem_per_sm_kb": 228,
             "source": "NVIDIA H100 Tensor Core GPU datasheet; tensor-core rates without sparsity"},
    "H200": {"name": "NVIDIA H200 SXM (datasheet)", "hbm_gbps": 4800, "fp32_tflops": 67, "tf32_tflops": 495,
             "bf16_tflops": 989, "l2_mb": 50, "smem_per_sm_kb": 228,
             "source": "NVIDIA H200 Tensor Core GPU datasheet; tensor-core rates without sparsity"},
}


def datasheet(name: str | None = None) -> dict | None:
    """The datasheet entry for the current GPU (or ``name``), if the course has one."""
    if name is None:
        name = device.describe().get("name", "") if device.MODE == "gpu" else ""
    for key, sheet in DATASHEETS.items():
        if key in name:
            return sheet
    return None


def _parallel_copy():
    from .compiler import njit, prange

    @njit(parallel=True, cache=True)
    def copy(dst, src):
        for i in prange(src.size):
            dst[i] = src[i]

    return copy


def _blas_name() -> str:
    try:
        cfg = np.show_config(mode="dicts")
        return cfg["Build Dependencies"]["blas"]["name"]
    except Exception:  # noqa: BLE001
        return "BLAS"


def _cublas_rate(n: int, tensor_cores: bool = False) -> dict:
    """cuBLAS SGEMM through torch (TF32 off) when torch is installed; otherwise nothing. With
    ``tensor_cores``, also the tensor-core rates a user gets from torch (TF32 on, and bf16): roofs the
    course's FP32 CUDA-core kernels do not aim at, shown on the rooflines for what they are."""
    try:
        import torch
    except ImportError:
        return {"compute_gflops": None, "compute_what": "torch not installed: no cuBLAS yardstick"}
    prev = torch.backends.cuda.matmul.allow_tf32

    def rate(dtype, tf32):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.rand(n, n, device="cuda").to(dtype)
        b = torch.rand(n, n, device="cuda").to(dtype)
        c = torch.empty(n, n, device="cuda", dtype=dtype)
        t = _median(time_gpu(lambda: torch.matmul(a, b, out=c), [()], repeat=10, flush=False))
        return 2 * n**3 / t / 1e9

    try:
        out = {"compute_gflops": rate(torch.float32, False),
               "compute_what": f"cuBLAS SGEMM via torch {torch.__version__}, {n}^3 fp32, TF32 off"}
        if tensor_cores:
            out["tensor_core_roofs"] = {
                "tf32_gflops": rate(torch.float32, True), "bf16_gflops": rate(torch.bfloat16, False),
                "what": f"cuBLAS via torch {torch.__version__}, {n}^3: fp32 with TF32 on, and bf16 (tensor cores)"}
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return out


# ----------------------------------------------------------------------------------------- bench
def environment() -> dict:
    from importlib import metadata

    from . import compiler

    versions = {"python": platform.python_version(), "numpy": np.__version__,
                "compiler": f"{compiler.NAME} {compiler.version()}"}
    for dist in ("numba", "numba-cuda", "numba-cuda-mlir", "torch", "cupy"):
        try:
            versions[dist.replace("-", "_")] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "cpu": platform.processor() or platform.machine(),
            "cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "cpu_threads": _cpu_threads(),
            "simd": simd_flags(), "device": device.describe(), "versions": versions,
            "command": " ".join(sys.argv)}


def cpu_model() -> str:
    """The CPU's marketing name ("AMD EPYC 7B13", "Intel(R) Xeon(R) Processor"), or the architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        import subprocess

        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                  text=True, timeout=5).stdout.strip() or platform.machine()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine()


def simd_flags() -> list[str]:
    """The vector instruction sets this CPU reports (Linux: /proc/cpuinfo), e.g. ["avx2", "avx512f", "fma"]."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return sorted(f for f in have if f in {"sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw",
                                                        "avx512vl", "avx512_vnni", "avx_vnni", "neon", "asimd"})
    except OSError:
        pass
    return ["neon"] if platform.machine() in ("arm64", "aarch64") else []


def _cpu_threads() -> int:
    from .compiler import get_num_threads

    return int(get_num_threads())


def cpu_slug(model: str | None = None, cores: int | None = None) -> str:
    """A folder name for one machine's CPU results: its model and core count, e.g. "intel-xeon-processor-2c"."""
    model = cpu_model() if model is None else model
    cores = os.cpu_count() if cores is None else cores
    words = re.sub(r"\((r|tm)\)|\bcpu\b|@.*$", " ", model.lower())
    return "-".join(re.findall(r"[a-z0-9]+", words)) + f"-{cores}c"


def default_bench_sizes(op, backend) -> list:
    if backend == "gpu" and device.SIMULATED:
        return op.sizes.get("bench_sim") or op.sizes.get("check_sim") or op.sizes["check"][:1]
    return op.sizes.get(f"bench_{backend}") or op.sizes["bench"]


def _prepare(op, size, dtype, backend, n_sets):
    """``n_sets`` independent (outputs..., inputs...) argument tuples, on the device for GPU runs."""
    rng = np.random.default_rng(1234)
    sets, template = [], None
    for _ in range(n_sets):
        inputs = as_tuple(op.make_inputs(size, np.dtype(dtype), rng))
        if template is None:  # the reference is only needed once, for output shapes and dtypes
            template = empty_outputs(reference_outputs(op, inputs), dtype, op.storage)
        outs = [np.empty_like(o) for o in template]
        if backend == "gpu":
            cuda = device.cuda
            outs = [cuda.to_device(o) for o in outs]
            inputs = tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in inputs)
        sets.append((*outs, *inputs))
    return sets


def _nbytes(args) -> int:
    return sum(getattr(a, "nbytes", 0) for a in args)


def bench(op_name: str, backend: str = "cpu", *, variants=None, sizes=None, dtype: str = "float32",
          repeat: int = 20, progress: bool = True, include_peaks: bool = True) -> dict:
    """Time every registered variant of ``op_name`` on ``backend``; return a JSON-able dict."""
    from .registry import get_op

    if backend == "cpu":  # before anything starts Numba's threads (see ops/cpu_baselines.py)
        from .compiler import import_torch_first

        import_torch_first()
    op = get_op(op_name)
    chosen = [v for v in op.variants if v.backend == backend and (not variants or v.name in variants)]
    if variants:
        missing = set(variants) - {v.name for v in chosen}
        if missing:
            raise KeyError(f"{op_name}/{backend} has no variant(s) {sorted(missing)}; "
                           f"known: {[v.name for v in op.variants if v.backend == backend]}")
    if backend == "gpu" and not device.GPU_VARIANTS_RUN:
        raise RuntimeError(f"cannot benchmark GPU variants: {device.REASON}")
    simulated = backend == "gpu" and device.SIMULATED
    if simulated:
        print("[kernels_src] WARNING: timing the CUDA simulator measures Python, not a GPU; "
              "these numbers are for testing the harness only and are marked simulated.", file=sys.stderr)
    sizes = [tuple(s) for s in (sizes or default_bench_sizes(op, backend))]
    itemsize = np.dtype(dtype).itemsize
    result = {"op": op.name, "backend": backend, "dtype": np.dtype(dtype).name, "kind": op.kind,
              "simulated": simulated, "meta": environment(),
              "peaks": measure_peaks(backend, tensor_cores=op.kind == "compute") if include_peaks and not simulated
              else {}, "rows": []}
    jobs = [(size, v) for size in sizes for v in chosen]
    it = jobs
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(jobs, desc=f"bench {op.name}/{backend}", unit="run")
    prepared = {}
    for size, v in it:
        ok, why = v.available()
        if not ok:
            result["rows"].append({"variant": v.name, "size": list(size), "size_label": op.size_label(size),
                                   "skipped": why})
            continue
        if size not in prepared:
            prepared.clear()
            one = _nbytes(_prepare(op, size, dtype, backend, 1)[0])
            n_sets = 1 if backend == "cpu" or simulated else max(1, min(3, (1 << 30) // max(one, 1)))
            prepared[size] = _prepare(op, size, dtype, backend, n_sets)
        sets = prepared[size]
        if backend == "gpu":
            times = time_gpu(v.fn, sets, repeat=repeat)
        else:
            times = time_cpu(v.fn, sets[0], min_repeat=min(5, repeat))
        t = _median(times)
        flops = (v.flops or op.flops)(size)
        nbytes = (v.bytes or op.bytes)(size, itemsize)
        row = {"variant": v.name, "rung": v.rung, "baseline": v.baseline, "summary": v.summary,
               "size": list(size), "size_label": op.size_label(size), "median_s": t,
               "min_s": float(np.min(times)), "q1_s": float(np.percentile(times, 25)),
               "q3_s": float(np.percentile(times, 75)), "repeats": len(times),
               "gflops": flops / t / 1e9, "gbps": nbytes / t / 1e9, "flops": flops, "bytes": nbytes}
        result["rows"].append(row)
    _add_fractions(result)
    return result


def _add_fractions(result: dict) -> None:
    peaks = result.get("peaks") or {}
    rows = [r for r in result["rows"] if "median_s" in r]
    for r in rows:
        if peaks.get("copy_gbps"):
            r["frac_copy_bw"] = r["gbps"] / peaks["copy_gbps"]
        if peaks.get("compute_gflops"):
            r["frac_compute_peak"] = r["gflops"] / peaks["compute_gflops"]
        base = [b for b in rows if b["baseline"] and b["size"] == r["size"]]
        if base:
            best = min(base, key=lambda b: b["median_s"])
            r["vs_baseline"] = best["median_s"] / r["median_s"]
            r["baseline_name"] = best["variant"]


def format_table(result: dict) -> str:
    memory = result.get("kind") == "memory"
    head = f"{result['op']} on {result['backend']} ({result['meta']['device']['name']}), {result['dtype']}"
    if result.get("simulated"):
        head += "  [SIMULATED: not a GPU timing]"
    peaks = result.get("peaks") or {}
    lines = [head]
    if peaks.get("copy_gbps"):
        lines.append(f"  copy bandwidth: {peaks['copy_gbps']:.1f} GB/s ({peaks['copy_what']})")
        for name, c in (peaks.get("copy_each") or {}).items():
            lines.append(f"    {name:<10} " + (f"{c['gbps']:.1f} GB/s" if "gbps" in c else "skipped: " + c["skipped"])
                         + f"  ({c['what']})")
    sheet = peaks.get("datasheet")
    if sheet:
        lines.append(f"  datasheet (not measured): {sheet['hbm_gbps']} GB/s HBM, {sheet['fp32_tflops']} TFLOP/s FP32 "
                     f"({sheet['name']})")
    if peaks.get("compute_gflops"):
        lines.append(f"  compute yardstick: {peaks['compute_gflops']:.1f} GFLOP/s ({peaks['compute_what']})")
    cols = ["size", "rung", "variant", "median", "GFLOP/s", "GB/s", "% copy BW" if memory else "% peak", "vs base"]
    rows = []
    for r in result["rows"]:
        if "skipped" in r:
            rows.append([r["size_label"], "", r["variant"], "skipped: " + r["skipped"], "", "", "", ""])
            continue
        frac = r.get("frac_copy_bw") if memory else r.get("frac_compute_peak")
        rows.append([r["size_label"], "base" if r["baseline"] else str(r["rung"]), r["variant"],
                     fmt_time(r["median_s"]), f"{r['gflops']:.2f}", f"{r['gbps']:.2f}",
                     f"{100 * frac:.1f}%" if frac is not None else "-",
                     f"{r['vs_baseline']:.2f}x" if "vs_baseline" in r else "-"])
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *rows)] if rows else [len(c) for c in cols]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    lines.append(fmt.format(*cols))
    lines += [fmt.format(*row) for row in rows]
    return "\n".join(lines)


def fmt_time(s: float, micro: str = "us") -> str:
    """Seconds as a short human string: 3.62 us, 1.2 ms, ... (``micro="µs"`` for the book)."""
    for unit, scale in (("s", 1), ("ms", 1e-3), (micro, 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def save_json(result: dict, path) -> Path:
    """Write atomically (temp file + rename) so an interrupted run never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path


def load_json(path) -> dict:
    return json.loads(Path(path).read_text())
