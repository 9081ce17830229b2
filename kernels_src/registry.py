"""The registry: the single list of operations and their implementations.

Every chapter adds a module under ``kernels_src/ops/`` that calls :func:`define_op` once and
:func:`register` for each rung of its ladder. Tests, benchmarks, the CLI, the book's tables and its
plots all enumerate this registry, so a variant exists in exactly one place.

Calling convention for every variant (the output comes first, as in a CUDA launcher)::

    fn(*outputs, *inputs)        # writes into outputs, returns nothing

``inputs`` is what the op's ``make_inputs(size, dtype, rng)`` returns; ``outputs`` are arrays shaped
like the reference's result. CPU variants get NumPy arrays; GPU variants get device arrays (the
harness copies), though a GPU launcher also accepts NumPy arrays, which numba copies for you.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from . import device

BACKENDS = ("cpu", "gpu")
Size = tuple


@dataclass
class Op:
    name: str
    reference: Callable[..., Any]  # float64 NumPy oracle: reference(*inputs) -> array or tuple of arrays
    make_inputs: Callable[..., tuple]  # make_inputs(size, dtype, rng) -> tuple of arrays/scalars
    sizes: dict  # "check", "check_sim", "bench", "bench_sim" -> list of size tuples
    flops: Callable[[Size], float]
    bytes: Callable[[Size, int], float]  # (size, itemsize) -> bytes that must move at least once
    kind: str = "memory"  # "memory" (judge by GB/s vs copy) or "compute" (GFLOP/s vs BLAS)
    tol: Any = None
    size_names: tuple = ("n",)
    title: str = ""
    chapter: int | None = None
    output_names: tuple = ("out",)
    variants: list = field(default_factory=list)
    # make_edge_inputs(size, dtype, rng) -> inputs with the values where kernels go wrong (zeros, signed
    # zeros, infinities, NaN, tiny and huge magnitudes), used by the graders' edge=True checks
    edge_inputs: Callable[..., tuple] | None = None
    # Half-precision storage (chapter 19), one entry per output: "bfloat16" (held as uint16 bit patterns),
    # "float16", or "" (the run's dtype). Outputs past the tuple's end take the run's dtype. See parity.py.
    storage: tuple = ()

    def size_label(self, size: Size) -> str:
        return "x".join(str(s) for s in size)

    def describe_size(self, size: Size) -> str:
        return " ".join(f"{n}={s}" for n, s in zip(self.size_names, size))


@dataclass
class Variant:
    op: str
    backend: str
    name: str
    fn: Callable[..., None]
    rung: int = 0
    doc: str = ""
    flops: Callable | None = None  # overrides the op's count (e.g. a kernel that recomputes)
    bytes: Callable | None = None  # overrides the op's count (e.g. an unfused pair moves more)
    tol: Any = None
    ptx: Sequence = ()  # [(cuda kernel, signature)] compiled to sm_90 PTX by `kernels ptx`
    dtypes: tuple = ("float32",)
    baseline: bool = False  # a vendor yardstick (numpy, cuBLAS), not a course kernel
    requires: Callable[[], tuple[bool, str]] | None = None  # for baselines needing torch/cupy
    edge_exempt: str = ""  # why this rung is not held to the op's edge values (e.g. an overflow demo)

    @property
    def key(self) -> str:
        return f"{self.op}/{self.backend}/{self.name}"

    @property
    def summary(self) -> str:
        return (self.doc or "").strip().split("\n")[0]

    @property
    def prediction(self) -> str:
        """The rung's prediction, as its docstring states it: the first sentence that says "predict..."
        ("" when the docstring makes none). Ladder tables print it beside the measurement."""
        import re

        doc = " ".join((self.doc or "").split())
        m = re.search(r"([^.]*\bpredict\w*\b(?:[^.]|\.\d)*\.)", doc, re.I)
        return m.group(1).strip() if m else ""

    def available(self) -> tuple[bool, str]:
        if self.backend == "gpu" and not device.GPU_VARIANTS_RUN:
            return False, f"GPU variants are off ({device.REASON})"
        if self.requires is not None:
            return self.requires()
        return True, ""


_OPS: dict[str, Op] = {}
EXERCISE_OPS: dict[str, Op] = {}  # ops that exist only as exercises: no variants, in no benchmark or table
EDGE_INPUTS: dict = {}  # op name -> make_edge_inputs(size, dtype, rng), for ops that declare it apart


def define_op(name: str, **kwargs) -> Op:
    """Declare an operation: its float64 reference, input generator, sizes and cost model."""
    op = _OPS.get(name)
    if op is not None:  # re-import (importlib.reload in a notebook): keep the variants list
        for k, v in kwargs.items():
            setattr(op, k, v)
        return op
    op = Op(name=name, **kwargs)
    _OPS[name] = op
    return op


def register(op: str, backend: str, variant: str, *, rung: int = 0, flops=None, bytes=None, tol=None,
             ptx=(), dtypes=("float32",), baseline: bool = False, requires=None, doc: str | None = None,
             edge_exempt: str = ""):
    """Decorator: add ``fn`` as implementation ``variant`` of ``op`` on ``backend``.

    GPU launchers are wrapped so that, under the simulator, they print one notice and run with the
    simulator speed-up; the wrapped launcher is what the module exports.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    if op not in _OPS:
        raise KeyError(f"register({op!r}, ...) before define_op({op!r}, ...)")

    def deco(fn):
        run = _gpu_launcher(fn) if backend == "gpu" else fn
        v = Variant(op=op, backend=backend, name=variant, fn=run, rung=rung, doc=doc or fn.__doc__ or "",
                    flops=flops, bytes=bytes, tol=tol, ptx=tuple(ptx), dtypes=tuple(dtypes),
                    baseline=baseline, requires=requires, edge_exempt=edge_exempt)
        lst = _OPS[op].variants
        for i, old in enumerate(lst):
            if old.key == v.key:
                if getattr(old.fn, "__module__", None) != getattr(fn, "__module__", None):
                    raise ValueError(f"{v.key} is registered twice ({old.fn.__module__}, {fn.__module__})")
                lst[i] = v
                break
        else:
            lst.append(v)
        lst.sort(key=lambda x: (x.backend, x.baseline is False, x.rung, x.name))
        return run

    return deco


def _gpu_launcher(fn):
    @functools.wraps(fn)
    def launch(*args, **kwargs):
        if device.MODE == "cpu":
            raise RuntimeError(f"{fn.__name__} is a GPU kernel launcher, but GPU variants are off "
                               f"({device.REASON}); unset KERNELS_DEVICE to simulate it")
        if device.MODE == "ptx":
            raise RuntimeError("KERNELS_DEVICE=ptx only compiles kernels; it cannot run them")
        device.announce()
        with device.simulator_speedup():
            return fn(*args, **kwargs)

    launch.__wrapped_launcher__ = fn
    return launch


def load_all() -> None:
    """Import every module under kernels_src.ops so that all registrations have happened."""
    import importlib

    importlib.import_module(__package__ + ".ops")  # its __init__ imports each module


def exercise_op(name: str, **kwargs) -> Op:
    """Declare an op that exists only as an exercise: the same record as :func:`define_op` (a float64
    reference, inputs, sizes, tolerance), with no ladder of variants, so it appears in no benchmark or table."""
    op = Op(name=name, **kwargs)
    EXERCISE_OPS[name] = op
    return op


def find_op(name: str) -> Op:
    """An exercise op by name, else a registered op (importing kernels_src.ops first, so that exercise
    ops declared in a chapter's ops module are known too)."""
    load_all()
    if name in EXERCISE_OPS:
        return EXERCISE_OPS[name]
    return get_op(name)


def find_edge_inputs(op: Op, *, module_fallback: bool = True):
    """``make_edge_inputs(size, dtype, rng)`` for ``op``: its own ``edge_inputs``, else one registered in
    :data:`EDGE_INPUTS`, else (with ``module_fallback``) a module-level ``make_edge_inputs`` next to its
    reference. The fallback cannot tell which of a module's ops it was written for, so the registry-wide
    edge test uses only the explicit ones."""
    import sys

    if op.edge_inputs is not None:
        return op.edge_inputs
    if op.name in EDGE_INPUTS:
        return EDGE_INPUTS[op.name]
    if not module_fallback:
        return None
    mod = sys.modules.get(getattr(op.reference, "__module__", ""), None)
    return getattr(mod, "make_edge_inputs", None)


def sprinkle(arr, rng, values):
    """Put each of ``values`` at a random position of ``arr`` (in place; fewer if ``arr`` is short): the
    building block of ``make_edge_inputs``."""
    if arr.size == 0:
        return arr
    flat = arr.reshape(-1)
    pos = rng.permutation(flat.size)[: len(values)]
    for p, v in zip(pos, values):
        flat[p] = v
    return arr


def ops() -> list[Op]:
    load_all()
    return sorted(_OPS.values(), key=lambda o: ((o.chapter if o.chapter is not None else 99), o.name))


def get_op(name: str) -> Op:
    load_all()
    try:
        return _OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; known ops: {', '.join(sorted(_OPS))}") from None


def variants(op: str | None = None, backend: str | None = None, *, baselines: bool = True) -> list[Variant]:
    out = []
    for o in ([get_op(op)] if op else ops()):
        out += [v for v in o.variants if (backend is None or v.backend == backend) and (baselines or not v.baseline)]
    return out


def get_variant(key: str) -> Variant:
    """Look up ``"op/backend/variant"``."""
    op, backend, name = key.split("/")
    for v in get_op(op).variants:
        if v.backend == backend and v.name == name:
            return v
    raise KeyError(f"no variant {key!r}; {op} has: {', '.join(v.key for v in get_op(op).variants)}")
