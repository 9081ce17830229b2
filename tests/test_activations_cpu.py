"""The CPU ladder of the activations (kernels_src/ops/activations.py): every CPU rung and yardstick on the edge
values, the simd rungs compile to packed instructions without a libm call, and the GPU's scalar functions are
the ones the loop rung uses (the simd rung swaps only the math module)."""
import platform
import zlib

import pytest

from kernels_src import parity
from kernels_src.ops import activations as A
from kernels_src.registry import get_op, variants

OPS = list(A.UNARY) + list(A.BINARY) + ["swiglu_bwd", "bias_gelu"]


def _cases():
    for name in OPS:
        op = get_op(name)
        for v in variants(name, "cpu"):
            size = op.sizes["check"][-2]
            yield pytest.param(v.key, size, id=f"{v.key}-edge")


@pytest.mark.parametrize("key,size", list(_cases()))
def test_cpu_variants_on_edge_values(key, size):
    from kernels_src.registry import get_variant

    v = get_variant(key)
    if v.edge_exempt:
        pytest.skip(v.edge_exempt)
    rep = parity.check_variant(v, get_op(v.op), size, "float32", seed=zlib.crc32(key.encode()), edge=True)
    if rep.skipped:
        pytest.skip(rep.skipped)
    assert rep.ok, str(rep)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="counts x86-64 SIMD instructions")
@pytest.mark.parametrize("name", ["gelu_tanh", "gelu", "silu_bwd", "swiglu_bwd", "bias_gelu"])
def test_simd_rung_is_packed_and_calls_no_libm(name):
    from kernels_src.tools.asm import variant_asm

    r = variant_asm(name, "simd")["total"]
    assert r["widest_fp_bits"] >= 256, r
    assert not r["calls"], r["calls"]
