"""``make bench``: benchmark every registered op, on the CPU and (if present) the real GPU.

    python -m kernels_src.benchall [--out DIR] [--backend cpu|gpu] [--ops a,b]

Writes DIR/<op>_<backend>.json for each op and prints each table. The book's committed results in
book/data/bench/ are produced the same way (on the GPU machine for the GPU files).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from . import device
from .bench import bench, format_table, save_json
from .registry import ops


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="_build/bench")
    p.add_argument("--backend", choices=["cpu", "gpu"], action="append")
    p.add_argument("--ops", help="comma-separated op names (default: all)")
    args = p.parse_args(argv)
    backends = args.backend or (["cpu", "gpu"] if device.MODE == "gpu" else ["cpu"])
    if "gpu" in backends and device.MODE != "gpu":
        print(f"skipping GPU benchmarks: {device.REASON}")
        backends = [b for b in backends if b != "gpu"]
    wanted = set(args.ops.split(",")) if args.ops else None
    out = Path(args.out)
    for op in ops():
        if wanted and op.name not in wanted:
            continue
        for backend in backends:
            if not any(v.backend == backend for v in op.variants):
                continue
            res = bench(op.name, backend)
            print(format_table(res))
            print(f"wrote {save_json(res, out / f'{op.name}_{backend}.json')}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
