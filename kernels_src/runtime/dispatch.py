"""The dispatcher: which registered kernel runs each call of a model, chosen from shape, dtype, layout and device.

A model names *roles* ("gemm", "rmsnorm", "attention", ...) and hands the dispatcher the call's arrays.
For each role a *policy* (an ordered list of rules) picks one registered variant, the first rule whose
condition holds for the call's shape and whose variant exists and runs here. The decision is cached per
(role, shapes, dtypes), so a step pays the rule walk once per distinct call, not once per launch.

Roles with a shape-aware policy: the three products of a linear layer,

    gemm     Y (M,N) = X (M,K) W (K,N)         forward and decode products
    gemm_nt  dX (M,N) = G (M,K) W^T, W (N,K)   backward to the input (and the tied LM head)
    gemm_tn  dW (M,N) = X^T G, X (K,M), G (K,N) backward to the weights: K = B*T token rows

each answered, in this order, by

    table    an entry of the device's autotune table for exactly this (role, M, N, K): its measured winner
    gemv     M <= gemv_max_m (default 1: one token): chapter 4's GEMV, once per row (no transpose for gemm_nt:
             W (N,K) is already the y = W x layout)
    splitk   K >= splitk_min_k and fewer than splitk_max_tiles 128x128 output tiles: chapter 5's rung 12
    large    everything else: chapter 5's warptile GEMM (rung 11); the simulator takes rung 2, CPUs rung 9 with
             AVX-512 (large_zmm), else rung 8

and the quantized products (qgemv_q8_0, qgemv_q4_0) go to the dequantizing GEMV of chapter 11 (weights repacked
once; K a multiple of 32): rung 10 for small products (K*N <= qgemv_split_max_weights: a decode step's, latency
bound), rung 6 for large ones. Other roles have one rule per device: the fastest correct rung that the op's chapter measured, with
a shape guard where a kernel has a limit (flash attention: head size D <= 128, 48 KiB of shared memory).

Thresholds come from the device's table (``kernels autotune`` writes it; ``tables/<device>.json``, chosen by
the GPU's name) or, without one, from :data:`DEFAULTS`. A table that names a variant the registry does not
have is refused when it is loaded (:class:`DispatchTableError`), never run as some other kernel. A call no
rule can serve raises :class:`UnsupportedCall`, naming the role, the shape and what exists.

    d = Dispatcher("gpu")            # the H100's table if this is an H100, else the defaults
    dec = d.pick("gemm", Y, X, W)    # Decision(role, variant, rule, why, entry, shape)
    d("gemm", Y, X, W)               # pick (cached) and run

Listing every call of one capstone step with its decision (``kernels dispatch --explain``) drives the model, so
it lives above it, in :mod:`kernels_src.model.explain`: the runtime never imports the model.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .. import device, registry
from ..device import ceil_div

TABLES = Path(__file__).resolve().parent / "tables"
SCHEMA = 1

# Documented defaults (used without a table, and for any threshold a table leaves out).
DEFAULTS = {
    "gemv_max_m": 1,  # GEMV for one row (a decode step at batch 1); above, a GEMM
    "splitk_min_k": 1024,  # split K only when each output sums at least this many products...
    "splitk_max_tiles": 132,  # ...and the output has fewer 128x128 tiles than the H100 has SMs
    "moe_gemv_max_slots": 8,  # MoE layer: up to this many (token, expert) slots, the no-align GEMV rung (ch 18)
    # quantized GEMV: rung 10 (packed_words) up to this many weights (the large capstone's biggest decode product
    # is 768 x 3072 = 2.4 M), rung 6 above, where the sweep at 4096^2-8192^2 measured it (ch 11)
    "qgemv_split_max_weights": 1 << 22,
}
TILE = 128  # the warptile/split-K block tile (gemm.WARPTILE), for counting output tiles

DEVICES = ("cpu", "gpu", "sim")


class DispatchError(Exception):
    """Base class of the dispatcher's errors."""


class DispatchTableError(DispatchError):
    """A dispatch table that cannot be used (unknown variant, wrong role, malformed)."""


class UnsupportedCall(DispatchError):
    """No registered variant serves this role at this shape and dtype on this device."""


# ------------------------------------------------------------------------------------------ decisions
@dataclass
class Decision:
    role: str
    variant: str  # the main kernel, "op/backend/variant"
    rule: str  # which rule fired: table, gemv, splitk, large, fixed, override, ...
    why: str  # one sentence
    shape: dict  # the call's named sizes (M, N, K for products)
    entry: dict | None = None  # the table entry that decided it (rule "table")
    kernels: tuple = ()  # every registered kernel the call runs (a transpose, then the GEMM, ...)
    fn: Callable | None = field(default=None, repr=False)

    def row(self) -> dict:
        return {"role": self.role, "shape": shape_text(self.shape), "variant": self.variant, "rule": self.rule,
                "why": self.why, "kernels": list(self.kernels),
                "entry": None if self.entry is None else {k: self.entry[k] for k in ("shape", "best", "us")
                                                          if k in self.entry}}


def shape_text(shape: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())


@dataclass
class Rule:
    """One line of a policy: if ``when(shape)`` holds, run ``variant`` (a key with ``{dev}`` for the backend)."""
    name: str
    variants: dict  # device -> variant key ("" or missing: the rule does not apply on that device)
    why: str
    when: Callable[[dict, dict], bool] | None = None  # (shape, thresholds) -> bool
    limit: str = ""  # what the condition requires, for the unsupported-call message


def _fixed(cpu, gpu, sim=None, why="", when=None, limit=""):
    return Rule("fixed", {"cpu": cpu, "gpu": gpu, "sim": sim or gpu}, why, when, limit)


# Shapes of each role's call, from its arguments (outputs first, as the registry's convention).
def _mm_shape(role, args):
    out, a, b = args[:3]
    if role == "gemm":  # Y (M,N) = X (M,K) W (K,N)
        return {"M": a.shape[0], "N": b.shape[1], "K": a.shape[1]}
    if role == "gemm_nt":  # Y (M,N) = G (M,K) W^T, W (N,K)
        return {"M": a.shape[0], "N": b.shape[0], "K": a.shape[1]}
    return {"M": a.shape[1], "N": b.shape[1], "K": a.shape[0]}  # gemm_tn: Y (M,N) = X^T G, X (K,M), G (K,N)


def _shape_of(role, args) -> dict:
    if role in MATMUL_ROLES:
        return _mm_shape(role, args)
    if role in ("attention", "attention_bwd"):
        q = args[2] if role == "attention" else args[4]
        return dict(zip("BHSD", q.shape))
    if role == "decode_attention":
        o, q, k = args[:3]
        return {"B": q.shape[0], "H": q.shape[1], "D": q.shape[2], "L": k.shape[2]}
    if role.startswith("qgemv_"):
        y, x, w = args[:3]
        return {"N": y.shape[0], "K": x.shape[0]}
    if role == "moe":  # out (T,d), x (T,d), Wr (d,E), Wg (E,d,f), Wu, W2, k, renorm
        x, wg, k = args[1], args[3], int(args[6])
        return {"T": x.shape[0], "d": x.shape[1], "f": wg.shape[2], "E": wg.shape[0], "k": k, "S": x.shape[0] * k}
    shp = getattr(args[0], "shape", ())
    return {"out": "x".join(map(str, shp))} if shp else {}


def _dtype_of(args) -> str:
    for a in args[1:]:
        dt = getattr(a, "dtype", None)
        if dt is not None and np.dtype(dt).kind == "f":
            return np.dtype(dt).name
    return "float32"


def _tiles(s):
    return ceil_div(s["M"], TILE) * ceil_div(s["N"], TILE)


MATMUL_ROLES = ("gemm", "gemm_nt", "gemm_tn")
_GEMV = {  # role -> device -> the GEMV for that layout (gemm_tn has none: its M is a feature count)
    "gemm": {"cpu": "gemv/cpu/rows8_prange", "gpu": "gemv/gpu/splitk_grid", "sim": "gemv/gpu/splitk"},
    "gemm_nt": {"cpu": "gemv_wx/cpu/rows4_prange", "gpu": "gemv_wx/gpu/warp_per_row_vec4",
                "sim": "gemv_wx/gpu/warp_per_row_smem"},
}
_LARGE = {"cpu": "gemm/cpu/packed_par", "gpu": "gemm/gpu/warptile", "sim": "gemm/gpu/coalesced"}
_LARGE_ZMM = {"cpu": "gemm/cpu/zmm_par"}  # needs AVX-512: elsewhere the next rule's rung 8
_SPLITK = {"cpu": "", "gpu": "gemm/gpu/splitk", "sim": "gemm/gpu/splitk"}


def _mm_policy(role):
    rules = []
    if role in _GEMV:
        rules.append(Rule("gemv", _GEMV[role], "M <= gemv_max_m: a matrix-vector product per row reads W once "
                          "per row at memory speed; a GEMM tile would be almost all padding (chapter 4)",
                          lambda s, t: s["M"] <= t["gemv_max_m"], "M <= gemv_max_m"))
    rules.append(Rule("splitk", _SPLITK, "K >= splitk_min_k and fewer than splitk_max_tiles output tiles: "
                      "one block per (tile, K slice) fills the SMs that whole-K tiles leave idle (chapter 5, rung 12)",
                      lambda s, t: s["K"] >= t["splitk_min_k"] and _tiles(s) < t["splitk_max_tiles"],
                      "K >= splitk_min_k and tiles < splitk_max_tiles"))
    rules.append(Rule("large_zmm", _LARGE_ZMM, "the general case on a CPU with AVX-512: a 12x32 tile of C in 24 zmm "
                      "registers (chapter 5, rung 9)"))
    rules.append(Rule("large", _LARGE, "the general case: the fastest GEMM rung for this device (chapter 5)"))
    return rules


_FLASH_D = 128  # flash tiles of chapter 9 fit the 48 KiB static shared-memory limit up to D = 128
_ROW_D = 192  # the row kernel keeps a (64, D) float32 array in shared memory: 48 KiB at D = 192
POLICIES: dict[str, list[Rule]] = {
    **{r: _mm_policy(r) for r in MATMUL_ROLES},
    "transpose": [_fixed("transpose/cpu/regs16", "transpose/gpu/smem", why="tiled through shared memory (ch 13)")],
    "rmsnorm": [_fixed("rmsnorm/cpu/simd", "rmsnorm/gpu/regs_shfl", "rmsnorm/gpu/regs",
                       why="one row per block in registers; warp shuffles on a real GPU (ch 7)")],
    "add_rmsnorm": [_fixed("add_rmsnorm/cpu/prange", "add_rmsnorm/gpu/shfl", "add_rmsnorm/gpu/smem",
                           why="residual add + the next RMSNorm in one launch; shuffle sums on a real GPU (ch 14)")],
    "rmsnorm_bwd": [_fixed("rmsnorm_bwd/cpu/pipe", "rmsnorm_bwd/gpu/regs_shfl", "rmsnorm_bwd/gpu/regs",
                           why="one row per block in registers (ch 7)")],
    "rope_qkv": [_fixed("rope_kv_write/cpu/prange", "rope_kv_write/gpu/token", why="RoPE, head split and cache "
                        "write in one pass (ch 10)")],
    "rope_qkv_bwd": [_fixed("qkv_rope_bwd/cpu/prange", "qkv_rope_bwd/gpu/thread", why="one thread per pair (ch 13)")],
    "attention": [
        _fixed("attention/cpu/microgemm", "attention/gpu/flash_shfl", "attention/gpu/row",
               why="flash tiles read by 16-byte shared loads, skipped above the causal diagonal (ch 9, rung 7); "
                   "the simulator runs the row kernel",
               when=lambda s, t: s["D"] <= _FLASH_D, limit=f"D <= {_FLASH_D}"),
        Rule("wide_head", {"cpu": "", "gpu": "attention/gpu/row", "sim": "attention/gpu/row"},
             "flash tiles do not fit 48 KiB of shared memory above D = 128: one block per query row",
             lambda s, t: s["D"] <= _ROW_D, limit=f"D <= {_ROW_D}"),
    ],
    "attention_bwd": [_fixed("attention_bwd/cpu/prange", "attention_bwd/gpu/flash2_vec",
                             why="two flash kernels (dK/dV per key tile, dQ per query tile) recomputing P, 16-byte "
                                 "shared loads, no atomics (ch 9, rung 2)",
                             when=lambda s, t: s["D"] <= _FLASH_D, limit=f"D <= {_FLASH_D}"),
                      Rule("any_head", {"cpu": "attention_bwd/cpu/prange"}, "the CPU backward has no tile limit")],
    "heads_merge": [_fixed("heads_merge/cpu/prange", "heads_merge/gpu/thread", why="a permute (ch 13)")],
    "heads_split": [_fixed("heads_split/cpu/prange", "heads_split/gpu/thread", why="a permute (ch 13)")],
    "gelu": [_fixed("gelu/cpu/simd_exp2", "gelu/gpu/ilp4", "gelu/gpu/thread", why="4 elements in flight per thread (ch 6)")],
    "gelu_bwd": [_fixed("gelu_bwd/cpu/simd_exp2", "gelu_bwd/gpu/ilp4", "gelu_bwd/gpu/thread", why="as the forward (ch 6)")],
    "add": [_fixed("axpy/cpu/prange", "axpy/gpu/stride", "axpy/gpu/thread", why="residual add = axpy with a = 1 (ch 1)")],
    "embedding": [_fixed("embedding/cpu/prange", "embedding/gpu/thread", why="a row gather (ch 13)")],
    "embedding_bwd": [_fixed("embedding_bwd/cpu/dealt", "embedding_bwd/gpu/thread",
                             why="deterministic scatter-add, a thread per column (ch 13)")],
    "cross_entropy": [_fixed("cross_entropy/cpu/simd_exp2", "cross_entropy/gpu/row",
                             why="fused softmax + loss, one row per block (ch 13)")],
    "cross_entropy_bwd": [_fixed("cross_entropy_bwd/cpu/simd_exp2", "cross_entropy_bwd/gpu/row", why="(ch 13)")],
    "sum": [_fixed("reduce_sum/cpu/simd_prange", "reduce_sum/gpu/two_pass", "reduce_sum/gpu/smem_tree",
                   why="the mean loss (ch 7)")],
    "adamw": [_fixed("adamw/cpu/prange", "adamw/gpu/fused_ilp4", "adamw/gpu/fused",
                     why="one fused pass over p, g, m, v (ch 12)")],
    "moe": [  # chapter 18's layer: router, experts, combine, as one call
        Rule("gemv", {"cpu": "", "gpu": "moe_layer/gpu/gemv", "sim": "moe_layer/gpu/gemv"},
             "T*k <= moe_gemv_max_slots (decode): no align, each slot's gate/up and down+combine as GEMVs over its "
             "experts' weights, four launches (ch 18, rung 2)",
             lambda s, t: s["S"] <= t["moe_gemv_max_slots"], "T*k <= moe_gemv_max_slots"),
        _fixed("moe_layer/cpu/course", "moe_layer/gpu/course",
               why="router, align, grouped warptile products with the gather in the load, combine (ch 18, rung 1)")],
    "decode_attention": [_fixed("decode_attention/cpu/simd", "decode_attention/gpu/bfly",
                                "decode_attention/gpu/block",
                                why="flash-decoding: the cache split over 2 blocks per SM, 16-byte rows, the step's dot "
                                "products summed by one butterfly; the rows per split follow the filled length (ch 10)")],
    **{f"qgemv_{f}": [Rule("small", {"cpu": "", "gpu": f"qgemv_{f}/gpu/packed_words",
                                     "sim": f"qgemv_{f}/gpu/packed_words"},
                           "K*N <= qgemv_split_max_weights (a decode step's products): latency bound, not DRAM bound, "
                           "so every load of a lane issued at once, several warps per long row, one 4-byte word of "
                           "quants a lane so that x is read coalesced (ch 11, rung 10; rung 11's shuffles are not yet "
                           "measured on the H100)",
                           lambda s, t: s["K"] % 32 == 0 and s["K"] * s["N"] <= t["qgemv_split_max_weights"],
                           "K a multiple of 32 and K*N <= qgemv_split_max_weights"),
                      _fixed(f"qgemv_{f}/cpu/packed_rows4", f"qgemv_{f}/gpu/packed_warp", f"qgemv_{f}/gpu/warp_per_row",
                             why="weights repacked once for 16-byte loads, a warp per output row, several loads in "
                             "flight per lane; x stays fp32 (ch 11, rung 6)",
                             when=lambda s, t: s["K"] % 32 == 0, limit="K a multiple of 32")] for f in ("q8_0", "q4_0")},
    **{f"qgemv_gelu_{f}": [Rule("small", {"cpu": "", "gpu": f"qgemv_gelu_{f}/gpu/packed_words",
                                          "sim": f"qgemv_gelu_{f}/gpu/packed_words"},
                                "the MLP's up projection and its GELU in one launch: rung 10 of chapter 11, the GELU "
                                "applied by the thread that stores each output (ch 14)",
                                lambda s, t: s["K"] % 32 == 0 and s["K"] * s["N"] <= t["qgemv_split_max_weights"],
                                "K a multiple of 32 and K*N <= qgemv_split_max_weights"),
                           _fixed(f"qgemv_gelu_{f}/cpu/fused_prange", f"qgemv_gelu_{f}/gpu/unfused",
                                  why="the product, then the GELU in place (two launches on a GPU)",
                                  when=lambda s, t: s["K"] % 32 == 0, limit="K a multiple of 32")]
       for f in ("q8_0", "q4_0")},
    **{f"{f}_{d}": [_fixed(f"{f}_{d}/cpu/fused", f"{f}_{d}/gpu/{'warp_per_block' if d == 'quantize' else 'thread_per_elem'}",
                           why="(ch 11)")]
       for f in ("q8_0", "q4_0") for d in ("quantize", "dequantize")},
}


# ------------------------------------------------------------------------------------------ tables
def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' (a table's file name)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def default_table_path(dev: str) -> Path | None:
    """$KERNELS_DISPATCH_TABLE (a path, or 'none'), else tables/<this GPU's name>.json on a real GPU."""
    env = os.environ.get("KERNELS_DISPATCH_TABLE")
    if env:
        return None if env.lower() == "none" else Path(env)
    if dev != "gpu" or device.MODE != "gpu":
        return None
    p = TABLES / f"{device_slug(device.describe()['name'])}.json"
    return p if p.exists() else None


def _role_ops(role):
    """The ops a role's variants may come from."""
    return {v.split("/")[0] for r in POLICIES[role] for v in r.variants.values() if v}


def validate_table(table: dict, where: str = "table") -> dict:
    """Check a dispatch table: known thresholds, known roles, and every variant it names registered and of
    an op that role may run. Returns the table; raises DispatchTableError naming the bad entry."""
    if not isinstance(table, dict):
        raise DispatchTableError(f"{where}: a dispatch table is a JSON object, not {type(table).__name__}")
    for k, v in (table.get("thresholds") or {}).items():
        if k not in DEFAULTS:
            raise DispatchTableError(f"{where}: unknown threshold {k!r}; known: {', '.join(DEFAULTS)}")
        if not isinstance(v, (int, float)) or v < 0:
            raise DispatchTableError(f"{where}: threshold {k} = {v!r} is not a non-negative number")
    for i, e in enumerate(table.get("entries") or []):
        role = e.get("role")
        if role not in POLICIES:
            raise DispatchTableError(f"{where}: entry {i} has unknown role {role!r}; roles: {', '.join(POLICIES)}")
        shape = e.get("shape")
        if not (isinstance(shape, list) and len(shape) == 3 and all(isinstance(x, int) for x in shape)):
            raise DispatchTableError(f"{where}: entry {i} ({role}) needs shape [M, N, K], not {shape!r}")
        for key in [e.get("best")] + list((e.get("us") or {})):
            _check_variant(key, role, f"{where}: entry {i} ({role} {'x'.join(map(str, shape))})")
    return table


def _check_variant(key, role, where):
    try:
        op, be, name = str(key).split("/")
    except ValueError:
        raise DispatchTableError(f"{where} names {key!r}, which is not an 'op/backend/variant' key") from None
    if op not in _role_ops(role):
        raise DispatchTableError(f"{where} names {key}, but role {role} runs ops {sorted(_role_ops(role))}")
    try:
        registry.get_variant(key)
    except KeyError as e:
        raise DispatchTableError(f"{where} names {key}, which is not registered ({e.args[0]})") from None


def load_table(path) -> dict:
    path = Path(path)
    try:
        table = json.loads(path.read_text())
    except FileNotFoundError:
        raise DispatchTableError(f"dispatch table {path} does not exist") from None
    except json.JSONDecodeError as e:
        raise DispatchTableError(f"dispatch table {path} is not valid JSON: {e}") from None
    return validate_table(table, str(path))


# ------------------------------------------------------------------------------------------ the dispatcher
class Dispatcher:
    """Picks and runs the variant for each call. ``dev``: 'cpu', 'gpu' (a real GPU) or 'sim' (the simulator);
    ``table``: a dict, a path, or None (the device's committed table if there is one, else the defaults);
    ``overrides``: {role: variant key} forced whatever the shape (tests, experiments);
    ``empty(shape, dtype)``: allocates the workspaces a plan needs (a transposed copy)."""

    def __init__(self, dev: str = "cpu", table=None, overrides: dict | None = None, empty=None, check=True):
        if dev not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, not {dev!r}")
        self.dev = dev
        self.check = check  # check that a picked variant runs here (off for model.explain on another machine)
        if table is None:
            path = default_table_path(dev)
            table = load_table(path) if path else None
            self.table_source = str(path) if path else "defaults (no table for this device)"
        elif isinstance(table, (str, Path)):
            self.table_source = str(table)
            table = load_table(table)
        else:
            self.table_source = "given"
            table = validate_table(table, "given table")
        self.table = table or {}
        self.thresholds = {**DEFAULTS, **(self.table.get("thresholds") or {})}
        self._entries = {(e["role"], tuple(e["shape"])): e for e in self.table.get("entries") or []}
        self.overrides = dict(overrides or {})
        for role, key in self.overrides.items():
            if role not in POLICIES:
                raise DispatchError(f"override for unknown role {role!r}; roles: {', '.join(POLICIES)}")
            _check_variant(key, role, f"override {role}")
        if empty is None:  # workspaces where the kernels run: host arrays would be copied at every launch
            empty = ((lambda shape, dtype=np.float32: np.empty(shape, dtype)) if dev == "cpu" or not check
                     else (lambda shape, dtype=np.float32: device.cuda.device_array(shape, dtype=dtype)))
        self._empty = empty
        self._ws: dict = {}
        self._cache: dict = {}

    # -- the decision
    def pick(self, role: str, *args) -> Decision:
        key = (role,) + tuple((a.shape, a.dtype.char) if hasattr(a, "shape") else type(a) for a in args)
        d = self._cache.get(key)
        if d is None:
            d = self._cache[key] = self._decide(role, args)
        return d

    def __call__(self, role, *args):
        self.pick(role, *args).fn(*args)

    def decide(self, role: str, shape: dict, dtype: str = "float32") -> Decision:
        """The decision for a role at named sizes (no arrays needed): what ``explain`` and the book show."""
        return self._decide(role, None, shape, dtype)

    def _decide(self, role, args, shape=None, dtype=None) -> Decision:
        if role not in POLICIES:
            raise UnsupportedCall(f"no dispatch policy for role {role!r}; roles: {', '.join(sorted(POLICIES))}")
        if shape is None:
            shape, dtype = _shape_of(role, args), _dtype_of(args)
        t = self.thresholds
        tried = []
        if role in self.overrides:
            return self._make(role, self.overrides[role], "override", "forced by the caller", shape)
        entry = self._entries.get((role, tuple(shape.get(k) for k in "MNK"))) if role in MATMUL_ROLES else None
        if entry is not None:
            ok, why_not = self._runs(entry["best"], dtype)
            if ok:
                us = entry.get("us") or {}
                others = ", ".join(f"{k.split('/')[-1]} {v:.0f} us" for k, v in sorted(us.items(), key=lambda kv: kv[1]))
                return self._make(role, entry["best"], "table",
                                  f"measured fastest at this shape ({others})" if others else "the table's entry",
                                  shape, entry)
            tried.append(f"table entry {entry['best']} ({why_not})")
        for rule in POLICIES[role]:
            key = rule.variants.get(self.dev)
            if not key:
                continue
            if rule.when is not None and not rule.when(shape, t):
                tried.append(f"{rule.name}: {key} needs {rule.limit or 'a condition this shape fails'}")
                continue
            ok, why_not = self._runs(key, dtype)
            if not ok:
                tried.append(f"{rule.name}: {key} ({why_not})")
                continue
            return self._make(role, key, rule.name, rule.why, shape)
        raise UnsupportedCall(
            f"no variant for role {role!r} at {shape_text(shape) or 'this shape'} ({dtype}) on device "
            f"{self.dev!r}; tried: " + "; ".join(tried or ["nothing applies on this device"]))

    def _runs(self, key, dtype):
        try:
            v = registry.get_variant(key)
        except KeyError:
            return False, "not registered"
        if dtype not in v.dtypes:
            return False, f"it takes {', '.join(v.dtypes)}, not {dtype}"
        if self.check:
            ok, why = v.available()
            if not ok:
                return False, why
        return True, ""

    # -- plans: the callable that runs a decision
    def _make(self, role, key, rule, why, shape, entry=None) -> Decision:
        v = registry.get_variant(key)
        fn, kernels = v.fn, (key,)
        op = key.split("/")[0]
        if role in MATMUL_ROLES:
            fn, kernels = self._matmul_plan(role, op, v.fn, key)
        return Decision(role, key, rule, why, shape, entry, kernels, fn)

    def _transpose(self):
        return self.pick_fixed("transpose")

    def pick_fixed(self, role):
        """The variant a shape-blind role gets on this device (its first rule that runs here)."""
        for rule in POLICIES[role]:
            key = rule.variants.get(self.dev)
            if key and self._runs(key, "float32")[0]:
                return key
        raise UnsupportedCall(f"no variant for role {role!r} on device {self.dev!r}")

    def ws(self, key, shape, dtype=np.float32):
        shape = tuple(int(s) for s in shape)
        a = self._ws.get(key)
        if a is None or a.shape != shape:
            a = self._ws[key] = self._empty(shape, dtype)
        return a

    def _matmul_plan(self, role, op, kern, key):
        tkey = self._transpose()
        tr = registry.get_variant(tkey).fn
        if op == "gemv":  # Y (M,N) = X (M,K) W (K,N), one y = x W per row
            def run(Y, X, W):
                for m in range(X.shape[0]):
                    kern(Y[m], X[m], W)
            return run, (key,)
        if op == "gemv_wx":  # Y (M,N) = G (M,K) W^T, W (N,K): y = W g per row, no transpose
            def run(Y, G, W):
                for m in range(G.shape[0]):
                    kern(Y[m], W, G[m])
            return run, (key,)
        if role == "gemm":
            return kern, (key,)
        ws = self.ws
        if role == "gemm_nt":  # Y = G W^T: transpose W (N,K) -> (K,N), then Y = G Wt
            def run(Y, G, W):
                Wt = ws(("T", W.shape), (W.shape[1], W.shape[0]))
                tr(Wt, W)
                kern(Y, G, Wt)
            return run, (tkey, key)

        def run(Y, X, G):  # gemm_tn: Y = X^T G: transpose X (K,M) -> (M,K), then Y = Xt G
            Xt = ws(("T", X.shape), (X.shape[1], X.shape[0]))
            tr(Xt, X)
            kern(Y, Xt, G)
        return run, (tkey, key)

    def default_variant(self, role) -> str:
        """The variant a role gets for a typical (large) call: what a role -> kernel table shows."""
        if role in self.overrides:
            return self.overrides[role]
        if role in MATMUL_ROLES:
            return self.decide(role, {"M": 4096, "N": 4096, "K": 4096}).variant
        try:
            return self.pick_fixed(role)
        except UnsupportedCall:
            return POLICIES[role][0].variants.get(self.dev, "")


def device_of(kind: str) -> str:
    """The dispatcher's device for a model backend kind: 'cpu', or 'gpu'/'sim' by what numba.cuda is."""
    if kind == "cpu":
        return "cpu"
    return "sim" if device.SIMULATED else "gpu"
