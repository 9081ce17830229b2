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


_LABEL = re.compile(r"^(\.LBB\d+_\d+):", re.M)
_JUMP = re.compile(r"^\s+j[a-z]+\s+(\.LBB\d+_\d+)", re.M)
_FMA = re.compile(r"vfn?m(?:add|sub)\d*p[sd]")


def hot_loop(asm: str) -> dict | None:
    """The loop a rung spends its time in, read from ``asm``: of the innermost loops (a backward jump to a label,
    with no other loop inside), the one with the most packed floating-point instructions (then the most vector
    loads and stores, then the most instructions). Counted per iteration: every instruction; ``vector_alu``,
    the instructions that need a vector execution unit (arithmetic, logic, compares, conversions, shuffles; not
    loads, stores, register moves or broadcasts from memory), the work the FMA ports share; packed FMAs; vector
    loads and stores of data (``loads``, ``stores``; ``nt_stores`` the non-temporal ones); reloads and stores of
    registers spilled to the stack (``spill_loads``, ``spill_stores``: more live values than registers);
    broadcasts (``vbroadcastss`` of a constant or an element); divisions and square roots; conversions
    (``vcvt*``: float32 <-> float64, float <-> int); scalar fp; calls. ``elements`` is the lanes of the widest
    register times the data stores (the data loads where it stores nothing, as a reduction), so
    ``per_element`` is the instructions the core issues for each element it writes (or reads). None where the
    code has no loop."""
    lines = asm.splitlines()
    labels, loops = {}, []
    for i, line in enumerate(lines):
        m = _LABEL.match(line)
        if m:
            labels[m.group(1)] = i
        m = _JUMP.match(line)
        if m and m.group(1) in labels:  # a jump back to a label already seen: a loop
            loops.append((labels[m.group(1)], i))
    inner = [lp for lp in loops if not any(o != lp and lp[0] <= o[0] and o[1] <= lp[1] for o in loops)]
    best = None
    for a, b in inner:
        c = Counter()
        widths = Counter()
        for line in lines[a + 1:b + 1]:
            m = _INSN.match(line)
            if not m:
                continue
            op, args = m.group(1), m.group(2).strip()
            c["insns"] += 1
            regs = re.findall(r"%([xyz]mm)\d+", args)
            width = max((_WIDTH[r] for r in regs), default=0)
            mem_last = args.endswith(")")
            has_mem = "(" in args
            stack = "(%rsp" in args  # a register spilled to the stack and read back, not data
            const = "(%rip)" in args  # the constant pool
            if op.startswith(("vbroadcast", "vpbroadcast")):
                c["broadcasts"] += 1
            elif regs and op.startswith(("vmovup", "vmovap", "vmovdq", "vmovnt", "vlddqu")) and has_mem:
                if stack:
                    c["spill_stores" if mem_last else "spill_loads"] += 1
                elif not const:
                    c["stores" if mem_last else "loads"] += 1
                    widths[width] += 1
                if op.startswith("vmovnt") and mem_last:
                    c["nt_stores"] += 1  # non-temporal: the line is written without being read first
            elif regs and has_mem and not mem_last and not const:
                c["spill_loads" if stack else "loads"] += 1  # a load folded into arithmetic
            if op.startswith("call"):
                c["calls"] += 1
            if regs and not op.startswith(("vmov", "vzero", "vlddqu")) and not (
                    op.startswith(("vbroadcast", "vpbroadcast")) and has_mem):
                c["vector_alu"] += 1  # an instruction for a vector unit (loads, stores and moves go elsewhere)
            if regs and re.fullmatch(r"v?(?:[a-z0-9]+)(ps|pd)", op) and not op.startswith(
                    ("vbroadcast", "vperm", "vshuf", "vunpck", "vmov", "vblend", "vinsert", "vextract")):
                c["packed_fp"] += 1
                widths[width] += 1
                if _FMA.fullmatch(op):
                    c["fma"] += 1
                if op.startswith(("vdiv", "vsqrt", "vrcp", "vrsqrt")):
                    c["div_sqrt"] += 1
            if regs and op.startswith("vcvt"):
                c["convert"] += 1  # float32 <-> float64 (vcvtps2pd, vcvtpd2ps) or float <-> int
            elif regs and re.fullmatch(r"v?[a-z0-9]+(ss|sd)", op) and not op.startswith(("vmov", "vbroadcast")):
                c["scalar_fp"] += 1
        key = (c["packed_fp"], c["loads"] + c["stores"], c["insns"])
        if best is None or key > best[0]:
            best = (key, c, widths)
    if best is None:
        return None
    _, c, widths = best
    bits = max(widths) if widths else 0
    lanes = bits // 32 if bits else 1
    per_iter = lanes * (c["stores"] or c["loads"] or 1)
    out = {k: c.get(k, 0) for k in ("insns", "vector_alu", "packed_fp", "fma", "loads", "stores", "broadcasts",
                                    "div_sqrt", "convert", "scalar_fp", "calls", "nt_stores", "spill_loads",
                                    "spill_stores")}
    out.update(bits=bits, elements=per_iter, per_element=c["insns"] / per_iter)
    return out


def _local_imports(fn) -> dict:
    """The names a function imports in its body (``from .gemm import gemm_packed_par`` inside a rung, so that the
    module loads only when the rung runs), bound to what they name: locals that ``__globals__`` does not hold."""
    import dis
    import importlib

    found, module, level = {}, None, 0
    package = (getattr(fn, "__module__", "") or "").rpartition(".")[0]
    for ins in dis.get_instructions(fn):
        if ins.opname == "LOAD_CONST" and isinstance(ins.argval, int):
            level = ins.argval
        elif ins.opname == "IMPORT_NAME":
            try:
                module = importlib.import_module("." * level + ins.argval, package) if level else \
                    importlib.import_module(ins.argval)
            except ImportError:
                module = None
        elif ins.opname == "IMPORT_FROM" and module is not None and hasattr(module, ins.argval):
            found[ins.argval] = getattr(module, ins.argval)
    return found


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
    ns.update(_local_imports(fn))
    out = []
    for name in list(code.co_names) + list(code.co_freevars) + list(code.co_varnames):
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
    # outputs in the op's storage format (bf16 bits, float16) where it names one, as parity and the bench pass them
    outs = [np.empty_like(o) for o in empty_outputs(reference_outputs(op, inputs), dtype, op.storage)]
    v.fn(*outs, *inputs)
    funcs = {}
    for d in _dispatchers(v.fn):
        irs = d.inspect_llvm()
        for sig, text in d.inspect_asm().items():
            funcs[f"{d.py_func.__name__}{tuple(str(t) for t in sig)}".replace("'", "")] = {
                **classify(text, irs.get(sig, "")), "hot_loop": hot_loop(text)}
    total = {"packed_fp_total": sum(f["packed_fp_total"] for f in funcs.values()),
             "scalar_fp": sum(f["scalar_fp"] for f in funcs.values()),
             "packed_int_total": sum(f["packed_int_total"] for f in funcs.values()),
             "widest_fp_bits": max([f["widest_fp_bits"] for f in funcs.values()] or [0]),
             "calls": dict(sum((Counter(f["calls"]) for f in funcs.values()), Counter())),
             "hot_loop": max((f["hot_loop"] for f in funcs.values() if f.get("hot_loop")),
                             key=lambda h: (h["packed_fp"], h["insns"]), default=None)}
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


def io_bytes(op_name: str, size, dtype: str = "float32", variant: str | None = None) -> dict:
    """The bytes an op's inputs and outputs occupy at ``size`` (as the bench allocates them), beside the bench's
    byte model (``bytes=``, what GB/s and the fraction of copy are computed from). Where the model counts every
    input and output once, ``read`` and ``written`` are the two parts of it; where it counts less or more (a
    causal mask skips half, a fused pair counts its intermediate), the outputs are still written whole, and
    ``read`` is the rest of the model."""
    from ..parity import as_tuple, empty_outputs, reference_outputs
    from ..registry import get_op, get_variant

    op = get_op(op_name)
    v = get_variant(f"{op_name}/cpu/{variant}") if variant else None
    size = tuple(size)
    inputs = as_tuple(op.make_inputs(size, np.dtype(dtype), np.random.default_rng(0)))
    outs = empty_outputs(reference_outputs(op, inputs), dtype, op.storage)
    n_in = sum(getattr(a, "nbytes", 0) for a in inputs)
    n_out = sum(o.nbytes for o in outs)
    model = float(((v and v.bytes) or op.bytes)(size, np.dtype(dtype).itemsize))
    written = min(float(n_out), model)
    return {"bytes": model, "in_bytes": n_in, "out_bytes": n_out, "read": model - written, "written": written}


def _board_child(pairs, dtype: str = "float32") -> None:
    """The child of :func:`board_asm`: one JSON line per (op, variant, size), as each is done."""
    for op_name, variant, size in pairs:
        row = {"op": op_name, "variant": variant}
        try:
            from ..registry import get_variant

            ok, why = get_variant(f"{op_name}/cpu/{variant}").available()
            if not ok:
                row["skipped"] = why
            else:
                row.update(_variant_asm_here(op_name, variant, None, dtype))
            row["io"] = io_bytes(op_name, size, dtype, variant)
        except Exception as e:  # noqa: BLE001  the parent reports it and goes on with the next op
            row["error"] = f"{type(e).__name__}: {e}"
        print(json.dumps(row), flush=True)
    try:
        copy = copy_yardstick_stores()
    except Exception as e:  # noqa: BLE001
        copy = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps({"copy_yardstick": copy}), flush=True)


def copy_yardstick_stores() -> dict:
    """The stores of the bench's parallel copy (the yardstick of every memory-bound op, bench._parallel_copy), as
    compiled here: ordinary vector stores read each line before writing it (write-allocate), non-temporal ones
    (``vmovnt*``) do not. LLVM may also turn the loop into a call of the C library's ``memcpy`` per thread
    (``"memcpy": true``), whose stores the library chooses (glibc streams large copies past a threshold set
    from the cache size)."""
    from .. import bench

    fn = bench._parallel_copy()
    a = np.arange(4099, dtype=np.float32)
    fn(np.empty_like(a), a)
    text = "".join(fn.inspect_asm().values())
    h = max((x for x in (hot_loop(t) for t in fn.inspect_asm().values()) if x),
            key=lambda x: (x["stores"], x["insns"]), default=None)
    return {"memcpy": bool(re.search(r"\bmemcpy\b", text)), "stores": h["stores"] if h else 0,
            "nt_stores": h["nt_stores"] if h else 0, "hot_loop": h}


def board_asm(rows, progress: bool = True, dtype: str = "float32") -> list:
    """For each scoreboard row ({"op", "best", "size"}), the instruction counts of its best rung (compiled at a
    check size in one child process with an empty Numba cache) and the op's byte model at the board's size; and
    the stores of the copy yardstick (:func:`copy_yardstick_stores`). Returns (rows, copy)."""
    import os
    import subprocess
    import tempfile

    from ..paths import ROOT

    spec = ";".join(f"{r['op']}:{r['best']}:{'x'.join(map(str, r['size']))}" for r in rows)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(rows), desc="cpuboard --asm", unit="op")
    out, copy = [], None
    with tempfile.TemporaryDirectory(prefix="kernels-asm-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "KERNELS_DEVICE": "cpu",
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.Popen([sys.executable, "-m", "kernels_src.tools.asm", "--board", dtype, spec],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            row = json.loads(line)
            if "copy_yardstick" in row:
                copy = row["copy_yardstick"]
                continue
            out.append(row)
            if bar is not None:
                bar.set_postfix_str(row["op"])
                bar.update(1)
        err = proc.stderr.read()
        proc.wait()
    if bar is not None:
        bar.close()
    if proc.returncode != 0 or len(out) != len(rows):
        done = {r["op"] for r in out}
        raise RuntimeError(f"cpuboard --asm: the child stopped (exit {proc.returncode}) before "
                           f"{[r['op'] for r in rows if r['op'] not in done]}:\n{err[-2000:]}")
    return out, copy


if __name__ == "__main__" and sys.argv[1] == "--board":  # the child of board_asm: --board DTYPE op:variant:size;...
    _board_child([(p.split(":")[0], p.split(":")[1], tuple(int(x) for x in p.split(":")[2].split("x")))
                  for p in sys.argv[3].split(";") if p], sys.argv[2])
elif __name__ == "__main__":  # the child of _in_child: python -m kernels_src.tools.asm OP DTYPE VARIANTS [SIZE]
    _op, _dtype, _names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    _size = tuple(int(p) for p in sys.argv[4].split("x")) if len(sys.argv) > 4 else None
    print(json.dumps({n: _variant_asm_here(_op, n, _size, _dtype) for n in _names}))
