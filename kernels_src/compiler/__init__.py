"""The one door to the compiler: every name a kernel takes from Numba comes from here.

Kernel modules (``kernels_src/ops``, ``kernels_src/model``, ``kernels_src/runtime``) import ``cuda``, the scalar
types they use inside kernels (``float32``, ``int32``, ...), the CPU compiler (``njit``, ``prange``), the
libdevice functions and the course's intrinsics (``load4``/``store4``) from this package, never from ``numba``
directly. ``tests/test_layout.py`` fails on a kernel module that goes around it. With one door, the compiler
under the course can change in one place:

    KERNELS_COMPILER=numba-cuda   (default) NVIDIA's numba-cuda package: the real GPU, PTX without a GPU, and
                                  the CUDA simulator
    KERNELS_COMPILER=mlir         numba-cuda-mlir, numba-cuda's successor (optional: ``pip install
                                  numba-cuda-mlir``); real GPU only. The simulator and the CPU path stay on
                                  numba-cuda/numba.

Where the course runs (real GPU, simulator, CPU) is chosen first, by :mod:`kernels_src.target`, because numba
reads ``NUMBA_ENABLE_CUDASIM`` only when ``numba.cuda`` is first imported. ``numba.cuda`` is either the
``numba-cuda`` package or, where that cannot be installed (macOS), numba's own built-in CUDA target, whose
simulator runs the course's kernels the same way. :data:`NAME` says which.

What each compiler gives up is in :data:`TRADE_OFFS`; ``kernels doctor`` prints it.
"""
from __future__ import annotations

import os

from .. import target as _target  # gpu / sim / cpu / ptx, chosen before numba.cuda is imported

# ------------------------------------------------------------------------------------------ which compiler
COMPILERS = ("numba-cuda", "mlir")
TRADE_OFFS = {
    "numba-cuda": "NVIDIA's numba-cuda (maintenance mode: fixes only, no NumPy 2.5); every feature the course "
                  "uses: simulator, PTX without a GPU, 16-byte loads, inline PTX",
    "mlir": "numba-cuda-mlir, the successor: real GPU only (no simulator, no inline PTX in 0.6); torch tensors "
            "are not accepted as kernel arguments",
    "numba-builtin": "numba's own built-in numba.cuda (no numba-cuda package, as on macOS): the CUDA simulator "
                     "and the CPU kernels run; no real GPU, no PTX check",
}
# Registered variants the successor cannot compile yet, and why (tests/test_compiler.py compiles every other kernel
# with it, and fails when one of these starts to compile, so that the entry is removed).
MLIR_GAPS = {
    "scan/gpu/lookback": "cuda.threadfence has no lowering in numba-cuda-mlir 0.6 (NotImplementedError)",
    "scan_exclusive/gpu/lookback": "cuda.threadfence has no lowering in numba-cuda-mlir 0.6 (NotImplementedError)",
    "decode_attention/gpu/bfly_fused": "cuda.threadfence has no lowering in numba-cuda-mlir 0.6 (NotImplementedError)",
    "decode_attention_paged/gpu/bfly_fused": "cuda.threadfence has no lowering in numba-cuda-mlir 0.6 "
                                             "(NotImplementedError)",
    **{f"{op}/gpu/{v}": "mma.sync needs inline PTX, which numba-cuda-mlir 0.6 does not have"
       for op in ("gemm_tf32", "gemm_f16", "gemm_bf16")
       for v in ("mma_warp", "mma_smem", "mma_dbuf", "mma_wide", "mma_wide256", "mma_occ")},
    **{f"{op}/gpu/{v}": "mma.sync needs inline PTX, which numba-cuda-mlir 0.6 does not have"
       for op in ("attention_f16", "attention_bf16")
       for v in ("mma_smem", "mma_shfl", "mma_swz", "mma_dbuf", "mma_br128", "mma_ex2")},
    **{f"{k}_fp16/gpu/vec16": "fp16 bit patterns <-> float32 (halfbits.f16bits_to_f32) are an llvmlite intrinsic, "
       "which numba-cuda-mlir 0.6 cannot compile" for k in ("softmax", "softmax_bwd", "layernorm", "layernorm_bwd",
                                                         "rmsnorm", "rmsnorm_bwd", "gelu", "gelu_bwd")},
}


def _wanted() -> str:
    w = os.environ.get("KERNELS_COMPILER", "numba-cuda").strip().lower() or "numba-cuda"
    w = {"numba_cuda": "numba-cuda", "numba-cuda-mlir": "mlir", "numba_cuda_mlir": "mlir"}.get(w, w)
    if w not in COMPILERS:
        raise ValueError(f"KERNELS_COMPILER={w!r} is not one of {', '.join(COMPILERS)}")
    return w


def _numba_cuda_is_package() -> bool:
    """True when ``numba.cuda`` comes from the numba-cuda package, False for numba's built-in target."""
    from importlib import metadata

    try:
        metadata.version("numba-cuda")
        return True
    except metadata.PackageNotFoundError:
        return False


WANTED = _wanted()
USE_MLIR = WANTED == "mlir" and _target.MODE in ("gpu", "ptx")
if WANTED == "mlir" and not USE_MLIR:
    REASON = f"KERNELS_COMPILER=mlir, but GPU kernels run in the {_target.MODE} mode, which stays on numba-cuda"
else:
    REASON = f"KERNELS_COMPILER={WANTED}" if "KERNELS_COMPILER" in os.environ else "the default"

# --------------------------------------------------------------------------------- the CPU compiler (numba)
from numba import get_num_threads, njit, prange, typeof, vectorize  # noqa: E402

# ---------------------------------------------------------------------------- the CUDA compiler and its types
if USE_MLIR:
    try:
        from numba_cuda_mlir import cuda  # type: ignore[import-not-found]
        from numba_cuda_mlir.numba_cuda import types as _types  # type: ignore[import-not-found]
    except ImportError as e:  # pragma: no cover  (needs the optional package)
        raise ImportError("KERNELS_COMPILER=mlir needs numba-cuda-mlir: pip install numba-cuda-mlir "
                          f"(it was not importable: {e})") from e
    NAME = "numba-cuda-mlir"
    if _target.MODE == "ptx":  # no GPU: numba-cuda-mlir asks the driver for the host's compute capability
        import numba_cuda_mlir.tools as _mlir_tools  # type: ignore[import-not-found]

        if getattr(_mlir_tools, "_cached_cc", None) is None:
            _mlir_tools._cached_cc = (9, 0)  # the H100's, which is what the course compiles for
else:
    from numba import cuda  # noqa: E402
    from numba.core import types as _types  # noqa: E402

    NAME = "numba-cuda" if _numba_cuda_is_package() else "numba-builtin"


def version() -> str:
    from importlib import metadata

    pkg = {"numba-cuda-mlir": "numba-cuda-mlir", "numba-cuda": "numba-cuda", "numba-builtin": "numba"}[NAME]
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:  # pragma: no cover
        return "unknown"


# Scalar types for use inside kernels (shared-array dtypes, casts, signatures). Under numba-cuda these are
# numba's own, which the CPU compiler also takes; under numba-cuda-mlir they are the successor's, and CPU
# (@njit) code must use NumPy's scalars (np.float32) instead.
float16 = getattr(_types, "float16", None)
float32 = _types.float32
float64 = _types.float64
int8, int16, int32, int64 = _types.int8, _types.int16, _types.int32, _types.int64
uint8, uint16, uint32, uint64 = _types.uint8, _types.uint16, _types.uint32, _types.uint64
boolean = _types.boolean
void = _types.void
types = _types


def fastmath(flags):
    """A ``fastmath=`` value this compiler accepts: numba-cuda takes a set of LLVM flags ({"contract", "afn",
    ...}); numba-cuda-mlir takes a bool only, so a flag set becomes False there (exact IEEE math, never a
    silent relaxation of a kernel that needs ``-inf`` or NaN to survive)."""
    if USE_MLIR and not isinstance(flags, bool):
        return False
    return flags


# ------------------------------------------------------------------------------------------------ libdevice
# Correctly rounded float32 multiply and add that the compiler never contracts into an FMA, and a bit cast.
if _target.SIMULATED:
    import numpy as _np

    def int_as_float(i):
        return _np.array([i], dtype=_np.int64).astype(_np.int32).view(_np.float32)[0]

    def fmul_rn(a, b):
        return _np.float32(_np.float32(a) * _np.float32(b))

    def fadd_rn(a, b):
        return _np.float32(_np.float32(a) + _np.float32(b))
elif USE_MLIR:
    from numba_cuda_mlir.cuda import libdevice as _libdevice  # type: ignore[import-not-found]

    fmul_rn, fadd_rn, int_as_float = _libdevice.fmul_rn, _libdevice.fadd_rn, _libdevice.int_as_float
else:
    from numba.cuda import libdevice as _libdevice

    fmul_rn, fadd_rn, int_as_float = _libdevice.fmul_rn, _libdevice.fadd_rn, _libdevice.int_as_float

# byte_perm(x, y, s): PTX's prmt.b32 (one instruction): result byte n = byte (s >> 4n) & 7 of the 8 bytes of
# y:x (x bytes 0-3, y bytes 4-7). The simulator computes the same on Python integers.
if _target.SIMULATED:
    def byte_perm(x, y, s):
        b = (int(x) & 0xFFFFFFFF) | ((int(y) & 0xFFFFFFFF) << 32)
        r = 0
        for n in range(4):
            r |= ((b >> (8 * ((int(s) >> (4 * n)) & 7))) & 0xFF) << (8 * n)
        return _np.int32(r - (1 << 32) if r >= 1 << 31 else r)
else:
    byte_perm = getattr(_libdevice, "byte_perm", None)
    if byte_perm is None:  # pragma: no cover  (a compiler without it: say so where a kernel would use it)
        def byte_perm(x, y, s):
            raise NotImplementedError(f"byte_perm (prmt.b32) is missing from {NAME}'s libdevice")

# ------------------------------------------------------------------------------------ the course's intrinsics
from .vec import load4, store4  # noqa: E402
from .sysflags import flag_load, flag_store  # noqa: E402
from .inline_ptx import (dp4a, exp2_approx, ldmatrix_x4, ldmatrix_x4_trans, mma_bf16, mma_f16,  # noqa: E402
                         mma_tf32, pack_bf16x2, pack_f16x2, to_tf32)
from .halfbits import (bf16_to_f32, f16_to_f32, f16bits_to_f32, f32_as_u32, f32_to_bf16, f32_to_f16,  # noqa: E402
                       f32_to_f16bits, u32_as_f32)
from .cpubits import (cpu_dispatcher_type, float32_bits, float32_from_bits, import_torch_first,  # noqa: E402
                      numba_threads_started, transpose16x16, transpose16x16_nt, using_svml)
from .cpubits import apply_cpu_vector_bits as _apply_cpu_vector_bits  # noqa: E402
from .cpusimd import (prefetchw, sfence, vabs16, stream_head, vadd16, vdiv16, vfma16, vload16, vmul16, vsplat16,  # noqa: E402
                      vsqrt16, vstore16, vstream16, vsub16, vzero16, zmm_kernels)

# The CPU's vector width for everything Numba compiles from here on (KERNELS_CPU_VECTOR_BITS; cpubits.py).
CPU_VECTORS = _apply_cpu_vector_bits()

# Numba's compile flags hashed and compared without ~50 property calls each time (flagspeed.py: the same results;
# the PTX check spent 17 % of its time there). KERNELS_FAST_FLAGS=0 turns it off.
from .flagspeed import install as _install_fast_flags  # noqa: E402

FAST_FLAGS = _install_fast_flags()

__all__ = ["NAME", "REASON", "TRADE_OFFS", "USE_MLIR", "version", "cuda", "njit", "prange", "vectorize",
           "get_num_threads", "typeof", "float16", "float32", "float64", "int8", "int16", "int32", "int64",
           "uint8", "uint16", "uint32", "uint64", "boolean", "void", "types", "fastmath", "fmul_rn", "fadd_rn",
           "int_as_float", "byte_perm", "load4", "store4", "flag_load", "flag_store", "dp4a", "mma_tf32", "mma_f16", "mma_bf16", "to_tf32", "pack_f16x2",
           "pack_bf16x2", "exp2_approx", "ldmatrix_x4", "ldmatrix_x4_trans", "float32_from_bits",
           "bf16_to_f32", "f32_to_bf16", "f16_to_f32", "f32_to_f16", "f16bits_to_f32", "f32_to_f16bits",
           "f32_as_u32", "u32_as_f32",
           "cpu_dispatcher_type", "float32_bits", "transpose16x16", "using_svml", "numba_threads_started", "import_torch_first", "CPU_VECTORS",
           "vload16", "vstore16", "vsplat16", "vfma16", "vadd16", "vzero16", "prefetchw", "zmm_kernels",
           "vsub16", "vmul16", "vdiv16", "vsqrt16", "vstream16", "sfence", "stream_head", "vabs16", "transpose16x16_nt"]
