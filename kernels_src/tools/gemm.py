"""Measurement and code-generation tools for the GEMM ladder (chapter 5), kept apart from the kernels.

- :func:`run_sweep`: the autotuning sweep of warptile shapes (``SWEEP``) on the GPU, which chose rung 9;
- :func:`ptx_report`: compile a kernel to sm_90 PTX and count what matters (shared loads, FMAs, spills);
- :func:`resource_report`, :func:`dump_sass`, :func:`write_codegen_evidence`: registers, shared memory and
  SASS of each rung, written as the JSON the chapter reads (book/data/gemm_codegen.json).

The kernels and their registrations stay in :mod:`kernels_src.ops.gemm`.
"""
from __future__ import annotations

import numpy as np

from .. import device
from ..device import cuda
from ..ops.gemm import SIG, SIG_VEC, gemm_cublas, make_vec, make_warptile

SWEEP = [  # candidate shapes for the autotuning sweep (run_sweep times each on the GPU)
    dict(BM=128, BN=128, BK=8, TM=8, TN=8, dbuf=True),
    dict(BM=128, BN=128, BK=8, TM=8, TN=8, dbuf=True, wr=8, wc=4),
    dict(BM=128, BN=256, BK=8, TM=8, TN=16, dbuf=True),
    dict(BM=128, BN=256, BK=8, TM=8, TN=16, dbuf=True, wr=8, wc=4),
    dict(BM=128, BN=256, BK=8, TM=8, TN=16, dbuf=False),
    dict(BM=64, BN=256, BK=8, TM=4, TN=16, dbuf=True),
    dict(BM=256, BN=128, BK=8, TM=16, TN=8, dbuf=True, wr=8, wc=4),
]

SWEEP_VEC = [  # candidates for rungs 10-11 (make_vec): 16-byte loads, with and without warp tiles
    dict(BK=8, warptile=False),
    dict(BK=8, warptile=False, minblocks=2),
    dict(BK=16, LR=8, LC=4, warptile=True),
    dict(BK=16, LR=8, LC=4, warptile=True, minblocks=2),
    dict(BK=16, LR=4, LC=8, warptile=True, minblocks=2),
    dict(BK=8, LR=8, LC=4, warptile=True, minblocks=2),
    dict(BM=64, BN=128, BK=16, LR=8, LC=4, warptile=True, minblocks=4),
    dict(BM=128, BN=256, BK=8, TM=8, TN=16, LR=8, LC=4, warptile=True),
]
FACTORIES = {"warptile": make_warptile, "vec": make_vec}


def ptx_report(launch_or_kernel, sig=SIG, cc=(9, 0)) -> dict:
    """Compile a kernel to PTX for sm_90 and count what matters (needs KERNELS_DEVICE=ptx or a GPU).

    Returns counts of vector/scalar shared loads, FMAs, local-memory (spill) traffic and 64-bit adds,
    plus ptxas's register and spill report when nvJitLink is available (it is, with numba-cuda[cu13]).
    """
    k = getattr(launch_or_kernel, "kernel", launch_or_kernel)
    opts = getattr(k, "targetoptions", {}) or {}
    kw = {key: opts[key] for key in ("fastmath", "launch_bounds") if opts.get(key) is not None}
    ptx, _ = cuda.compile_ptx(k.py_func, sig, cc=cc, **kw)
    counts = {pat: ptx.count(pat) for pat in ("ld.shared.v4.f32", "ld.shared.f32", "st.shared", "ld.global",
                                               "fma.rn", "ld.local", "st.local", "add.s64", "selp", "bar.sync")}
    out = {"ptx": ptx, "counts": counts}
    try:
        from cuda.bindings import nvjitlink

        h = nvjitlink.create(2, [f"-arch=sm_{cc[0]}{cc[1]}", "-verbose"])
        data = ptx.encode()
        nvjitlink.add_data(h, nvjitlink.InputType.PTX, data, len(data), "kernel")
        nvjitlink.complete(h)
        buf = bytearray(nvjitlink.get_info_log_size(h))
        nvjitlink.get_info_log(h, buf)
        log = buf.decode(errors="replace")
        out["ptxas"] = [ln.strip() for ln in log.splitlines() if "registers" in ln or "spill" in ln]
        import re

        m = re.search(r"[Uu]sed (\d+) registers", log)
        out["registers"] = int(m.group(1)) if m else None
        m = re.search(r"(\d+) bytes spill stores", log)
        out["spill_stores"] = int(m.group(1)) if m else None
        nvjitlink.destroy(h)
    except Exception as e:  # noqa: BLE001  (the counts above are still useful)
        out["ptxas_error"] = f"{type(e).__name__}: {e}"
    return out


def run_sweep(path=None, sizes=((2048, 2048, 2048), (4096, 4096, 4096)), configs=None, repeat=10,
              factory="warptile", check_sizes=((517, 389, 263), (520, 392, 264))) -> dict:
    """Autotuning sweep (real GPU only): check and time every shape in ``SWEEP`` (or ``configs``, built by
    ``FACTORIES[factory]``) with the bench's own timer (L2 flushed, CUDA events, median), next to cuBLAS,
    and write the results as JSON. The check sizes cover the guarded path (K, N not multiples of 4) and the
    16-byte one (multiples of 4, with edge blocks)."""
    import json

    from .. import bench
    from ..parity import check_variant
    from ..registry import Variant, get_op

    if device.MODE != "gpu":
        raise RuntimeError("the sweep needs the real GPU")
    op = get_op("gemm")
    out = {"meta": bench.environment(), "factory": factory, "rows": []}
    make = FACTORIES[factory]
    cands = [("cublas", None)] + [(str(c), c) for c in (configs or SWEEP)]
    for size in sizes:
        sets = bench._prepare(op, size, "float32", "gpu", 2)
        for name, cfg in cands:
            fn = gemm_cublas if cfg is None else make(**cfg)
            row = {"config": cfg, "name": name, "size": list(size)}
            if cfg is not None:
                v = Variant("gemm", "gpu", "sweep", fn)
                row["check_ok"] = all(check_variant(v, op, s).ok for s in check_sizes)
                row["registers"] = _one(fn.kernel.get_regs_per_thread())
                row["local_bytes"] = _one(fn.kernel.get_local_mem_per_thread())
            t = float(np.median(bench.time_gpu(fn, sets, repeat=repeat)))
            row.update(median_s=t, gflops=op.flops(size) / t / 1e9)
            out["rows"].append(row)
            print(f"{size} {name}: {row['gflops']:.0f} GFLOP/s",
                  {k: row.get(k) for k in ("check_ok", "registers", "local_bytes")},
                  flush=True)
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    return out


def _one(d):
    """numba returns {signature: value} when a kernel has several compiled overloads."""
    return next(iter(d.values())) if isinstance(d, dict) and d else d


def resource_report(path=None) -> list:
    """Registers and local memory (spills) per thread of every GPU rung, as compiled for this GPU."""
    import json

    from ..registry import variants

    rows = []
    A = cuda.to_device(np.ones((70, 30), np.float32))
    B = cuda.to_device(np.ones((30, 50), np.float32))
    C = cuda.to_device(np.zeros((70, 50), np.float32))
    for v in variants("gemm", "gpu", baselines=False):
        v.fn(C, A, B)  # compiles for the real argument types
        for k, _ in v.ptx:
            rows.append({"variant": v.name, "registers": _one(k.get_regs_per_thread()),
                         "local_bytes": _one(k.get_local_mem_per_thread()),
                         "shared_bytes": _one(k.get_shared_mem_per_block())})
            print(rows[-1], flush=True)
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


def dump_sass(outdir, names=("blocktile2d", "hinted", "dbuf")) -> None:
    """Write the SASS (the GPU's real machine code, via nvdisasm) of some rungs to ``outdir``.

    Needs a real GPU and the CUDA toolkit's nvdisasm; counts of the instructions that matter are
    printed: LDS (scalar shared loads), LDS.128 (16-byte ones), FFMA, and local-memory LDL/STL.
    """
    import os
    import re

    from ..registry import get_variant

    A = cuda.to_device(np.ones((70, 30), np.float32))
    B = cuda.to_device(np.ones((30, 50), np.float32))
    C = cuda.to_device(np.zeros((70, 50), np.float32))
    for name in names:
        v = get_variant(f"gemm/gpu/{name}")
        v.fn(C, A, B)
        k = v.ptx[0][0]
        sass = _one(k.inspect_sass())
        with open(os.path.join(outdir, f"gemm_sass_{name}.txt"), "w") as f:
            f.write(sass)
        counts = {op: len(re.findall(pat, sass)) for op, pat in
                  (("LDS", r"\bLDS(\.32)?\s"), ("LDS.64", r"\bLDS\.64\b"), ("LDS.128", r"\bLDS\.128\b"),
                   ("FFMA", r"\bFFMA\b"), ("LDL", r"\bLDL\b"), ("STL", r"\bSTL\b"), ("IMAD", r"\bIMAD"),
                   ("IADD3", r"\bIADD3\b"))}
        print(name, counts, flush=True)


def inner_loop(ptx: str) -> str:
    """The PTX of the loop that holds a kernel's FMAs (from the label before the first FMA to the branch
    after the last): the part of the kernel that runs K/BK times per thread."""
    lines = ptx.splitlines()
    fmas = [i for i, ln in enumerate(lines) if "fma.rn" in ln]
    if not fmas:
        return ""
    lo, hi = fmas[0], fmas[-1]
    while lo > 0 and not lines[lo].startswith("$L__"):
        lo -= 1
    while hi < len(lines) - 1 and "bra" not in lines[hi]:
        hi += 1
    return "\n".join(lines[lo:hi + 1])


def write_codegen_evidence(path, sass_dir=None) -> dict:
    """Compile every GPU rung to PTX for sm_90 (no GPU needed: run with KERNELS_DEVICE=ptx), count the
    instructions that matter, ask ptxas (through nvJitLink) for registers and spills, keep the inner
    loops of rungs 5 and 6, and add the SASS counts measured on the GPU if ``sass_dir`` holds them."""
    import json
    import re
    from collections import Counter
    from pathlib import Path

    from ..registry import variants

    ev = {"note": "PTX compiled for sm_90 by numba-cuda's NVVM; registers from ptxas via nvJitLink", "ptx": [],
          "inner_loop": {}, "sass": {}}
    for v in variants("gemm", "gpu", baselines=False):
        rep = ptx_report(*v.ptx[0])
        loop = inner_loop(rep["ptx"])
        ops = Counter(ln.split()[0] for ln in loop.splitlines() if ln.strip() and not ln.startswith("$"))
        ev["ptx"].append({"variant": v.name, "rung": v.rung, "ptx_registers": rep.get("registers"),
                          "spill_stores": rep.get("spill_stores"), "counts": rep["counts"],
                          "loop_instructions": sum(ops.values()), "loop_fma": ops.get("fma.rn.ftz.f32", 0)})
        if v.name in ("blocktile2d", "hinted"):
            ev["inner_loop"][v.name] = loop
    if sass_dir:
        ev["sass_loop"] = {}
        for f in sorted(Path(sass_dir).glob("gemm_sass_*.txt")):
            name = f.stem.replace("gemm_sass_", "")
            loop = sass_inner_loop(f.read_text())
            ev["sass"][name] = {op: len(re.findall(pat, loop)) for op, pat in
                                (("LDS", r"\bLDS(\.32)?\s"), ("LDS.128", r"\bLDS\.128\b"), ("FFMA", r"\bFFMA\b"),
                                 ("IMAD", r"\bIMAD"), ("IADD3", r"\bIADD3\b"), ("LDL", r"\bLDL\b"),
                                 ("STL", r"\bSTL\b"))}
            ev["sass"][name]["all"] = len(re.findall(r"/\*[0-9a-f]{4,}\*/", loop))
            ev["sass_loop"][name] = loop
    Path(path).write_text(json.dumps(ev, indent=1) + "\n")
    return ev


def sass_inner_loop(sass: str) -> str:
    """The SASS loop (label ... backward BRA to it) that holds the most FFMAs."""
    import re

    lines = sass.splitlines()
    labels = {m.group(1): i for i, ln in enumerate(lines) if (m := re.match(r"^\s*(\.L_x_\d+):", ln))}
    best = (0, "")
    for j, ln in enumerate(lines):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", ln)
        if m and m.group(1) in labels and labels[m.group(1)] < j:
            body = lines[labels[m.group(1)]:j + 1]
            n = sum("FFMA" in b for b in body)
            if n > best[0]:
                best = (n, "\n".join(b.rstrip() for b in body if b.strip()))
    return best[1]
