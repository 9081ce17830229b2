"""What one kernel launch costs the host: numba.cuda by argument count, specialized, pre-bound, packed, in a
CUDA graph, and one torch op, all in one process.

    python -m kernels_src launchcost [--launches 2000] [--repeat 7] [--json OUT.json]

Each kernel touches 1024 floats (four blocks of 256 threads), far less work than a launch
costs, so the time per launch of a loop of back-to-back launches followed by one synchronisation is the
host's cost per launch (the GPU keeps up). Ways to launch, each on kernels taking 1, 2, 4 and 8 arrays:

    plain        kern[grid, block](*args)               numba's whole path every call
    bound        cfg = kern[grid, block]; cfg(*args)    the launch configuration built once
    specialized  ks = kern.specialize(*args); ks[grid, block](*args)   no type lookup per call
    packed       runtime.launch: the parameters flattened once, one cuLaunchKernel per call
    graph        the same launches captured in one CUDA graph, replayed with one cuGraphLaunch
                 (time per kernel, as the GPU runs them back to back)

and ``torch_add``: ``x.add_(1.0)`` on a 1024-float CUDA tensor (torch's own dispatcher and launch), when
torch is installed. Medians over ``--repeat`` loops. Real GPU only.
"""
from __future__ import annotations

import json
import sys
import time

N = 1024
THREADS = 256
ARITIES = (1, 2, 4, 8)


def _kernels():
    """One kernel per arity: out[i] += sum of the other arrays' i-th elements (enough to keep every argument)."""
    from ..compiler import cuda

    @cuda.jit
    def k1(a):
        i = cuda.grid(1)
        if i < a.size:
            a[i] += 1.0

    @cuda.jit
    def k2(a, b):
        i = cuda.grid(1)
        if i < a.size:
            a[i] += b[i]

    @cuda.jit
    def k4(a, b, c, d):
        i = cuda.grid(1)
        if i < a.size:
            a[i] += b[i] + c[i] + d[i]

    @cuda.jit
    def k8(a, b, c, d, e, f, g, h):
        i = cuda.grid(1)
        if i < a.size:
            a[i] += b[i] + c[i] + d[i] + e[i] + f[i] + g[i] + h[i]

    return {1: k1, 2: k2, 4: k4, 8: k8}


def _per_launch(fn, launches, repeat, sync):
    """Median over `repeat` loops of (wall time of `launches` calls of fn + one sync) / launches, in µs."""
    import numpy as np

    fn()
    sync()
    ts = []
    for _ in range(repeat):
        sync()
        t0 = time.perf_counter()
        for _ in range(launches):
            fn()
        sync()
        ts.append((time.perf_counter() - t0) / launches * 1e6)
    return float(np.median(ts)), [float(t) for t in ts]


def measure(launches=2000, repeat=7) -> dict:
    import numpy as np

    from .. import device
    from ..compiler import cuda
    from ..runtime import graphs
    from ..runtime.launch import Plan

    if device.MODE != "gpu":
        raise RuntimeError(f"launch cost needs a real GPU (kernels run in the {device.MODE} mode)")
    sync = device.synchronize
    grid = (N + THREADS - 1) // THREADS
    arrays = [cuda.to_device(np.zeros(N, np.float32)) for _ in range(8)]
    res = {"device": device.describe(), "elements": N, "threads": THREADS, "launches_per_loop": launches,
           "repeat": repeat, "us_per_launch": {}, "loops_us": {}}

    def put(name, fn):
        med, all_ = _per_launch(fn, launches, repeat, sync)
        res["us_per_launch"][name] = med
        res["loops_us"][name] = all_
        print(f"{name:24s} {med:8.2f} us/launch", flush=True)

    ok, why = graphs.available()
    for n, k in _kernels().items():
        args = arrays[:n]
        put(f"plain_{n}", lambda k=k, args=args: k[grid, THREADS](*args))
        cfg = k[grid, THREADS]
        put(f"bound_{n}", lambda cfg=cfg, args=args: cfg(*args))
        ks = k.specialize(*args)
        put(f"specialized_{n}", lambda ks=ks, args=args: ks[grid, THREADS](*args))
        kscfg = ks[grid, THREADS]
        put(f"specialized_bound_{n}", lambda c=kscfg, args=args: c(*args))
        plan, _ = Plan.record(lambda k=k, args=args: k[grid, THREADS](*args))
        p = plan.packed[0]
        res.setdefault("params_per_launch", {})[str(n)] = p.n_params
        put(f"packed_{n}", p.launch)
        if ok:
            plan100, _ = Plan.record(lambda k=k, args=args: [k[grid, THREADS](*args) for _ in range(100)])
            g = graphs.capture(plan100)
            med, all_ = _per_launch(g.launch, max(1, launches // 100), repeat, g.synchronize)
            res["us_per_launch"][f"graph_{n}"] = med / 100
            res["loops_us"][f"graph_{n}"] = [t / 100 for t in all_]
            print(f"{'graph_' + str(n):24s} {med / 100:8.2f} us/kernel (100 kernels per graph)", flush=True)
    if not ok:
        res["graph_unavailable"] = why
    try:
        import torch

        x = torch.zeros(N, device="cuda")
        put("torch_add", lambda: x.add_(1.0))
        res["torch"] = torch.__version__
        # torch in a CUDA graph, per op
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                x.add_(1.0)
        torch.cuda.current_stream().wait_stream(s)
        tg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(tg):
            for _ in range(100):
                x.add_(1.0)
        med, all_ = _per_launch(tg.replay, max(1, launches // 100), repeat, torch.cuda.synchronize)
        res["us_per_launch"]["torch_graph"] = med / 100
        res["loops_us"]["torch_graph"] = [t / 100 for t in all_]
        print(f"{'torch_graph':24s} {med / 100:8.2f} us/kernel", flush=True)
    except ImportError:
        res["torch"] = None
    return res


def add_parser(sub) -> None:
    from ..usage import positive_int

    s = sub.add_parser("launchcost", help="host cost of one kernel launch: numba by argument count, specialized, "
                       "packed, CUDA graph, torch")
    s.add_argument("--launches", type=positive_int, default=2000, help="launches per timed loop")
    s.add_argument("--repeat", type=positive_int, default=7, help="timed loops (the median is reported)")
    s.add_argument("--json", help="write the results to this file")
    s.set_defaults(func=cmd_launchcost)


def cmd_launchcost(args) -> int:
    from ..usage import output_file

    out = output_file(args.json)
    try:
        res = measure(args.launches, args.repeat)
    except RuntimeError as e:
        print(f"kernels launchcost: error: {e}", file=sys.stderr)
        return 2
    if out:
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {args.json}")
    return 0
