"""Chapter 18's own promises (Mixture of Experts): the router's tie and NaN rules, the align layout on awkward
routings (one token, everything to one expert, empty experts, capacity overflow, E prime), that align is built
from chapter 15's kernels, empty experts cost no blocks, the combine is deterministic, and the backward
references are the adjoints of the forward ones. Parity of every rung is in tests/test_registry.py."""
import numpy as np
import pytest

from kernels_src import device
from kernels_src.ops import moe_align as al
from kernels_src.ops import moe_gemm as gg
from kernels_src.ops import moe_layer as ly
from kernels_src.ops import moe_route as rt
from kernels_src.parity import poison


def _route_cpu(x, Wr, k, renorm):
    T, E = x.shape[0], Wr.shape[1]
    lg = poison(np.empty((T, E), np.float32))
    w = poison(np.empty((T, k), np.float32))
    ids = poison(np.empty((T, k), np.int32))
    rt.router_cpu(lg, w, ids, x, Wr, k, renorm)
    return lg, w, ids


def test_tie_rule_lower_expert_first():
    # logits of one token, worked by hand: 2 at experts 1, 3, 4; 5 at expert 2; 0 at expert 0
    logits = np.array([[0.0, 2.0, 5.0, 2.0, 2.0]], np.float32)
    x, Wr = np.ones((1, 1), np.float32), logits.copy()
    for fn in (_route_cpu, lambda *a: tuple(r for r in rt.reference_router(*a))):
        _, _, ids = fn(x, Wr, 3, 0)
        assert np.asarray(ids).tolist() == [[2, 1, 3]]
        _, w, ids = fn(x, Wr, 5, 1)  # k = E: every expert, in the rule's order; renormalised weights sum to 1
        assert np.asarray(ids).tolist() == [[2, 1, 3, 4, 0]]
        assert np.isclose(np.asarray(w, np.float64).sum(), 1.0)


def test_nan_rule_routes_to_first_experts_and_stays_in_its_token():
    rng = np.random.default_rng(0)
    x, Wr, k, renorm = rt.make_inputs_router((6, 8, 5, 2, 1), np.float32, rng)
    x[3, 2] = np.nan
    lg, w, ids = _route_cpu(x, Wr, k, renorm)
    assert ids[3].tolist() == [0, 1] and np.isnan(w[3]).all()
    clean = np.delete(np.arange(6), 3)
    assert np.isfinite(w[clean]).all()
    _, w_ref, ids_ref = rt.reference_router(x.astype(np.float64), Wr.astype(np.float64), k, renorm)
    assert np.array_equal(ids, ids_ref)
    # the whole layer: the NaN token's output is NaN, every other token's is finite and unchanged
    xl, Wr2, Wg, Wu, W2, k2, rn = ly.make_inputs_layer((6, 8, 4, 5, 2), np.float32, rng)
    out = poison(np.empty((6, 8), np.float32))
    ly.layer_cpu_course(out, xl, Wr2, Wg, Wu, W2, k2, rn)
    xl[3, 0] = np.nan
    out2 = poison(np.empty((6, 8), np.float32))
    ly.layer_cpu_course(out2, xl, Wr2, Wg, Wu, W2, k2, rn)
    assert np.isnan(out2[3]).all()
    assert np.array_equal(out2[clean], out[clean])


def _align_cpu(ids, E, B, cap):
    S = ids.size
    P = rt.padded_rows(S, E, B)
    outs = (poison(np.empty(P, np.int32)), poison(np.empty(P // B, np.int32)), poison(np.empty(E + 1, np.int32)),
            poison(np.empty(S, np.int32)))
    al.align_sort_scan_cpu(*outs, ids, E, B, cap)
    return outs


def test_align_awkward_routings():
    # one token, two experts chosen out of 5, B = 4: worked by hand
    sid, be, off, sr = _align_cpu(np.array([[3, 1]], np.int32), 5, 4, 0)
    assert off.tolist() == [0, 0, 4, 4, 8, 8]  # experts 0, 2, 4 are empty: zero rows
    assert sid[:8].tolist() == [1, 2, 2, 2, 0, 2, 2, 2]  # slot 1 (expert 1) first; sentinel S = 2 pads
    assert be.tolist()[:2] == [1, 3] and set(be.tolist()[2:]) == {-1}
    assert sr.tolist() == [4, 0]
    # every token to expert 0 (E = 7, prime): one run, the other six experts own no block
    ids = np.zeros((13, 1), np.int32)
    sid, be, off, sr = _align_cpu(ids, 7, 4, 0)
    assert off.tolist() == [0] + [16] * 7
    assert be.tolist()[:4] == [0, 0, 0, 0] and set(be.tolist()[4:]) == {-1}
    assert sr.tolist() == list(range(13))


def test_capacity_drops_the_later_tokens():
    ids = np.array([[0], [1], [0], [0], [1], [0]], np.int32)  # expert 0: tokens 0, 2, 3, 5; expert 1: 1, 4
    sid, be, off, sr = _align_cpu(ids, 2, 2, 2)
    assert sr.tolist() == [0, 2, 1, -1, 3, -1]  # tokens 3 and 5 overflow expert 0's capacity of 2
    assert sid[:4].tolist() == [0, 2, 1, 4]
    # a dropped slot adds nothing to its token's output
    Y = np.arange(sid.size * 3, dtype=np.float32).reshape(-1, 3)
    w = np.ones((6, 1), np.float32)
    out = poison(np.empty((6, 3), np.float32))
    al.combine_cpu(out, Y, w, sr)
    assert np.all(out[[3, 5]] == 0) and np.array_equal(out[0], Y[0])


def test_align_uses_chapter_15_kernels(monkeypatch):
    from kernels_src.ops import histogram, scan, sort

    calls = []
    for mod, name in ((histogram, "hist_seq"), (scan, "scan_seq"), (sort, "radix_sort_cpu")):
        real = getattr(mod, name)

        def spy(*a, _real=real, _name=name):
            calls.append(_name)
            return _real(*a)

        monkeypatch.setattr(mod, name, spy)
    _align_cpu(rt.make_routing(50, 7, 2, 1, np.random.default_rng(1)), 7, 8, 0)
    assert {"hist_seq", "scan_seq", "radix_sort_cpu"} <= set(calls)


def test_empty_experts_cost_no_blocks():
    rng = np.random.default_rng(2)
    ids = rt.make_routing(40, 9, 2, 1, rng)  # Zipf: the last experts get few or no tokens
    ids[ids == 8] = 0
    ids[ids == 7] = 0  # experts 7 and 8 empty
    ids = np.sort(ids, axis=1)
    for t in range(ids.shape[0]):  # keep k distinct experts per token
        if ids[t, 0] == ids[t, 1]:
            ids[t, 1] = 1 if ids[t, 0] != 1 else 2
    B = 4
    sid, be, off, sr = al.reference_align(ids, 9, B, 0)
    counts = np.bincount(ids.reshape(-1), minlength=9)
    assert counts[7] == counts[8] == 0
    assert (be >= 0).sum() == sum(-(-c // B) for c in counts)  # one block per B rows of each expert, none else
    assert not np.isin([7, 8], be).any()


@pytest.mark.skipif(device.MODE == "cpu", reason="needs the GPU or the simulator")
def test_gpu_combine_is_deterministic():
    rng = np.random.default_rng(3)
    Y, w, sr = al.make_inputs_combine((9, 8, 3, 3, 4, 0, 0), np.float32, rng)
    a = poison(np.empty((9, 8), np.float32))
    b = poison(np.empty((9, 8), np.float32))
    al.combine_gpu_thread(a, Y, w, sr)
    al.combine_gpu_thread(b, Y, w, sr)
    assert np.array_equal(a, b)
    c = poison(np.empty((9, 8), np.float32))
    al.combine_cpu(c, Y, w, sr)
    assert np.array_equal(a, c)  # the same sum in the same order j = 0..k-1: the same bits


def _dot(a, b):
    return float(np.sum(np.asarray(a, np.float64) * np.asarray(b, np.float64)))


def test_backward_references_are_adjoints():
    """Y is linear in X and in W, out in Y and in w: <dY, Y> equals <dX, X>, <dW, W>, <dY, Y>, <dw, w>."""
    rng = np.random.default_rng(4)
    dY, X, W, sid, be, off, sr, k = gg.make_inputs_grouped_bwd((11, 5, 6, 4, 2, 1), np.float64, rng)
    Y = gg.reference_grouped(X.astype(float), W.astype(float), sid, be, k)
    dX, dW = gg.reference_grouped_bwd(dY.astype(float), X.astype(float), W.astype(float), sid, be, off, sr, k)
    assert np.isclose(_dot(dY, Y), _dot(dX, X)) and np.isclose(_dot(dY, Y), _dot(dW, W))
    dout, Yc, w, sr2, sid2 = al.make_inputs_combine_bwd((11, 5, 4, 2, 4, 3, 0), np.float64, rng)
    out = al.reference_combine(Yc.astype(float), w.astype(float), sr2)
    dYc, dw = al.reference_combine_bwd(dout.astype(float), Yc.astype(float), w.astype(float), sr2, sid2)
    assert np.isclose(_dot(dout, out), _dot(dYc, Yc)) and np.isclose(_dot(dout, out), _dot(dw, w))


@pytest.mark.parametrize("renorm", [0, 1])
def test_router_and_aux_gradients_by_finite_differences(renorm):
    rng = np.random.default_rng(5 + renorm)
    T, E, k = 5, 6, 3
    logits = rng.standard_normal((T, E))
    _, _, ids = rt.reference_router(logits, np.eye(E), k, renorm)
    dw = rng.standard_normal((T, k))

    def weights(lg):  # the same experts (a small step does not change the ranking)
        p = np.exp(lg - lg.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        w = np.take_along_axis(p, ids.astype(int), 1)
        return w / w.sum(1, keepdims=True) if renorm else w

    g = rt.reference_router_bwd(dw, logits, ids, renorm)
    dlb, dz = rt.reference_aux_bwd(logits, ids)
    h = 1e-6
    for t, e in [(0, 0), (2, 3), (4, 5), (1, int(ids[1, 0]))]:
        step = np.zeros_like(logits)
        step[t, e] = h
        fd = (np.sum(dw * weights(logits + step)) - np.sum(dw * weights(logits - step))) / (2 * h)
        assert np.isclose(g[t, e], fd, atol=1e-7)
        lp, lm = rt.reference_aux(logits + step, ids), rt.reference_aux(logits - step, ids)
        assert np.isclose(dlb[t, e], (lp[0] - lm[0]) / (2 * h), atol=1e-7)
        assert np.isclose(dz[t, e], (lp[1] - lm[1]) / (2 * h), atol=1e-7)


def test_balanced_routing_has_load_balancing_loss_one():
    T, E, k = 12, 4, 2
    ids = np.array([[t % E, (t + 1) % E] for t in range(T)], np.int32)  # every expert 6 of 24 slots
    lb, z = rt.reference_aux(np.zeros((T, E)), ids)
    assert np.isclose(lb, 1.0) and np.isclose(z, np.log(E) ** 2)
    losses = poison(np.empty(2, np.float32))
    rt.aux_cpu(losses, np.zeros((T, E), np.float32), ids)
    assert np.allclose(losses, [1.0, np.log(E) ** 2], rtol=1e-6)


@pytest.mark.gpu
def test_layer_matches_torch_loop_on_the_gpu():
    """On the H100: the course's layer and the torch eager loop agree at a bench shape."""
    from kernels_src.registry import get_variant

    v = get_variant("moe_layer/gpu/torch_loop")
    ok, why = v.available()
    if not ok:
        pytest.skip(why)
    rng = np.random.default_rng(6)
    args = ly.make_inputs_layer((512, 256, 384, 8, 2), np.float32, rng)
    cuda = device.cuda
    d = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    a = cuda.device_array((512, 256), np.float32)
    b = cuda.device_array((512, 256), np.float32)
    ly.layer_gpu_course(a, *d)
    v.fn(b, *d)
    ref = ly.reference_layer(*[x.astype(np.float64) if isinstance(x, np.ndarray) else x for x in args])
    np.testing.assert_allclose(a.copy_to_host(), ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(b.copy_to_host(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("renorm", [0, 1])
def test_layer_backward_reference_by_directional_differences(renorm):
    """d/dh of sum(dout * out) along a random direction, for each input, against the reference's gradients
    (continuous random inputs: no two logits close enough for a step of 1e-6 to change the routing)."""
    rng = np.random.default_rng(7 + renorm)
    T, d, f, E, k = 9, 6, 5, 4, 2
    args = [rng.standard_normal((T, d)), rng.standard_normal((d, E)), rng.standard_normal((E, d, f)) / 2,
            rng.standard_normal((E, d, f)) / 2, rng.standard_normal((E, f, d)) / 2]
    dout = rng.standard_normal((T, d))
    grads = ly.reference_layer_bwd(dout, *args, k, renorm)
    h = 1e-6
    for i, g in enumerate(grads):
        v = rng.standard_normal(args[i].shape)
        plus = [a + h * v if j == i else a for j, a in enumerate(args)]
        minus = [a - h * v if j == i else a for j, a in enumerate(args)]
        fd = (np.sum(dout * ly.reference_layer(*plus, k, renorm))
              - np.sum(dout * ly.reference_layer(*minus, k, renorm))) / (2 * h)
        assert np.isclose(np.sum(g * v), fd, rtol=1e-5, atol=1e-6), i
