"""Chapter 18's MoE option of the capstone GPT (Config(experts=E, topk=k)): the same checks as the dense model
(tests/test_ch13_capstone.py) against the float64 reference model, with the same stated tolerances: logits,
loss and every gradient on a fixed batch (CPU, and the GPU backend in the simulator), and an AdamW trajectory."""
import numpy as np
import pytest

from kernels_src.model.gpt import GPT, backend
from kernels_src.model.reference import Config, ReferenceGPT, adamw_step, param_shapes
from test_ch13_capstone import TRAJ_RTOL, _batch, _compare, _params

CFG = Config(vocab=29, ctx=16, width=32, heads=2, layers=2, mlp=2, experts=4, topk=2)


def test_moe_params_replace_the_mlp():
    shapes = param_shapes(CFG)
    assert "h0.wfc" not in shapes and shapes["h1.wg"] == (4, 32, 64) and shapes["h0.wr"] == (32, 4)
    assert shapes["h0.w2"] == (4, 64, 32)


def test_moe_fixed_batch_cpu():
    p = _params(CFG)
    ids, tg = _batch(CFG, 2, 11)
    model = GPT(CFG, p, "cpu")
    model.expert_load = []
    _compare(model, ReferenceGPT(CFG, p), ids, tg)
    loads = np.array(model.expert_load)  # (layers, forwards, E)
    assert loads.shape == (2, 1, 4) and np.all(loads.sum(axis=2) == 2 * 11 * 2)  # every token, k slots


@pytest.mark.slow
def test_moe_fixed_batch_gpu_simulated(sim_greenlets):
    from kernels_src import device

    if not device.GPU_VARIANTS_RUN:
        pytest.skip(device.REASON)
    cfg = Config(vocab=7, ctx=8, width=16, heads=2, layers=1, mlp=1, experts=3, topk=2, aux_lb=0.5, aux_z=0.01)
    p = _params(cfg)
    ids, tg = _batch(cfg, 1, 5)
    _compare(GPT(cfg, p, backend("gpu")), ReferenceGPT(cfg, p), ids, tg)


def test_moe_adamw_trajectory_10_steps():
    p = _params(CFG)
    model, ref = GPT(CFG, p, "cpu"), ReferenceGPT(CFG, p)
    m = {k: np.zeros_like(v) for k, v in ref.p.items()}
    v = {k: np.zeros_like(x) for k, x in ref.p.items()}
    hyper = dict(beta1=0.9, beta2=0.95, eps=1e-8, wd=0.1)
    ids, tg = _batch(CFG, 2, 12)
    losses = []
    for step in range(1, 11):
        loss_r, grads = ref.loss_and_grads(ids, tg)
        adamw_step(ref.p, grads, m, v, step, 1e-3, **hyper)
        loss = model.train_step(ids, tg, 1e-3, **hyper)
        assert abs(loss - loss_r) <= TRAJ_RTOL * abs(loss_r), (step, loss, loss_r)
        losses.append(loss)
    assert losses[-1] < losses[0]


AUX = Config(vocab=29, ctx=16, width=32, heads=2, layers=2, mlp=2, experts=4, topk=2, aux_lb=0.5, aux_z=0.01)


def test_moe_with_aux_losses_fixed_batch_and_trajectory():
    """With the load-balancing loss and the z-loss in the objective: the same checks, and the losses differ
    from the model without them (the terms are really added)."""
    p = _params(AUX)
    ids, tg = _batch(AUX, 2, 11)
    _compare(GPT(AUX, p, "cpu"), ReferenceGPT(AUX, p), ids, tg)
    plain = ReferenceGPT(CFG, p).forward(ids, tg)[1]
    assert ReferenceGPT(AUX, p).forward(ids, tg)[1] > plain + 0.4  # lb >= 1 for any routing: 0.5 * lb >= 0.5
    model, ref = GPT(AUX, p, "cpu"), ReferenceGPT(AUX, p)
    m = {k: np.zeros_like(v) for k, v in ref.p.items()}
    v = {k: np.zeros_like(x) for k, x in ref.p.items()}
    for step in range(1, 6):
        loss_r, grads = ref.loss_and_grads(ids, tg)
        adamw_step(ref.p, grads, m, v, step, 1e-3)
        loss = model.train_step(ids, tg, 1e-3)
        assert abs(loss - loss_r) <= TRAJ_RTOL * abs(loss_r), (step, loss, loss_r)


def test_reference_aux_gradient_by_finite_differences():
    cfg = Config(vocab=11, ctx=8, width=8, heads=2, layers=1, mlp=1, experts=3, topk=2, aux_lb=0.7, aux_z=0.1)
    p = _params(cfg, spread=0.3)
    ids, tg = _batch(cfg, 2, 5)
    ref = ReferenceGPT(cfg, p)
    _, g = ref.loss_and_grads(ids, tg)
    rng = np.random.default_rng(4)
    for name in ("h0.wr", "h0.wg", "h0.g2", "wte"):
        for _ in range(3):
            idx = tuple(rng.integers(0, s) for s in ref.p[name].shape)
            old = ref.p[name][idx]
            ref.p[name][idx] = old + 1e-6
            lp = ref.forward(ids, tg)[1]
            ref.p[name][idx] = old - 1e-6
            lm = ref.forward(ids, tg)[1]
            ref.p[name][idx] = old
            fd = (lp - lm) / 2e-6
            assert abs(fd - g[name][idx]) <= 1e-6 + 1e-5 * abs(fd), (name, idx, fd, g[name][idx])


# ------------------------------------------------------------------ decoding through the dispatcher's "moe" role
def _check_moe_decode(model, cfg, p, toks):
    """Every decode step's logits = the float64 reference forward's logits at that position."""
    ref = ReferenceGPT(cfg, p).forward(np.array([toks]))[0].reshape(len(toks), -1)
    kv = model.new_cache()
    for pos, t in enumerate(toks):
        got = model.decode_step([t], pos, kv)[0]
        assert np.isfinite(got).all()
        assert np.abs(got - ref[pos]).max() <= 1e-5 + 1e-4 * np.abs(ref[pos]).max(), pos
    return model.be.table["moe"]


def test_moe_decode_matches_reference_cpu():
    p = _params(CFG)
    assert _check_moe_decode(GPT(CFG, p, "cpu"), CFG, p, [3, 17, 0, 28, 5]) == "moe_layer/cpu/course"


def test_moe_decode_kv_cache_equals_no_cache():
    p = _params(CFG)
    model = GPT(CFG, p, "cpu")
    assert model.generate([1, 2, 3], 6, cache=True) == model.generate([1, 2, 3], 6, cache=False)


@pytest.mark.slow
def test_moe_decode_matches_reference_gpu_simulated(sim_greenlets):
    from kernels_src import device

    if not device.GPU_VARIANTS_RUN:
        pytest.skip(device.REASON)
    cfg = Config(vocab=7, ctx=8, width=16, heads=2, layers=1, mlp=1, experts=3, topk=2)
    p = _params(cfg)
    assert _check_moe_decode(GPT(cfg, p, backend("gpu")), cfg, p, [1, 6, 2]) == "moe_layer/gpu/gemv"


@pytest.mark.parametrize("T,k,want", [(1, 2, "gemv"), (4, 2, "gemv"), (5, 2, "course"), (1, 8, "gemv"),
                                      (3, 3, "course"), (4096, 2, "course")])
def test_moe_role_gives_few_slots_the_gemv_rung(T, k, want):
    from kernels_src.runtime.dispatch import DEFAULTS, Dispatcher

    d = Dispatcher("gpu", table={}, check=False).decide("moe", {"T": T, "d": 1024, "f": 3584, "E": 8, "k": k,
                                                               "S": T * k})
    assert d.variant == f"moe_layer/gpu/{want}"
    assert (T * k <= DEFAULTS["moe_gemv_max_slots"]) == (want == "gemv")
    assert Dispatcher("cpu", table={}).decide("moe", {"T": T, "k": k, "S": T * k}).variant == "moe_layer/cpu/course"
