"""Autotuning the flash-attention forward's tile (chapter 9, rungs 6-7): ``kernels autotune --attention``.

For each (rung, head size D, causal or not) it builds every tile of the shortlist below (or, with ``--all-tiles``,
every tile ``flash2_tiles`` lists; by default only rung 7, the rung the dispatcher runs, and ``--all-tiles`` adds
rung 6), runs it at the chapter's shape (B 4, H 16, S = T 2048), checks it against the
float64 reference on the first and last (b, h) and times it (device time, the median of 5 batches, as
``kernels autotune`` times products). The winner of each key goes into the device's table under ``"tiles"``
(kernels_src.runtime.tiles), beside the dispatcher's entries, which are kept as they are; the rungs read it at
every launch. A tile that fails the check or cannot launch is recorded with its error and never wins.
"""
from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

import numpy as np

from .. import device
from ..runtime import dispatch as D
from ..runtime.tiles import tile_text

SHAPE = dict(B=4, H=16, S=2048)  # the chapter's benchmark shape (D varies)
HEADS = (64, 128)
# The tiles timed by default: the rung's default, the committed sweep's winners and their neighbours
# (book/data/bench/h100/attention_flash2_sweep_gpu.json). D = 128 has few tiles that fit 48 KiB: all of them.
SHORTLIST = {
    (64, True): ["64x64x8x4/0", "64x64x8x8/3", "64x64x8x8/0", "64x64x8x4/3", "64x32x4x4/0"],
    (64, False): ["64x32x4x4/0", "64x32x8x4/3", "64x32x4x8/0", "32x64x8x8/3", "32x32x4x4/0"],
}


def _gpu_time(fn, reps=5, batches=5):
    """Device time per call (us): CUDA events around ``reps`` calls, median of ``batches``. An attention call
    takes milliseconds here, so the host's launch cost (tens of us) hides behind the queued calls."""
    cuda = device.cuda
    fn()
    device.synchronize()
    e0, e1 = cuda.event(), cuda.event()
    ts = []
    for _ in range(batches):
        e0.record()
        for _ in range(reps):
            fn()
        e1.record()
        e1.synchronize()
        ts.append(cuda.event_elapsed_time(e0, e1) * 1e3 / reps)
    return float(np.median(ts))


def _parse(text):
    dims, mb = text.split("/")
    br, bc, tm, tn = (int(x) for x in dims.split("x"))
    return dict(BR=br, BC=bc, TM=tm, TN=tn, minblocks=int(mb))


def candidates(d, shuffle, all_tiles=False):
    from ..ops import attention_flash2 as f

    every = f.flash2_tiles(d, shuffle, f.TILE_MINBLOCKS)
    if all_tiles or (d, shuffle) not in SHORTLIST:
        return list(every)
    short = [_parse(t) for t in SHORTLIST[(d, shuffle)]]
    return [t for t in short if t in every]


RUNGS = ("flash_shfl",)  # rung 7, the one the dispatcher runs; --all-tiles tunes rung 6 too


def tune(heads=HEADS, rungs=RUNGS, all_tiles=False, progress=True, shape=SHAPE) -> list[dict]:
    from ..ops import attention as A
    from ..ops import attention_flash2 as f

    cuda = device.cuda
    rng = np.random.default_rng(0)
    entries = []
    for d in heads:
        for rung in rungs:
            shuffle = rung == "flash_shfl"
            tiles = candidates(d, shuffle, all_tiles)
            for causal in (0, 1):
                size = (shape["B"], shape["H"], shape["H"], shape["S"], shape["S"], d, causal)
                q, k, v, kv, _ = A.make_inputs(size, np.float32, rng)
                want = {}
                for bh in ((0, 0), (size[0] - 1, size[1] - 1)):
                    sl = (slice(bh[0], bh[0] + 1), slice(bh[1], bh[1] + 1))
                    want[bh] = A.reference(*(a[sl].astype(np.float64) for a in (q, k, v)), kv[sl[0]], causal)[0]
                dq, dk, dv_, dkv = (cuda.to_device(a) for a in (q, k, v, kv))
                o = cuda.device_array(q.shape, np.float32)
                lse = cuda.device_array(q.shape[:3], np.float32)
                rtol, atol = A.tol(size, np.float32)
                us, errors = {}, {}
                for t in tiles:
                    name = tile_text(t)
                    try:
                        fn = f.flash2(d, shuffle, **t)
                        o.copy_to_device(np.full(q.shape, np.nan, np.float32))
                        fn(o, lse, dq, dk, dv_, dkv, causal)
                        got = o.copy_to_host()
                        bad = [bh for bh, w in want.items()
                               if not np.all(np.abs(got[bh[0], bh[1]] - w[0, 0]) <= atol + rtol * np.abs(w[0, 0]))]
                        if bad:  # a wrong result never wins
                            errors[name] = f"differs from the float64 reference at (b, h) {bad[0]}"
                            continue
                        run = lambda: fn(o, lse, dq, dk, dv_, dkv, causal)  # noqa: E731
                        us[name] = _gpu_time(run)
                    except Exception as e:  # noqa: BLE001 - a tile that cannot build or launch is recorded
                        errors[name] = f"{type(e).__name__}: {e}"
                if not us:
                    raise RuntimeError(f"no tile ran at D={d} {rung} causal={causal}: {errors}")
                best = min(us, key=us.get)
                dflt = tile_text(dict(f.flash2_config(d, shuffle), minblocks=0))
                e = {"kind": "attention", "variant": f"attention/gpu/{rung}", "D": d, "causal": causal,
                     "shape": [size[0], size[1], size[3], size[4], d], "best": _parse(best), "us": us,
                     "default": dflt}
                if errors:
                    e["errors"] = errors
                entries.append(e)
                if progress:
                    print(f"attention {rung:10s} D={d:3d} causal={causal}  best {best:12s} {us[best]:8.0f} us  "
                          f"(default {dflt} {us.get(dflt, float('nan')):8.0f} us; {len(us)} tiles, "
                          f"{len(errors)} failed)", flush=True)
    return entries


def autotune_attention(out=None, base=None, all_tiles=False, heads=HEADS, progress=True) -> dict:
    """Time the tiles, then write the table: ``base`` (default: this GPU's committed table, if any) with its
    attention tile entries replaced by the new ones."""
    if device.MODE != "gpu":
        raise SystemExit("kernels autotune --attention times kernels on a real GPU; this machine has none "
                         f"({device.REASON}). Without a table the rungs use flash2_config's documented defaults.")
    desc = device.describe()
    slug = D.device_slug(desc.get("name", "gpu"))
    base_path = Path(base) if base else D.TABLES / f"{slug}.json"
    table = json.loads(base_path.read_text()) if base_path.exists() else {
        "schema": D.SCHEMA, "device": desc.get("name"), "date": datetime.date.today().isoformat(),
        "command": "kernels autotune --attention", "thresholds": {}, "entries": []}
    t0 = time.perf_counter()
    new = tune(heads=heads, rungs=("flash_shfl", "flash_vec") if all_tiles else RUNGS, all_tiles=all_tiles,
               progress=progress)
    table["tiles"] = [e for e in table.get("tiles") or [] if e.get("kind") != "attention"] + new
    table["tiles_meta"] = {"command": "kernels autotune --attention" + (" --all-tiles" if all_tiles else ""),
                           "date": datetime.date.today().isoformat(), "device": desc.get("name"),
                           "seconds": time.perf_counter() - t0,
                           "timing": "us: device time per call at B 4, H 16, S = T 2048, fp32 (CUDA events around "
                                     "5 calls queued back to back), median of 5 batches"}
    D.validate_table(table, "the new table")
    path = Path(out) if out else base_path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1) + "\n")
    if progress:
        print(f"wrote {path}: {len(new)} attention tile entries")
    return table
