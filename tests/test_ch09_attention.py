"""Chapter 9: attention. The reference against a finite-difference derivative, the masks and their
fully-masked-row rule, GQA, the edge inputs on every stable rung, and the determinism of the backward.
(The generic registry tests already check every variant on the op's sizes.)"""
import warnings

import numpy as np
import pytest

import kernels_src
from kernels_src import device, parity
from kernels_src.figures import attention as F
from kernels_src.ops import attention as A


def _inputs(size, seed=0, dtype=np.float64):
    return A.make_inputs(size, np.dtype(dtype), np.random.default_rng(seed))


def test_reference_matches_textbook_formula():
    q, k, v, kv, c = _inputs((1, 1, 1, 4, 6, 8, 0))
    s = q[0, 0] @ k[0, 0].T / np.sqrt(8)
    p = np.exp(s) / np.exp(s).sum(-1, keepdims=True)
    o, lse = A.reference(q, k, v, kv, c)
    np.testing.assert_allclose(o[0, 0], p @ v[0, 0], rtol=1e-12)
    np.testing.assert_allclose(lse[0, 0], np.log(np.exp(s).sum(-1)), rtol=1e-12)


def test_causal_is_bottom_right_and_decode_sees_everything():
    vis = A.visible(3, 5, np.array([5]), 1)[0, 0]
    assert vis.tolist() == [[True, True, True, False, False], [True, True, True, True, False], [True] * 5]
    assert A.visible(1, 7, np.array([7]), 1).all()  # S = 1: one decode step attends to every key


def test_fully_masked_rows_are_zero_with_lse_minus_inf():
    q, k, v, _, _ = _inputs((2, 2, 1, 5, 3, 16, 1))  # causal with S > T: rows 0, 1 see no key
    o, lse = A.reference(q, k, v, np.array([3, 0], dtype=np.int32), 1)
    assert np.all(o[0, :, :2] == 0) and np.all(lse[0, :, :2] == -np.inf)
    assert np.all(np.isfinite(lse[0, :, 2:]))
    assert np.all(o[1] == 0) and np.all(lse[1] == -np.inf)  # kv_len = 0: every row masked


def test_gqa_equals_mha_with_repeated_kv():
    q, k, v, kv, c = _inputs((2, 6, 2, 7, 9, 16, 3))
    o1, l1 = A.reference(q, k, v, kv, c)
    o2, l2 = A.reference(q, np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1), kv, c)
    np.testing.assert_allclose(o1, o2, rtol=1e-13)
    np.testing.assert_allclose(l1, l2, rtol=1e-13)


@pytest.mark.parametrize("size", [(1, 2, 1, 5, 7, 4, 3), (2, 2, 2, 4, 4, 3, 1), (1, 1, 1, 1, 6, 5, 0)])
def test_backward_reference_matches_finite_differences(size):
    """Central differences of f = sum(dO * O(Q, K, V)) in float64 against the analytic dQ, dK, dV."""
    rng = np.random.default_rng(1)
    q, k, v, kv, c = _inputs(size, seed=2)
    do = rng.standard_normal(q.shape)
    o, lse = A.reference(q, k, v, kv, c)
    grads = A.reference_bwd(do, q, k, v, o, lse, kv, c)

    def f(q_, k_, v_):
        return float(np.sum(do * A.reference(q_, k_, v_, kv, c)[0]))

    h = 1e-6
    for which, g in enumerate(grads):
        args = [q, k, v]
        x = args[which]
        num = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            xp, xm = x.copy(), x.copy()
            xp[idx] += h
            xm[idx] -= h
            num[idx] = (f(*[xp if w == which else a for w, a in enumerate(args)])
                        - f(*[xm if w == which else a for w, a in enumerate(args)])) / (2 * h)
        np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-8, err_msg=f"gradient {which} (0=dQ, 1=dK, 2=dV)")


def test_visible_pairs_counts_the_masks():
    assert A.visible_pairs((1, 1, 1, 4, 4, 8, 1)) == 10
    assert A.visible_pairs((2, 1, 1, 3, 6, 8, 2)) == 3 * 4 + 3 * 6
    q, k, v, kv, c = _inputs((3, 1, 1, 9, 12, 8, 3))
    assert A.visible_pairs((3, 1, 1, 9, 12, 8, 3)) == int(A.visible(9, 12, kv, c).sum())


def _stable_variants(op, backend=None):
    keys = [v.key for v in kernels_src.get_op(op).variants
            if not v.baseline and v.name != "naive" and (backend is None or v.backend == backend)]
    return keys


EDGE_SIZES = {"cpu": [(3, 2, 1, 9, 7, 16, 1), (4, 2, 2, 1, 13, 32, 2), (3, 4, 2, 11, 11, 64, 3)],
              "gpu": [(3, 2, 1, 6, 5, 16, 1), (3, 2, 2, 1, 9, 16, 2)]}


def _check(key, op_name, size, inputs, tol):
    v = kernels_src.get_variant(key)
    ok, why = v.available()
    if not ok:
        pytest.skip(why)
    op = kernels_src.get_op(op_name)
    refs = parity.reference_outputs(op, inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        outs = parity.run_variant(v, inputs, parity.empty_outputs(refs, "float32"))
    for name, got, ref in zip(op.output_names, outs, refs):
        rep = parity.compare(name, got, ref, *tol)
        assert rep.ok, f"{key} {size}\n" + "\n".join(rep.lines())
    return outs


@pytest.mark.parametrize("key", _stable_variants("attention") + ["attention/cpu/naive"])
def test_forward_edge_inputs(key, sim_greenlets):  # results only (races: test_registry)
    """Logits near +-1e4, exact ties, kv_len = 0 (fully masked rows), causal with S > T, S = 1."""
    backend = key.split("/")[1]
    for n, size in enumerate(EDGE_SIZES[backend]):
        inputs = A.make_edge_inputs(size, np.dtype(np.float32), np.random.default_rng(n))
        _check(key, "attention", size, inputs, A.tol(size, np.float32))


@pytest.mark.parametrize("key", _stable_variants("attention_bwd") + _stable_variants("attention_bwd_dv"))
def test_backward_edge_inputs(key, sim_greenlets):  # results only (races: test_registry)
    op_name = key.split("/")[0]
    backend = key.split("/")[1]
    for n, size in enumerate(EDGE_SIZES[backend]):
        inputs = A.make_edge_inputs_bwd(size, np.dtype(np.float32), np.random.default_rng(n))
        # logits of 1e4 are rounded to ~1e-3 in float32 (and so is L): P = exp(s - L) carries that as a
        # relative error, which the generic backward tolerance is not meant to absorb
        _check(key, op_name, size, inputs, (5e-3, 5e-3))


@pytest.mark.parametrize("key", ["attention_bwd/cpu/prange", "attention_bwd/gpu/flash2", "attention_bwd/gpu/flash2_vec"])
def test_backward_is_deterministic(key):
    """No atomics: two runs give the same bits (GQA, so several heads feed each dK, dV)."""
    size = (2, 4, 2, 9, 11, 16, 1) if "gpu" in key else (2, 4, 2, 37, 41, 32, 3)
    inputs = A.make_inputs_bwd(size, np.dtype(np.float32), np.random.default_rng(3))
    a = _check(key, "attention_bwd", size, inputs, A.tol_bwd(size, np.float32))
    b = _check(key, "attention_bwd", size, inputs, A.tol_bwd(size, np.float32))
    for x, y in zip(a, b):
        assert np.array_equal(x, y)


def test_causal_rungs_skip_work_on_cpu():
    """The online rung stops at the diagonal: with a causal mask it does about half the work."""
    from kernels_src.bench import time_cpu

    size = (1, 4, 4, 192, 192, 32, 0)
    ins0 = _inputs(size, dtype=np.float32)
    ins1 = _inputs(size[:-1] + (1,), dtype=np.float32)
    o = np.empty(ins0[0].shape, np.float32)
    lse = np.empty(ins0[0].shape[:3], np.float32)
    t0 = np.median(time_cpu(A.attention_online_cpu, (o, lse, *ins0), min_time=0.05))
    t1 = np.median(time_cpu(A.attention_online_cpu, (o, lse, *ins1), min_time=0.05))
    assert t1 < 0.8 * t0


def test_flash_trace_reaches_the_reference():
    q, k, v, kv, c = _inputs((1, 1, 1, 3, 20, 8, 0), seed=4)
    o, _ = A.reference(q, k, v, kv, c)
    steps = F.flash_trace(q[0, 0, 2], k[0, 0], v[0, 0], BC=6)
    assert len(steps) == 4
    np.testing.assert_allclose(steps[-1]["out"], o[0, 0, 2], rtol=1e-12)
    assert all(a["m"] <= b["m"] for a, b in zip(steps, steps[1:]))


def test_score_memory_is_quadratic_and_flash_is_not():
    m = F.score_memory(np.array([1024, 2048]))
    assert m["scores"][1] == 4 * m["scores"][0]
    assert m["qkvo"][1] == 2 * m["qkvo"][0]
    assert m["flash_block"][0] == m["flash_block"][1]


def test_flash_tiles_fit_in_shared_memory():
    for D in (16, 32, 64, 128):
        for cfg in (A._base_cfg(D), A._tuned_cfg(D)):
            assert A.make_flash_kernel(D, skip=True, **cfg).config["smem_bytes"] <= A.SMEM_LIMIT
    with pytest.raises(ValueError):
        A.make_flash_kernel(128, skip=True, BR=64, BC=64, TM=8, TN=8)


@pytest.mark.skipif(not device.SIMULATED, reason="simulator-only: the torch baselines need a real GPU")
def test_baselines_skip_without_gpu():
    v = kernels_src.get_variant("attention/gpu/sdpa_math")
    assert not v.available()[0]
