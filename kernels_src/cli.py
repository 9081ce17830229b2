"""Command line: ``python -m kernels_src`` (also installed as ``kernels``).

    kernels list [OP]                      the registry as a table
    kernels check [OP] [--backend gpu]     parity of every variant over a size sweep (exit 1 on failure)
    kernels bench OP [--backend cpu|gpu] [--sizes 1024,4096] [--json FILE]
    kernels ptx [OP]                       compile every GPU kernel to PTX for sm_90 (no GPU needed)
    kernels doctor                         what is installed, what works, and how to fix what doesn't
    kernels profile OP [--size S] [--set memory|stalls|shared|all] [--json FILE]
                                           Nsight Compute counters per variant (real GPU and ncu needed)
    kernels cpuboard [--ops a,b] [--again]  every op's best CPU rung against torch (CPU) and NumPy, one run
    kernels asm OP [--variants a,b] [--json FILE]
                                           SIMD instructions in each CPU rung's machine code (did it vectorize?)
    kernels submit exercises/ch01_axpy.md   write submissions/ch01_axpy.ipynb, the file to hand in (and to grade)
    kernels collectives sweep [--sizes 8B..1GiB] [--impl nccl,ring,oneshot] [--json FILE]
                                           all-reduce bus bandwidth across GPUs (needs 2 GPUs)

A bad value (an unknown op, variant or dtype, a size of the wrong rank or below 1, a path that does not exist) is
refused before any work with one line on stderr, ``kernels CMD: error: ...``, and exit status 2; no command
creates a directory it was not asked for (kernels_src/usage.py holds the checks).
"""
from __future__ import annotations

import sys

from . import device
from .usage import (Parser, UsageError, check_dtype, check_sizes, names, op_named, ops_with, output_file,
                    parse_sizes, positive_int, variant_names)


def _table(rows, cols) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *rows)]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    return "\n".join([fmt.format(*cols), fmt.format(*("-" * w for w in widths))] + [fmt.format(*map(str, r)) for r in rows])


def cmd_list(args) -> int:
    from .registry import ops

    if args.op:
        op_named(args.op)
    rows = []
    for op in ops():
        if args.op and op.name != args.op:
            continue
        for v in op.variants:
            rows.append([op.chapter if op.chapter is not None else "", op.name, v.backend,
                         "base" if v.baseline else v.rung, v.name, v.summary[:70]])
    if not rows:
        print(f"no variants registered{' for ' + args.op if args.op else ''}", file=sys.stderr)
        return 2
    print(_table(rows, ["ch", "op", "backend", "rung", "variant", "what it is"]))
    return 0


def cmd_check(args) -> int:
    from .parity import check
    from .registry import variants

    op = op_named(args.op) if args.op else None
    if args.sizes and op is None:
        raise UsageError("--sizes needs an OP: each op has its own number of dimensions (kernels check OP --sizes ...)")
    sizes = check_sizes(op, parse_sizes(args.sizes), "check") if op else None
    if args.variant:
        if op is not None:
            variant_names(op, args.backend, [args.variant])
        elif not any(v.name == args.variant for v in variants(None, args.backend)):
            raise UsageError(f"no op has a {args.backend or ''}{' ' if args.backend else ''}variant {args.variant!r}; "
                             "`kernels list` shows them all")
    chosen = [v for v in variants(args.op, args.backend) if not args.variant or v.name == args.variant]
    if op is not None and not chosen:
        variant_names(op, args.backend, [])  # says that op has no variants on that backend
    dtype = check_dtype(args.dtype, {d for v in chosen for d in v.dtypes},
                        f"the variants of {args.op or 'any op'}{' on ' + args.backend if args.backend else ''}")
    reports = check(args.op, args.backend, args.variant, sizes, dtype, seed=args.seed, progress=not args.quiet)
    if not reports:
        print("nothing to check: no registered variant matches", file=sys.stderr)
        return 2
    failed = [r for r in reports if not r.ok and not r.skipped]
    skipped = [r for r in reports if r.skipped]
    for r in reports:
        if not r.ok or args.verbose:
            print(r)
    ran = len(reports) - len(skipped)
    print(f"{ran - len(failed)} of {ran} checks passed"
          + (f", {len(skipped)} skipped ({skipped[0].skipped})" if skipped else "")
          + f"; GPU mode: {device.MODE}")
    if ran == 0:
        return 2
    return 1 if failed else 0


def cmd_bench(args) -> int:
    from .bench import bench, format_table, save_json

    op = op_named(args.op)
    variants = variant_names(op, args.backend, args.variants) if names(args.variants) else None
    sizes = check_sizes(op, parse_sizes(args.sizes), "bench")
    variant_names(op, args.backend, [])  # an op with no variant on this backend has nothing to time
    chosen = [v for v in op.variants if v.backend == args.backend and (not variants or v.name in variants)]
    dtype = check_dtype(args.dtype, {d for v in chosen for d in v.dtypes}, f"the {args.backend} variants of {op.name}")
    out = output_file(args.json)
    try:
        result = bench(op.name, args.backend, variants=variants, sizes=sizes, dtype=dtype, repeat=args.repeat,
                       progress=not args.quiet)
    except (KeyError, RuntimeError) as e:
        print(f"kernels bench: error: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    print(format_table(result))
    if out:
        print(f"wrote {save_json(result, out)}")
    return 0


def cmd_ptx(args) -> int:
    from .ptx import compile_registry, compile_registry_subprocess, unavailable

    if args.op:
        op = op_named(args.op)
        if not any(v.backend == "gpu" and not v.baseline for v in op.variants):
            raise UsageError(f"{op.name} has no GPU kernels to compile; ops that have: {', '.join(ops_with('gpu'))}")
    if unavailable():
        print(f"PTX check skipped: {unavailable()}")
        return 0
    results = compile_registry(args.op) if device.MODE == "ptx" else compile_registry_subprocess(args.op)
    bad = [r for r in results if not r.ok]
    for r in results:
        if not r.ok or args.verbose:
            print(r)
    print(f"{len(results) - len(bad)} of {len(results)} kernels compiled to PTX for sm_90")
    return 1 if bad or not results else 0


def cmd_doctor(args) -> int:
    from .doctor import doctor

    return doctor()


def build_parser() -> Parser:
    p = Parser(prog="kernels", description="The course's kernel library: list, check, "
                                "benchmark and compile every registered kernel.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    s = sub.add_parser("list", help="the registry as a table")
    s.add_argument("op", nargs="?")
    s.set_defaults(func=cmd_list)

    s = sub.add_parser("check", help="parity of every variant against the float64 reference")
    s.add_argument("op", nargs="?")
    s.add_argument("--backend", choices=["cpu", "gpu"])
    s.add_argument("--variant")
    s.add_argument("--sizes", help="comma-separated sizes, e.g. 1,7,1000 or 1x1x1,31x17x5")
    s.add_argument("--dtype")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.add_argument("-v", "--verbose", action="store_true", help="print passing checks too")
    s.set_defaults(func=cmd_check)

    s = sub.add_parser("bench", help="time the variants of one op")
    s.add_argument("op")
    s.add_argument("--backend", choices=["cpu", "gpu"], default="cpu")
    s.add_argument("--variants", help="comma-separated variant names (default: all)")
    s.add_argument("--sizes", help="comma-separated sizes, e.g. 1024,4096 or 512x512x512 (default: the op's)")
    s.add_argument("--dtype", default="float32")
    s.add_argument("--repeat", type=positive_int, default=20)
    s.add_argument("--json", help="also write the results (with device, versions, date) to this file, in a "
                   "directory that exists")
    s.add_argument("-q", "--quiet", action="store_true")
    s.set_defaults(func=cmd_bench)

    s = sub.add_parser("ptx", help="compile every GPU kernel to PTX for sm_90 (no GPU needed)")
    s.add_argument("op", nargs="?")
    s.add_argument("-v", "--verbose", action="store_true")
    s.set_defaults(func=cmd_ptx)

    s = sub.add_parser("doctor", help="versions, GPU, simulator, PTX: what works and how to fix the rest")
    s.set_defaults(func=cmd_doctor)

    from .tools import profile

    profile.add_parser(sub)
    from .tools import launchcost, stepprofile

    launchcost.add_parser(sub)
    stepprofile.add_parser(sub)
    from .tools import asm, autotune, cpuboard

    autotune.add_parser(sub)
    asm.add_parser(sub)
    cpuboard.add_parser(sub)
    from .tools import train_dp

    train_dp.add_parser(sub)  # train-dp: the capstone data-parallel (chapter 21)
    from .tools import submit

    submit.add_parser(sub)  # kernels submit exercises/chNN_slug.md: the .ipynb to hand in
    from .dist import sweep as collectives

    collectives.add_parser(sub)  # kernels collectives sweep: all-reduce across GPUs (course ring, one-shot, NCCL)
    for extra in EXTRA_COMMANDS:
        extra(sub)
    return p


EXTRA_COMMANDS: list = []  # functions that add subcommands: each add_commands(sub) of EXTRA_MODULES, and any other
EXTRA_MODULES = ("kernels_src.grading.cli",)  # modules above the CLI, loaded where installed; none imports this one


def main(argv=None) -> int:
    """Run one subcommand. A bad value (UsageError, or a KeyError naming an unknown op or variant) is one line
    on stderr and exit status 2, like argparse's own usage errors; the checks come before any work."""
    _load_extras()
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (UsageError, KeyError) as e:
        print(f"kernels {args.cmd}: error: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2


def _load_extras() -> None:
    import importlib

    for mod in EXTRA_MODULES:
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod and not mod.startswith(str(e.name)):
                raise
            continue
        if m.add_commands not in EXTRA_COMMANDS:
            EXTRA_COMMANDS.append(m.add_commands)
