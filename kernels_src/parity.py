"""Parity: compare an implementation against the float64 NumPy reference.

Rules (they hold for every variant and every exercise):
- outputs are *poisoned* (NaN for floats; for integers a value the reference does not hold: the most
  negative one for signed types, the largest for unsigned ones, or the next one it does not hold) before
  the kernel runs, so an element the kernel never wrote cannot pass;
- NaN or Inf where the reference is finite fails; where the reference is itself non-finite the
  result must match it exactly (NaN where NaN, +inf where +inf);
- a finite element passes when ``|got - ref| <= atol + rtol * |ref|``, with (rtol, atol) chosen by
  dtype unless the op or variant says otherwise;
- inputs must come back unchanged.

A failure says where and by how much: shape, count of bad elements, max abs/rel error, and the first
mismatches as (index, expected, got).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import device

DEFAULT_TOL = {  # (rtol, atol) per output dtype
    "float64": (1e-10, 1e-12),
    "float32": (1e-5, 1e-6),
    "float16": (5e-3, 1e-3),
}
MAX_SHOWN = 5


def resolve_tol(tol, dtype, size=None) -> tuple[float, float]:
    """``tol`` may be None, (rtol, atol), {dtype_name: (rtol, atol)} or a callable(size, dtype)."""
    name = np.dtype(dtype).name
    if callable(tol):
        tol = tol(size, np.dtype(dtype))
    if isinstance(tol, dict):
        tol = tol.get(name)
    if tol is None:
        tol = DEFAULT_TOL.get(name, DEFAULT_TOL["float32"])
    rtol, atol = tol
    return float(rtol), float(atol)


# The poison is a NaN with a recognisable payload: it fails every comparison like any NaN, and its bit
# pattern (which copies and NaN arithmetic keep) tells "never written" apart from "computed a NaN".
POISON_BITS = {2: (np.uint16, 0x7E5D), 4: (np.uint32, 0x7FC0DEAD), 8: (np.uint64, 0x7FF8DEADBEEF0000)}


# Half-precision storage (chapter 19): an op may store an output as "float16" (NumPy's float16, poisoned with
# the fp16 NaN above) or as "bfloat16", which NumPy has no dtype for: a uint16 array of bf16 bit patterns (value
# = the float32 with bits h << 16). Its poison is a bf16 NaN with its own payload (exponent bits all ones,
# mantissa 0x5D), and its elements are decoded to float64 before they are compared, so NaN never passes.
BF16_POISON = 0x7FDD
STORAGE_DTYPE = {"float16": np.float16, "bfloat16": np.uint16}


def storage_of(op, k: int) -> str:
    """The storage format of output ``k`` of ``op`` ("" unless the op declares one)."""
    st = getattr(op, "storage", ()) or ()
    return st[k] if k < len(st) else ""


def stored_value(a, fmt: str = "") -> np.ndarray:
    """float64 values of an output array held in format ``fmt`` (bf16 bit patterns decoded)."""
    a = np.asarray(a)
    if fmt == "bfloat16":
        bits = np.ascontiguousarray(a, dtype=np.uint16).astype(np.uint32) << np.uint32(16)
        with np.errstate(invalid="ignore"):  # signalling-NaN patterns become quiet NaNs: still NaN
            return bits.view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def int_poison_value(dtype, avoid=None):
    """The poison of an integer output: the most negative value of a signed type, the largest of an unsigned one
    (0, the smallest, is a count, a key or an index that a kernel may rightly write), or, where ``avoid`` (the
    reference) holds that value, the nearest one past it that ``avoid`` does not hold. So a kernel that writes
    nothing always fails its check, whatever the data: an unwritten element never equals the reference."""
    dtype = np.dtype(dtype)
    info = np.iinfo(dtype)
    signed = info.min < 0
    start = np.array(info.min if signed else info.max, dtype=dtype)
    if avoid is None or np.size(avoid) == 0:
        return start[()]
    held = np.unique(np.asarray(avoid))
    span = int(info.max) - int(info.min) + 1
    if held.size >= span:
        # Every value of the type is a correct answer somewhere (a byte output such as Q8_0's can hold all 256):
        # no single poison can tell "never written" from "written"; the type's end value stays the poison.
        return start[()]
    k = 0
    while True:  # at most held.size values are held: a window of candidates at a time, never past the type
        n = min(1024, span - k)
        ut = np.dtype(f"u{dtype.itemsize}")  # steps below the type's span fit its unsigned twin
        steps = np.arange(k, k + n, dtype=np.uint64).astype(ut)
        cand = (start.view(ut) + steps).view(dtype) if signed else start - steps
        free = ~np.isin(cand, held)
        if free.any():
            return cand[np.argmax(free)]
        k += n


def poison(a: np.ndarray, fmt: str = "", avoid=None) -> np.ndarray:
    """Fill ``a`` with its poison in place and return it. ``avoid``: the reference of an integer output (its
    poison is then a value the reference does not hold, see int_poison_value)."""
    if fmt == "bfloat16":
        a.view(np.uint16).fill(BF16_POISON)
        return a
    if np.issubdtype(a.dtype, np.floating) and a.dtype.itemsize in POISON_BITS:
        utype, bits = POISON_BITS[a.dtype.itemsize]
        a.view(utype).fill(bits)
    elif np.issubdtype(a.dtype, np.floating):
        a.fill(np.nan)
    elif np.issubdtype(a.dtype, np.integer):
        a.fill(int_poison_value(a.dtype, avoid))
    else:
        a.fill(True)
    return a


def is_poison(a, fmt: str = "", avoid=None) -> np.ndarray:
    """Elementwise: does ``a`` still hold (or was it computed only from) the poison value? ``avoid``: the
    reference the integer poison was chosen against (as in :func:`poison`)."""
    a = np.asarray(a)
    if fmt == "bfloat16":
        return np.ascontiguousarray(a).view(np.uint16) == BF16_POISON
    if np.issubdtype(a.dtype, np.floating) and a.dtype.itemsize in POISON_BITS:
        utype, bits = POISON_BITS[a.dtype.itemsize]
        return np.ascontiguousarray(a).view(utype) == bits
    if np.issubdtype(a.dtype, np.integer):
        return a == int_poison_value(a.dtype, avoid)
    return np.zeros(a.shape, dtype=bool)


@dataclass
class Mismatch:
    index: tuple
    expected: float
    got: float
    unwritten: bool | None = None  # True: still the poison value; None: not known

    def __str__(self) -> str:
        if self.unwritten:
            note = "  <- never written (still the poison value)"
        elif self.unwritten is None and np.isnan(self.got) and not np.isnan(self.expected):
            note = "  <- never written? (still the poison value)"
        else:
            note = ""
        return f"index {self.index}: expected {self.expected:.7g}, got {self.got:.7g}{note}"


@dataclass
class OutputReport:
    name: str
    shape: tuple
    ok: bool
    n_bad: int = 0
    n_total: int = 0
    n_nonfinite: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    rtol: float = 0.0
    atol: float = 0.0
    mismatches: list = field(default_factory=list)
    bad_mask: np.ndarray | None = None
    problem: str = ""

    def lines(self) -> list[str]:
        if self.problem:
            return [f"{self.name}: {self.problem}"]
        head = (f"{self.name} shape {self.shape}: {self.n_bad} of {self.n_total} elements wrong"
                + (f" ({self.n_nonfinite} NaN/Inf where the reference is finite)" if self.n_nonfinite else ""))
        out = [head,
               f"  max abs err {self.max_abs:.3g}, max rel err {self.max_rel:.3g} "
               f"(allowed: |err| <= {self.atol:g} + {self.rtol:g}*|expected|)"]
        if self.mismatches:
            out.append("  first mismatches:")
            out += [f"    {m}" for m in self.mismatches]
        return out


def compare(name: str, got, ref, rtol: float, atol: float, max_shown: int = MAX_SHOWN, fmt: str = "") -> OutputReport:
    """Compare one output array against its float64 reference (``fmt``: the output's storage format)."""
    ref = np.asarray(ref)
    got = np.asarray(got)
    if got.shape != ref.shape:
        return OutputReport(name, tuple(ref.shape), False, problem=f"shape {got.shape}, expected {ref.shape}")
    if ref.size == 0:
        return OutputReport(name, ref.shape, True)
    g = stored_value(got, fmt)
    r = ref.astype(np.float64)
    fin = np.isfinite(r)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(g - r)
        rel = err / np.maximum(np.abs(r), np.finfo(np.float64).tiny)
        ok_fin = fin & np.isfinite(g) & (err <= atol + rtol * np.abs(r))
    ok_nonfin = ~fin & ((np.isnan(r) & np.isnan(g)) | (np.isinf(r) & (g == r)))
    good = ok_fin | ok_nonfin
    bad = ~good
    n_bad = int(bad.sum())
    err_fin = np.where(fin & np.isfinite(g), err, np.inf if n_bad else 0.0)
    rel_fin = np.where(fin & np.isfinite(g), rel, np.inf if n_bad else 0.0)
    rep = OutputReport(name, tuple(ref.shape), n_bad == 0, n_bad=n_bad, n_total=int(ref.size),
                       n_nonfinite=int((fin & ~np.isfinite(g)).sum()),
                       max_abs=float(np.max(np.where(fin, err_fin, 0.0))),
                       max_rel=float(np.max(np.where(fin, rel_fin, 0.0))), rtol=rtol, atol=atol)
    if n_bad:
        rep.bad_mask = bad
        unwritten = is_poison(got, fmt, avoid=ref)
        for idx in np.argwhere(bad)[:max_shown]:
            t = tuple(int(i) for i in idx)
            rep.mismatches.append(Mismatch(t, float(r[t]), float(g[t]), bool(unwritten[t])))
    return rep


@dataclass
class ParityReport:
    label: str
    size_desc: str
    dtype: str
    outputs: list = field(default_factory=list)
    problems: list = field(default_factory=list)  # mutated inputs, exceptions
    skipped: str = ""

    @property
    def ok(self) -> bool:
        return not self.skipped and not self.problems and all(o.ok for o in self.outputs)

    def __str__(self) -> str:
        if self.skipped:
            return f"SKIP {self.label} [{self.size_desc}]: {self.skipped}"
        status = "ok  " if self.ok else "FAIL"
        lines = [f"{status} {self.label} [{self.size_desc}, {self.dtype}]"]
        if not self.ok:
            for o in self.outputs:
                if not o.ok:
                    lines += ["  " + s for s in o.lines()]
            lines += ["  " + p for p in self.problems]
        return "\n".join(lines)


def as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def to_float64(inputs) -> tuple:
    return tuple(a.astype(np.float64) if isinstance(a, np.ndarray) and np.issubdtype(a.dtype, np.floating)
                 else (float(a) if isinstance(a, np.floating) else a) for a in inputs)


def reference_outputs(op, inputs) -> tuple:
    return tuple(np.asarray(r) for r in as_tuple(op.reference(*to_float64(inputs))))


def empty_outputs(refs, dtype, storage=()) -> list[np.ndarray]:
    """Poisoned outputs shaped like the references: floating ones in ``dtype``, or in the storage format that
    ``storage`` (one entry per output, as ``Op.storage``) names for them."""
    outs = []
    for k, r in enumerate(refs):
        fmt = storage[k] if k < len(storage) else ""
        if fmt and np.issubdtype(r.dtype, np.floating):
            outs.append(poison(np.empty(r.shape, dtype=STORAGE_DTYPE[fmt]), fmt))
            continue
        dt = np.dtype(dtype) if np.issubdtype(r.dtype, np.floating) else r.dtype
        outs.append(poison(np.empty(r.shape, dtype=dt), avoid=r if np.issubdtype(dt, np.integer) else None))
    return outs


def run_variant(variant, inputs, outs) -> list[np.ndarray]:
    """Run ``variant`` on host ``inputs`` writing into poisoned host ``outs``; returns host results.

    GPU variants get device copies of every array and the outputs are copied back after a sync.
    Raises AssertionError if an input array was modified.
    """
    originals = [a.copy() if isinstance(a, np.ndarray) else None for a in inputs]
    if variant.backend == "gpu":
        cuda = device.cuda
        d_in = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in inputs]
        d_out = [cuda.to_device(o) for o in outs]
        variant.fn(*d_out, *d_in)
        device.synchronize()
        results = [d.copy_to_host() for d in d_out]
        after = [d.copy_to_host() if isinstance(a, np.ndarray) else None for d, a in zip(d_in, inputs)]
    else:
        variant.fn(*outs, *inputs)
        results, after = outs, list(inputs)
    for i, (before, now) in enumerate(zip(originals, after)):
        if before is not None and not np.array_equal(before, now, equal_nan=True):
            raise AssertionError(f"input #{i} was modified by the kernel; inputs must be read-only")
    return results


def check_variant(variant, op, size, dtype="float32", seed=0, edge: bool = False) -> ParityReport:
    """``variant`` against the float64 reference at ``size`` on inputs from ``op.make_inputs`` or, with
    ``edge``, from the op's edge inputs (NaN, infinities, signed zeros, extreme magnitudes)."""
    label = variant.key
    rep = ParityReport(label, op.describe_size(size) + (", edge values" if edge else ""), np.dtype(dtype).name)
    ok, why = variant.available()
    if not ok:
        rep.skipped = why
        return rep
    rng = np.random.default_rng(seed)
    make = op.make_inputs
    if edge:
        from .registry import find_edge_inputs

        make = find_edge_inputs(op, module_fallback=False)
        if make is None:
            raise ValueError(f"{op.name} defines no edge inputs")
    inputs = as_tuple(make(size, np.dtype(dtype), rng))
    refs = reference_outputs(op, inputs)
    outs = empty_outputs(refs, dtype, op.storage)
    try:
        results = run_variant(variant, inputs, outs)
    except AssertionError as e:
        rep.problems.append(str(e))
        return rep
    except Exception as e:  # noqa: BLE001  (report any crash as a failure, with its type)
        rep.problems.append(f"raised {type(e).__name__}: {e}")
        return rep
    rtol, atol = resolve_tol(variant.tol if variant.tol is not None else op.tol, dtype, size)
    names = op.output_names if len(op.output_names) == len(refs) else [f"out{i}" for i in range(len(refs))]
    rep.outputs = [compare(n, g, r, rtol, atol, fmt=storage_of(op, k))
                   for k, (n, g, r) in enumerate(zip(names, results, refs))]
    return rep


def default_check_sizes(op, backend: str) -> list:
    if backend == "gpu" and device.SIMULATED:
        return op.sizes.get("check_sim") or op.sizes["check"]
    return op.sizes["check"]


def check(op_name=None, backend=None, variant=None, sizes=None, dtype=None, seed=0, progress=True):
    """Check every matching registered variant over its size sweep. Returns a list of ParityReports."""
    from .registry import get_op, variants

    todo = []
    for v in variants(op_name, backend):
        if variant and v.name != variant:
            continue
        op = get_op(v.op)
        for size in (sizes or default_check_sizes(op, v.backend)):
            for dt in ([dtype] if dtype else v.dtypes):
                todo.append((v, op, tuple(size), dt))
    reports = []
    it = todo
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(todo, desc="check", unit="case", leave=False)
    for v, op, size, dt in it:
        reports.append(check_variant(v, op, size, dt, seed=seed))
    return reports
