"""The compiler door (kernels_src.compiler): which compiler builds the course's kernels, and that the optional
successor, numba-cuda-mlir, compiles every registered kernel to PTX for sm_90 with no GPU, as numba-cuda does."""
import importlib.util
import os
import subprocess
import sys

import pytest

from kernels_src import compiler, device

HAS_MLIR = importlib.util.find_spec("numba_cuda_mlir") is not None
needs_mlir = pytest.mark.skipif(not HAS_MLIR, reason="numba-cuda-mlir is not installed (Linux only; the `mlir` extra)")


def _child(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True, text=True,
                          timeout=600)


def test_the_door_names_its_compiler():
    assert compiler.NAME in ("numba-cuda", "numba-builtin", "numba-cuda-mlir")
    assert compiler.version() not in ("", "unknown")
    key = "mlir" if compiler.NAME == "numba-cuda-mlir" else compiler.NAME
    assert compiler.TRADE_OFFS[key]
    # the default stays numba-cuda wherever it is installed
    if importlib.util.find_spec("numba_cuda") is not None and "KERNELS_COMPILER" not in os.environ:
        assert compiler.NAME == "numba-cuda" and not compiler.USE_MLIR


def test_fastmath_flags_pass_through_numba_cuda_and_become_exact_under_mlir():
    flags = {"contract", "afn"}
    if compiler.USE_MLIR:
        assert compiler.fastmath(flags) is False and compiler.fastmath(True) is True
    else:
        assert compiler.fastmath(flags) == flags and compiler.fastmath(False) is False


def test_an_unknown_compiler_is_refused_in_one_clear_line():
    p = _child("import kernels_src", KERNELS_COMPILER="banana")
    assert p.returncode != 0
    assert "KERNELS_COMPILER='banana' is not one of numba-cuda, mlir" in p.stderr


def test_mlir_in_the_simulator_stays_on_numba_cuda_and_says_why():
    p = _child("from kernels_src import compiler; print(compiler.NAME, '|', compiler.REASON)",
               KERNELS_COMPILER="mlir", KERNELS_DEVICE="sim")
    assert p.returncode == 0, p.stderr
    name, reason = p.stdout.strip().split(" | ")
    assert name in ("numba-cuda", "numba-builtin") and "stays on numba-cuda" in reason


@needs_mlir
@pytest.mark.ptx
def test_mlir_load4_store4_emit_16_byte_accesses():
    """Under numba-cuda-mlir the course's load4/store4 are overloads on cuda.vector.load/store: still one
    ld.global.v4 / st.global.v4 per call, for 1-D, 2-D and 3-D arrays (never four scalar accesses)."""
    code = """
from kernels_src.compiler import cuda, load4, store4, NAME
assert NAME == "numba-cuda-mlir", NAME
def k(out, x):
    i = cuda.grid(1)
    if 4 * i + 3 < x.size:
        a, b, c, d = load4(x, i)
        store4(out, i, a + b, b, c, d)
for nd in ("::1", ":, ::1", ":, :, ::1"):
    ptx, _ = cuda.compile_ptx(k, f"void(float32[{nd}], float32[{nd}])", cc=(9, 0))
    print(nd.replace(" ", ""), ptx.count("ld.global.v4.f32"), ptx.count("st.global.v4.f32"), ptx.count("ld.global.f32"))
"""
    p = _child(code, KERNELS_COMPILER="mlir", KERNELS_DEVICE="ptx", NUMBA_ENABLE_CUDASIM="0")
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [ln.split() for ln in p.stdout.strip().splitlines()]
    assert len(rows) == 3
    for nd, v4_loads, v4_stores, scalar_loads in rows:
        assert int(v4_loads) >= 1 and int(v4_stores) >= 1 and int(scalar_loads) == 0, (nd, v4_loads, v4_stores)


MLIR_PARTS = 4  # the registry's GPU ops in groups (one child process each, ~3 CPU s to start), shared by the workers


@needs_mlir
@pytest.mark.ptx
@pytest.mark.slow
@pytest.mark.parametrize("part", range(MLIR_PARTS), ids=lambda i: f"part{i + 1}of{MLIR_PARTS}")
def test_mlir_compiles_every_registered_kernel_to_ptx(monkeypatch, part):
    """CI has no GPU, but numba-cuda-mlir can compile to PTX without one (kernels_src.compiler tells it the
    target's compute capability): every kernel of the registry must compile with it, as with numba-cuda."""
    from kernels_src.ptx import compile_registry_subprocess, registry_chunks

    from kernels_src.compiler import MLIR_GAPS

    chunks = registry_chunks(MLIR_PARTS)
    if part >= len(chunks):
        pytest.skip("fewer ops than parts")
    monkeypatch.setenv("KERNELS_COMPILER", "mlir")
    results = compile_registry_subprocess(chunks[part], timeout=1500)
    bad = [str(r) for r in results if not r.ok and r.variant not in MLIR_GAPS]
    assert results and not bad, "\n".join(bad[:10])
    failing = {r.variant for r in results if not r.ok}
    fixed = sorted(v for v in MLIR_GAPS if v.split("/")[0] in chunks[part] and v not in failing)
    assert not fixed, f"these compile with numba-cuda-mlir now: remove them from MLIR_GAPS: {fixed}"


def test_mlir_gaps_name_registered_gpu_variants():
    """The parts above check the gaps of their own ops; a gap naming no registered variant is stale."""
    from kernels_src.compiler import MLIR_GAPS
    from kernels_src.registry import variants

    keys = {v.key for v in variants(None, "gpu")}
    stale = sorted(set(MLIR_GAPS) - keys)
    assert not stale, f"MLIR_GAPS names variants that are not registered: {stale}"


def test_fast_flags_give_numbas_own_answers():
    """compiler/flagspeed.py replaces TargetConfig.values and __hash__ (faster compiles); on flags with options set,
    unset, set back to their default and copied from another config, both give what Numba's own methods give."""
    from numba.core.compiler import Flags

    from kernels_src.compiler import flagspeed

    assert "numba.core.targetconfig" in flagspeed.install() or flagspeed.ORIGINAL, "nothing was patched"
    classes = [Flags]
    try:
        from numba.cuda.flags import Flags as CudaFlags  # the numba-cuda package's own copy

        classes.append(CudaFlags)
    except ImportError:  # numba's built-in numba.cuda (macOS): no second copy
        pass
    for cls in classes:
        base = next(b for b in cls.__mro__ if b in flagspeed.ORIGINAL)
        values0, hash0 = flagspeed.ORIGINAL[base]
        a, b = cls(), cls()
        assert a.values() == values0(a) and hash(a) == hash0(a) and a == b
        a.nrt = not a.nrt  # set, different from the default
        b.nrt = b.nrt  # set, equal to the default
        assert a.values() == values0(a) and a.values()["nrt"] != cls().values()["nrt"]
        assert b.values() == values0(b) and b == cls() and a != b
        assert hash(a) == hash0(a) == hash(b) == hash0(b)
        c = cls(copy_from=a)
        assert c == a and c.values() == values0(c)
        a.discard("nrt")
        assert a == cls() and a.values() == values0(a)
