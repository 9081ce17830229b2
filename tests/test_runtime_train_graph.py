"""A training step (forward, backward, AdamW) through the runtime (chapter 14, issue 23): replayed as one CUDA
graph it gives the same losses and the same parameters after N steps as the step run through the registered
launchers; where no graph can be captured (CPU, simulator, the MoE model) the trainer runs eagerly and says why."""
import numpy as np
import pytest

from kernels_src import device
from kernels_src.model.gpt import GPT
from kernels_src.model.reference import Config, init_params

CFG = Config(vocab=29, ctx=16, width=64, heads=2, layers=2)
gpu_only = pytest.mark.skipif(device.MODE != "gpu", reason=f"CUDA graphs need a real GPU (mode: {device.MODE})")
LRS = [3e-3, 1e-3, 2e-3, 5e-4, 1e-3]  # a schedule: the learning rate changes inside one graph


def batches(cfg, B, T, n, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, cfg.vocab, (B, T)), rng.integers(0, cfg.vocab, (B, T))) for _ in range(n)]


def run_trainer(cfg, kind, mode, data, lrs, **kw):
    m = GPT(cfg, init_params(cfg, 0), kind)
    tr = m.trainer(*data[0][0].shape, mode=mode, quiet=True, **kw)
    losses = []
    for (ids, tg), lr in zip(data, lrs):
        tr.step(ids, tg, lr)
        losses.append(tr.loss())
    return np.array(losses), m.params(), tr


def run_train_step(cfg, kind, data, lrs, **kw):
    m = GPT(cfg, init_params(cfg, 0), kind)
    losses = [m.train_step(ids, tg, lr, **kw) for (ids, tg), lr in zip(data, lrs)]
    return np.array(losses), m.params()


def test_cpu_trainer_falls_back_and_says_why():
    m = GPT(CFG, init_params(CFG, 0), "cpu")
    with pytest.warns(RuntimeWarning, match="training eagerly"):
        tr = m.trainer(2, 5)
    assert tr.mode == "eager" and "CPU" in tr.why and tr.why in tr.describe()
    with pytest.raises(RuntimeError, match="CPU"):
        m.trainer(2, 5, mode="graph")
    with pytest.raises(ValueError, match="not one of"):
        m.trainer(2, 5, mode="fast")
    with pytest.raises(ValueError, match="batch shape"):
        tr.step(np.zeros((3, 5), int), np.zeros((3, 5), int), 1e-3)


def test_cpu_trainer_equals_train_step():
    """The trainer's eager step is model.train_step with the loss left on the device: the same losses and the
    same parameters, bit for bit (the same kernels in the same order), and the loss is a real loss (finite,
    near log V at initialisation)."""
    data = batches(CFG, 2, 7, 3)
    la, pa, _ = run_trainer(CFG, "cpu", "auto", data, LRS, wd=0.05)
    lb, pb = run_train_step(CFG, "cpu", data, LRS, wd=0.05)
    assert np.isfinite(la).all() and abs(la[0] - np.log(CFG.vocab)) < 1.0
    np.testing.assert_array_equal(la, lb)
    for k in pb:
        np.testing.assert_array_equal(pa[k], pb[k], err_msg=k)
    assert not np.array_equal(pa["wte"], init_params(CFG, 0)["wte"].astype(np.float32))  # it did train


@pytest.mark.skipif(device.MODE != "sim", reason="the simulator's fallback (mode: sim only)")
def test_simulator_trainer_falls_back_and_says_why(sim_greenlets):
    """One step only (the simulator is slow; the eager step's equality with train_step is shown on the CPU); its
    blocks run as greenlets (each kernel's race test is in tests/test_registry.py)."""
    cfg = Config(vocab=11, ctx=8, width=32, heads=1, layers=1)
    data = batches(cfg, 1, 3, 1)
    with pytest.warns(RuntimeWarning, match="training eagerly"):
        GPT(cfg, init_params(cfg, 0), "gpu").trainer(1, 3)
    la, pa, tr = run_trainer(cfg, "gpu", "auto", data, LRS)
    assert tr.mode == "eager" and "real GPU" in tr.why
    assert np.isfinite(la).all() and abs(la[0] - np.log(cfg.vocab)) < 1.0
    assert not np.array_equal(pa["wte"], init_params(cfg, 0)["wte"].astype(np.float32))
    with pytest.raises(RuntimeError, match="real GPU"):
        tr.model.trainer(1, 3, mode="graph")


def test_moe_model_trains_eagerly_and_says_why():
    cfg = Config(vocab=13, ctx=8, width=32, heads=1, layers=1, experts=4, topk=2)
    m = GPT(cfg, init_params(cfg, 0), "cpu")
    tr = m.trainer(1, 4, quiet=True)
    assert tr.mode == "eager" and "MoE" in tr.why


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["graph", "plan"])
def test_replayed_training_equals_eager(mode):
    """Same kernels on the same buffers in the same order, AdamW's scalars set per step: the losses and the
    parameters after five steps (a changing learning rate) match the eager steps. Bit-identical unless the
    eager run itself is not (a kernel that sums with atomics in a varying order); then within twice the
    spread of two eager runs (and 1e-6 relative), which is the most a replay can be asked for."""
    cfg = Config(vocab=29, ctx=32, width=64, heads=2, layers=2)
    data = batches(cfg, 3, 19, len(LRS), seed=1)
    le, pe, _ = run_trainer(cfg, "gpu", "eager", data, LRS)
    le2, pe2 = run_train_step(cfg, "gpu", data, LRS)
    lg, pg, tr = run_trainer(cfg, "gpu", mode, data, LRS)
    assert tr.mode == mode and len(tr.plan) > 50 and tr.n_adamw == 2, tr.describe()
    assert not tr.split, tr.split  # AdamW's new scalars went into the captured graph's own nodes
    assert np.isfinite(lg).all() and np.isfinite(le).all()
    for got, want, again, what in [(lg, le, le2, "losses")] + [(pg[k], pe[k], pe2[k], k) for k in pe]:
        spread = float(np.abs(want - again).max())
        if spread == 0:  # the eager step is deterministic: the replay must be bit-identical
            np.testing.assert_array_equal(got, want, err_msg=f"{mode} {what}")
        else:
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=2 * spread, err_msg=f"{mode} {what}")
    # the learning rate reached the graph: a replay with lr 0 leaves the parameters as they were
    m2 = tr.model
    before = m2.params()["wte"].copy()
    tr.step(*data[0], 0.0)
    tr.synchronize()
    np.testing.assert_array_equal(m2.params()["wte"], before * np.float32(1.0))
