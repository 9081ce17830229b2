"""The poison of integer outputs: a kernel that writes nothing must fail its check whatever the data, including an
unsigned output (sort keys, counts) whose reference holds 0, the type's largest value, or a run of values below it."""
import numpy as np
import pytest

from kernels_src import parity
from kernels_src.registry import Variant, get_op


def _does_nothing(*args):
    """A 'kernel' that returns without writing its outputs."""


NOTHING = Variant(op="radix_sort", backend="cpu", name="does_nothing", fn=_does_nothing)
U32_MAX = np.iinfo(np.uint32).max


def _keys_out_report(keys):
    op = get_op("radix_sort")
    inputs = (keys.astype(np.uint32), np.arange(keys.size, dtype=np.int32))
    refs = parity.reference_outputs(op, inputs)
    outs = parity.run_variant(NOTHING, inputs, parity.empty_outputs(refs, "float32"))
    return parity.compare("keys_out", outs[0], refs[0], 0.0, 0.0), outs[0], refs[0]


@pytest.mark.parametrize("keys", [
    np.zeros(37, np.uint64),                                   # every key 0: 0 was the old uint32 poison
    np.full(37, U32_MAX, np.uint64),                           # every key the largest uint32
    U32_MAX - np.arange(3000, dtype=np.uint64),                # the 3000 largest values, each once
    np.array([0, 1, U32_MAX, U32_MAX - 1, 2**31], np.uint64),  # both ends
], ids=["zeros", "max", "top-3000", "ends"])
def test_do_nothing_kernel_is_caught_on_uint32_output(keys):
    rep, got, ref = _keys_out_report(keys)
    assert got.dtype == np.uint32
    assert not rep.ok and rep.n_bad == keys.size  # every element is reported, not only some
    assert not np.isin(got, ref).any()  # the poison is a value the reference does not hold
    assert parity.is_poison(got, avoid=ref).all()  # and the report can say "never written"
    assert all(m.unwritten for m in rep.mismatches)


def test_do_nothing_kernel_fails_check_variant_on_radix_sorts_edge_keys():
    """The registered op's own edge inputs (keys 0, 1, 2^31, 2^32 - 1, ...): both outputs fail."""
    rep = parity.check_variant(NOTHING, get_op("radix_sort"), (97,), edge=True)
    assert not rep.ok
    assert [o.ok for o in rep.outputs] == [False, False]


def test_histogram_do_nothing_caught_with_empty_bins():
    """int32 counts of 0 are common (empty bins): the signed poison (int32's minimum) is never a count."""
    v = Variant(op="histogram", backend="cpu", name="does_nothing", fn=_does_nothing)
    rep = parity.check_variant(v, get_op("histogram"), (3, 50, 0))
    assert not rep.ok and rep.outputs[0].n_bad == 50


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int32, np.int64])
def test_int_poison_value_avoids_the_reference(dtype):
    info = np.iinfo(dtype)
    start = info.min if info.min < 0 else info.max
    assert parity.int_poison_value(dtype) == start
    assert parity.poison(np.empty(4, dtype))[0] == start
    step = 1 if info.min < 0 else -1
    k = 100 if info.bits == 8 else 3000  # more than the first window of 1024 candidates where the type allows
    held = np.array([start + step * j for j in range(k)] + [0], dtype=dtype)
    p = parity.int_poison_value(dtype, held)
    assert p == start + step * k and p not in held
    a = parity.poison(np.empty(5, dtype), avoid=held)
    assert (a == p).all() and parity.is_poison(a, avoid=held).all()


def test_uint8_poison_with_every_value_but_one_held():
    held = np.delete(np.arange(256, dtype=np.uint8), 17)
    assert parity.int_poison_value(np.uint8, held) == 17


def test_uint8_poison_when_the_reference_holds_every_value():
    # A Q8_0 byte output can hold all 256 values: no poison can be told from an answer, so the type's end value
    # is used (and the function returns instead of searching forever or overflowing the byte).
    held = np.arange(256, dtype=np.uint8)
    assert parity.int_poison_value(np.uint8, held) == 255
    assert parity.int_poison_value(np.int8, held.view(np.int8)) == -128
