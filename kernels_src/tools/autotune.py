"""Autotuning the dispatcher: time the candidates for each product shape on this device and write the table.

    kernels autotune [--out FILE] [--quick]     time every candidate on the model's shapes and a grid
    kernels autotune --attention [--out FILE]   the flash-attention forward's tile per (rung, D, causal)
    kernels dispatch --explain train|decode     which variant each call of one step gets, and why

For every (role, M, N, K) of one training step and one decode step of the capstone model (the chapter's
config and the larger one: 12 layers, width 768, context 1024), and for a grid that locates the thresholds
(M from 1 to 16 for the GEMV; K from 256 to 8192 against the output's tile count for split-K), each
candidate plan is run through the dispatcher with the role forced to it, checked against float64, and timed
twice: device time (CUDA events around calls queued behind a spinning kernel: no launch cost, which a CUDA
graph removes) and host wall time per call (launch cost included). The winner is by device time. cuBLAS
(torch, TF32 off) is timed beside them as a yardstick, never as a candidate.

The table (JSON) holds every measured entry, with the winner, and thresholds fitted from the grid:
  gemv_max_m        the largest M at which the GEMV won at every grid shape with M' <= M
  splitk_min_k      the smallest K at which split-K beat the warptile GEMM by more than 5 %
  splitk_max_tiles  one more than the largest output tile count at which it did
The dispatcher consults an exact entry first, then the thresholds (kernels_src.runtime.dispatch).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from .. import bench as gpu_bench
from .. import device
from ..runtime import dispatch as D

GEMV_M = (1, 2, 4, 8, 16)
GEMV_NK = ((768, 768), (3072, 768), (768, 3072))
SPLITK_MN = ((128, 128), (512, 512), (768, 768), (768, 2304), (1024, 1024), (2048, 2048), (4096, 4096))
SPLITK_K = (256, 1024, 2048, 4096, 8192)
LARGE = dict(vocab=96, ctx=1024, width=768, heads=12, layers=12)
LARGE_BATCH = 4


def model_shapes(configs=None) -> list[tuple[str, tuple]]:
    """(role, (M, N, K)) of every product in one training step and one decode step of each config."""
    from ..model.configs import BATCH, BENCH
    from ..model.explain import explain
    from ..model.reference import Config

    configs = configs or [(Config(**BENCH), BATCH), (Config(**LARGE), LARGE_BATCH)]
    out = []
    for cfg, batch in configs:
        for step in ("train", "decode"):
            for r in explain(step, cfg, dev="gpu", table={}, batch=batch if step == "train" else 1):
                if r["role"] in D.MATMUL_ROLES:
                    s = dict(x.split("=") for x in r["shape"].split())
                    key = (r["role"], (int(s["M"]), int(s["N"]), int(s["K"])))
                    if key not in out:
                        out.append(key)
    return out


def grid_shapes() -> list[tuple[str, tuple]]:
    g = [("gemm", (m, n, k)) for m in GEMV_M for n, k in GEMV_NK]
    g += [("gemm_nt", (m, n, k)) for m in GEMV_M for n, k in GEMV_NK[:1]]
    g += [("gemm_tn", (m, n, k)) for m, n in SPLITK_MN for k in SPLITK_K]
    return g


def candidates(role, shape) -> list[str]:
    M = shape[0]
    c = ["gemm/gpu/warptile", "gemm/gpu/splitk", "gemm/gpu/tuned"]
    if M <= max(GEMV_M):
        if role == "gemm":
            c.append("gemv/gpu/splitk_grid")
        elif role == "gemm_nt":
            c.append("gemv_wx/gpu/warp_per_row_vec4")
    return c


def _arrays(role, shape, rng):
    M, N, K = shape
    dev = device.cuda
    Y = dev.device_array((M, N), np.float32)
    if role == "gemm":
        a, b = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    elif role == "gemm_nt":
        a, b = rng.standard_normal((M, K)), rng.standard_normal((N, K))
    else:
        a, b = rng.standard_normal((K, M)), rng.standard_normal((K, N))
    return Y, dev.to_device(a.astype(np.float32)), dev.to_device(b.astype(np.float32))


def _time(fn, reps, batches=5):
    """Host wall time per call (µs): launches back to back, one synchronisation per batch, median."""
    fn()
    device.synchronize()
    ts = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        device.synchronize()
        ts.append((time.perf_counter() - t0) / reps)
    return float(np.median(ts)) * 1e6


def _gpu_time(fn, reps, host_us, batches=5):
    """Device time per call (µs), without the host's launch cost: a spinning kernel holds the GPU while the
    host queues the reps calls between two CUDA events, so the calls then run back to back. Median of batches."""
    cuda = device.cuda
    e0, e1 = cuda.event(), cuda.event()
    ts = []
    for _ in range(batches):
        gpu_bench.spin_gpu(1.5 * reps * host_us + 200)
        e0.record()
        for _ in range(reps):
            fn()
        e1.record()
        e1.synchronize()
        ts.append(cuda.event_elapsed_time(e0, e1) * 1e3 / reps)
    return float(np.median(ts))


def _reference(role, a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return a @ b if role == "gemm" else (a @ b.T if role == "gemm_nt" else a.T @ b)


def tune(shapes, progress=True, torch_yardstick=True) -> list[dict]:
    rng = np.random.default_rng(0)
    entries = []
    torch = None
    if torch_yardstick:
        try:
            import torch

            torch.backends.cuda.matmul.allow_tf32 = False
        except ImportError:
            torch = None
    for role, shape in shapes:
        Y, A, B = _arrays(role, shape, rng)
        flops = 2.0 * shape[0] * shape[1] * shape[2]
        reps = int(min(50, max(3, 2e9 / flops)))
        want = _reference(role, A.copy_to_host(), B.copy_to_host())
        us, host, errors = {}, {}, {}
        for key in candidates(role, shape):
            d = D.Dispatcher("gpu", table={}, overrides={role: key})
            fn = d.pick(role, Y, A, B).fn
            try:
                Y.copy_to_device(np.full(Y.shape, np.nan, np.float32))
                fn(Y, A, B)
                got = Y.copy_to_host()
                err = float(np.abs(got - want).max() / max(1e-30, np.abs(want).max()))
                if not np.isfinite(err) or err > 1e-4:  # a wrong result never wins
                    errors[key] = f"relative error {err:.3g}"
                    continue
                host[key] = _time(lambda: fn(Y, A, B), reps)
                us[key] = _gpu_time(lambda: fn(Y, A, B), reps, host[key])
            except Exception as e:  # noqa: BLE001 - a candidate that cannot run is recorded, not fatal
                errors[key] = f"{type(e).__name__}: {e}"
        e = {"role": role, "shape": list(shape), "best": min(us, key=us.get), "us": us, "host_us": host}
        if errors:
            e["errors"] = errors
        if torch is not None:
            ta, tb = (torch.as_tensor(x, device="cuda") for x in (A, B))
            f = {"gemm": lambda: ta @ tb, "gemm_nt": lambda: ta @ tb.T, "gemm_tn": lambda: ta.T @ tb}[role]
            hu = _time(lambda: f(), reps)
            e["cublas_us"] = _gpu_time(lambda: f(), reps, hu)
        entries.append(e)
        if progress:
            print(f"{role:8s} {'x'.join(map(str, shape)):>16s}  best {e['best']:30s} "
                  + "  ".join(f"{k.split('/')[-1]} {v:.0f} ({host[k]:.0f})" for k, v in us.items())
                  + (f"  cublas {e['cublas_us']:.0f}" if "cublas_us" in e else ""), flush=True)
    return entries


def fit_thresholds(entries) -> dict:
    """Thresholds from the grid entries (see the module docstring); DEFAULTS where the grid says nothing."""
    t = dict(D.DEFAULTS)
    gem = [e for e in entries if e["role"] == "gemm" and tuple(e["shape"][1:]) in GEMV_NK]
    if gem:
        max_m = None
        for n, k in GEMV_NK:
            ms = sorted((e["shape"][0], e["best"].startswith("gemv/")) for e in gem if tuple(e["shape"][1:]) == (n, k))
            m_ok = 0
            for m, won in ms:
                if not won:
                    break
                m_ok = m
            max_m = m_ok if max_m is None else min(max_m, m_ok)
        t["gemv_max_m"] = int(max_m)
    sk = [e for e in entries if e["role"] == "gemm_tn" and "gemm/gpu/splitk" in e["us"] and "gemm/gpu/warptile" in e["us"]]
    won = [e for e in sk if e["us"]["gemm/gpu/splitk"] < 0.95 * e["us"]["gemm/gpu/warptile"]]
    if won:
        t["splitk_min_k"] = int(min(e["shape"][2] for e in won))
        t["splitk_max_tiles"] = int(max(D._tiles({"M": e["shape"][0], "N": e["shape"][1]}) for e in won)) + 1
    elif sk:
        t["splitk_min_k"] = int(max(e["shape"][2] for e in sk)) + 1  # it never won: never split
    return t


def autotune(out=None, quick=False, progress=True) -> dict:
    if device.MODE != "gpu":
        raise SystemExit("kernels autotune times kernels on a real GPU; this machine has none "
                         f"({device.REASON}). Without a table the dispatcher uses its documented defaults.")
    import datetime

    shapes = model_shapes()
    if not quick:
        shapes += [s for s in grid_shapes() if s not in shapes]
    t0 = time.perf_counter()
    entries = tune(shapes, progress)
    desc = device.describe()
    table = {"schema": D.SCHEMA, "device": desc.get("name"), "date": datetime.date.today().isoformat(),
             "command": "kernels autotune" + (" --quick" if quick else ""),
             "timing": "us: device time per call (CUDA events around calls queued behind a spinning kernel, so "
                       "no launch cost), median of 5 batches; host_us: host wall time per call, launches back to "
                       "back (launch cost included). The winner is by device time: host cost is the launch "
                       "plans' and CUDA graphs' job (kernels_src.runtime)",
             "thresholds": fit_thresholds(entries), "entries": entries, "seconds": time.perf_counter() - t0}
    D.validate_table(table, "the new table")
    path = Path(out) if out else D.TABLES / f"{D.device_slug(desc.get('name', 'gpu'))}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1) + "\n")
    if progress:
        print(f"wrote {path}: {len(entries)} entries, thresholds {table['thresholds']}")
    return table


# ------------------------------------------------------------------------------------------ CLI
def cmd_autotune(args) -> int:
    from ..usage import output_file

    out = output_file(args.out, "--out")
    if device.MODE != "gpu":
        print("kernels autotune: error: autotune times kernels on a real GPU; this machine has none "
              f"({device.REASON}). Without a table the dispatcher uses its documented defaults.", file=sys.stderr)
        return 2
    if args.attention:  # the flash-attention forward's tile per (rung, D, causal): tools/autotune_attention.py
        from .autotune_attention import autotune_attention

        autotune_attention(out, base=args.base, all_tiles=args.all_tiles)
        return 0
    autotune(out, args.quick)
    return 0


def parse_config(text: str | None):
    """``--config vocab=96,ctx=1024,width=768,heads=12,layers=12`` (any of them) -> a model Config, or None."""
    from ..model.reference import Config
    from ..usage import UsageError

    if not text:
        return None
    allowed = list(Config.__dataclass_fields__)
    example = "vocab=96,ctx=1024,width=768,heads=12,layers=12"
    values = {}
    for kv in text.split(","):
        key, eq, val = (x.strip() for x in kv.partition("="))
        if not eq or key not in allowed:
            raise UsageError(f"--config: cannot read {kv!r}; give name=number for any of {', '.join(allowed)} "
                             f"(e.g. {example})")
        try:
            values[key] = int(val)
        except ValueError:
            raise UsageError(f"--config: {key}={val!r} is not a whole number (e.g. {example})") from None
        if values[key] < (0 if key == "layers" else 1):
            raise UsageError(f"--config: {key}={values[key]} is too small ({key} must be "
                             f"{0 if key == 'layers' else 1} or more)")
    cfg = Config(**values)
    if cfg.width % cfg.heads:
        raise UsageError(f"--config: width={cfg.width} is not a multiple of heads={cfg.heads}")
    return cfg


def cmd_dispatch(args) -> int:
    from ..model.explain import explain, explain_text
    from ..usage import input_path, output_file

    cfg = parse_config(args.config)
    table = input_path(args.table, "--table", "file")
    out = output_file(args.json)
    try:
        rows = explain(args.explain, cfg, dev=args.device, table=table, batch=args.batch)
    except D.DispatchError as e:
        print(f"kernels dispatch: error: {e}", file=sys.stderr)
        return 2
    if out:
        out.write_text(json.dumps(rows, indent=1) + "\n")
    print(explain_text(rows))
    return 0


def add_parser(sub) -> None:
    from ..usage import positive_int

    s = sub.add_parser("autotune", help="time the dispatcher's candidates on this GPU and write its table")
    s.add_argument("--out", help="the table's path (default: kernels_src/runtime/tables/<this GPU>.json)")
    s.add_argument("--quick", action="store_true", help="only the capstone model's shapes, no threshold grid")
    s.add_argument("--attention", action="store_true",
                   help="instead: time the flash-attention forward's tiles (chapter 9, rungs 6-7) per head size and "
                        "mask, and write the winners into the table under 'tiles' (its other entries kept)")
    s.add_argument("--all-tiles", action="store_true", help="with --attention: every tile that fits, not the shortlist")
    s.add_argument("--base", help="with --attention: the table to add the tiles to (default: this GPU's committed one)")
    s.set_defaults(func=cmd_autotune)
    s = sub.add_parser("dispatch", help="which variant each call of one model step gets, and why")
    s.add_argument("--explain", choices=["train", "decode"], required=True)
    s.add_argument("--config", help="model config, e.g. vocab=96,ctx=1024,width=768,heads=12,layers=12 "
                                    "(default: the capstone benchmark's)")
    s.add_argument("--device", choices=list(D.DEVICES), default="gpu")
    s.add_argument("--table", help="a dispatch table (default for --device gpu: the committed H100 table)")
    s.add_argument("--batch", type=positive_int, help="sequences per step (default: the benchmark's; decode: 1)")
    s.add_argument("--json", help="also write the rows to this file")
    s.set_defaults(func=cmd_dispatch)
