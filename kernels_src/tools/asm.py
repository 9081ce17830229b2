"""Look at the machine code of the CPU rungs: did the loop vectorize? (the CPU's answer to Nsight Compute)

    kernels asm OP [--variants a,b] [--size S] [--json FILE]

Each CPU variant is run once on small inputs (which compiles it), then every Numba function its wrapper
calls is read back with ``dispatcher.inspect_asm()`` (for ``prange`` loops this includes the parallel
region's body) and its instructions are counted by kind:

- ``packed_fp``: floating-point SIMD instructions on whole vector registers (``vfmadd231ps %zmm``...),
  split by register width: xmm (128 bits, 4 floats), ymm (256, 8 floats: AVX2), zmm (512, 16 floats: AVX-512);
- ``scalar_fp``: floating-point instructions on one element (``vmulss``, ``vaddsd``): the loop did not
  vectorize, or this is its remainder;
- ``packed_int``: integer SIMD (``vpmaddwd``, ``vpdpbusd``, ``vpaddd``), the int8 dot products;
- ``calls``: math functions called, read from the optimised LLVM IR (``llvm.exp.f32``: the C library's exp,
  one element per call). A libm call inside a loop means one element at a time, whatever the rest does.

Counts are of instructions in the code, not of instructions executed: they say what the compiler made of
each loop, and a measurement says how fast it runs.
"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter

import numpy as np

_INSN = re.compile(r"^\s+([a-z][a-z0-9]*)\s+([^#\n]*)", re.M)
_WIDTH = {"xmm": 128, "ymm": 256, "zmm": 512}


_MATH_CALL = re.compile(r"call [^@\n]*@((?:llvm\.)?(?:exp|exp2|log|log2|tanh|erf|erfc|pow|sqrt|sin|cos|expf|logf|tanhf|"
                        r"erff|erfcf|powf|__svml_\w+|numba_\w*(?:exp|log|tanh|erf)\w*)(?:\.[\w.]+)?)\(")


def math_calls(llvm_ir: str) -> dict:
    """Calls to math functions in the optimised LLVM IR, by callee: ``llvm.exp.f32`` is one scalar exp per
    element (the C library's, called one at a time), ``llvm.exp.v16f32`` a vector of 16 (which without a vector
    math library is still split into 16 scalar calls), ``__svml_expf16`` Intel's vector library."""
    return dict(sorted(Counter(_MATH_CALL.findall(llvm_ir)).items()))


def classify(asm: str, llvm_ir: str = "") -> dict:
    """Counts of the instructions in ``asm`` (AT&T syntax, as LLVM prints it for x86-64) by kind and width."""
    packed = Counter()
    scalar = 0
    pint = Counter()
    mnemonics = Counter()
    for m in _INSN.finditer(asm):
        op, args = m.group(1), m.group(2)
        regs = re.findall(r"%([xyz]mm)\d+", args)
        if not regs:
            continue
        width = max(_WIDTH[r] for r in regs)
        if re.fullmatch(r"v?(?:[a-z0-9]+)(ps|pd|ph)", op) and not op.startswith(("vbroadcast", "vperm", "vshuf",
                                                                                  "vunpck", "vmov", "vblend",
                                                                                  "vinsert", "vextract")):
            packed[width] += 1
            mnemonics[op] += 1
        elif re.fullmatch(r"v?[a-z0-9]+(ss|sd|sh)", op) and not op.startswith(("vmov", "vbroadcast")):
            scalar += 1
            mnemonics[op] += 1
        elif op.startswith("vp") and not op.startswith(("vpermq", "vpshuf", "vpbroadcast", "vpinsr", "vpextr")):
            pint[width] += 1
            mnemonics[op] += 1
    return {"packed_fp": {f"{w}bit": n for w, n in sorted(packed.items())},
            "packed_fp_total": sum(packed.values()), "widest_fp_bits": max(packed) if packed else 0,
            "scalar_fp": scalar,
            "packed_int": {f"{w}bit": n for w, n in sorted(pint.items())}, "packed_int_total": sum(pint.values()),
            "calls": math_calls(llvm_ir),
            "top": dict(mnemonics.most_common(8))}


def _dispatchers(fn, seen=None) -> list:
    """The Numba CPU functions ``fn`` calls: itself if it is one, and the ones named in its code (globals and
    closure cells), followed through Numba functions and the course's plain Python helpers."""
    from ..compiler import cpu_dispatcher_type

    CPUDispatcher = cpu_dispatcher_type()
    seen = set() if seen is None else seen
    if id(fn) in seen:
        return []
    seen.add(id(fn))
    if isinstance(fn, CPUDispatcher):  # itself, then the Numba functions it calls (compiled separately)
        return [fn] + _dispatchers(fn.py_func, seen)
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    ns = dict(getattr(fn, "__globals__", {}))
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
        try:
            ns[name] = cell.cell_contents
        except ValueError:
            pass
    out = []
    for name in list(code.co_names) + list(code.co_freevars):
        obj = ns.get(name)
        if isinstance(obj, CPUDispatcher):
            out += _dispatchers(obj, seen)
        elif callable(obj) and getattr(obj, "__module__", "").startswith("kernels_src.ops") and len(seen) < 50:
            out += _dispatchers(obj, seen)
    return out


def _variant_asm_here(op_name: str, variant: str, size=None, dtype: str = "float32") -> dict:
    """Compile one CPU variant in this process (by running it on ``size``, default the op's largest check size)
    and count the instructions of every Numba function it calls. Code Numba loaded from its on-disk cache
    cannot be inspected, which is why :func:`variant_asm` runs this in a child with an empty cache."""
    from ..parity import as_tuple, empty_outputs, reference_outputs
    from ..registry import get_op, get_variant

    op = get_op(op_name)
    v = get_variant(f"{op_name}/cpu/{variant}")
    size = tuple(size or op.sizes["check"][-1])
    inputs = as_tuple(op.make_inputs(size, np.dtype(dtype), np.random.default_rng(0)))
    outs = [np.empty_like(o) for o in empty_outputs(reference_outputs(op, inputs), dtype)]
    v.fn(*outs, *inputs)
    funcs = {}
    for d in _dispatchers(v.fn):
        irs = d.inspect_llvm()
        for sig, text in d.inspect_asm().items():
            funcs[f"{d.py_func.__name__}{tuple(str(t) for t in sig)}".replace("'", "")] = classify(text, irs.get(sig, ""))
    total = {"packed_fp_total": sum(f["packed_fp_total"] for f in funcs.values()),
             "scalar_fp": sum(f["scalar_fp"] for f in funcs.values()),
             "packed_int_total": sum(f["packed_int_total"] for f in funcs.values()),
             "widest_fp_bits": max([f["widest_fp_bits"] for f in funcs.values()] or [0]),
             "calls": dict(sum((Counter(f["calls"]) for f in funcs.values()), Counter()))}
    return {"op": op_name, "variant": variant, "size": list(size), "functions": funcs, "total": total,
            "baseline": v.baseline}


def _course_rungs(op_name: str) -> list[str]:
    from ..registry import get_op

    return [v.name for v in get_op(op_name).variants if v.backend == "cpu" and not v.baseline]


_RESULTS: dict = {}  # (op, variant, size, dtype) -> counts


def _in_child(op_name: str, size, dtype: str, variants) -> dict:
    """The given CPU rungs of ``op_name``, counted in a fresh Python process whose Numba cache is empty."""
    import os
    import subprocess
    import tempfile

    from ..paths import ROOT

    with tempfile.TemporaryDirectory(prefix="kernels-asm-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "KERNELS_DEVICE": "cpu",
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, "-m", "kernels_src.tools.asm", op_name, dtype, ",".join(variants)] + \
            (["x".join(map(str, size))] if size else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"kernels asm {op_name}: the child failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def variant_asm(op_name: str, variant: str, size=None, dtype: str = "float32") -> dict:
    """Instruction counts of one CPU rung (see the module's docstring), compiled in a child process with an
    empty Numba cache; later calls for the same rung and size reuse the result."""
    if variant not in _course_rungs(op_name):
        raise KeyError(f"{op_name}/cpu has no course rung {variant!r}; known: {_course_rungs(op_name)}")
    key = (op_name, variant, tuple(size) if size else None, dtype)
    if key not in _RESULTS:
        _RESULTS[key] = _in_child(op_name, size, dtype, [variant])[variant]
    return _RESULTS[key]


def op_asm(op_name: str, variants=None, size=None) -> dict:
    from ..bench import environment

    chosen = [n for n in _course_rungs(op_name) if not variants or n in variants]
    if variants and set(variants) - set(chosen):
        raise KeyError(f"{op_name}/cpu has no variant(s) {sorted(set(variants) - set(chosen))}; known: "
                       f"{_course_rungs(op_name)}")
    found = _in_child(op_name, size, "float32", chosen)  # one child for them all
    return {"op": op_name, "meta": environment(), "rows": [found[n] for n in chosen]}


def format_rows(result: dict) -> str:
    lines = [f"{result['op']} on {result['meta'].get('cpu_model', '?')} "
             f"(SIMD: {' '.join(result['meta'].get('simd', [])) or '?'})",
             f"{'variant':<18} {'packed fp (by width)':<28} {'scalar fp':>9} {'packed int':>10}  libm calls"]
    for r in result["rows"]:
        by_width = {}
        for f in r["functions"].values():
            for w, n in f["packed_fp"].items():
                by_width[w] = by_width.get(w, 0) + n
        widths = ", ".join(f"{n}x{w}" for w, n in sorted(by_width.items())) or "none"
        calls = ", ".join(f"{k} x{n}" for k, n in r["total"]["calls"].items()) or "-"
        lines.append(f"{r['variant']:<18} {widths:<28} {r['total']['scalar_fp']:>9} "
                     f"{r['total']['packed_int_total']:>10}  {calls}")
    return "\n".join(lines)


def add_parser(sub) -> None:
    s = sub.add_parser("asm", help="count the SIMD instructions in each CPU rung's machine code (did it vectorize?)")
    s.add_argument("op")
    s.add_argument("--variants", help="comma-separated CPU variant names (default: every course rung)")
    s.add_argument("--size", help="the input size to compile for, e.g. 1024 or 64x64x64 (default: a check size)")
    s.add_argument("--json", help="also write the counts to this file")
    s.set_defaults(func=cmd_asm)


def cmd_asm(args) -> int:
    from ..usage import UsageError, check_sizes, op_named, output_file, parse_sizes, variant_names

    op = op_named(args.op)
    rungs = _course_rungs(op.name)
    if not rungs:
        raise UsageError(f"{op.name} has no CPU course rungs to disassemble; `kernels list {op.name}` shows its variants")
    variants = variant_names(op, "cpu", args.variants, known=rungs) if args.variants else None
    size = check_sizes(op, parse_sizes(args.size), "check")
    if size and len(size) != 1:
        raise UsageError(f"--size takes one size, not {len(size)}")
    out = output_file(args.json)
    res = op_asm(op.name, variants, size[0] if size else None)
    print(format_rows(res))
    if out:
        from ..bench import save_json

        print(f"wrote {save_json(res, out)}")
    return 0


if __name__ == "__main__":  # the child of _in_child: python -m kernels_src.tools.asm OP DTYPE VARIANTS [SIZE]
    _op, _dtype, _names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    _size = tuple(int(p) for p in sys.argv[4].split("x")) if len(sys.argv) > 4 else None
    print(json.dumps({n: _variant_asm_here(_op, n, _size, _dtype) for n in _names}))
