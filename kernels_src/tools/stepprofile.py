"""Where a whole step's time goes: per-op kernel time, launch count, host time and the gaps between kernels,
for one training step or one decode step, for the course model and for the same model in torch.

    python -m kernels_src stepprofile decode [--config bench|large] [--json OUT.json]
    python -m kernels_src stepprofile train  [--config bench|large] [--json OUT.json]

For the course model, the step runs once with every launch recorded and tagged with the role (gemm,
rmsnorm, ...) whose launcher made it, and with the host time each launcher took. Then it runs under
``torch.profiler`` (CUPTI sees every kernel in the process, numba's included): the i-th kernel on the GPU
timeline is the i-th recorded launch, which gives each kernel's GPU time and the idle gap before it. The
decode step is profiled three ways: eager (the registered launchers), replayed as a launch plan, and
replayed as a CUDA graph (:mod:`kernels_src.runtime`). torch's step is profiled the same way (eager, and
for decode replayed in a CUDA graph). Without torch on a real GPU, only the host-side part is measured.

The JSON keeps, per run: wall time (median of repeated steps), launches, summed kernel time, summed gaps,
per-role launches / kernel time / host time, and the kernel timeline (name, start, duration in µs).
"""
from __future__ import annotations

import json
import sys
import time
from collections import defaultdict

import numpy as np

CONFIGS = {
    "bench": dict(ctx=256, width=512, heads=8, layers=4),       # the chapter's benchmark model
    "large": dict(ctx=1024, width=768, heads=12, layers=12),    # GPT-2-small-sized
}


def config(name):
    from ..model import data
    from ..model.reference import Config

    return Config(vocab=data.VOCAB, **CONFIGS[name])


def _median_wall(fn, reps=20, warm=3):
    from ..model.bench import median_time

    return median_time(fn, reps=reps, warm=warm)


def record_roles(model, fn):
    """Run fn() once with the model's backend calls tagged: returns [(role, kernel name)] per launch and
    {role: host seconds} (the launchers' own time, no synchronisation)."""
    from ..compiler import launch as _launch

    be = model.be
    cls = type(be)
    roles: list = []
    host: dict = defaultdict(float)
    rec: list = []

    def traced(self, role, *args):
        n0 = len(rec)
        t0 = time.perf_counter()
        cls.__call__(self, role, *args)
        host[role] += time.perf_counter() - t0
        roles.extend([role] * (len(rec) - n0))

    be.__class__ = type("Traced" + cls.__name__, (cls,), {"__call__": traced})
    try:
        with _launch.recording(rec):
            fn()
    finally:
        be.__class__ = cls
    names = [r.name for r in rec]
    return list(zip(roles, names)), dict(host)


def gpu_timeline(fn, warm=1):
    """[(kernel name, start µs, duration µs)] of every GPU kernel fn() ran, in start order (torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from .. import device

    for _ in range(warm):
        fn()
    device.synchronize()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        device.synchronize()
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if e.device_type.name == "CUDA" and _is_kernel(e)]
    out = sorted(((e.name, float(e.time_range.start), float(e.time_range.end - e.time_range.start)) for e in ev),
                 key=lambda t: t[1])
    return out


def _is_kernel(e):
    n = e.name.lower()
    return not (n.startswith("memcpy") or n.startswith("memset") or "cudamemcpy" in n)


def summarize(timeline, wall_s, tagged=None, host=None):
    """One run's numbers from its kernel timeline (and, for the course model, the recorded roles)."""
    starts = np.array([t[1] for t in timeline]) if timeline else np.zeros(0)
    durs = np.array([t[2] for t in timeline]) if timeline else np.zeros(0)
    gaps = np.maximum(starts[1:] - (starts[:-1] + durs[:-1]), 0.0) if len(timeline) > 1 else np.zeros(0)
    span = float(starts[-1] + durs[-1] - starts[0]) if len(timeline) else 0.0
    out = {"wall_s": wall_s, "launches": len(timeline), "kernel_s": float(durs.sum()) * 1e-6,
           "gap_s": float(gaps.sum()) * 1e-6, "span_s": span * 1e-6,
           "timeline_us": [[n, round(s - (starts[0] if len(starts) else 0), 2), round(d, 2)] for n, s, d in timeline]}
    if tagged is not None:
        by = defaultdict(lambda: {"launches": 0, "kernel_s": 0.0, "gap_s": 0.0, "host_s": 0.0})
        matched = len(tagged) == len(timeline)
        out["roles_matched"] = matched
        for i, (role, _name) in enumerate(tagged):
            b = by[role]
            b["launches"] += 1
            if matched:
                b["kernel_s"] += float(durs[i]) * 1e-6
                b["gap_s"] += float(gaps[i - 1]) * 1e-6 if i > 0 else 0.0
        for role, s in (host or {}).items():
            by[role]["host_s"] = s
        out["by_role"] = dict(by)
        out["recorded_launches"] = len(tagged)
    else:
        by = defaultdict(lambda: {"launches": 0, "kernel_s": 0.0})
        for n, _s, d in timeline:
            b = by[_short(n)]
            b["launches"] += 1
            b["kernel_s"] += d * 1e-6
        out["by_kernel"] = dict(by)
    return out


def _short(name, n=60):
    return name if len(name) <= n else name[:n] + "..."


def _have_torch():
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def profile_decode(cfg, pos=None, modes=("eager", "plan", "graph"), torch_too=True, qfmt=None) -> dict:
    from ..model.gpt import GPT
    from ..model.reference import init_params

    pos = cfg.ctx // 2 if pos is None else pos
    params = init_params(cfg, 0)
    model = GPT(cfg, params, "gpu")
    qw = model.quantize(qfmt)[0] if qfmt else None
    cache = model.new_cache()
    res = {"step": "decode", "config": cfg.__dict__, "pos": pos, "weights": qfmt or "fp32", "runs": {}}
    have_torch = _have_torch()
    for mode in modes:
        dec = model.decoder(cache, qw, mode=mode)
        dec.step([3], pos)                                # records (plan/graph) or just runs (eager)
        wall = _median_wall(lambda: dec.step([3], pos))
        run = {"mode": dec.describe()}
        tagged = host = None
        if mode == "eager":
            model._write_state([3], pos, 1)
            tagged, host = record_roles(model, lambda: model._decode_launches(1, cache, qw))
        tl = gpu_timeline(lambda: dec.step([3], pos)) if have_torch else []
        run.update(summarize(tl, wall, tagged, host))
        if mode == "eager" and not have_torch:
            run["launches"] = len(tagged)
        res["runs"][f"course_{mode}"] = run
    if torch_too and have_torch and qfmt is None:
        res["runs"].update(torch_decode_runs(cfg, params, pos))
    return res


def torch_decode_runs(cfg, params, pos) -> dict:
    import torch

    from ..model.bench import torch_graph_decode, torch_model

    _P, _fwd, decode = torch_model(cfg, params)
    H, D = cfg.heads, cfg.head_dim
    cache = [(torch.zeros(1, H, cfg.ctx, D, device="cuda"), torch.zeros(1, H, cfg.ctx, D, device="cuda"))
             for _ in range(cfg.layers)]
    tok = torch.tensor([3], device="cuda")
    out = {}
    wall = _median_wall(lambda: decode(tok, pos, cache))
    out["torch_eager"] = summarize(gpu_timeline(lambda: decode(tok, pos, cache)), wall)
    g, run = torch_graph_decode(cfg, params, pos)
    wall = _median_wall(run)
    out["torch_graph"] = summarize(gpu_timeline(run), wall)
    return out


def profile_train(cfg, batch=16, T=None, torch_too=True) -> dict:
    from ..model.gpt import GPT
    from ..model.reference import init_params

    T = cfg.ctx if T is None else T
    params = init_params(cfg, 0)
    model = GPT(cfg, params, "gpu")
    rng = np.random.default_rng(0)
    ids, tg = rng.integers(0, cfg.vocab, (batch, T)), rng.integers(0, cfg.vocab, (batch, T))

    def step():
        model.forward(ids, tg)
        model.backward()
        model.adamw(1e-4)

    res = {"step": "train", "config": cfg.__dict__, "batch": batch, "T": T, "runs": {}}
    wall = _median_wall(step, reps=5, warm=2)
    tagged, host = record_roles(model, step)
    tl = gpu_timeline(step) if _have_torch() else []
    run = summarize(tl, wall, tagged, host)
    run["mode"] = "eager"
    res["runs"]["course_eager"] = run
    try:  # the same step replayed as one CUDA graph (GPT.trainer): the same kernels in the same order
        tr = model.trainer(batch, T, mode="graph", quiet=True)

        def gstep():
            tr.step(ids, tg, 1e-4)

        gstep()  # records and captures
        wall = _median_wall(gstep, reps=5, warm=2)
        tl = gpu_timeline(gstep) if _have_torch() else []
        run = summarize(tl, wall, tagged if len(tagged) == len(tr.plan) else None)
        run["mode"] = tr.describe()
        res["runs"]["course_graph"] = run
    except Exception as e:  # report, keep the rest
        res["runs"]["course_graph"] = {"error": f"{type(e).__name__}: {e}"[:500]}
    if torch_too and _have_torch():
        import torch

        from ..model.bench import torch_model

        P, forward, _dec = torch_model(cfg, params)
        ids_t = torch.tensor(ids, device="cuda", dtype=torch.long)
        tg_t = torch.tensor(tg, device="cuda", dtype=torch.long)
        opt = torch.optim.AdamW(list(P.values()), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                                fused=True)

        def tstep():
            opt.zero_grad(set_to_none=False)
            _, loss = forward(ids_t, tg_t)
            loss.backward()
            opt.step()

        wall = _median_wall(tstep, reps=5, warm=2)
        res["runs"]["torch_eager"] = summarize(gpu_timeline(tstep), wall)
    return res


def add_parser(sub) -> None:
    s = sub.add_parser("stepprofile", help="per-op kernel time, launches and gaps of one training or decode step "
                       "(course model and torch)")
    s.add_argument("step", choices=["train", "decode"])
    s.add_argument("--config", choices=sorted(CONFIGS), default="bench")
    s.add_argument("--weights", choices=["fp32", "q8_0", "q4_0"], default="fp32", help="decode only")
    s.add_argument("--json", help="write the profile to this file")
    s.set_defaults(func=cmd_stepprofile)


def cmd_stepprofile(args) -> int:
    from .. import device
    from ..usage import output_file

    out = output_file(args.json)
    if device.MODE != "gpu":
        print(f"kernels stepprofile: error: a step profile needs a real GPU (kernels run in the {device.MODE} mode)", file=sys.stderr)
        return 2
    cfg = config(args.config)
    if args.step == "decode":
        res = profile_decode(cfg, qfmt=None if args.weights == "fp32" else args.weights)
    else:
        res = profile_train(cfg)
    res["device"] = device.describe()
    for name, r in res["runs"].items():
        print(f"{name:14s} wall {1e6 * r['wall_s']:9.1f} us  launches {r['launches']:5d}  "
              f"kernels {1e6 * r['kernel_s']:9.1f} us  gaps {1e6 * r['gap_s']:9.1f} us")
    if out:
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {out}")
    return 0
